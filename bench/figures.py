"""Figures, the issue's targets, and docs/performance.md: each run appends its rows and its configuration.

The "Latest figures" table gets one dated row per figure (newest last); "Benchmark runs" gets one
entry per run with the machine, the Postgres settings and every benchmark's exact configuration.
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "performance.md"
TABLE_HEADING = "## Latest figures"
TABLE_HEAD = ("| date | benchmark | figure | value | target | verdict (measured / target) | command |\n"
              "| --- | --- | --- | --- | --- | --- | --- |\n")
RUNS_HEADING = "## Benchmark runs"


@dataclass(frozen=True)
class Target:
    op: str  # ">=" (at least) or "<=" (at most)
    value: float

    def verdict(self, measured: float) -> str:
        ratio = measured / self.value if self.value else float("inf")
        met = measured >= self.value if self.op == ">=" else measured <= self.value
        return f"{'met' if met else 'missed'} ({ratio:.2f}x)"


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
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
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
    """How long PROBE takes now, in ms: this machine's speed at the moment. Here it moves by half within
    seconds with no steal shown (159, 171 and 237 ms for 3,000,000 steps, 5 s apart, nothing else running)."""
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


def record(run: Run, *, postgres: dict, doc: pathlib.Path = DOC) -> None:
    """Append the run's rows to the Latest figures table and its configuration to Benchmark runs."""
    date = run.started.strftime("%Y-%m-%d %H:%M UTC")
    text = doc.read_text()
    rows = "".join(f"| {date} | {f.benchmark} | {f.name} | {f.shown_value()} | {f.shown_target()} | {f.verdict()} "
                   f"| `{run.command}` |\n" for f in run.figures)
    if TABLE_HEADING not in text:
        intro_end = text.index("\n## ") + 1 if "\n## " in text else len(text)
        section = (f"{TABLE_HEADING}\n\nWritten by `python -m bench` (bench/): one dated row per figure, newest last; "
                   "each run's exact configuration is under \"Benchmark runs\" below. Targets are the scale issue's "
                   "(issue 7); the verdict's ratio is measured / target.\n\n" + TABLE_HEAD + "\n")
        text = text[:intro_end] + section + text[intro_end:]
    start = text.index(TABLE_HEADING)
    head = text.index(TABLE_HEAD, start) + len(TABLE_HEAD)
    end = head
    while text.startswith("|", end):
        end = text.index("\n", end) + 1
    text = text[:end] + rows + text[end:]
    entry = [f"### {date}: `{run.command}`", "",
             f"- machine: {json.dumps(machine())}", f"- postgres: {json.dumps(postgres)}",
             f"- load average (1 min) as each part started: {json.dumps(run.load)}",
             f"- CPU time stolen by the hypervisor during each part (/proc/stat): {json.dumps(run.steal)}",
             f"- {PROBE}, as each part started and ended: {json.dumps(run.probe)}"]
    entry += [f"- {name}: {json.dumps(config)}" for name, config in run.configs.items()]
    entry += [f"- not run / limits: {note}" for note in run.notes]
    if RUNS_HEADING not in text:
        text = text.rstrip("\n") + f"\n\n{RUNS_HEADING}\n\nThe configuration of every recorded run, newest last.\n"
    text = text.rstrip("\n") + "\n\n" + "\n".join(entry) + "\n"
    doc.write_text(text)
