"""The agent's own metrics: driven through a real Agent, a real SimCluster and real gRPC on loopback.

The dispatcher is faked at the gRPC boundary (a servicer that welcomes, sends the commands a test
queues and acks what it is told to), so the agent's own code runs unchanged.
"""
from __future__ import annotations

import json
import queue
import re
import threading
import time
import urllib.request
from concurrent import futures

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.backends.sim.cluster import SimCluster, SimConfig
from agent.connection import Agent, AgentSettings
from agent.metrics import AgentMetrics
from sluice.serving import MetricsServer
from sluice.transport import PLAINTEXT
from sluice.v1 import agents_pb2, agents_pb2_grpc

NODE = {"cpu": 4000, "memory": 16 * 2**30 * 1000}
WAIT = 5.0
JOB = {"spec": {"queue": "default", "podSets": [{"name": "worker", "count": 1, "template": {
    "metadata": {"annotations": {"sluice.io/sim-duration": "1h"}},
    "spec": {"containers": [{"name": "main", "image": "img", "resources": {"requests": {"cpu": "1"}}}]}}}]}}


class FakeDispatcher(agents_pb2_grpc.AgentsServicer):
    """Welcomes every connection, then sends what the test puts in `to_agent`."""

    def __init__(self) -> None:
        self.to_agent: queue.Queue = queue.Queue()

    def Connect(self, request_iterator, context):
        hello = next(request_iterator)
        threading.Thread(target=self._drain, args=(request_iterator,), daemon=True).start()
        yield agents_pb2.DispatcherMessage(welcome=agents_pb2.Welcome(cluster=hello.hello.cluster))
        while context.is_active():
            try:
                yield self.to_agent.get(timeout=0.05)
            except queue.Empty:
                continue

    @staticmethod
    def _drain(request_iterator) -> None:
        try:
            for _ in request_iterator:
                pass
        except grpc.RpcError:
            pass


def start_server(servicer: FakeDispatcher, port: int = 0) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    agents_pb2_grpc.add_AgentsServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, bound


def dispatch(command_id: int, job_id: int) -> agents_pb2.DispatcherMessage:
    return agents_pb2.DispatcherMessage(command=agents_pb2.Command(
        id=command_id, dispatch=agents_pb2.DispatchAttempt(job_id=job_id, attempt=1, spec_json=json.dumps(JOB))))


def cancel(command_id: int, job_id: int) -> agents_pb2.DispatcherMessage:
    return agents_pb2.DispatcherMessage(command=agents_pb2.Command(
        id=command_id, cancel=agents_pb2.CancelAttempt(job_id=job_id, attempt=1, reason="test")))


def value(agent: Agent, name: str, **labels: str) -> float | None:
    return agent.metrics.registry.get_sample_value(name, {"cluster": agent.settings.cluster, **labels})


