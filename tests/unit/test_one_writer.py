"""One write path: dispatcher/store/lifecycle.py is the only code that writes a job's state or its job
events, and statements name job states through policy/states.py, never as literals of their own.

Read as text over every product module, so a new writer anywhere (a statement, an ORM insert, a COPY)
fails here before review."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRODUCT = ("dispatcher", "agent", "sluice", "devstack")
LIFECYCLE = ROOT / "dispatcher" / "store" / "lifecycle.py"
CODEC = ROOT / "dispatcher" / "store" / "copy_codec.py"  # encodes the rows lifecycle.py copies in

WRITES = {
    "an insert of job events": re.compile(r"INSERT\s+INTO\s+job_events|COPY\s+job_events|"
                                          r"(?<!class )(?<![\w.])JobEvent\(", re.I),
    "a write of a job's state": re.compile(r"UPDATE\s+jobs\s+SET\s+state|update\(Job\)|INSERT\s+INTO\s+jobs\b|"
                                           r"COPY\s+jobs\b", re.I),
}
JOB_STATE_LITERAL = re.compile(r"'(QUEUED|DISPATCHED|RUNNING|SUCCEEDED|FAILED|CANCELLED|LOST|UNSCHEDULABLE|"
                               r"PREEMPTED)'")


def _product_files():
    for package in PRODUCT:
        base = ROOT / package
        if base.is_dir():
            yield from (p for p in sorted(base.rglob("*.py")) if "_pb2" not in p.name)


def test_only_the_lifecycle_module_writes_job_state_and_events():
    found = {what: [] for what in WRITES}
    for path in _product_files():
        text = path.read_text()
        for what, pattern in WRITES.items():
            if pattern.search(text) and path != LIFECYCLE:
                found[what].append(str(path.relative_to(ROOT)))
    assert found == {what: [] for what in WRITES}


def test_the_lifecycle_module_does_write_them():
    """The patterns above still match the real statements (a test that matches nothing proves nothing)."""
    text = LIFECYCLE.read_text()
    assert all(pattern.search(text) for pattern in WRITES.values())


def test_store_statements_name_job_states_through_the_state_table():
    """State names in SQL come from policy/states.py (f-strings, store.models.sql_strings), so the
    transition table stays the one authority; models.py mirrors the migrations' index predicates."""
    offenders = []
    for path in sorted((ROOT / "dispatcher" / "store").glob("*.py")):
        if path.name == "models.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if JOB_STATE_LITERAL.search(line):
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert offenders == []
