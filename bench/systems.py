"""The whole system run as deployed (System), and the submit and e2e benchmarks, measured from outside.

By default (split) the dispatcher runs alone in a child process (dispatcher.server.Dispatcher, what
`sluice dispatcher serve` runs) and the sim agents of every cluster in another, the way they are
deployed; with split=False both run in one process as `sluice up` (devstack.embedded.Embedded) does.
Each uses a database of the run's PostgreSQL and listens on 127.0.0.1 with a free port; clients run in
other processes and talk to it over real gRPC (sluice.client).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import psutil
import psycopg

from bench import workload
from bench.figures import Figure, Run, Target
from bench.postgres import Postgres
from sluice import process as tuning
from sluice.objects import ClusterObject, QueueObject, SimulatedSpec
from sluice.quantity import parse_resources

SPAWN = multiprocessing.get_context("spawn")
SPLIT = ("the dispatcher alone, as `sluice dispatcher serve` runs it (its scheduler in a process of its own); "
         "the sim agents (one per cluster) in another")


def objects(clusters: int, nodes: int) -> list:
    """The classes of `sluice up`, one queue, and on-premises sim clusters of nodes x 64 cpu / 256 GiB."""
    node = parse_resources({"cpu": "64", "memory": "256Gi"})
    return [*workload.CLASSES, QueueObject("default"),
            *[ClusterObject(f"sim-{i}", tier="onprem", site="dc-1", simulated=SimulatedSpec(nodes, node))
              for i in range(clusters)]]


def _serve(pipe, data_dir: str, database_url: str, objs: list, cordon: bool, split: bool,
           schedule: bool = True, tls: bool = True, server: dict | None = None, listen: str = "127.0.0.1:0") -> None:
    tuning.apply()  # a process entry point: before it imports grpc
    from devstack.embedded import Embedded, UpSettings, local_tls
    from dispatcher.server import Dispatcher, ServerSettings
    from dispatcher.services import administering
    from dispatcher.store import tokens
    from dispatcher.store.database import DatabaseSettings

    logging.basicConfig(level=logging.WARNING)
    if split:  # the dispatcher alone, as `sluice dispatcher serve` runs it; the agents are another process's
        # over TLS as deployed, with certificates as `sluice up` makes them (every replica shares the CA)
        server_tls = local_tls(pathlib.Path(data_dir) / "certs", "127.0.0.1:0") if tls else None
        # The scheduler in a process of its own, as `sluice dispatcher serve` runs it by default.
        settings = {"scheduler_process": schedule, **(server or {})}
        server = Dispatcher(ServerSettings(listen=listen, metrics_listen=None, schedule=schedule,
                                           tls=server_tls, database=DatabaseSettings(url=database_url),
                                           **settings)).start()
        with server.sessions.begin() as session:
            administering.apply(session, "bench", objs)
            admin = tokens.create(session, "admin", "bench")
            agents = {o.name: tokens.create(session, "agent", f"agent-{o.name}", o.name)
                      for o in objs if isinstance(o, ClusterObject)}
        info = {"address": server.address, "token": admin, "agents": agents,
                "ca": str(server_tls.cert.parent / "ca.crt") if tls else None}
        stop = server.stop
    else:
        embedded = Embedded(UpSettings(data_dir=pathlib.Path(data_dir), listen="127.0.0.1:0", make_default=False,
                                       database_url=database_url, insecure=not tls), objs).start()
        embedded.wait_connected()
        server, stop = embedded.dispatcher, embedded.stop
        info = {"address": server.address, "token": embedded.admin_token, "ca": embedded.tls.ca if tls else None}
    cpu = 0.0
    try:
        if cordon:  # jobs stay queued: only the submit path (and the cycles it wakes) is measured
            with server.sessions.begin() as session:
                for o in objs:
                    if isinstance(o, ClusterObject):
                        administering.set_cluster_state(session, "bench", o.name, "cordoned")
        pipe.send(info)
        cpu = _cpu_s()
        pipe.recv()  # anything: stop
        cpu = _cpu_s() - cpu
    finally:
        stop()
    sample = server.metrics.registry.get_sample_value
    pipe.send({"cycles": sample("sluice_scheduling_cycles_total") or 0,
               "cycle_seconds": sample("sluice_scheduling_cycle_seconds_sum") or 0.0, "cpu_seconds": cpu})


def _cpu_s() -> float:
    """CPU seconds used so far by this process and its children (the scheduler process)."""
    used = time.process_time()
    for child in psutil.Process().children(recursive=True):
        try:
            used += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return used


def _serve_agents(pipe, data_dir: str, address: str, agents: dict[str, str], objs: list, ca: str | None) -> None:
    """One sim agent per cluster, in this process: what `sluice agent run --backend sim` runs per cluster."""
    tuning.apply()  # a process entry point: before it imports grpc
    from agent.connection import Agent, AgentSettings
    from devstack.embedded import sim_cluster
    from sluice.transport import Tls

    logging.basicConfig(level=logging.WARNING)
    running = [Agent(AgentSettings(o.name, address, agents[o.name], tls=Tls(ca=ca) if ca else Tls(insecure=True)),
                     sim_cluster(o, pathlib.Path(data_dir))).start()
               for o in objs if isinstance(o, ClusterObject)]
    try:
        for agent in running:
            if not agent.connected.wait(60):
                raise TimeoutError("a sim agent did not connect")
        pipe.send("connected")
        pipe.recv()
    finally:
        for agent in running:
            agent.stop()
    pipe.send("stopped")


def _start(target, args: tuple, name: str, timeout_s: float = 120.0):
    """A spawned child and our end of its pipe, once it has sent its first message (returned too)."""
    pipe, child = SPAWN.Pipe()
    process = SPAWN.Process(target=target, args=(child, *args), name=name)
    process.start()
    deadline = time.monotonic() + timeout_s
    while not pipe.poll(0.2):
        if not process.is_alive() or time.monotonic() > deadline:
            _stop(process, pipe)
            raise RuntimeError(f"{name} did not start (exit code {process.exitcode})")
    return process, pipe, pipe.recv()


def _serve_command(data_dir: str, url: str, schedule: bool, tls: bool, server: dict | None, listen: str) -> list[str]:
    """`sluice dispatcher serve` as _serve runs its Dispatcher (split): the same database, certificates and
    settings. A setting no flag states is refused here rather than left at its default unsaid."""
    from dispatcher.scheduler.settings import SchedulerSettings
    command = [sys.executable, "-m", "sluice", "dispatcher", "serve", "--database-url",
               url.replace("postgresql+psycopg://", "postgresql://"), "--listen", listen, "--metrics-listen", "",
               "--schedule" if schedule else "--no-schedule"]
    certs = pathlib.Path(data_dir) / "certs"
    command += ["--tls-cert", str(certs / "dispatcher.crt"), "--tls-key", str(certs / "dispatcher.key")] if tls \
        else ["--insecure"]
    flags = {"heartbeat_s": "--heartbeat-s", "watch_streams": "--watch-streams",
             "watch_streams_per_user": "--watch-streams-per-user", "agent_admissions_per_s": "--agent-admissions-per-s"}
    for name, value in (server or {}).items():
        if name == "scheduler" and value == SchedulerSettings(unreachable_after_s=value.unreachable_after_s):
            command += ["--unreachable-after-s", f"{value.unreachable_after_s:g}"]
        elif name in flags:
            command += [flags[name], f"{value:g}"]
        else:
            raise ValueError(f"`sluice dispatcher serve` has no flag for the setting {name}={value!r}")
    return command


def _serving(command: list[str], log: pathlib.Path, timeout_s: float = 120.0) -> subprocess.Popen:
    """A `sluice dispatcher serve` process, once it says it serves (its output goes to `log`)."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while "serving on" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            _stop(process, None)
            raise RuntimeError(f"`sluice dispatcher serve` did not serve (exit code {process.returncode}): "
                               f"{log.read_text()[-2000:]}")
        time.sleep(0.05)
    return process


