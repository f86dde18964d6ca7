"""A dispatcher on an external Postgres that goes away (its postmaster killed with kill -9) and comes back:
while it is gone, health says NOT_SERVING and every call fails with UNAVAILABLE and one line for people;
once it is back, health says SERVING and everything resumes by itself (the pool, the listener, the leader
lock, the agents' links), with nothing lost and no restart of the dispatcher.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dispatcher.server import LIVENESS
from dispatcher.store import database
from sluice.admin_client import AdminClient
from sluice.client import Client, ClientError
from sluice.objects import default_objects
from tests.conftest import SCRATCH

FINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def job(name: str, duration: str = "0.3s") -> dict:
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"queue": "default", "podSets": [{"name": "w", "count": 1, "template": {
                "metadata": {"annotations": {"sluice.io/sim-duration": duration}},
                "spec": {"containers": [{"name": "m", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}}]}}


def health(address: str, service: str = "", ca: str | None = None) -> str:
    """The health check's answer, over TLS verified against `ca` when given (a `sluice up` dispatcher)."""
    channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(pathlib.Path(ca).read_bytes())) if ca \
        else grpc.insecure_channel(address)
    with channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


def wait_for(what: str, check, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def kill_postmaster(pgdata: pathlib.Path) -> int:
    pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    # Gone, not only dead: until it is reaped a new server refuses to start over its postmaster.pid.
    wait_for("the postmaster to be gone", lambda: not psutil.pid_exists(pid), 30)
    return pid


def _alive(pid: int) -> bool:
    """Running: a process that died and was not reaped yet (a zombie) is not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def all_final(client: Client, ids: list[int]):
    jobs = [client.get(i) for i in ids]
    return jobs if all(j["state"] in FINAL for j in jobs) else None


@pytest.fixture
def own_postgres():
    """A PostgreSQL of this test's own (the shared one must not be killed), with a migrated database."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="sl-out-", dir=SCRATCH))
    url, server = database.start_embedded(root, cleanup="delete")
    db = database.connect(database.DatabaseSettings(url=url))
    database.migrate(db.engine)
    db.close()
    yield url, server
    server.cleanup()
    shutil.rmtree(root, ignore_errors=True)


def test_external_postgres_killed_and_back(own_postgres, tmp_path):
    from devstack.embedded import Embedded, UpSettings
    url, server = own_postgres
    embedded = Embedded(UpSettings(data_dir=tmp_path / "data", listen="127.0.0.1:0", make_default=False,
                                   database_url=url, sim_time_scale=0.2), default_objects()).start()
    client = Client(embedded.client_settings(timeout_s=10))
    ca = embedded.tls.ca
    try:
        embedded.wait_connected()
        address = embedded.dispatcher.address
        assert health(address, ca=ca) == "SERVING"
        before = client.submit([job(f"before-{n}", "2s") for n in range(6)])
        watching = Client(embedded.client_settings(timeout_s=10))
        watch_ended: list[BaseException] = []
        threading.Thread(target=_watch, args=(watching, watch_ended), daemon=True).start()

        kill_postmaster(server.pgdata)
        assert wait_for("health NOT_SERVING", lambda: health(address, ca=ca) == "NOT_SERVING", 15)
        assert health(address, LIVENESS, ca) == "SERVING", "alive: a restart would not bring the database back"
        admin = AdminClient(embedded.client_settings(timeout_s=10))
        for call in (lambda: client.get(before[0]), lambda: client.list(limit=5), client.clusters,
                     lambda: client.submit([job("during")]), lambda: client.cancel([before[0]]),
                     lambda: admin.get_objects("")):
            with pytest.raises(ClientError) as refused:
                call()
            assert refused.value.code == "UNAVAILABLE", refused.value
            assert refused.value.message == database.UNREACHABLE
        wait_for("the open watch to end", lambda: watch_ended, 15)
        assert (watch_ended[0].code, watch_ended[0].message) == ("UNAVAILABLE", database.UNREACHABLE)
        watching.close()
        admin.close()

        with type(server)._lock:  # the operator brings the server back; the dispatcher is not restarted
            wait_for("the server to start", lambda: _start(server), 30)
        assert wait_for("health SERVING", lambda: health(address, ca=ca) == "SERVING", 15)
        after = wait_for("a submit to be taken", lambda: _submit(client, job("after")), 30)
        jobs = wait_for("every job to end", lambda: all_final(client, before + after), 90)
        assert [j["state"] for j in jobs] == ["SUCCEEDED"] * len(jobs)
        # Every agent is back, each after its own (jittered) backoff, at most backoff_max_s after the store.
        assert wait_for("every agent to reconnect",
                        lambda: all(agent.connected.is_set() for agent in embedded.agents.values()), 30)
        assert embedded.dispatcher.scheduler.is_leader.is_set()
    finally:
        client.close()
        embedded.stop()


def _watch(client: Client, ended: list) -> None:
    try:
        for _ in client.watch():
            pass
    except ClientError as error:
        ended.append(error)


def _start(server) -> bool:
    try:
        server.ensure_postgres_running()
    except Exception:  # noqa: BLE001 - the dead server's backends may still hold its shared memory
        return False
    return True


def _submit(client: Client, document: dict) -> list[int] | None:
    try:
        return client.submit([document])
    except ClientError as error:
        assert error.code == "UNAVAILABLE", error  # only while the pool renews its connections
        return None


def test_dispatcher_serve_follows_an_external_postgres_that_goes_and_returns(own_postgres, tmp_path):
    from tests.integration.test_cli import REPO, base_env, free_port
    url, server = own_postgres
    port = free_port()
    log = tmp_path / "serve.log"
    serve = subprocess.Popen([sys.executable, "-m", "sluice", "dispatcher", "serve", "--database-url",
                              url.replace("postgresql+psycopg://", "postgresql://"), "--listen", f"127.0.0.1:{port}",
                              "--metrics-listen", "", "--insecure"], env=base_env(tmp_path), cwd=REPO,
                             stderr=log.open("w"))
    address = f"127.0.0.1:{port}"
    try:
        wait_for("serve to say it serves", lambda: "serving on" in log.read_text(), 30)
        assert health(address) == "SERVING"
        with type(server)._lock:
            kill_postmaster(server.pgdata)
            assert wait_for("health NOT_SERVING", lambda: health(address) == "NOT_SERVING", 15)
            wait_for("the server to start", lambda: _start(server), 30)
        assert wait_for("health SERVING", lambda: health(address) == "SERVING", 15)
        assert serve.poll() is None, "no restart needed"
        serve.send_signal(signal.SIGINT)
        assert serve.wait(30) == 0
        shown = log.read_text()
        assert "the database is unreachable; health is NOT_SERVING until it returns" in shown
        assert "the database is reachable again; serving" in shown
        assert "Traceback" not in shown, shown
    finally:
        if serve.poll() is None:
            serve.kill()


def test_only_connection_failures_become_store_unavailable(db_url):
    from sqlalchemy import exc, text

    from dispatcher.errors import StoreUnavailable
    db = database.connect(database.DatabaseSettings(url=db_url))
    sessions = db.sessions()
    try:
        with pytest.raises(exc.OperationalError, match="statement timeout"):  # the server answered: not an outage
            with sessions.begin() as session:
                database.statement_timeout(session, 0.01)
                session.execute(text("SELECT pg_sleep(1)"))
        with pytest.raises(StoreUnavailable) as gone:  # the session's connection ended under it (plain SQL path)
            with sessions.begin() as session:
                database.named(session, "SELECT pg_terminate_backend(pg_backend_pid())")
        assert str(gone.value) == database.UNREACHABLE
        with sessions() as session:  # the next session has a connection that works
            assert database.named(session, "SELECT 1 AS one")[0].one == 1
    finally:
        db.close()
