"""Replays of jobs that wait (simulation/waiting.py): startAfter, dependencies (Sluice job files' dependsOn,
SWF's preceding job and think time) and arrays with a parallelism, released at the virtual moment their holds
end, worked out by hand; bad traces answered with one line naming the document."""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys
import time

import pytest
import yaml
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from simulation.engine import replay
from simulation.run import simulate
from simulation.scenario import scenario, sim_jobs
from simulation.traces import TraceError, read_trace
from sluice.objects import ClusterObject, QueueObject, ServiceClassObject, SimulatedSpec

POLICIES = ["sluice", "fifo", "easy-backfill"]


def objects(cpus: int = 8) -> list:
    return [ServiceClassObject("standard", priority=500), QueueObject("a"),
            ClusterObject("c1", tier="onprem", site="s", simulated=SimulatedSpec(1, {"cpu": cpus * 1000}))]


def doc(name: str | None, submit: float, run: float, *, cpu: int = 1, **spec) -> dict:
    return {"apiVersion": "sluice.io/v1", "kind": "Job", **({"metadata": {"name": name}} if name else {}),
            "spec": {"queue": "a", "podSets": [{"name": "m", "count": 1, "template": {"spec": {"containers": [
                {"name": "m", "image": "i", "resources": {"requests": {"cpu": cpu}}}]}}}], **spec},
            "submitAt": submit, "runFor": run}


def write(tmp_path: pathlib.Path, docs: list[dict], name: str = "jobs.json") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(json.dumps(docs))
    return path


def starts(result, policy: str) -> dict[int, float]:
    return {o.id: o.start_s for o in result.outcomes[policy]}


WORKFLOW = [
    doc("a", 0, 100),                                                         # 1: a chain a -> b -> c
    doc("b", 0, 50, dependsOn=[{"job": "a"}]),                                # 2
    doc("c", 0, 10, dependsOn=[{"job": 2, "condition": "finished"}]),         # 3: by number
    doc("top", 0, 20),                                                        # 4: a diamond
    doc("left", 0, 30, dependsOn=[{"job": "top"}]),                           # 5
    doc("right", 0, 60, dependsOn=[{"job": "top"}]),                          # 6
    doc("bottom", 0, 5, dependsOn=[{"job": "left"}, {"job": "right"}]),       # 7
    doc("sweep", 0, 40, array={"count": 5, "parallelism": 2}),                # 8..12: 2 at once, in index order
    doc("later", 10, 10, startAfter="5m"),                                    # 13: 300 s after its submit
    doc("gather", 0, 1, dependsOn=[{"job": "sweep"}]),                        # 14: every element
    doc("late-child", 0, 1, startAfter="30s", dependsOn=[{"job": "top"}]),     # 15: its time outlasts top
]


def test_chain_diamond_array_and_start_after_start_when_their_holds_end(tmp_path):
    trace = read_trace(write(tmp_path, WORKFLOW))
    assert [j.id for j in trace.jobs if j.name.startswith("sweep")] == [8, 9, 10, 11, 12]
    assert [j.array.index for j in trace.jobs if j.array] == [0, 1, 2, 3, 4]
    result = simulate(trace, objects(), POLICIES)
    expected = {1: 0, 2: 100, 3: 150, 4: 0, 5: 20, 6: 20, 7: 80, 8: 0, 9: 0, 10: 40, 11: 40, 12: 80, 13: 310,
                14: 120, 15: 30}
    for policy in POLICIES:  # room for all: each starts the moment its holds end, whatever the policy
        assert starts(result, policy) == expected, policy
        figures = result.figures[policy]
        assert figures["meanWaitSeconds"] == 0  # waits count from when its holds ended, not from submitAt
        assert figures["heldJobs"] == {"startAfter": 2, "dependencies": 6, "array": 3}, policy
        assert figures["unrunnable"] == 0
    held = {o.id: (o.held, o.held_s, o.submit_s) for o in result.outcomes["sluice"]}
    assert held[13] == ("time", 300.0, 310.0) and held[12] == ("array", 80.0, 80.0) and held[8] == (None, 0.0, 0.0)
    assert held[15] == ("time", 30.0, 30.0) and held[7] == ("dependencies", 80.0, 80.0)