def _stop(process, pipe):
    """Stop the child (a `sluice dispatcher serve` process: with SIGINT, as Ctrl-C); what it said last (None if
    nothing)."""
    if isinstance(process, subprocess.Popen):
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        return None
    said = None
    if process.is_alive():
        try:
            pipe.send("stop")
            if pipe.poll(60):
                said = pipe.recv()
        except (OSError, EOFError):
            pass
        process.join(30)
        if process.is_alive():
            process.terminate()
            process.join(10)
    return said


class System:
    """A dispatcher and sim agents, each in child processes; stopped, with the ledgers left in data_dir.

    split=False: `sluice up` (Embedded): the dispatcher and its in-process sim agents in one process.
    split=True: the dispatcher alone in one process and the agents in another, the way they are deployed
    (an agent runs in its own cluster, never inside the dispatcher).
    """

    def __init__(self, pg: Postgres, name: str, objs: list, *, cordon: bool = False, split: bool = False,
                 replicas: int = 1, apart: bool = False, tls: bool = True, agents: bool = True,
                 server: dict | None = None):
        """replicas > 1 (split only): more dispatcher processes on the same database, started after the
        first (which therefore leads and serves the agents); clients call the last one.
        apart (split only): the first process only schedules; a second one, `schedule=False` (as
        `sluice dispatcher serve --no-schedule`), serves the agents and the clients.
        tls=False: everything in plaintext on loopback (`python -m bench --plaintext`), to tell what the
        code costs from what encryption costs.
        agents=False (split only): no agent process; `agent_tokens` holds each cluster's token for agents the
        caller runs (bench/swarm.py).
        server (split only): ServerSettings fields of the dispatchers other than their defaults (the first's, and
        with apart the serving one's too)."""
        self.db = pg.create(name)
        self.libpq = pg.libpq(self.db)
        self.data_dir = pg.root / f"up-{self.db}"
        self._children = []
        self.leader_stats: dict = {}
        first = (str(self.data_dir), pg.url(self.db), objs, cordon, split, True, tls, server)
        process, pipe, info = _start(_serve, first, "bench-dispatcher")
        self._children.append((process, pipe))
        self._serving = (0, first)  # which child the agents and clients call, and how it was started
        self.address, self.token, self.ca = info["address"], info["token"], info["ca"]
        self.agent_tokens: dict[str, str] = info.get("agents", {})
        self.pid = process.pid  # the (first) dispatcher's process
        self.serving_pid = process.pid  # the process the agents and clients call
        self.addresses = [self.address]  # every replica's, the leader first
        if split:
            try:
                if apart:
                    serving = (str(self.data_dir), pg.url(self.db), [], False, True, False, tls, server)
                    process, pipe, api = _start(_serve, serving, "bench-dispatcher-api")
                    self._children.append((process, pipe))
                    self.serving_pid = process.pid
                    self._serving = (1, serving)
                    self.address, self.token = api["address"], api["token"]
                    self.addresses.append(self.address)
                if agents:
                    self._children.append(_start(_serve_agents, (str(self.data_dir), self.address, info["agents"],
                                                                 objs, self.ca), "bench-agents")[:2])
                for n in range(1, replicas):
                    process, pipe, more = _start(_serve, (str(self.data_dir), pg.url(self.db), [], False, True, True,
                                                          tls), f"bench-dispatcher-{n + 1}")
                    self._children.append((process, pipe))
                    self.address, self.token = more["address"], more["token"]
                    self.addresses.append(self.address)
            except Exception:
                self.close()
                raise

    def config(self, timeout_s: float = 60.0):
        """How a client reaches the system (TLS with its CA, unless plaintext): picklable, for the submitter
        processes."""
        from sluice.config import ClientConfig
        return ClientConfig(self.address, self.token, timeout_s=timeout_s, ca=self.ca, insecure=self.ca is None)

    def client(self, timeout_s: float = 60.0):
        from sluice.client import Client
        return Client(self.config(timeout_s))

    def count(self, where: str) -> int:
        with psycopg.connect(self.libpq) as conn:
            return conn.execute(f"SELECT count(*) FROM jobs WHERE {where}").fetchone()[0]

    def kill_and_restart_serving(self) -> None:
        """kill -9 of the dispatcher process the agents and clients call, then `sluice dispatcher serve` on its
        address with its settings (split only), as a service manager would restart it; returns once it serves."""
        index, args = self._serving
        process, pipe = self._children[index]
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
        # The objects and tokens are in the database already: a restarted `serve` applies and makes none.
        data_dir, url, _objs, _cordon, _split, schedule, tls, server = args
        process = _serving(_serve_command(data_dir, url, schedule, tls, server, self.address),
                           pathlib.Path(data_dir) / "restarted.log")
        self._children[index] = (process, None)
        self.serving_pid = process.pid
        if index == 0:
            self.pid = process.pid

    def close(self) -> None:
        for process, pipe in reversed(self._children):  # the agents first, then the dispatcher
            said = _stop(process, pipe)
            if (process, pipe) == self._children[0] and isinstance(said, dict):
                self.leader_stats = said  # the leading dispatcher's cycle count and time, from its metrics
        self._children = []

    def __enter__(self) -> System:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def percentiles(values: list[float]) -> tuple[float, float]:
    """p50 and p99 of `values` (NaN for none)."""
    ordered = sorted(values)
    def at(q):
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")
    return at(0.5), at(0.99)


