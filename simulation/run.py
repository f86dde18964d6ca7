"""One `sluice simulate` run: a trace replayed under each policy asked for, on one scenario, with the figures
each replay gives (report.py) and what the mapping was."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from simulation import POLICIES, report
from simulation.engine import Replayed, replay
from simulation.scenario import Scenario, scenario, sim_jobs
from simulation.world import UNRUNNABLE
from sluice.objects import AdminObject


@dataclass
class Simulation:
    trace: dict  # what was replayed (report.render_table's trace_info)
    scenario: Scenario
    figures: dict[str, dict]  # per policy, report.policy_figures and what the replay adds
    outcomes: dict[str, list[report.JobOutcome]]
    replays: dict[str, Replayed]


def outcomes_of(replayed: Replayed) -> list[report.JobOutcome]:
    """Each job as the report reads it: arrived when it was queued (its submit, or the end of its holds)."""
    return [report.JobOutcome(j.trace_id, j.queue, j.submit if j.eligible is None else j.eligible, j.first_start,
                              j.finished, j.run_s, j.requests, j.cluster, j.preemptions,
                              j.reason if j.state == UNRUNNABLE else None, tuple(j.runs), j.held_by,
                              0.0 if j.eligible is None else j.eligible - j.submit)
            for j in replayed.jobs]


def simulate(trace, objects: list[AdminObject] | None, policies: list[str], *,
             progress: Callable[[str, int, int], None] | None = None,
             checkpoint_s: float | None = None, exact_runtimes: bool = False) -> Simulation:
    """Replay `trace` (traces.read_trace) under each of `policies` (engine.POLICIES) on `objects` (None:
    the mapping built from the trace). progress(policy, jobs done, jobs) is called as the replays go, and with
    every job done when a replay ends (the jobs that never ran are settled then too).
    checkpoint_s: the trace's jobs save their progress this often, so an evicted job loses only what ran
    since its last checkpoint (None: an evicted job starts again from scratch). exact_runtimes: every policy
    is told each job's run time as its requested time (perfect estimates), not what the trace requested."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}: one of {', '.join(POLICIES)}")
    scene = scenario(trace, objects)
    entitled = scene.entitled()
    figures, outcomes, replays = {}, {}, {}
    for name in dict.fromkeys(policies):
        jobs = sim_jobs(trace, scene, checkpoint_s, exact_runtimes)
        started = time.perf_counter()
        done = None if progress is None else (lambda n, name=name, total=len(jobs): progress(name, n, total))
        replayed = replay(jobs, list(scene.clusters), scene.policy, name, progress=done)
        seconds = time.perf_counter() - started
        if progress is not None:
            progress(name, len(jobs), len(jobs))
        outcomes[name] = outcomes_of(replayed)
        found = report.policy_figures(outcomes[name], capacity=scene.capacity, entitled=entitled, busy=replayed.busy,
                                      capacity_over_time=replayed.capacity)
        windows = report.window_shares(outcomes[name], capacity=scene.capacity, entitled=entitled)
        found.update(reservations=replayed.reservations, burstSpend=round(replayed.burst_spend, 2),
                     fairShareViolations=sum(v["windows"] for v in report.fair_share_violations(windows)),
                     fairShareJudged=sum(w["windows"] for w in windows for q in w["queues"].values()
                                         if q["share"] is not None and q["attainableShare"] and q["waitingAnyTime"]),
                     cycles=replayed.cycles, replaySeconds=round(seconds, 2))
        figures[name], replays[name] = found, replayed
    info = {"name": trace.name, "format": trace.format, "jobs": len(trace.jobs), "skippedLines": trace.skipped,
            "droppedJobs": trace.dropped, "mapping": "built from the trace" if scene.built else "config",
            "clusters": {c.name: {**c.to_document()["spec"]["simulated"],
                                  **({"maxNodes": c.elastic["maxNodes"]} if c.elastic else {})}
                         for c in scene.clusters},
            "queues": len(scene.policy.quotas),
            "requestedTimes": sum(1 for j in trace.jobs if j.requested_s)}  # the jobs whose run time a policy may know
    if exact_runtimes:
        info["exactRuntimes"] = True
    if checkpoint_s:
        info["checkpointInterval"] = checkpoint_s
    if getattr(trace, "window", None):
        info["window"] = list(trace.window)
    return Simulation(info, scene, figures, outcomes, replays)