def test_array_slots_go_in_index_order_and_waits_count_from_the_slot(tmp_path):
    # 2 cpus: a 2-cpu job fills the cluster until 100; the array's first two elements take its slots at 0
    # and wait in the queue for room; the next two get their slots only when those end.
    docs = [doc("big", 0, 100, cpu=2), doc("sweep", 1, 10, array={"count": 4, "parallelism": 2})]
    result = simulate(read_trace(write(tmp_path, docs)), objects(cpus=2), POLICIES)
    for policy in POLICIES:
        assert starts(result, policy) == {1: 0, 2: 100, 3: 100, 4: 110, 5: 110}, policy
        waits = {o.id: o.start_s - o.submit_s for o in result.outcomes[policy]}
        assert waits == {1: 0, 2: 99, 3: 99, 4: 0, 5: 0}, policy


def test_a_dependency_that_cannot_be_met_makes_the_job_unrunnable_saying_why(tmp_path):
    docs = [doc("huge", 0, 10, cpu=64),                                       # 1: no cluster could ever hold it
            doc("needs-it", 0, 10, dependsOn=[{"job": "huge"}]),              # 2: succeeded: cannot be met
            doc("grandchild", 0, 10, dependsOn=[{"job": "needs-it", "condition": "finished"}]),   # 3: finished
            doc("after", 0, 10, dependsOn=[{"job": "needs-it"}]),             # 4: succeeded: cannot either
            doc("on-failure", 5, 10, dependsOn=[{"job": 1, "condition": "failed"}]),              # 5: met
            doc("ok", 0, 10),                                                 # 6
            doc("on-ok-failing", 0, 10, dependsOn=[{"job": "ok", "condition": "failed"}])]        # 7
    result = simulate(read_trace(write(tmp_path, docs)), objects(), POLICIES)
    for policy in POLICIES:
        out = {o.id: o for o in result.outcomes[policy]}
        assert out[2].unrunnable == "dependency job 1 ended UNRUNNABLE; this job needed it to succeed"
        assert out[4].unrunnable == "dependency job 2 ended UNRUNNABLE; this job needed it to succeed"
        assert out[3].unrunnable is None and out[3].start_s == 0  # finished: a job that failed has finished
        assert out[5].start_s == 5
        assert out[7].unrunnable == "dependency job 6 ended SUCCEEDED; this job needed it to fail"
        assert result.figures[policy]["unrunnable"] == 4


def test_a_dependency_on_an_array_is_on_every_element_and_on_an_elements_number_on_that_one(tmp_path):
    docs = [doc("sweep", 0, 10, array={"count": 2}), doc("then", 0, 10, dependsOn=[{"job": "sweep"}]),
            doc("other", 0, 10, dependsOn=[{"job": 2}])]  # 2: the sweep's second element alone
    trace = read_trace(write(tmp_path, docs))
    assert [(j.id, [d.on for d in j.depends_on]) for j in trace.jobs] == [(1, []), (2, []), (3, [(1, 2)]),
                                                                           (4, [(2,)])]
    result = simulate(trace, objects(), ["sluice"])
    assert starts(result, "sluice") == {1: 0, 2: 0, 3: 10, 4: 10}
    element = simulate(read_trace(write(tmp_path, [doc("sweep", 0, 10, array={"count": 2}), doc("late", 0, 50),
                                                   doc("after-late", 0, 1, dependsOn=[{"job": "sweep"}, {"job": 3}])]
                                        )), objects(), ["sluice"])
    assert starts(element, "sluice") == {1: 0, 2: 0, 3: 0, 4: 50}


