"""`sluice simulate` as a user runs it: real trace windows, JSON and table output, the printed mapping fed
back with --config, plots, and bad input answered with one line and no traceback."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sluice.cli.simulate import MAPPING_END
from tests.shared_traces import shared_trace

SDSC = "SDSC-SP2-1998-4.2-cln.swf.gz"


def sluice(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "sluice", "simulate", *args], capture_output=True, text=True,
                          timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    if check:
        assert done.returncode == 0, done.stderr
    return done


def figures(done: subprocess.CompletedProcess) -> dict:
    out = json.loads(done.stdout)
    for policy in out["policies"].values():
        policy.pop("replaySeconds")
    return out


def test_json_has_every_figure_per_policy_and_queue():
    out = figures(sluice("--trace", str(shared_trace(SDSC)), "--window", "0:400", "-o", "json"))
    assert out["trace"]["jobs"] == 400 and out["trace"]["format"] == "swf" and out["trace"]["window"] == [0, 400]
    assert list(out["policies"]) == ["sluice", "fifo", "easy-backfill"]
    for policy in out["policies"].values():
        for key in ("jobs", "makespanSeconds", "meanWaitSeconds", "p99WaitSeconds", "meanCompletionSeconds",
                    "boundedSlowdown", "utilization", "preemptions", "unrunnable", "queues", "reservations"):
            assert key in policy, key
        assert policy["jobs"] == 400
        for queue in policy["queues"].values():
            assert {"share", "entitledShare", "meanWaitSeconds"} <= set(queue)
    assert out["trace"]["config"][0]["kind"] == "ServiceClass"  # the mapping built from the trace


def test_the_printed_mapping_read_back_with_config_gives_the_same_figures(tmp_path):
    trace = str(shared_trace(SDSC))
    table = sluice("--trace", trace, "--window", "100:300", "--policy", "sluice").stdout
    mapping, _, rest = table.partition(MAPPING_END)
    assert "Mean wait" in rest and "Bounded slowdown" in rest
    config = tmp_path / "mapping.yaml"
    config.write_text(mapping)
    built = figures(sluice("--trace", trace, "--window", "100:300", "--policy", "sluice", "-o", "json"))
    given = figures(sluice("--trace", trace, "--window", "100:300", "--policy", "sluice", "-o", "json",
                           "--config", str(config)))
    assert given["policies"] == built["policies"] and given["trace"]["mapping"] == "config"


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    sluice("--trace", str(shared_trace(SDSC)), "--window", "0:200", "--plot", str(tmp_path / "plots"))
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["utilization.png", "wait_cdf.png"]
    assert all((tmp_path / "plots" / p).stat().st_size > 1000 for p in pngs)


SWF = """; MaxProcs: 16
1 0 0 100 4 -1 -1 4 200 -1 1 1 1 -1 1 1 -1 -1
2 10 0 50 2 -1 -1 2 60 -1 1 2 2 -1 1 1 -1 -1
3 20 0 oops 2 -1 -1 2 60 -1 1 2 2 -1 1 1 -1 -1
4 30 0 10 8 -1 -1 8 60 -1 1 1 1 -1 1 1 -1 -1
"""


def test_a_bad_line_is_named_and_the_run_refused_unless_skipped(tmp_path):
    trace = tmp_path / "small.swf"
    trace.write_text(SWF)
    refused = sluice("--trace", str(trace), check=False)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("error: simulate --trace") and "line 4" in refused.stderr
    done = json.loads(sluice("--trace", str(trace), "--skip-bad-lines", "-o", "json").stdout)
    assert done["trace"]["skippedLines"] == 1 and done["trace"]["jobs"] == 3
    trace.write_text("; MaxProcs: 16\n" + SWF.splitlines()[3] + "\n")  # its one job line is unreadable
    empty = sluice("--trace", str(trace), "--skip-bad-lines", check=False)
    assert empty.returncode == 1 and empty.stderr == \
        f"error: simulate --trace {trace}: the trace has no job to replay (1 unreadable line skipped)\n"


def test_a_sluice_job_file_replays_with_its_own_queues_and_classes(tmp_path):
    trace = tmp_path / "jobs.yaml"
    trace.write_text("""\
submitAt: 0s
runFor: 2m
apiVersion: sluice.io/v1
kind: Job
metadata: {name: train}
spec:
  queue: ml
  podSets: [{name: w, count: 2, template: {spec: {containers: [{name: c, image: x,
            resources: {requests: {cpu: "4"}}}]}}}]
---
submitAt: 30s
runFor: 10s
apiVersion: sluice.io/v1
kind: Job
metadata: {name: small}
spec:
  queue: ml
  podSets: [{name: w, count: 1, template: {spec: {containers: [{name: c, image: x,
            resources: {requests: {cpu: "1"}}}]}}}]
