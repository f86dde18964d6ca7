"""kill -9 of `sluice up` in the middle of a chain of dependent jobs, a diamond and an array with a
parallelism, then `sluice up` again on the same data dir: every job reaches its final state in order, none
runs twice, and a failed dependency still fails its dependants."""
from __future__ import annotations

import os
import pathlib
import signal
import tempfile
import time

import pytest

from agent.backends.sim.ledger import ledger_duplicates
from sluice.client import Client
from sluice.config import load
from tests.e2e.test_crash import FINAL, _stop_postgres, free_port, start_up


def step(name: str, duration: str = "1s", exit_code: str = "0", **spec) -> dict:
    retries = 0 if exit_code != "0" else 2  # a lost attempt (the kill) is retried; a failing one is not
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"queue": "default", "maxRetries": retries, **spec,
                     "podSets": [{"name": "w", "count": 1, "template": {
                "metadata": {"annotations": {"sluice.io/sim-duration": duration, "sluice.io/sim-exit-code": exit_code}},
                "spec": {"containers": [{"name": "m", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}}]}}


def after(*names: str, condition: str = "succeeded") -> list[dict]:
    return [{"job": n, "condition": condition} for n in names]


@pytest.mark.slow
def test_kill_9_mid_chain_then_restart_runs_the_rest_in_order_exactly_once():
    root = pathlib.Path(tempfile.mkdtemp(prefix="sl-chain-", dir="/tmp"))
    data = root / "data"
    data.mkdir()
    env = {**os.environ, "HOME": str(root), "XDG_CONFIG_HOME": str(root / "config")}
    port = free_port()
    chain = [step("c0")] + [step(f"c{n}", dependsOn=after(f"c{n - 1}")) for n in range(1, 8)]
    diamond = [step("top"), step("left", dependsOn=after("top")), step("right", dependsOn=after("top")),
               step("bottom", dependsOn=after("left", "right"))]
    broken = [step("bad", exit_code="1"), step("never", dependsOn=after("bad")),
              step("cleanup", dependsOn=after("bad", condition="failed"))]
    sweep = [step("sweep", duration="0.5s", array={"count": 30, "parallelism": 3}),
             step("reduce", dependsOn=after("sweep"))]
    docs = chain + diamond + broken + sweep
    proc = start_up(data, port, env)
    try:
        with Client(load(data / "client.yaml")) as client:
            ids = client.submit(docs)
            by_name: dict[str, int] = {}
            for job_id in ids:
                by_name.setdefault(client.get(job_id)["name"], job_id)
            while client.get(by_name["c2"])["state"] not in FINAL:
                time.sleep(0.1)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

        proc = start_up(data, port, env)
        with Client(load(data / "client.yaml")) as client:
            deadline = time.monotonic() + 240
            while True:
                jobs = {j["id"]: j for j in client.list(limit=0)}
                if all(j["state"] in FINAL for j in jobs.values()) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        named = {name: jobs[job_id] for name, job_id in by_name.items()}
        assert len(jobs) == len(ids) == len(docs) - 1 + 30
        assert [j for j in jobs.values() if j["state"] not in FINAL] == []
        assert (named["bad"]["state"], named["never"]["state"], named["cleanup"]["state"]) == \
            ("FAILED", "FAILED", "SUCCEEDED")
        assert named["never"]["reason"] == \
            f"dependency job {by_name['bad']} ended FAILED; this job needed it to succeed"
        fine = [j for name, j in named.items() if name not in ("bad", "never")]
        fine += [j for j in jobs.values() if j["arrayId"] is not None]
        assert [(j["name"], j["state"], j["reason"]) for j in fine if j["state"] != "SUCCEEDED"] == []
        for n in range(1, 8):
            assert named[f"c{n - 1}"]["finishedAt"] <= named[f"c{n}"]["startedAt"]
        assert max(named["left"]["finishedAt"], named["right"]["finishedAt"]) <= named["bottom"]["startedAt"]
        elements = [j for j in jobs.values() if j["arrayId"] is not None]
        assert max(j["finishedAt"] for j in elements) <= named["reduce"]["startedAt"]
        ledgers = list((data / "sim").glob("*.ledger"))
        assert ledgers and sum(ledger_duplicates(p) for p in ledgers) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except Exception:
                os.killpg(proc.pid, signal.SIGKILL)
        _stop_postgres(data)
