"""Figures, the issue's targets, and docs/performance.md: each run rewrites the current figures in place.

The "Current figures" table holds one row per figure: a run replaces the rows of the figures it
measured and keeps the others. "The runs behind these figures" holds one entry per run that still has
a row (the machine, the Postgres settings and every benchmark's exact configuration).
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "performance.md"
TABLE_HEADING = "## Current figures"
TABLE_HEAD = ("| date | benchmark | figure | value | target | verdict (measured / target) | command |\n"
              "| --- | --- | --- | --- | --- | --- | --- |\n")
RUNS_HEADING = "## The runs behind these figures"


@dataclass(frozen=True)
class Target:
    op: str  # ">=" (at least) or "<=" (at most)
    value: float

    def verdict(self, measured: float) -> str:
        met = measured >= self.value if self.op == ">=" else measured <= self.value
        if not self.value:  # a target of none (jobs lost): no ratio to show
            return "met" if met else "missed"
        return f"{'met' if met else 'missed'} ({measured / self.value:.2f}x)"


@dataclass
class Figure:
    benchmark: str
    name: str
    value: float
    unit: str
    target: Target | None = None
    note: str = ""  # shown after the value: what it is measured over

    def shown_value(self) -> str:
        v = self.value
        text = f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.3g}" if abs(v) < 10 else f"{v:,.1f}"
        return f"{text} {self.unit}".strip() + (f" ({self.note})" if self.note else "")

    def shown_target(self) -> str:
        if self.target is None:
            return "-"
        v = self.target.value
        return f"{self.target.op} {v:,.0f} {self.unit}".replace(">=", "≥").replace("<=", "≤").strip() \
            if abs(v) >= 10 else f"{self.target.op} {v:g} {self.unit}".replace(">=", "≥").replace("<=", "≤")

    def verdict(self) -> str:
        return self.target.verdict(self.value) if self.target else "-"


@dataclass
class Run:
    command: str
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    figures: list[Figure] = field(default_factory=list)
    configs: dict[str, dict] = field(default_factory=dict)  # per benchmark, its exact configuration
    notes: list[str] = field(default_factory=list)  # what did not run, and why
    load: dict[str, str] = field(default_factory=dict)  # 1-minute load average as each benchmark started
    # The machine during each benchmark: the share of its CPU time the hypervisor took (steal), and how
    # long a fixed piece of Python took as it started and as it ended (`cpu_probe_ms`). On a shared
    # virtual machine the same code's figures move with both.
    steal: dict[str, str] = field(default_factory=dict)
    probe: dict[str, str] = field(default_factory=dict)
    _part: tuple[str, tuple[int, int], float] | None = None

    def part(self, title: str | None) -> None:
        """A benchmark starts (None: the last one ended): print and keep what the machine did in the one before."""
        probe, now = cpu_probe_ms(), cpu_times()
        if self._part is not None:
            name, (total, stolen), began = self._part
            self.probe[name] = f"{began:.0f} -> {probe:.0f} ms"
            if now[0] > total:
                self.steal[name] = f"{(now[1] - stolen) / (now[0] - total):.0%}"
            print(f"  the machine during {name}: CPU time stolen {self.steal.get(name, '?')}, "
                  f"probe {self.probe[name]}", flush=True)
        self._part = (title, now, probe) if title is not None else None

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        print(f"  {figure.name}: {figure.shown_value()}"
              + (f"   target {figure.shown_target()}: {figure.verdict()}" if figure.target else ""), flush=True)
        return figure


def cpu_times() -> tuple[int, int]:
    """(all, stolen) CPU time of the machine since boot, in clock ticks, from /proc/stat; (0, 0) without it."""
    try:
        ticks = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return 0, 0
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    return sum(ticks), ticks[7] if len(ticks) > 7 else 0


PROBE = "a loop of 1,000,000 integer steps in Python, best of 3"


def cpu_probe_ms() -> float:
    """How long PROBE takes now, in ms: this machine's speed at the moment, which moves even with no steal shown."""
    def once() -> float:
        began, total = time.perf_counter(), 0
        for i in range(1_000_000):
            total += i * i % 7
        return time.perf_counter() - began
    return min(once() for _ in range(3)) * 1000