SWF = """; MaxProcs: 8
1 0 0 100 4 -1 -1 4 -1 -1 1 1 1 -1 1 1 -1 -1
2 10 0 50 4 -1 -1 4 -1 -1 1 1 1 -1 1 1 1 30
3 20 0 10 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 99 -1
4 30 0 10 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 2 -1
5 40 0 0 1 -1 -1 1 -1 -1 5 1 1 -1 1 1 -1 -1
6 50 0 10 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 5 20
"""


def test_swf_preceding_job_and_think_time_are_a_finished_dependency_and_a_delay(tmp_path):
    path = tmp_path / "feedback.swf"
    path.write_text(SWF)
    trace = read_trace(path)
    # 2 follows 1's end (100) by 30 s; 3's preceding job is not in the log; 4 follows 2 at once; 6 follows a
    # dropped record (5, cancelled before it started): not replayed, so taken to have ended before.
    assert {j.id: [(d.on, d.condition, d.think_s) for d in j.depends_on] for j in trace.jobs} == {
        1: [], 2: [((1,), "finished", 30.0)], 3: [], 4: [((2,), "finished", 0.0)], 6: []}
    result = simulate(trace, None, POLICIES)
    for policy in POLICIES:
        assert starts(result, policy) == {1: 0, 2: 130, 3: 20, 4: 180, 6: 50}, policy
    independent = simulate(read_trace(path, dependencies=False), None, ["sluice"])
    assert starts(independent, "sluice") == {1: 0, 2: 10, 3: 60, 4: 60, 6: 60}  # 1 and 2 fill the 8 cpus
    window = simulate(read_trace(path, window=(1, 3)), None, ["sluice"])  # 1 is not replayed: 2 is free
    assert starts(window, "sluice") == {2: 0, 3: 10, 4: 50}


def test_swf_preceding_jobs_in_a_cycle_are_refused(tmp_path):
    path = tmp_path / "loop.swf"
    path.write_text(SWF.replace("1 1 1 -1 1 1 -1 -1\n2", "1 1 1 -1 1 1 4 -1\n2", 1))
    with pytest.raises(TraceError, match=r"loop.swf line 2: the preceding jobs \(field 17\) form a cycle: "
                                         r"job 1 -> job 4 -> job 2 -> job 1"):
        read_trace(path)


@pytest.mark.parametrize("docs, message, document", [
    ([doc("x", 0, 1, dependsOn=[{"job": "nope"}])],
     "jobs.json document 1: spec.dependsOn[0].job: no document of the trace is named 'nope'", 1),
    ([doc("x", 0, 1), doc("x", 0, 1), doc("y", 0, 1, dependsOn=[{"job": "x"}])],
     "jobs.json document 3: spec.dependsOn[0].job: 2 documents are named 'x' (1, 2)", 3),
    ([doc("x", 0, 1, dependsOn=[{"job": 9}])], "jobs.json document 1: spec.dependsOn[0].job: no job numbered 9", 1),
    ([doc("x", 0, 1, dependsOn=[{"job": "y"}]), doc("y", 0, 1, dependsOn=[{"job": "x"}])],
     "jobs.json: the dependencies form a cycle: document 1 (x) -> document 2 (y) -> document 1 (x)", 1),
    ([doc("s", 0, 1, array={"count": 3}, dependsOn=[{"job": 2}])],
     "jobs.json: the dependencies form a cycle: document 1 (s) -> document 1 (s)", 1),
    ([doc("x", 0, 1, startAfter="2026-12-01T03:00:00Z")],
     "jobs.json document 1: spec.startAfter: 2026-12-01T03:00:00Z is a time, but a replay has no calendar", 1),
    ([doc("x", 0, 1, array={"count": 0})], "jobs.json document 1: spec.array.count", 1),
    ([doc("x", 0, 1, dependsOn=[{"job": "y", "condition": "sometimes"}])],
     "jobs.json document 1: spec.dependsOn[0].condition", 1),
])
def test_bad_holds_are_refused_naming_the_document(tmp_path, docs, message, document):
    with pytest.raises(TraceError) as caught:
        read_trace(write(tmp_path, docs))
    assert str(caught.value).startswith(message) and caught.value.document == document
    assert "\n" not in str(caught.value)


def test_skipping_bad_documents_skips_what_depends_on_them_and_keeps_the_numbers(tmp_path):
    docs = [doc("bad", 0, 0), doc("child", 0, 1, dependsOn=[{"job": "bad"}]), doc("c", 0, 1),
            doc("d", 0, 1, dependsOn=[{"job": 3}])]
    trace = read_trace(write(tmp_path, docs), skip_bad_lines=True)
    assert trace.skipped == 2 and [(j.id, j.name) for j in trace.jobs] == [(3, "c"), (4, "d")]


def test_a_long_start_after_costs_no_cycles_while_it_waits(tmp_path):
    docs = [doc(f"j{i}", i, 60, startAfter=f"{30 + i}d") for i in range(20)]
    trace = read_trace(write(tmp_path, docs))
    scene = scenario(trace, objects())
    began = time.perf_counter()
    replayed = replay(sim_jobs(trace, scene), list(scene.clusters), scene.policy, "sluice")
    assert time.perf_counter() - began < 5
    assert [j.first_start for j in replayed.jobs] == [i + (30 + i) * 86400.0 for i in range(20)]
    assert replayed.cycles <= 2 * len(docs)  # one for each release (and start), none while they wait


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sluice", "simulate", *args], capture_output=True, text=True,
                          timeout=120, cwd=pathlib.Path(__file__).resolve().parents[2])


def test_the_cli_replays_holds_and_says_what_is_wrong_in_one_line(tmp_path):
    path = tmp_path / "feedback.swf"
    path.write_text(SWF)
    done = run_cli("--trace", str(path), "--policy", "sluice", "-o", "json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)["policies"]["sluice"]
    assert figures["heldJobs"] == {"startAfter": 0, "dependencies": 2, "array": 0}
    assert figures["meanWaitSeconds"] == 0
    table = run_cli("--trace", str(path), "--policy", "sluice", "--no-dependencies")
    assert table.returncode == 0 and "Held for dependencies" not in table.stdout
    held = run_cli("--trace", str(path), "--policy", "sluice")
    assert "Held for dependencies" in held.stdout
    bad = run_cli("--trace", str(write(tmp_path, [doc("x", 0, 1, dependsOn=[{"job": "y"}])])))
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and "no document of the trace is named 'y'" in bad.stderr


# -- any job file ------------------------------------------------------------------------------------------

_TIMES = st.one_of(st.integers(-5, 400), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from(["90s", "2m", "1h", "0s", "-5s", "1e300", "soon", "", "2026-12-01T00:00:00Z", None,
                                    [], {}, True, 10 ** 30]))
_REFERENCES = st.one_of(st.sampled_from(["a", "b", "c", "nobody", "", "a-b"]), st.integers(-2, 12),
                        st.sampled_from([None, 1.5, [], {"x": 1}]))
_DEPENDENCY = st.one_of(st.fixed_dictionaries({"job": _REFERENCES},
                                              optional={"condition": st.sampled_from(["succeeded", "failed",
                                                                                      "finished", "done", 3])}),
                        st.sampled_from(["a", 1, None]))
_ARRAY = st.one_of(st.fixed_dictionaries({"count": st.one_of(st.integers(-1, 6), st.sampled_from(["3", 10 ** 9]))},
                                         optional={"parallelism": st.one_of(st.integers(-1, 4), st.just("2"))}),
                   st.sampled_from(["0-3%2", 4, None]))
_DOCUMENT = st.fixed_dictionaries(
    {"submitAt": _TIMES, "runFor": _TIMES},
    optional={"name": st.sampled_from(["a", "b", "c", "a"]), "cpu": st.one_of(st.integers(0, 12), st.just("x")),
              "startAfter": _TIMES, "dependsOn": st.one_of(st.lists(_DEPENDENCY, max_size=3), st.just("a")),
              "array": _ARRAY})


def _document(drawn: dict) -> dict:
    spec = {k: drawn[k] for k in ("startAfter", "dependsOn", "array") if k in drawn}
    out = doc(drawn.get("name"), 0, 0, cpu=drawn.get("cpu", 1), **spec)
    out["submitAt"], out["runFor"] = drawn["submitAt"], drawn["runFor"]
    return out


@settings(max_examples=int(os.environ.get("SLUICE_FUZZ_EXAMPLES") or 120), deadline=None, database=None)
@given(drawn=st.lists(_DOCUMENT, min_size=1, max_size=6), as_yaml=st.booleans())
@example(drawn=[{"submitAt": 0, "runFor": math.nan}], as_yaml=False)  # once read, and replayed as never ending
@example(drawn=[{"submitAt": 0, "runFor": 1, "startAfter": 6.8e16}], as_yaml=False)  # once looped for ever
def test_any_job_file_is_read_or_refused_naming_a_document_and_what_is_read_replays(tmp_path_factory, drawn, as_yaml):
    """Fuzzed job files (times, names, dependencies, arrays, right and wrong): each is read, or refused with a
    TraceError that names a document; with --skip-bad-lines the rest is read; whatever is read replays under
    every policy, each job settled (ended, or unrunnable with a reason)."""
    folder = tmp_path_factory.mktemp("jobs")
    docs = [_document(d) for d in drawn]
    if as_yaml:
        path = folder / "jobs.yaml"
        path.write_text(yaml.safe_dump_all(docs))
    else:
        path = write(folder, docs)
    for skip in (False, True):
        try:
            trace = read_trace(path, skip_bad_lines=skip)
        except TraceError as err:
            assert "document" in str(err) or "no job" in str(err), str(err)
            event("refused" if not skip else "refused though skipping")
            continue
        if not trace.jobs:
            continue
        result = simulate(trace, objects(), POLICIES)
        event(f"replayed {len(trace.jobs)} jobs" + (", skipping" if skip else ""))
        for policy in POLICIES:
            assert result.figures[policy]["jobs"] == len(trace.jobs)
            for outcome in result.outcomes[policy]:
                assert outcome.end_s is not None or outcome.unrunnable, (policy, outcome)


def test_a_start_after_beyond_any_workloads_span_is_refused_naming_its_document(tmp_path):
    path = write(tmp_path, [doc("a", 0, 10), doc("b", 0, 10, startAfter=2.5e11)])
    with pytest.raises(TraceError, match=r"document 2: spec.startAfter: more than 10,000,000,000 seconds"):
        read_trace(path)
    assert [j.name for j in read_trace(path, skip_bad_lines=True).jobs] == ["a"]


def test_jobs_that_run_one_after_another_past_the_replays_clock_end_are_unfinished_or_never_start(tmp_path):
    # 26 jobs of the whole machine for 317 years each: the replay's clock stops 6,300 years in (a cycle's
    # datetime would overflow after the year 9999), and its report is a few windows, not 55 million.
    path = write(tmp_path, [doc(f"j{i}", 0, 10 ** 10, cpu=8) for i in range(26)])
    result = simulate(read_trace(path), objects(), POLICIES)
    for policy in POLICIES:
        figures = result.figures[policy]
        assert (figures["finished"], figures["unfinished"], figures["unrunnable"]) == (20, 1, 5)
        assert figures["unrunnableReasons"] == {
            "never started: the replay's clock ended 200,000,000,000 s (about 6,300 years) in": 5}
        # Every hour of the 6,300 years had work waiting, each judged (and got its whole share).
        assert (figures["fairShareJudged"], figures["fairShareViolations"]) == (math.ceil(2e11 / 3600), 0)