# -- submit ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SubmitConfig:
    clients: int = 8
    batch: int = 1000
    seconds: float = 20.0  # each client submits for this long
    sim_clusters: int = 3
    nodes: int = 4
    split: bool = True  # the agents in a process of their own (False: all in one `sluice up` process)
    tls: bool = True  # as deployed; False: plaintext on loopback (--plaintext), the code's cost alone

    @classmethod
    def quick(cls) -> SubmitConfig:
        return cls(seconds=3.0)


def _submitter(pipe, config, batch: int, seconds: float, start) -> None:
    """Submit `batch` jobs per call for `seconds`; batch 0: empty calls (Health.Check) on the same kind of
    channel, the most a client can get through this gRPC server and machine per call."""
    tuning.apply()  # a process entry point: before it imports grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from sluice.client import Client

    docs = [workload.job_document("default", workload.SHAPES[0], "standard", i % 10) for i in range(batch)]
    client = Client(config)
    if batch:
        def call() -> int:
            return len(client.submit(docs))
    else:
        health = health_pb2_grpc.HealthStub(client._channel)

        def call() -> int:
            health.Check(health_pb2.HealthCheckRequest(), timeout=120)
            return 1
    call()  # the channel is up before the clock starts
    pipe.send("ready")
    start.wait()
    began = time.monotonic()
    submitted, calls = 0, 0
    while time.monotonic() - began < seconds:
        submitted += call()
        calls += 1
    ended = time.monotonic()
    client.close()
    pipe.send({"jobs": submitted, "calls": calls, "began": began, "ended": ended})


def _submit_once(pg: Postgres, config: SubmitConfig, clients: int, batch: int) -> dict:
    with System(pg, "submit", objects(config.sim_clusters, config.nodes), cordon=True,
                split=config.split, tls=config.tls) as system:
        start = SPAWN.Event()
        pipes, processes = [], []
        for _ in range(clients):
            parent, child = SPAWN.Pipe(duplex=False)
            p = SPAWN.Process(target=_submitter, args=(child, system.config(120), batch, config.seconds,
                                                       start), name="bench-submitter")
            p.start()
            pipes.append(parent)
            processes.append(p)
        for parent in pipes:  # every client connected and warmed up
            if not parent.poll(120) or parent.recv() != "ready":
                raise TimeoutError("a submitting client did not start")
        before = system.count("true")
        start.set()
        results = []
        for parent in pipes:
            if not parent.poll(config.seconds + 300):
                raise TimeoutError("a submitting client did not finish")
            results.append(parent.recv())
        for p in processes:
            p.join(10)
        committed = system.count("true") - before
    jobs = sum(r["jobs"] for r in results)
    elapsed = max(r["ended"] for r in results) - min(r["began"] for r in results)
    if batch and committed != jobs:
        raise RuntimeError(f"submit: {jobs} ids returned but {committed} jobs committed")
    return {"jobs": jobs, "calls": sum(r["calls"] for r in results), "seconds": elapsed, "rate": jobs / elapsed}


