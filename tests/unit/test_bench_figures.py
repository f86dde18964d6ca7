"""`python -m bench` records into docs/performance.md by replacing rows in place, never by appending.

Recording runs on a temp copy of the real doc, with a Run built by hand (no benchmark runs).
"""
from __future__ import annotations

import shutil
from datetime import UTC, datetime

import pytest

from bench import figures

POSTGRES = {"server_version": "16.2", "shared_buffers": "2GB"}


def table_rows(text: str) -> list[str]:
    head = text.index(figures.TABLE_HEAD, text.index(figures.TABLE_HEADING)) + len(figures.TABLE_HEAD)
    rows = []
    for line in text[head:].splitlines():
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def key(row: str) -> tuple[str, str]:
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    return cells[1], cells[2]


def runs_section(text: str) -> str:
    start = text.index(figures.RUNS_HEADING)
    end = text.find("\n## ", start)
    return text[start:] if end < 0 else text[start:end]


def run_at(minute: int, figs: list[figures.Figure], command: str = "python -m bench submit") -> figures.Run:
    run = figures.Run(command, started=datetime(2030, 1, 2, 3, minute, tzinfo=UTC))
    run.figures.extend(figs)
    run.configs["submit"] = {"clients": 8, "batch": 1000}
    run.load = {"submit": "0.5"}
    return run


@pytest.fixture
def doc(tmp_path):
    copy = tmp_path / "performance.md"
    shutil.copy(figures.DOC, copy)
    return copy


def test_the_doc_has_one_row_per_figure_and_an_entry_for_each_run_named():
    text = figures.DOC.read_text()
    rows = table_rows(text)
    assert rows and len({key(r) for r in rows}) == len(rows)
    dates = {r.strip("|").split(" | ")[0].strip() for r in rows}
    for date in dates:
        assert f"### {date}: `" in runs_section(text)


def test_a_measured_figure_replaces_its_row_and_a_new_one_follows_its_benchmark(doc):
    before = doc.read_text()
    old_rows = table_rows(before)
    replaced = next(r for r in old_rows if key(r) == ("submit", "submit, 1,000-job calls, 8 clients"))
    figs = [figures.Figure("submit", "submit, 1,000-job calls, 8 clients", 54_321, "jobs/s",
                           figures.Target(">=", 20_000), note="a fake run"),
            figures.Figure("submit", "a figure the doc has not seen", 7, "x")]
    figures.record(run_at(4, figs), postgres=POSTGRES, doc=doc)
    after = doc.read_text()
    rows = table_rows(after)

    assert len(rows) == len(old_rows) + 1  # one replaced, one added: nothing appended twice
    assert [key(r) for r in rows if key(r)[1] != "a figure the doc has not seen"] == [key(r) for r in old_rows]
    new = rows[[key(r) for r in rows].index(("submit", "submit, 1,000-job calls, 8 clients"))]
    assert new.startswith("| 2030-01-02 03:04 UTC | submit |") and "54,321 jobs/s (a fake run)" in new
    assert "met (2.72x)" in new and "`python -m bench submit`" in new
    assert replaced not in after
    added = [key(r) for r in rows].index(("submit", "a figure the doc has not seen"))
    assert key(rows[added - 1])[0] == "submit" and key(rows[added + 1])[0] != "submit"
    untouched = [r for r in old_rows if key(r)[0] != "submit"]
    assert all(r in rows for r in untouched)

    runs = runs_section(after)
    assert "### 2030-01-02 03:04 UTC: `python -m bench submit`" in runs
    assert '- submit: {"clients": 8, "batch": 1000}' in runs
    for date in {r.strip("|").split(" | ")[0].strip() for r in old_rows}:  # their rows remain, so their entries
        assert f"### {date}: `" in runs
    # Outside the table and the runs, the doc is as it was.
    assert before[:before.index(figures.TABLE_HEADING)] == after[:after.index(figures.TABLE_HEADING)]
    assert before[before.index("## Issue 23"):] == after[after.index("## Issue 23"):]


def test_a_run_measuring_every_figure_replaces_every_row_and_the_run_configuration(doc):
    old_rows = table_rows(doc.read_text())
    figs = [figures.Figure(benchmark, name, 1.0, "x") for benchmark, name in map(key, old_rows)]
    run = run_at(5, figs, command="python -m bench")
    figures.record(run, postgres=POSTGRES, doc=doc)
    once = doc.read_text()
    rows = table_rows(once)
    assert [key(r) for r in rows] == [key(r) for r in old_rows]
    assert all(r.startswith("| 2030-01-02 03:05 UTC |") for r in rows)
    runs = runs_section(once)
    assert runs.count("\n### ") == 1 and "### 2030-01-02 03:05 UTC: `python -m bench`" in runs

    figures.record(run, postgres=POSTGRES, doc=doc)  # the same run again changes nothing
    assert doc.read_text() == once