""")
    config = tmp_path / "config.yaml"
    config.write_text("""\
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: ml}
spec: {}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: c1}
spec: {tier: onprem, site: s, simulated: {nodes: 2, node: {cpu: "4"}}}
""")
    out = json.loads(sluice("--trace", str(trace), "--config", str(config), "--policy", "sluice", "-o", "json").stdout)
    sluice_figures = out["policies"]["sluice"]
    assert sluice_figures["jobs"] == 2 and sluice_figures["finished"] == 2
    assert sluice_figures["meanWaitSeconds"] == 45.0  # the small job waits for the gang's two nodes (90 s)


@pytest.mark.parametrize(("args", "says"), [
    (["--trace", "/nonexistent/trace.swf"], "no such file"),
    (["--window", "ten"], "is not START:COUNT"),
    (["--policy", "backfill"], "is not one of sluice, fifo, easy-backfill"),
    (["-o", "yaml"], "is not one of table, json"),
    (["--format", "parquet"], "parquet"),
    (["--checkpoint-interval", "often"], "simulate --checkpoint-interval: 'often' is not a duration"),
    (["--checkpoint-interval", "0s"], "'0s' must be longer than 0"),
    (["--config", "/nonexistent/config.yaml"], "simulate --config /nonexistent/config.yaml: No such file or directory"),
    # Refused before the replay, which may take minutes, not after it (with or without matplotlib).
    (["--plot", "/dev/null/plots"], "simulate --plot /dev/null/plots: "),
])
def test_bad_options_get_one_clear_line(args, says):
    base = ["--trace", str(shared_trace(SDSC))] if args[0] != "--trace" else []
    done = sluice(*base, *args, check=False)
    assert done.returncode == 1 and says in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""  # nothing was replayed


def test_a_checkpoint_interval_is_in_the_trace_figures():
    out = figures(sluice("--trace", str(shared_trace(SDSC)), "--window", "0:50", "--policy", "sluice",
                         "--checkpoint-interval", "30m", "-o", "json"))
    assert out["trace"]["checkpointInterval"] == 1800


def test_the_trace_figures_say_how_many_run_times_the_policies_know():
    lublin = str(shared_trace("lublin_256.swf"))  # no requested times at all
    told = figures(sluice("--trace", lublin, "--window", "0:300", "-o", "json"))
    assert told["trace"]["requestedTimes"] == 0 and "exactRuntimes" not in told["trace"]
    assert told["policies"]["easy-backfill"]["reservations"] == 0  # none can be dated
    exact = figures(sluice("--trace", lublin, "--window", "0:300", "--exact-runtimes", "-o", "json"))
    assert exact["trace"]["exactRuntimes"] is True
    assert exact["policies"]["easy-backfill"]["reservations"] > 0
    assert exact["policies"]["sluice"]["meanWaitSeconds"] < told["policies"]["sluice"]["meanWaitSeconds"]
    sdsc = figures(sluice("--trace", str(shared_trace(SDSC)), "--window", "0:50", "--policy", "fifo", "-o", "json"))
    assert sdsc["trace"]["requestedTimes"] == 50


def test_a_table_says_when_no_policy_knows_the_run_times_and_what_tells_them():
    lublin = str(shared_trace("lublin_256.swf"))  # no requested times at all
    told = sluice("--trace", lublin, "--window", "0:100")
    assert told.stderr.splitlines()[-1] == (
        "note: 100 of 100 jobs give no requested run time, so no policy knows when they end: Sluice's "
        "reservations keep their room from every other job, and EASY cannot date a reservation and starts "
        "whatever fits. --exact-runtimes tells every policy each job's run time.")
    assert "note:" not in sluice("--trace", lublin, "--window", "0:100", "--exact-runtimes").stderr
    assert "note:" not in sluice("--trace", lublin, "--window", "0:100", "--policy", "fifo").stderr  # nothing to date
    assert "note:" not in sluice("--trace", str(shared_trace(SDSC)), "--window", "0:50").stderr  # every job says one
    assert "note:" not in sluice("--trace", lublin, "--window", "0:100", "-o", "json").stderr  # requestedTimes says it


def test_a_config_missing_the_trace_queues_is_refused(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("""\
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: other}
spec: {}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: c1}
spec: {tier: onprem, site: s, simulated: {nodes: 1, node: {cpu: "128"}}}
""")
    done = sluice("--trace", str(shared_trace(SDSC)), "--window", "0:50", "--config", str(config), check=False)
    assert done.returncode == 1 and "queues the config does not define" in done.stderr


def test_on_a_terminal_each_policy_gets_a_bar_that_ends_its_line_though_a_job_never_runs(tmp_path):
    import os
    import pty
    trace = tmp_path / "wide.swf"
    trace.write_text("; MaxProcs: 16\n" + SWF.splitlines()[1] + "\n"  # job 2 asks 32 of the 16 cpus
                     + SWF.splitlines()[2].replace(" 2 -1 -1 2 ", " 32 -1 -1 32 ") + "\n")
    leader, follower = pty.openpty()
    run = subprocess.Popen([sys.executable, "-m", "sluice", "simulate", "--trace", str(trace), "--policy", "sluice",
                            "--policy", "fifo"], stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    stdout, _ = run.communicate(timeout=300)
    terminal = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the replay closed its end of the terminal
            break
        if not chunk:
            break
        terminal += chunk
    os.close(leader)
    assert run.returncode == 0 and "Unrunnable" in stdout
    shown = terminal.decode().replace("\r\n", "\n")  # the terminal's own line ending
    bars = [redraws.split("\r")[-1] for redraws in shown.split("\n") if "jobs," in redraws]
    assert [b.split("[")[0].strip() for b in bars] == ["sluice", "fifo"], shown
    assert all("] 2/2 jobs, " in b and b.endswith("\x1b[K") for b in bars), shown
    assert "Traceback" not in shown


@pytest.mark.parametrize("done, elapsed, says", [
    (0, 0.0, "[..............................] 0/4,000 jobs, 0.0s"),
    (1_000, 4.0, "[#######.......................] 1,000/4,000 jobs, 4.0s"),  # too soon to tell a pace
    (1_000, 20.0, "[#######.......................] 1,000/4,000 jobs, 20.0s, about 1m 00s left"),
    (4_000, 80.0, "[##############################] 4,000/4,000 jobs, 1m 20s"),
])
def test_the_bar_says_how_long_the_replay_took_and_once_it_has_a_pace_how_long_it_will(done, elapsed, says):
    from sluice.cli.simulate import progress_line
    assert progress_line("sluice", done, 4_000, elapsed) == f"\r{'sluice':>14} {says}\x1b[K"
