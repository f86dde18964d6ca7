"""`sluice demo`: the whole system on a mixed workload, with a summary that says whether it worked.

The workload is more than the on-premises cluster holds (so, after waiting BURST_AFTER_S, the overflow
bursts to the priced cloud cluster under the default burst policy and its budgets), has jobs pinned to
the edge site and GPU jobs only on-premises can run, and a few jobs meant to fail. The demo passes when
every job ends as intended, none is lost and no (job, attempt) created pods twice.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import random
import shutil
import sys
import tempfile
import time

from agent.backends.sim.ledger import ledger_duplicates
from devstack.embedded import Embedded, UpSettings
from sluice.client import Client
from sluice.objects import ServiceClassObject, default_objects

FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
BURST_AFTER_S = 2.0  # a demo is short: standard jobs may burst after 2 s, not the default 10 minutes


def demo_objects() -> list:
    """The defaults of `sluice up`, with the standard class bursting after BURST_AFTER_S."""
    return [dataclasses.replace(o, burst_after_s=BURST_AFTER_S)
            if isinstance(o, ServiceClassObject) and o.name == "standard" else o for o in default_objects()]


def _job(n: int, rng: random.Random) -> tuple[dict, str]:
    """One job document and the state it is meant to end in."""
    kind = rng.choices(["cpu", "gpu", "edge", "fail"], weights=[70, 12, 12, 6])[0]
    cpu = {"cpu": str(rng.choice([2, 4, 8])), "memory": f"{rng.choice([4, 8, 16])}Gi"}
    annotations = {"sluice.io/sim-duration": f"{rng.uniform(0.5, 2.0):.2f}s"}
    spec: dict = {"queue": "default", "priority": rng.randint(0, 10), "maxRetries": 0 if kind == "fail" else 2}
    if kind == "gpu":
        cpu["nvidia.com/gpu"] = str(rng.choice([1, 2]))
    if kind == "edge":
        spec["placement"] = {"sites": ["edge-1"]}
        cpu = {"cpu": "2", "memory": "4Gi"}
    if kind == "fail":
        annotations["sluice.io/sim-exit-code"] = "3"
    spec["podSets"] = [{"name": "worker", "count": rng.choice([1, 1, 2, 3]), "template": {
        "metadata": {"annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "demo/work:1", "resources": {"requests": cpu}}]}}}]
    doc = {"apiVersion": "sluice.io/v1", "kind": "Job",
           "metadata": {"name": f"demo-{kind}-{n}", "labels": {"demo": kind}}, "spec": spec}
    return doc, "FAILED" if kind == "fail" else "SUCCEEDED"


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def _seconds(a: str | None, b: str | None) -> float | None:
    from datetime import datetime
    if not a or not b:
        return None
    def parse(s):
        return datetime.fromisoformat(s.replace("Z", "+00:00"))
    return (parse(b) - parse(a)).total_seconds()


def _progress(jobs: list[dict], elapsed: float) -> list[str]:
    """The live table: one row per cluster (jobs active there, ended there), then the totals."""
    states = ("QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED", "FAILED")
    rows: dict[str, dict[str, int]] = {}
    total = {s: 0 for s in states}
    for j in jobs:
        total[j["state"]] = total.get(j["state"], 0) + 1
        if j["cluster"]:
            row = rows.setdefault(j["cluster"], {s: 0 for s in states})
            row[j["state"]] = row.get(j["state"], 0) + 1
    head = f"{'cluster':<10}" + "".join(f"{s.lower():>12}" for s in states)
    lines = [f"{elapsed:6.1f}s", head]
    lines += [f"{name:<10}" + "".join(f"{row[s] if s != 'QUEUED' else '':>12}" for s in states)
              for name, row in sorted(rows.items())]
    lines.append(f"{'all':<10}" + "".join(f"{total[s]:>12}" for s in states))
    return lines


def run_demo(*, jobs: int = 200, data_dir: pathlib.Path | None = None, json_out: bool = False,
             timeout_s: float = 600.0, seed: int = 7) -> bool:
    data = data_dir or pathlib.Path(tempfile.mkdtemp(prefix="sluice-demo-"))
    embedded = Embedded(UpSettings(data_dir=data, listen="127.0.0.1:0", make_default=False,
                                   throwaway=data_dir is None), demo_objects()).start()
    live = sys.stderr.isatty() and not json_out
    try:
        embedded.wait_connected()
        rng = random.Random(seed)
        workload = [_job(n, rng) for n in range(jobs)]
        client = Client(embedded.client_settings())
        started = time.monotonic()
        ids = client.submit([doc for doc, _ in workload])
        intended = {job_id: want for job_id, (_, want) in zip(ids, workload)}
        deadline = started + timeout_s
        shown = 0
        while True:
            listed = client.list(limit=0)
            mine = [j for j in listed if j["id"] in intended]
            if live:
                lines = _progress(mine, time.monotonic() - started)
                up = f"\x1b[{shown}F" if shown else ""  # back to the table's first line, then redraw it
                print(up + "\n".join(line + "\x1b[K" for line in lines), file=sys.stderr, flush=True)
                shown = len(lines)
            if all(j["state"] in FINAL for j in mine) or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        elapsed = time.monotonic() - started
        burst = [b for b in client.usage(since_s=0)["burst"] if b["queue"] is None]
        client.close()
        duplicated = sum(ledger_duplicates(p) for p in (data / "sim").glob("*.ledger"))
    finally:
        embedded.stop()
        if data_dir is None:
            shutil.rmtree(data, ignore_errors=True)
    by_state: dict[str, int] = {}
    by_cluster: dict[str, int] = {}
    for j in mine:
        by_state[j["state"]] = by_state.get(j["state"], 0) + 1
        if j["cluster"]:
            by_cluster[j["cluster"]] = by_cluster.get(j["cluster"], 0) + 1
    latency = [s for j in mine if (s := _seconds(j["createdAt"], j["startedAt"])) is not None]
    lost = len(intended) - len([j for j in mine if j["state"] in FINAL])
    wrong = [j for j in mine if j["state"] != intended[j["id"]]]
    summary = {"jobs": len(intended), "succeeded": by_state.get("SUCCEEDED", 0), "failed": by_state.get("FAILED", 0),
               "cancelled": by_state.get("CANCELLED", 0), "lost": lost, "duplicated": duplicated,
               "byCluster": dict(sorted(by_cluster.items())), "byState": dict(sorted(by_state.items())),
               "submitToStartSeconds": {"p50": _percentile(latency, 0.5), "p99": _percentile(latency, 0.99)},
               "elapsedSeconds": round(elapsed, 2), "unintended": len(wrong),
               "burst": {"attempts": sum(b["attempts"] for b in burst),
                         "spend": round(sum(b["spentInWindow"] for b in burst), 4)}}
    ok = not wrong and lost == 0 and duplicated == 0
    if json_out:
        print(json.dumps(summary))
    else:
        _print_summary(summary, wrong, ok)
    return ok


def _print_summary(summary: dict, wrong: list[dict], ok: bool) -> None:
    print(f"{summary['jobs']} jobs in {summary['elapsedSeconds']}s: {summary['succeeded']} succeeded, "
          f"{summary['failed']} failed "
          f"(as intended: {summary['failed'] - sum(1 for j in wrong if j['state'] == 'FAILED')}), "
          f"lost {summary['lost']}, duplicated {summary['duplicated']}")
    print("by cluster: " + ", ".join(f"{c} {n}" for c, n in summary["byCluster"].items()))
    lat = summary["submitToStartSeconds"]
    print(f"submit->start: p50 {lat['p50']}s, p99 {lat['p99']}s")
    print(f"burst: {summary['burst']['attempts']} attempts to paid clusters, spend {summary['burst']['spend']:.4f}")
    for j in wrong[:10]:
        print(f"  unintended: job {j['id']} {j['name']} ended {j['state']}: {j['reason']}")
    print("demo passed" if ok else "demo FAILED")
