"""kill -9 of the embedded PostgreSQL under a running `sluice up`: while it is down, health says NOT_SERVING
and calls fail with UNAVAILABLE and one line; `sluice up` starts it again and says so; the jobs submitted
before finish, one submitted after runs, and a clean stop then stops the server it restarted.
"""
from __future__ import annotations

import os
import pathlib
import signal
import tempfile

import pgserver
import pytest

from agent.backends.sim.ledger import ledger_duplicates
from dispatcher.store.database import UNREACHABLE
from sluice.client import Client, ClientError
from sluice.config import load
from tests.e2e.test_crash import _stop_postgres, free_port, start_up
from tests.integration.test_store_outage import FINAL, _alive, health, job, kill_postmaster, wait_for


def interrupt_when_ready(proc, log: pathlib.Path, starts: int) -> int:
    """SIGINT once the `starts`-th start has said "ready" (its handler is then in place); its exit code."""
    wait_for("sluice up to say ready", lambda: log.read_text().count("ready: Ctrl-C stops") >= starts, 30)
    proc.send_signal(signal.SIGINT)
    return proc.wait(30)


def postmaster_pid(data: pathlib.Path) -> int:
    return int(((data / "postgres").resolve() / "postmaster.pid").read_text().split()[0])


@pytest.mark.slow
def test_embedded_postgres_killed_under_sluice_up():
    root = pathlib.Path(tempfile.mkdtemp(prefix="sl-pgk-", dir="/tmp"))
    data = root / "data"
    data.mkdir()
    log = root / "up.log"
    env = {**os.environ, "HOME": str(root), "XDG_CONFIG_HOME": str(root / "config")}
    port = free_port()
    address = f"127.0.0.1:{port}"
    ca = str(data / "certs" / "ca.crt")  # `sluice up` made it on start
    proc = start_up(data, port, env)
    try:
        with Client(load(data / "client.yaml")) as client:
            before = client.submit([job(f"before-{n}", "3s") for n in range(20)])
            wait_for("jobs to run", lambda: any(client.get(i)["state"] == "RUNNING" for i in before), 30)

            # pgserver's own lock, which `sluice up` takes to start its server: held, the restart waits,
            # so the outage lasts long enough to be looked at.
            with pgserver.PostgresServer._lock:
                killed = kill_postmaster((data / "postgres").resolve())
                assert wait_for("health NOT_SERVING", lambda: health(address, ca=ca) == "NOT_SERVING", 15)
                for call in (lambda: client.get(before[0]), client.clusters, lambda: client.submit([job("x")])):
                    with pytest.raises(ClientError) as refused:
                        call()
                    assert (refused.value.code, refused.value.message) == ("UNAVAILABLE", UNREACHABLE)
            assert wait_for("health SERVING", lambda: health(address, ca=ca) == "SERVING", 60)
            restarted = postmaster_pid(data)
            assert restarted != killed and _alive(restarted)
            shown = log.read_text()
            assert "the embedded PostgreSQL is not running; restarting it" in shown
            assert "the embedded PostgreSQL restarted" in shown

            after = wait_for("a submit to be taken", lambda: _submit(client, job("after")), 30)
            jobs = wait_for("every job to end", lambda: _final(client, before + after), 120)
            assert [j["state"] for j in jobs] == ["SUCCEEDED"] * len(jobs)
            assert all(j["attempt"] == 1 for j in jobs), "the outage cost no job an attempt"
        ledgers = list((data / "sim").glob("*.ledger"))
        assert ledgers and sum(ledger_duplicates(p) for p in ledgers) == 0

        assert interrupt_when_ready(proc, log, 1) == 0
        assert wait_for("the restarted server to stop", lambda: not _alive(restarted), 15)
        assert "Traceback" not in log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _stop_postgres(data)


def _final(client: Client, ids: list[int]):
    jobs = [client.get(i) for i in ids]
    return jobs if all(j["state"] in FINAL for j in jobs) else None


def _submit(client: Client, document: dict):
    try:
        return client.submit([document])
    except ClientError as error:
        assert error.code == "UNAVAILABLE", error
        return None


@pytest.mark.slow
def test_clean_stop_after_a_kill_9_stops_the_embedded_postgres():
    root = pathlib.Path(tempfile.mkdtemp(prefix="sl-pgs-", dir="/tmp"))
    data = root / "data"
    data.mkdir()
    env = {**os.environ, "HOME": str(root), "XDG_CONFIG_HOME": str(root / "config")}
    port = free_port()
    proc = start_up(data, port, env)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        server = postmaster_pid(data)
        assert _alive(server), "a killed `sluice up` leaves its server running, to be reused"
        proc = start_up(data, port, env)
        assert postmaster_pid(data) == server
        assert interrupt_when_ready(proc, root / "up.log", 2) == 0
        assert wait_for("the server to stop", lambda: not _alive(server), 15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _stop_postgres(data)