def machine() -> dict:
    """The machine, and the commit of the code that was measured (this checkout's, with a flag when its
    dispatcher/, agent/ or sluice/ differ from it)."""
    code = pathlib.Path(__file__).resolve().parent.parent
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=code).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "dispatcher", "agent", "sluice"],
                           capture_output=True, text=True, cwd=code).stdout.strip()
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "commit": commit + (" (with uncommitted changes under dispatcher/, agent/ or sluice/)" if dirty else "")}


def _section(text: str, heading: str) -> tuple[int, int]:
    """Where the section under `heading` starts (at the heading) and ends (at the next `## ` or the end)."""
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return start, len(text) if end < 0 else end + 1


def _row_key(row: str) -> tuple[str, str]:
    """A table row's (benchmark, figure): the one figure it shows."""
    cells = row.split(" | ")
    return cells[1].strip(), cells[2].strip()


def _run_date(row: str) -> str:
    return row.split(" | ")[0].lstrip("| ").strip()


def record(run: Run, *, postgres: dict, doc: pathlib.Path = DOC) -> None:
    """Replace, in the Current figures table, the row of each figure the run measured (adding the new ones
    after their benchmark's rows), and leave in "The runs behind these figures" the entries of the runs
    that still have a row, this one's included."""
    date = run.started.strftime("%Y-%m-%d %H:%M UTC")
    text = doc.read_text()
    text += "" if text.endswith("\n") else "\n"
    if TABLE_HEADING not in text:
        text = text.rstrip("\n") + (f"\n\n{TABLE_HEADING}\n\nWritten by `python -m bench`: one row per figure; "
                                    "the verdict's ratio is measured / target.\n\n" + TABLE_HEAD)
    start, _ = _section(text, TABLE_HEADING)
    head = text.index(TABLE_HEAD, start) + len(TABLE_HEAD)
    end = head
    while text.startswith("|", end):
        end = text.index("\n", end) + 1
    rows = text[head:end].splitlines(keepends=True)
    for f in run.figures:
        row = (f"| {date} | {f.benchmark} | {f.name} | {f.shown_value()} | {f.shown_target()} | {f.verdict()} "
               f"| `{run.command}` |\n")
        keys = [_row_key(r) for r in rows]
        if (f.benchmark, f.name) in keys:
            rows[keys.index((f.benchmark, f.name))] = row
        else:
            same = [n for n, (benchmark, _) in enumerate(keys) if benchmark == f.benchmark]
            rows.insert(same[-1] + 1 if same else len(rows), row)
    text = text[:head] + "".join(rows) + text[end:]

    entry = [f"### {date}: `{run.command}`", "",
             f"- machine: {json.dumps(machine())}", f"- postgres: {json.dumps(postgres)}",
             f"- load average (1 min) as each part started: {json.dumps(run.load)}",
             f"- CPU time stolen by the hypervisor during each part (/proc/stat): {json.dumps(run.steal)}",
             f"- {PROBE}, as each part started and ended: {json.dumps(run.probe)}"]
    entry += [f"- {name}: {json.dumps(config)}" for name, config in run.configs.items()]
    entry += [f"- not run / limits: {note}" for note in run.notes]
    if RUNS_HEADING not in text:
        _, table_end = _section(text, TABLE_HEADING)
        text = (text[:table_end].rstrip("\n") + f"\n\n{RUNS_HEADING}\n\nWritten by `python -m bench`: the "
                "configuration of each run that has a row above.\n\n" + text[table_end:].lstrip("\n"))
        if not text.endswith("\n"):
            text += "\n"
    start, end = _section(text, RUNS_HEADING)
    intro, *entries = text[start:end].split("\n### ")
    dates = {_run_date(r) for r in rows}
    kept = ["### " + e.rstrip("\n") for e in entries if e.split(": `", 1)[0] in dates - {date}]
    if date in dates:
        kept.append("\n".join(entry))
    text = (text[:start] + intro.rstrip("\n") + "\n\n" + "\n\n".join(kept) + "\n"
            + ("\n" if end < len(text) else "") + text[end:])
    doc.write_text(text)
