"""A replayable trace as a file, and run for real: `sluice up` as `--config` would start it (an Embedded
dispatcher on real Postgres, one in-process sim agent per cluster over real gRPC, durations unscaled), for
the fidelity tests that compare `sluice simulate` with it."""
from __future__ import annotations

import threading
import time
from datetime import datetime

import yaml

from simulation.traces import Trace, read_trace
from sluice.objects import ClusterObject

LEAD_S = 1.0  # the first submit comes this long after the clock's zero is taken
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def trace_file(docs: list[dict], path) -> Trace:
    """The job documents written as a Sluice job file at `path`, read back as `sluice simulate` reads it."""
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return read_trace(path, "sluice")


def run_for_real(docs: list[dict], objects, db_url, data_dir) -> tuple[dict[str, tuple[float, str]], float]:
    """Each of the trace's job documents (with submitAt and runFor) submitted at its submitAt on the wall clock,
    those of one moment in one request (committed at once, as they arrive at once); once every job has
    ended: name -> (start, cluster), seconds after the trace's time 0 (the agent's report of its pods
    running), and the run's length. Every job must succeed."""
    from devstack.embedded import Embedded, UpSettings
    from sluice.client import Client

    # A cluster with nodes to begin with is ready once its capacity is in; an elastic one may have none yet.
    starting = {o.name for o in objects if isinstance(o, ClusterObject) and o.simulated and o.simulated.nodes}
    embedded = Embedded(UpSettings(data_dir=data_dir, listen="127.0.0.1:0", make_default=False,
                                   database_url=db_url), objects).start()
    try:
        embedded.wait_connected()
        with Client(embedded.client_settings(timeout_s=30)) as client:
            deadline = time.monotonic() + 15
            while not all(c["state"] == "active" and (c["allocatable"] or c["name"] not in starting)
                          for c in client.clusters()):
                assert time.monotonic() < deadline, f"clusters not active: {client.clusters()}"
                time.sleep(0.05)
            moments: dict[float, list[dict]] = {}
            for doc in docs:
                job = {k: v for k, v in doc.items() if k not in ("submitAt", "runFor")}
                moments.setdefault(doc["submitAt"], []).append(job)
            zero_wall, zero = time.time() + LEAD_S, time.monotonic() + LEAD_S
            errors: list[BaseException] = []

            def submit_all():
                try:
                    for at, jobs in sorted(moments.items()):
                        time.sleep(max(0.0, zero + at - time.monotonic()))
                        client.submit(jobs)
                except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                    errors.append(exc)

            submitter = threading.Thread(target=submit_all, daemon=True)
            submitter.start()
            submitter.join(timeout=max(moments) + 30)
            assert not errors, errors
            deadline = time.monotonic() + 30
            while True:
                jobs = client.list()
                if len(jobs) == len(docs) and all(j["state"] in FINAL for j in jobs):
                    break
                assert time.monotonic() < deadline, \
                    f"not all ended: {[(j['name'], j['state'], j['reason']) for j in jobs if j['state'] not in FINAL]}"
                time.sleep(0.2)
            took = time.monotonic() - zero
    finally:
        embedded.stop()
    assert all(j["state"] == "SUCCEEDED" for j in jobs), [(j["name"], j["state"], j["reason"]) for j in jobs]

    def offset(stamp: str) -> float:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - zero_wall
    return {j["name"]: (offset(j["startedAt"]), j["cluster"]) for j in jobs}, took
