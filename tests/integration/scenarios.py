"""What the scenario tests share: objects as YAML, job documents, polling, and (in conftest.py) the
`sluice` fixture that starts an Embedded dispatcher with sim agents on given objects.

Pod durations are scaled by TIME_SCALE (a "30s" pod runs 3 s); policy times (reservationAfter, burst
after) are not.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy.orm import sessionmaker

from dispatcher.services import administering
from dispatcher.store import database

TIME_SCALE = 0.1
ACTIVE = ("DISPATCHED", "RUNNING")
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")

CLASSES = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500}
---
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: batch}
spec: {priority: 100, preemptible: true}
---
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: critical}
spec: {priority: 1000, canPreempt: true}
"""


def cluster(name: str, cpu: int, nodes: int = 1, *, tier: str = "onprem", site: str = "dc-1", **spec) -> str:
    """A simulated cluster of `nodes` nodes of `cpu` cores and 64Gi; more spec fields (price, elastic) as given."""
    extra = "".join(f"\n  {k}: {json.dumps(v)}" for k, v in spec.items())
    return f"""
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {{name: {name}}}
spec:
  tier: {tier}
  site: {site}
  simulated: {{nodes: {nodes}, node: {{cpu: "{cpu}", memory: 64Gi}}}}{extra}
"""


def queue(name: str, **spec) -> str:
    return f"""
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {{name: {name}}}
spec: {json.dumps(spec)}
"""


def job(queue_name: str, cpu: str, duration: str, *, name: str = "j", service_class: str | None = None,
        **more) -> dict:
    spec: dict = {"queue": queue_name, **more}
    if service_class:
        spec["serviceClass"] = service_class
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {**spec, "podSets": [{"name": "w", "count": 1, "template": {
                "metadata": {"annotations": {"sluice.io/sim-duration": duration}},
                "spec": {"containers": [{"name": "m", "image": "x",
                                         "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}}}]}}


def ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def wait_for(check, timeout: float, what: str, interval: float = 0.02):
    """Poll `check` until it returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:g}s (last: {last!r})")


def by_id(client, queue_name: str) -> dict[int, dict]:
    return {j["id"]: j for j in client.list(queue=queue_name)}


def wait_final(client, ids, timeout: float = 30.0) -> list[dict]:
    final: dict[int, dict] = {}  # a final state is for good: each job is asked until it is in one, not after

    def check():
        for i in ids:
            if i not in final:
                job = client.get(i)
                if job["state"] not in FINAL:
                    return None  # the ones after it are asked next time: a round costs what changed
                final[i] = job
        return [final[i] for i in ids]
    try:
        return wait_for(check, timeout, "jobs final", 0.05)
    except AssertionError:
        raise AssertionError(f"not final in {timeout}s: "
                             f"{[(j['id'], j['state'], j['reason']) for j in (client.get(i) for i in ids)]}") from None


@contextmanager
def store_with(db_url: str, objects: list):
    """Sessions on the test's database (a pool of two) once these objects are applied; closed at the end."""
    db = database.connect(database.DatabaseSettings(url=db_url, pool_size=2, pool_overflow=0))
    try:
        made = sessionmaker(db.engine, expire_on_commit=False)
        with made.begin() as session:
            administering.apply(session, "test", objects)
        yield made
    finally:
        db.close()
