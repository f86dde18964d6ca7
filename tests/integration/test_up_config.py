"""`sluice up --config FILE` applies FILE on the first start of a data dir, and again only when FILE changed:
what admins changed since survives a restart, and the summary says which it was."""
from __future__ import annotations

import yaml

from devstack.embedded import Embedded, UpSettings, summary_line
from dispatcher.services import administering
from sluice.objects import load_objects

CONFIG = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: default}
spec: {serviceClasses: [standard]}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: solo}
spec:
  tier: onprem
  site: dc-1
  simulated: {nodes: 1, node: {cpu: "4", memory: 8Gi}}
"""
EXTRA = """
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: extra}
spec: {serviceClasses: [standard]}
"""


def start(db_url, tmp_path, text: str) -> Embedded:
    return Embedded(UpSettings(data_dir=tmp_path / "data", listen="127.0.0.1:0", make_default=False,
                               database_url=db_url), load_objects(text)).start()


def queues(embedded: Embedded) -> dict[str, dict]:
    with embedded.dispatcher.sessions() as session:
        return {d["metadata"]["name"]: d["spec"] for d in administering.get(session, "Queue")}


def test_config_applied_on_first_start_and_when_changed_only(db_url, tmp_path):
    first = start(db_url, tmp_path, CONFIG)
    try:
        assert "default" in queues(first)
        said = [summary_line(first)]
        with first.dispatcher.sessions.begin() as session:  # an admin's change, after the file was applied
            administering.set_quota(session, "ops", "default", {"cpu": "2"}, {})
    finally:
        first.stop()

    again = start(db_url, tmp_path, CONFIG)
    try:
        assert queues(again)["default"]["guaranteed"] == {"cpu": "2"}, "the unchanged file reverted an admin's change"
        said.append(summary_line(again))
    finally:
        again.stop()

    changed = start(db_url, tmp_path, CONFIG + EXTRA)
    try:
        found = queues(changed)
        assert "extra" in found
        assert not found["default"].get("guaranteed"), "a changed file is applied whole"
        said.append(summary_line(changed))
    finally:
        changed.stop()
    shown = [yaml.safe_load(summary)["config"] for summary in said]
    assert shown[0] == "applied", shown
    assert shown[1].startswith("not applied: unchanged since it was last applied here"), shown
    assert shown[2] == "applied (changed since it was last applied here)", shown


def test_config_applied_to_a_database_it_was_not_applied_to(db_url, pg_server, tmp_path):
    from tests.conftest import _new_database
    start(db_url, tmp_path, CONFIG).stop()
    other = start(_new_database(pg_server, "sluice_template"), tmp_path, CONFIG)  # same data dir, another database
    try:
        assert "default" in queues(other)
        assert yaml.safe_load(summary_line(other))["config"] == "applied"
    finally:
        other.stop()
