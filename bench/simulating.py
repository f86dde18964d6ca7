"""`sluice simulate`'s speed: whole public traces replayed through the production cycle (policy sluice).

The traces are read from ../shared/traces (never copied in); a trace that is not there is noted and
skipped. The figure is the replay's wall time, reading the trace included.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from bench.figures import Figure, Run, Target
from simulation.run import simulate
from simulation.traces import read_trace
from tests.shared_traces import SHARED_TRACES


@dataclass(frozen=True)
class SimulateConfig:
    philly_jobs: int | None = None  # None: the whole trace (82,247 jobs)
    swf_jobs: int = 200_000  # of HPC2N's 202,871
    philly_checkpoint_s: float = 1800.0  # Philly's training jobs checkpoint, as docs/simulate.md replays them

    @classmethod
    def quick(cls) -> SimulateConfig:
        return cls(philly_jobs=5_000, swf_jobs=5_000)


TARGETS = {"philly": Target("<=", 60.0), "swf": Target("<=", 180.0)}
TARGET_JOBS = {"philly": 82_247, "swf": 200_000}
QUALITY = ("meanWaitSeconds", "meanCompletionSeconds", "boundedSlowdown", "utilization", "fairShareViolations",
           "fairShareJudged")  # printed beside the time, for docs/simulate.md


def run(config: SimulateConfig, out: Run) -> None:
    out.configs["simulate"] = {**asdict(config), "policy": "sluice", "mapping": "built from the trace",
                               "traces": "the public traces beside the repository (tests/shared_traces.py)"}
    for key, name, jobs, checkpoint_s in (("philly", "philly-2017.csv", config.philly_jobs, config.philly_checkpoint_s),
                                          ("swf", "HPC2N-2002-2.2-cln.swf.gz", config.swf_jobs, None)):
        path = SHARED_TRACES / name
        if not path.exists():
            out.notes.append(f"simulate: {path} is not there; not measured")
            continue
        began = time.perf_counter()
        trace = read_trace(path, window=None if jobs is None else (0, jobs))
        result = simulate(trace, None, ["sluice"], checkpoint_s=checkpoint_s)
        seconds = time.perf_counter() - began
        figures = result.figures["sluice"]
        print(f"  {name}: " + ", ".join(f"{k} {figures[k]:,.3f}" for k in QUALITY), flush=True)
        whole = len(trace.jobs) >= TARGET_JOBS[key]  # the targets are for whole traces
        out.add(Figure("simulate", f"replay of {name}, {len(trace.jobs):,} jobs, policy sluice", seconds, "s",
                       TARGETS[key] if whole else None,
                       note=f"{figures['cycles']:,} cycles, {len(trace.jobs) / seconds:,.0f} jobs/s"))
