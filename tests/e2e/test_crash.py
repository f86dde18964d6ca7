"""kill -9 of `sluice up` in the middle of a 1,000-job run, then `sluice up` again on the same data dir:
every job reaches a final state and no (job, attempt) creates pods twice.
"""
from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from agent.backends.sim.ledger import ledger_duplicates
from sluice.client import Client, ClientError
from sluice.config import load

FINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_up(data_dir: pathlib.Path, port: int, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "sluice", "up", "--data-dir", str(data_dir),
                             "--listen", f"127.0.0.1:{port}"], env=env, stdout=subprocess.DEVNULL,
                            stderr=open(data_dir.parent / "up.log", "ab"), start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, (data_dir.parent / "up.log").read_text()[-3000:]
        if (data_dir / "client.yaml").exists():
            try:
                with Client(load(data_dir / "client.yaml")) as client:
                    clusters = client.clusters()
                if all(c["state"] == "active" for c in clusters) and len(clusters) == 3:
                    return proc
            except ClientError:
                pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("sluice up did not become ready")


def job(n: int) -> dict:
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": f"crash-{n}"},
            "spec": {"queue": "default", "podSets": [{"name": "w", "count": 1 + n % 2, "template": {
                "metadata": {"annotations": {"sluice.io/sim-duration": f"{0.2 + (n % 5) / 10:.1f}s"}},
                "spec": {"containers": [{"name": "m", "image": "x", "resources": {"requests": {"cpu": "2"}}}]}}}]}}


@pytest.mark.slow
def test_kill_9_mid_run_then_restart_finishes_every_job_exactly_once():
    root = pathlib.Path(tempfile.mkdtemp(prefix="sl-crash-", dir="/tmp"))
    data = root / "data"
    data.mkdir()
    env = {**os.environ, "HOME": str(root), "XDG_CONFIG_HOME": str(root / "config")}
    port = free_port()
    proc = start_up(data, port, env)
    try:
        with Client(load(data / "client.yaml")) as client:
            ids = client.submit([job(n) for n in range(1000)])
            assert len(ids) == 1000
            while sum(j["state"] in FINAL for j in client.list(limit=0)) < 250:
                time.sleep(0.1)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        killed_at = {j["id"]: j["state"] for j in _list(data)}
        assert sum(s in FINAL for s in killed_at.values()) < 1000, "the run finished before the kill"

        proc = start_up(data, port, env)
        with Client(load(data / "client.yaml")) as client:
            deadline = time.monotonic() + 240
            while True:
                jobs = client.list(limit=0)
                if all(j["state"] in FINAL for j in jobs) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        assert len(jobs) == 1000
        assert [j for j in jobs if j["state"] != "SUCCEEDED"] == []
        ledgers = list((data / "sim").glob("*.ledger"))
        assert ledgers and sum(ledger_duplicates(p) for p in ledgers) == 0
        retried = [j for j in jobs if j["attempt"] > 1]
        assert all(j["attempt"] <= 2 for j in jobs), "one crash costs at most one extra attempt"
        print(f"killed with {sum(s in FINAL for s in killed_at.values())} final; "
              f"{len(retried)} jobs took a second attempt")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        _stop_postgres(data)


def _list(data: pathlib.Path) -> list[dict]:
    """Read the jobs straight from the database: no dispatcher is running."""
    import psycopg
    with psycopg.connect(f"postgresql://postgres@/sluice?host={(data / 'postgres').resolve()}") as conn:
        return [{"id": i, "state": s} for i, s in conn.execute("SELECT id, state FROM jobs")]


def _stop_postgres(data: pathlib.Path) -> None:
    pgdata = (data / "postgres").resolve()
    pid_file = pgdata / "postmaster.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass
