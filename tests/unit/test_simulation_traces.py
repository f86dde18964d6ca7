"""Workload traces: SWF, the Philly CSV and Sluice job files read into TraceJob values; bad lines named by
number; the window option; the first 2,000 jobs of each real trace in ../shared/traces."""
from __future__ import annotations

import gzip
import os
import pathlib
import time

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from simulation.run import simulate
from simulation.scenario import ScenarioError
from simulation.traces import GPU, Trace, TraceError, TraceJob, read_trace
from tests.shared_traces import SHARED_TRACES

SWF_HEADER = """; Version: 2.2
; Computer: test machine
; MaxNodes: 32
; MaxProcs: 64
;
"""
# job, submit, wait, run, alloc, cpu, mem, req procs, req time, req mem, status, user, group, exe, queue, part, ...
SWF_JOBS = """\
1 100 5 50 4 -1 -1 4 60 -1 1 3 7 -1 2 1 -1 -1
2 130 0 0 8 -1 -1 8 60 -1 5 3 7 -1 2 1 -1 -1
3 120 0 30 -1 -1 -1 16 -1 -1 1 -1 -1 -1 -1 -1 -1 -1
4 140 0 10 -1 -1 -1 -1 60 -1 0 4 7 -1 1 1 -1 -1
5 200 2 75.5 2 12.25 -1 2 100 -1 1 5 8 -1 1 2 -1 -1
"""


def write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.write_text(text)
    return path


# -- SWF ---------------------------------------------------------------------------------------------

def test_swf_jobs_fields_and_header(tmp_path):
    trace = read_trace(write(tmp_path / "small.swf", SWF_HEADER + SWF_JOBS))
    assert isinstance(trace, Trace)
    assert (trace.name, trace.format, trace.machine) == ("small", "swf", {"cpu": 64000})
    assert (trace.skipped, trace.dropped, trace.lines, trace.usable_jobs) == (0, 2, 10, 3)
    assert [job.id for job in trace.jobs] == [1, 3, 5]  # job 2 ran 0 s, job 4 had no size: dropped
    first, second, third = trace.jobs
    assert first == TraceJob(id=1, submit_s=0.0, run_s=50.0, requested_s=60.0, pods=((1, {"cpu": 4000}),),
                             user="u3", group="g7", queue="q2", partition="p1", name="job-1")
    assert second.submit_s == 20.0 and second.pods == ((1, {"cpu": 16000}),)  # requested processors: field 8
    assert (second.requested_s, second.user, second.group, second.queue, second.partition) == (None, "", "", "default",
                                                                                               "")
    assert third.run_s == 75.5 and third.requests == {"cpu": 2000} and third.queue == "q1"


def test_swf_sorted_by_submit_then_id(tmp_path):
    text = "7 50 0 10 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 -1 -1\n" \
           "3 50 0 10 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 -1 -1\n" \
           "9 20 0 10 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 -1 -1\n"
    trace = read_trace(write(tmp_path / "t.swf", text))
    assert [(job.id, job.submit_s) for job in trace.jobs] == [(9, 0.0), (3, 30.0), (7, 30.0)]
    assert trace.machine is None


def test_swf_machine_from_max_nodes_when_no_max_procs(tmp_path):
    trace = read_trace(write(tmp_path / "t.swf", "; MaxNodes: 256\n" + SWF_JOBS))
    assert trace.machine == {"cpu": 256000}


def test_gzipped_swf(tmp_path):
    path = tmp_path / "small.swf.gz"
    path.write_bytes(gzip.compress((SWF_HEADER + SWF_JOBS).encode()))
    trace = read_trace(path)
    assert (trace.name, trace.format, len(trace.jobs)) == ("small", "swf", 3)
    assert trace.jobs == read_trace(write(tmp_path / "small.swf", SWF_HEADER + SWF_JOBS)).jobs


@pytest.mark.parametrize("line, message", [
    ("6 300 0 x 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 -1 -1", "line 11: field 4 (run time) is not a number: 'x'"),
    ("6 300 0 10 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 -1", "line 11: expected 18 fields, found 17"),
    ("6 300 0 10 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 -1 -1 5", "line 11: expected 18 fields, found 19"),
    ("6 nan 0 10 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 -1 -1", "line 11: field 2 (submit time) is not a finite number: 'nan'"),
    ("6 300 0 10 1.5 -1 -1 1 -1 -1 1 1 1 -1 1 1 -1 -1",
     "line 11: field 5 (allocated processors) is not a whole number: '1.5'"),
    # A replay's clock cannot run that far (it overflowed before: an unexpected error).
    ("6 1e300 0 10 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 -1 -1",
     "line 11: field 2 (submit time) is more than 10,000,000,000 seconds (about 300 years): '1e300'"),
    ("6 300 0 10 1e20 -1 -1 1 -1 -1 1 1 1 -1 1 1 -1 -1",
     "line 11: field 5 (allocated processors) is more than 1,000,000,000: '1e20'"),
    ("6 300 0 10 1 -1 -1 1 2e10 -1 1 1 1 -1 1 1 -1 -1",
     "line 11: field 9 (requested time) is more than 10,000,000,000 seconds (about 300 years): '2e10'"),
    # Every field finite, their sum not (it was taken for a field that is not: an unexpected error).
    ("6 300 0 10 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 1.7e308 1.7e308",
     "line 11: field 18 (think time) is more than 10,000,000,000 seconds (about 300 years): '1.7e308'"),
])
def test_swf_bad_line_names_file_line_and_field(tmp_path, line, message):
    path = write(tmp_path / "trace.swf", SWF_HEADER + SWF_JOBS + line + "\n")
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    assert str(caught.value) == f"trace.swf {message}"
    assert caught.value.line == 11


def test_swf_skip_bad_lines_counts_them(tmp_path):
    bad = "oops\n6 300 0 x 1 -1 -1 1 -1 -1 1 1 1 -1 1 1 -1 -1\n"
    trace = read_trace(write(tmp_path / "t.swf", SWF_HEADER + bad + SWF_JOBS), skip_bad_lines=True)
    assert (trace.skipped, trace.dropped, len(trace.jobs)) == (2, 2, 3)


# -- window --------------------------------------------------------------------------------------------

def test_window_takes_jobs_in_submit_order_after_dropping_and_rebases(tmp_path):
    path = write(tmp_path / "t.swf", SWF_HEADER + SWF_JOBS)
    trace = read_trace(path, window=(1, 5))
    assert [(job.id, job.submit_s) for job in trace.jobs] == [(3, 0.0), (5, 80.0)]
    assert (trace.usable_jobs, trace.window) == (3, (1, 5))
    assert [job.id for job in read_trace(path, window=(0, 1)).jobs] == [1]


@pytest.mark.parametrize("window, message", [
    ((3, 1), "the window starts at job 3, but the trace has 3 usable jobs"),
    ((-1, 2), "window start must be a whole number of jobs, 0 or more, got -1"),
    ((0, 0), "window count must be a whole number of jobs, 1 or more, got 0"),
    ((0,), "window must be (start, count)"),
])
def test_window_refusals(tmp_path, window, message):
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_trace(write(tmp_path / "t.swf", SWF_JOBS), window=window)


# -- Philly ----------------------------------------------------------------------------------------

PHILLY = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:01:55,66.0,1,66.0,11cb48
2017-10-09 06:13:03,2951.0,12,35412.0,6214e9
2017-10-09 06:13:03,100.0,16,1600.0,6214e9
2017-10-09 06:00:00,0.0,2,0.0,6214e9
2017-10-09 08:00:00,10.0,0,0.0,6214e9
"""


def test_philly_rows_sorted_gpus_in_8_gpu_pods_and_queues(tmp_path):
    trace = read_trace(write(tmp_path / "philly.csv", PHILLY))
    assert (trace.name, trace.format, trace.machine, trace.lines, trace.dropped) == ("philly", "philly", None, 6, 2)
    assert [(job.id, job.submit_s) for job in trace.jobs] == [(3, 0.0), (4, 0.0), (2, 2932.0)]
    twelve, sixteen, one = trace.jobs
    assert twelve.pods == ((1, {GPU: 8000}), (1, {GPU: 4000})) and twelve.requests == {GPU: 12000}
    assert sixteen.pods == ((2, {GPU: 8000}),)
    assert one.pods == ((1, {GPU: 1000}),) and one.run_s == 66.0 and one.requested_s is None
    assert (one.queue, twelve.queue) == ("11cb48", "6214e9")


def test_philly_timestamps_in_seconds(tmp_path):
    text = "timestamp,duration,num_gpus,gpu_time,cluster\n500,10,1,10,a\n200.5,10,8,80,b\n"
    trace = read_trace(write(tmp_path / "p.csv", text))
    assert [(job.queue, job.submit_s) for job in trace.jobs] == [("b", 0.0), ("a", 299.5)]


@pytest.mark.parametrize("row, message", [
    ("yesterday,10,1,10,a", "line 3: timestamp is neither seconds nor a date and time"),
    ("100,ten,1,10,a", "line 3: duration is not a number: 'ten'"),
    ("100,10,-2,10,a", "line 3: num_gpus is not a whole number of GPUs, 0 or more: '-2'"),
    ("100,10,1.5,10,a", "line 3: num_gpus is not a whole number of GPUs, 0 or more: '1.5'"),
    ("100,10,1,10", "line 3: expected 5 columns, found 4"),
    ("100,10,1,10,Big Cluster", "line 3: cluster 'Big Cluster' cannot be a Sluice queue name"),
    ("100,10,1e20,10,a", "line 3: num_gpus is more than 1,000,000,000: '1e20'"),
    ("1e300,10,1,10,a", "line 3: timestamp is more than 10,000,000,000 seconds (about 300 years) from 1970: '1e300'"),
    ("100,1e11,1,10,a", "line 3: duration is more than 10,000,000,000 seconds (about 300 years): '1e11'"),
])
def test_philly_bad_rows(tmp_path, row, message):
    path = write(tmp_path / "p.csv", f"timestamp,duration,num_gpus,gpu_time,cluster\n100,10,1,10,a\n{row}\n")
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    assert str(caught.value).startswith(f"p.csv {message}") and caught.value.line == 3
    trace = read_trace(path, skip_bad_lines=True)
    assert (trace.skipped, len(trace.jobs)) == (1, 1)


def test_a_byte_order_mark_before_the_header_is_not_part_of_it(tmp_path):
    text = "\ufefftimestamp,duration,num_gpus,gpu_time,cluster\r\n100,10,1,10,a\r\n"  # as a spreadsheet saves a CSV
    trace = read_trace(write(tmp_path / "p.csv", text))
    assert [(job.queue, job.run_s) for job in trace.jobs] == [("a", 10.0)]


def test_philly_header_must_name_the_columns(tmp_path):
    with pytest.raises(TraceError, match="line 1: the header must name the columns .* missing num_gpus"):
        read_trace(write(tmp_path / "p.csv", "timestamp,duration,gpus,gpu_time,cluster\n1,1,1,1,a\n"))


# -- Sluice job files -------------------------------------------------------------------------------

SLUICE = """\
apiVersion: sluice.io/v1
kind: Job
metadata: {name: train}
spec:
  queue: research
  maxRuntime: 2h
  podSets:
  - name: worker
    count: 4
    template:
      spec:
        containers:
        - {name: main, image: train:1, resources: {requests: {cpu: "2", nvidia.com/gpu: 1}}}
submitAt: 2m
runFor: 1h
---
apiVersion: sluice.io/v1
kind: Job
spec:
  queue: default
  podSets:
  - {name: one, count: 1, template: {spec: {containers: [{name: m, image: i, resources: {requests: {cpu: 500m}}}]}}}
submitAt: 30
runFor: 90s
"""


def test_sluice_job_files(tmp_path):
    trace = read_trace(write(tmp_path / "jobs.yaml", SLUICE))
    assert (trace.name, trace.format, trace.lines, trace.machine) == ("jobs", "sluice", 2, None)
    small, train = trace.jobs
    assert (small.id, small.submit_s, small.run_s, small.requested_s) == (2, 0.0, 90.0, None)
    assert (small.name, small.queue, small.pods) == ("job-2", "default", ((1, {"cpu": 500}),))
    assert (train.id, train.submit_s, train.run_s, train.requested_s) == (1, 90.0, 3600.0, 7200.0)
    assert train.pods == ((4, {"cpu": 2000, GPU: 1000}),) and train.requests == {"cpu": 8000, GPU: 4000}
    assert train.spec is not None and train.spec.name == "train" and train.queue == "research"


def test_sluice_json_array(tmp_path):
    doc = ('{"apiVersion": "sluice.io/v1", "kind": "Job", "spec": {"queue": "q", "podSets": [{"name": "a", '
           '"count": 2, "template": {"spec": {"containers": [{"name": "m", "image": "i", "resources": '
           '{"requests": {"cpu": 1}}}]}}}]}, "submitAt": "%s", "runFor": 5}')
    trace = read_trace(write(tmp_path / "jobs.json", f"[{doc % '1m'}, {doc % '0s'}]"))
    assert [(job.id, job.submit_s, job.run_s) for job in trace.jobs] == [(2, 0.0, 5.0), (1, 60.0, 5.0)]


@pytest.mark.parametrize("change, message", [
    (("submitAt: 30\n", ""), "jobs.yaml document 2: submitAt: required for a replayed job"),
    (("runFor: 90s\n", ""), "jobs.yaml document 2: runFor: required for a replayed job"),
    (("runFor: 90s", "runFor: soon"), "jobs.yaml document 2: runFor: 'soon' is not a duration"),
    (("runFor: 90s", "runFor: 0"), "jobs.yaml document 2: runFor: must be more than 0s"),
    (("count: 1,", "count: many,"), "jobs.yaml document 2: spec.podSets[0].count"),
    (("runFor: 90s", "runFor: 99999999999s"),
     "jobs.yaml document 2: runFor: more than 10,000,000,000 seconds (about 300 years): '1e+11s'"),
])
def test_sluice_bad_documents_named_by_number(tmp_path, change, message):
    path = write(tmp_path / "jobs.yaml", SLUICE.replace(*change))
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    assert str(caught.value).startswith(message) and caught.value.document == 2
    trace = read_trace(path, skip_bad_lines=True)
    assert (trace.skipped, [job.id for job in trace.jobs]) == (1, [1])


# -- files and formats -------------------------------------------------------------------------------

def test_format_from_name_or_asked(tmp_path):
    path = write(tmp_path / "workload.log", SWF_JOBS)
    with pytest.raises(TraceError, match="workload.log: cannot tell the trace format .* --format swf|philly|sluice"):
        read_trace(path)
    assert len(read_trace(path, "swf").jobs) == 3
    with pytest.raises(TraceError, match="unknown trace format 'gwf'"):
        read_trace(path, "gwf")


def test_missing_file_and_broken_gzip(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "absent.swf")
    broken = tmp_path / "broken.swf.gz"
    broken.write_bytes(gzip.compress(SWF_JOBS.encode())[:20])
    with pytest.raises(TraceError, match="broken.swf.gz: not a readable gzip file"):
        read_trace(broken)


# -- the real traces ----------------------------------------------------------------------------------

def shared(name: str) -> pathlib.Path:
    path = SHARED_TRACES / name
    if not path.exists():
        pytest.skip(f"the public traces are not at {SHARED_TRACES} (see its README.md): {name} absent")
    return path


@pytest.mark.parametrize("name, machine, queues", [
    ("SDSC-SP2-1998-4.2-cln.swf.gz", 128, None), ("HPC2N-2002-2.2-cln.swf.gz", 240, {"default"}),
    ("lublin_256.swf", 256, {"q0"}),
])
def test_real_swf_traces_first_2000_jobs(name, machine, queues):
    trace = read_trace(shared(name), window=(0, 2000))
    assert trace.machine == {"cpu": machine * 1000}
    assert len(trace.jobs) == 2000 and trace.skipped == 0 and trace.usable_jobs > 2000
    assert trace.jobs[0].submit_s == 0.0
    assert all(a.submit_s <= b.submit_s for a, b in zip(trace.jobs, trace.jobs[1:]))
    for job in trace.jobs:
        assert job.run_s > 0 and len(job.pods) == 1 and job.pods[0][0] == 1
        assert 1000 <= job.requests["cpu"] <= machine * 1000
    if queues is not None:
        assert {job.queue for job in trace.jobs} == queues


def test_real_sdsc_sp2_queues_and_dropped_records():
    trace = read_trace(shared("SDSC-SP2-1998-4.2-cln.swf.gz"), window=(0, 2000))
    assert {job.queue for job in trace.jobs} <= {f"q{n}" for n in range(7)}  # the header lists queues 0-6
    assert trace.dropped > 0 and trace.usable_jobs + trace.dropped == 59_715  # MaxRecords


def test_real_philly_first_2000_jobs():
    started = time.perf_counter()
    trace = read_trace(shared("philly-2017.csv"), window=(0, 2000))
    elapsed = time.perf_counter() - started
    assert trace.usable_jobs == 82_247 and trace.skipped == 0 and len(trace.jobs) == 2000
    assert len({job.queue for job in trace.jobs}) <= 15
    for job in trace.jobs:
        assert job.run_s >= 1 and job.requests[GPU] % 1000 == 0 and job.requests[GPU] >= 1000
        assert all(per_pod[GPU] <= 8000 for _, per_pod in job.pods)
    assert elapsed < 10  # parsed cheaply; generous for a shared machine


def test_real_philly_has_15_queues():
    trace = read_trace(shared("philly-2017.csv"))
    assert len({job.queue for job in trace.jobs}) == 15
    assert trace.jobs[-1].submit_s > 90 * 86400  # September to December 2017


# -- any text --------------------------------------------------------------------------------------------

_NUMBERS = st.one_of(st.integers(0, 5000).map(str), st.integers(1, 64).map(str), st.integers(-10, 10 ** 25).map(str),
                     st.floats(allow_nan=True, allow_infinity=True).map(repr),
                     st.sampled_from(["-1", "0", "1e300", "1e11", "9" * 30, "x", "", "1.5", "2017-10-09 07:01:55"]))


@settings(max_examples=int(os.environ.get("SLUICE_FUZZ_EXAMPLES") or 150), deadline=None, database=None)
@given(rows=st.lists(st.tuples(_NUMBERS, _NUMBERS, _NUMBERS, st.sampled_from(["a", "b-1", "Big"])), max_size=5),
       lines=st.lists(st.lists(_NUMBERS, min_size=16, max_size=19), max_size=4))
# A job of 71,288 GPUs: the built machine has 8,911 nodes, and packing its pods once took the replay minutes.
@example(rows=[("705536", "10416", "21", "b-1"), ("17874", "18", "71288", "a")], lines=[])
def test_any_rows_are_read_or_refused_in_words_and_what_is_read_replays(tmp_path_factory, rows, lines):
    folder = tmp_path_factory.mktemp("any")
    philly = "timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
        f"{stamp},{duration},{gpus},1,{cluster}\n" for stamp, duration, gpus, cluster in rows)
    swf = "; MaxProcs: 64\n" + "".join(" ".join(fields) + "\n" for fields in lines)
    for path in (write(folder / "p.csv", philly), write(folder / "t.swf", swf)):
        for skip in (False, True):
            try:
                trace = read_trace(path, skip_bad_lines=skip)
            except TraceError:
                assert not skip or path.suffix == ".csv"  # skipping, only a Philly header can still refuse
                continue
            if not trace.jobs:
                continue
            try:
                result = simulate(trace, None, ["sluice", "easy-backfill"])
            except ScenarioError:
                event("refused by the built mapping")
                continue
            event(f"replayed {path.suffix}")
            assert all(f["jobs"] == len(trace.jobs) for f in result.figures.values())