def eventually(check, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def settings(port: int, cluster: str = "c1") -> AgentSettings:
    return AgentSettings(cluster, f"127.0.0.1:{port}", "token", heartbeat_s=0.1,
                         backoff_initial_s=0.05, backoff_max_s=0.2, tls=PLAINTEXT)


def test_metrics_follow_the_link_commands_and_acks():
    fake = FakeDispatcher()
    server, port = start_server(fake)
    agent = Agent(settings(port), SimCluster(SimConfig(nodes=1, node=NODE)))
    assert value(agent, "sluice_agent_connected") == 0
    agent.start()
    try:
        eventually(lambda: value(agent, "sluice_agent_connected") == 1)
        assert value(agent, "sluice_agent_reconnects_total") == 0

        fake.to_agent.put(dispatch(1, 10))
        eventually(lambda: value(agent, "sluice_agent_commands_applied_total", kind="dispatch") == 1)
        assert value(agent, "sluice_agent_attempts_created_total") == 1
        # PENDING and RUNNING reached the agent; the fake dispatcher has acked neither.
        eventually(lambda: value(agent, "sluice_agent_status_reports_unacked") == 2)
        fake.to_agent.put(agents_pb2.DispatcherMessage(status_ack=agents_pb2.StatusAck(seq=2)))
        eventually(lambda: value(agent, "sluice_agent_status_reports_unacked") == 0)

        fake.to_agent.put(dispatch(2, 10))  # a repeat: applied again, nothing created
        eventually(lambda: value(agent, "sluice_agent_commands_applied_total", kind="dispatch") == 2)
        assert value(agent, "sluice_agent_attempts_created_total") == 1

        fake.to_agent.put(cancel(3, 10))
        eventually(lambda: value(agent, "sluice_agent_commands_applied_total", kind="cancel") == 1)
        assert value(agent, "sluice_agent_attempts_deleted_total") == 1
        assert value(agent, "sluice_agent_backend_errors_total") == 0

        server.stop(0).wait()
        eventually(lambda: value(agent, "sluice_agent_connected") == 0)
        eventually(lambda: value(agent, "sluice_agent_reconnects_total") >= 1)
        server, _ = start_server(fake, port)  # the dispatcher is back on the same address
        eventually(lambda: value(agent, "sluice_agent_connected") == 1)
        assert value(agent, "sluice_agent_commands_applied_total", kind="dispatch") == 2
    finally:
        agent.stop()
        server.stop(0).wait()
    assert value(agent, "sluice_agent_connected") == 0


class BrokenCluster:
    """A backend whose cluster API fails on every call (the Backend protocol, nothing of ours faked)."""

    def start(self, on_status) -> None:
        pass

    def create_attempt(self, job_id: int, attempt: int, spec: dict, avoid_nodes: tuple[str, ...] = ()) -> bool:
        raise OSError("cluster API unreachable")

    def delete_attempt(self, job_id: int, attempt: int) -> None:
        raise OSError("cluster API unreachable")

    def inventory(self) -> list:
        raise OSError("cluster API unreachable")

    def capacity(self):
        raise OSError("cluster API unreachable")

    def stop(self) -> None:
        pass


def test_backend_calls_that_raise_are_counted_and_still_raise():
    agent = Agent(settings(1), BrokenCluster())
    out: queue.Queue = queue.Queue()
    with pytest.raises(OSError):
        agent._apply(dispatch(1, 10).command, out)
    with pytest.raises(OSError):
        agent._apply(cancel(2, 10).command, out)
    with pytest.raises(OSError):
        agent._capacity()
    with pytest.raises(OSError):
        agent._inventory()
    assert value(agent, "sluice_agent_backend_errors_total") == 4
    assert value(agent, "sluice_agent_commands_applied_total", kind="dispatch") == 0
    assert value(agent, "sluice_agent_attempts_created_total") == 0
    assert value(agent, "sluice_agent_attempts_deleted_total") == 0
    assert out.empty()  # nothing acked


def test_agents_in_one_process_keep_their_own_registries():
    one = Agent(settings(1, "alpha"), SimCluster(SimConfig(nodes=1, node=NODE)))
    two = Agent(settings(1, "beta"), SimCluster(SimConfig(nodes=1, node=NODE)))
    one._apply(dispatch(1, 10).command, queue.Queue())
    assert value(one, "sluice_agent_attempts_created_total") == 1
    assert value(two, "sluice_agent_attempts_created_total") == 0
    assert two.metrics.registry.get_sample_value("sluice_agent_connected", {"cluster": "alpha"}) is None


def test_served_on_loopback_with_conventional_names():
    metrics = AgentMetrics("c1", unacked=lambda: 3)
    metrics.command_applied("dispatch").inc()
    server = MetricsServer("127.0.0.1:0", metrics.registry)
    try:
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(server.url, timeout=5) as response:
            families = list(text_string_to_metric_families(response.read().decode()))
    finally:
        server.stop()
    counters = ["sluice_agent_attempts_created", "sluice_agent_attempts_deleted", "sluice_agent_commands_applied",
                "sluice_agent_reconnects", "sluice_agent_backend_errors"]  # the parser drops _total
    assert {family.name: family.type for family in families} == {
        "sluice_agent_connected": "gauge",
        "sluice_agent_status_reports_unacked": "gauge",
        **{name: "counter" for name in counters},
    }
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in families for sample in family.samples}
    assert samples[("sluice_agent_status_reports_unacked", (("cluster", "c1"),))] == 3
    assert samples[("sluice_agent_commands_applied_total", (("cluster", "c1"), ("kind", "dispatch")))] == 1
    assert samples[("sluice_agent_commands_applied_total", (("cluster", "c1"), ("kind", "cancel")))] == 0
    for family in families:
        assert re.fullmatch(r"sluice_agent_[a-z][a-z0-9_]*", family.name)
        for sample in family.samples:
            assert sample.labels["cluster"] == "c1"
            if family.type == "counter":
                assert sample.name.endswith(("_total", "_created"))
            else:
                assert not sample.name.endswith("_total")