def submit(pg: Postgres, config: SubmitConfig, run: Run) -> None:
    run.configs["submit"] = {**asdict(config), "job": "1 pod, 1 cpu, 2Gi, class standard, queue default",
                             "server": (SPLIT if config.split else "sluice up (Embedded) in its own process")
                             + ", clusters cordoned",
                             "clients": f"{config.clients} processes, sluice.client.Client (each call after a "
                                        "client's first goes on its Jobs.SubmitStream)"}
    for clients, batch, target in ((config.clients, config.batch, 20_000), (1, config.batch, None),
                                   (config.clients, 1, 2_000)):
        r = _submit_once(pg, config, clients, batch)
        what = f"{batch:,}-job calls" if batch > 1 else "single-job calls"
        run.add(Figure("submit", f"submit, {what}, {clients} client{'s' if clients > 1 else ''}", r["rate"], "jobs/s",
                       Target(">=", target) if target else None,
                       note=f"{r['jobs']:,} jobs in {r['calls']:,} calls over {r['seconds']:.1f}s"))
    single = r["rate"]
    r = _submit_once(pg, config, config.clients, 0)  # the floor under single-job calls, same run
    # Calls, not stream messages: the floor the single-job calls had before they went on streams.
    run.add(Figure("submit", f"empty calls (Health.Check), {config.clients} clients: the transport's floor", r["rate"],
                   "calls/s", note=f"{r['calls']:,} calls over {r['seconds']:.1f}s, same server and clients"))
    run.add(Figure("submit", "single-job submit / empty calls", single / r["rate"], "x"))


# -- end to end ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EndToEndConfig:
    jobs: int = 10_000
    sim_clusters: int = 4
    nodes: int = 8  # x 64 cpu: 2,048 one-cpu jobs may run at once
    duration: str = "1s"
    timeout_s: float = 900.0
    split: bool = True  # the agents in a process of their own (False: all in one `sluice up` process)
    tls: bool = True  # as deployed; False: plaintext on loopback (--plaintext), the code's cost alone

    @classmethod
    def quick(cls) -> EndToEndConfig:
        return cls(jobs=1_000, timeout_s=180.0)


def end_to_end(pg: Postgres, config: EndToEndConfig, run: Run) -> None:
    from agent.backends.sim.ledger import ledger_duplicates

    run.configs["e2e"] = {**asdict(config), "job": f"1 pod, 1 cpu, 2Gi, {config.duration}, class standard",
                          "server": SPLIT if config.split else
                          "sluice up (Embedded) in its own process, one in-process sim agent per cluster",
                          "measured": "first submit call -> last job SUCCEEDED (database polled every 0.25s)"}
    with System(pg, "e2e", objects(config.sim_clusters, config.nodes), split=config.split, tls=config.tls) as system:
        client = system.client()
        docs = [workload.job_document("default", workload.SHAPES[0], "standard", i % 10, duration=config.duration)
                for i in range(config.jobs)]
        began = time.monotonic()
        client.submit(docs)
        submitted = time.monotonic() - began
        marks: list[tuple[float, int]] = []
        deadline = began + config.timeout_s
        while time.monotonic() < deadline:
            done = system.count("state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')")
            marks.append((time.monotonic() - began, done))
            if done >= config.jobs:
                break
            time.sleep(0.25)
        elapsed = marks[-1][0]
        succeeded = system.count("state = 'SUCCEEDED'")
        client.close()
    duplicated = sum(ledger_duplicates(p) for p in (system.data_dir / "sim").glob("*.ledger"))
    ended = marks[-1][1]
    lo = next(t for t, n in marks if n >= 0.1 * ended) if ended else 0
    hi = next(t for t, n in marks if n >= 0.9 * ended) if ended else 0
    steady = 0.8 * ended / (hi - lo) if hi > lo else float("nan")
    note = (f"{ended:,} of {config.jobs:,} jobs ended ({succeeded:,} succeeded) in {elapsed:.1f}s, submit took "
            f"{submitted:.1f}s; {duplicated} pods created twice")
    run.add(Figure("e2e", "jobs completed through gRPC agents + sim", ended / elapsed, "jobs/s", note=note))
    run.add(Figure("e2e", "completion rate between 10% and 90% done", steady, "jobs/s"))
    if ended < config.jobs:
        run.notes.append(f"e2e: only {ended} of {config.jobs} jobs ended within {config.timeout_s:.0f}s")
