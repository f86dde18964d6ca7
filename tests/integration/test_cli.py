"""The `sluice` command line as a user runs it: `sluice up` in the background, every other command a
subprocess against it, output and exit codes as docs/api.md promises them.

One `sluice up` serves the whole module (startup is the slow part); its HOME and XDG dirs are private
temp dirs, so the user's real client config is never touched. The restart test runs last.
"""
from __future__ import annotations

import json
import os
import pathlib
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import yaml

from sluice import config
from sluice.client import Client
from tests.conftest import SCRATCH

REPO = pathlib.Path(__file__).resolve().parents[2]
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
JOB_KEYS = {"id", "name", "queue", "serviceClass", "priority", "state", "reason", "cluster", "attempt", "createdAt",
            "dispatchedAt", "startedAt", "finishedAt", "labels"}
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
CLUSTERS = {"onprem", "cloud", "edge"}


def base_env(home: pathlib.Path) -> dict:
    """The environment of a user whose home is `home`, with no SLUICE_* settings of ours leaking in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"),
               PYTHONUNBUFFERED="1")
    return env


def run_sluice(env: dict, *args: str, input: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sluice", *args], env=env, cwd=REPO, input=input,
                          capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_yaml(name="cli", duration="1s", exit_code="0", queue_line="  queue: default\n", max_retries=0) -> str:
    return (f"apiVersion: sluice.io/v1\nkind: Job\nmetadata: {{name: {name}, labels: {{via: stdin}}}}\nspec:\n"
            f"{queue_line}  maxRetries: {max_retries}\n  podSets:\n  - name: w\n    count: 1\n    template:\n"
            f"      metadata: {{annotations: {{sluice.io/sim-duration: '{duration}', "
            f"sluice.io/sim-exit-code: '{exit_code}'}}}}\n"
            "      spec: {containers: [{name: m, image: x, resources: {requests: {cpu: '1'}}}]}\n")


class Up:
    """A `sluice up` subprocess on a fixed data dir and port, restartable."""

    def __init__(self, home: pathlib.Path, data_dir: pathlib.Path, port: int):
        self.home, self.data_dir, self.port = home, data_dir, port
        self.env = base_env(home)
        self.proc: subprocess.Popen | None = None
        self.runs = 0
        self._client: Client | None = None

    def client(self) -> Client:
        """A Python client on the config `sluice up` wrote, for the tests' waits (a CLI process per look
        costs the loaded machine far more)."""
        if self._client is None:
            self._client = Client(config.load(self.data_dir / "client.yaml"))
        return self._client

    @property
    def log(self) -> pathlib.Path:
        return self.home / f"up-{self.runs}.log"

    def start(self, timeout: float = 60.0) -> None:
        self.runs += 1
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sluice", "up", "--data-dir", str(self.data_dir),
                 "--listen", f"127.0.0.1:{self.port}"],
                env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sluice up exited with {self.proc.returncode}:\n{self.log.read_text()}")
            if (self.data_dir / "client.yaml").exists():
                last = run_sluice(self.env, "clusters", "-o", "json")
                if last.returncode == 0:
                    states = {c["name"]: c["state"] for c in json.loads(last.stdout)}
                    if states == {name: "active" for name in CLUSTERS}:
                        return
            time.sleep(0.2)
        raise AssertionError(f"sluice up not ready in {timeout}s: {last}\n{self.log.read_text()}")

    def stop(self, grace: float = 15.0) -> int | None:
        """Ctrl-C, then SIGKILL if it does not exit within `grace`; returns the exit code."""
        proc, self.proc = self.proc, None
        if self._client is not None:
            self._client.close()
            self._client = None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return None
        return proc.returncode

    def postmaster_pid(self) -> int | None:
        pidfile = self.data_dir / "postgres" / "postmaster.pid"
        try:
            return int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop_leftover_postgres(self) -> None:
        """After an unclean exit the embedded server keeps running: stop the one this data dir started."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGINT)  # postgres' "fast" shutdown
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.postmaster_pid() is not None:
            time.sleep(0.1)


@pytest.fixture(scope="module")
def up():
    home = pathlib.Path(tempfile.mkdtemp(prefix="sl-home-", dir="/tmp"))
    data_dir = pathlib.Path(tempfile.mkdtemp(prefix="sl-up-", dir=SCRATCH))
    server = Up(home, data_dir, free_port())
    try:
        server.start()
        yield server
    finally:
        server.stop()
        server.stop_leftover_postgres()
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(data_dir, ignore_errors=True)


def sluice(up: Up, *args: str, input: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return run_sluice(up.env, *args, input=input, timeout=timeout)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"{result.args} exited {result.returncode}: {result.stderr}"
    return result.stdout


def one_error_line(result: subprocess.CompletedProcess, code: int = 1) -> str:
    assert result.returncode == code, f"{result.args} exited {result.returncode}: {result.stdout}{result.stderr}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def submit(up: Up, *args: str, input: str | None = None) -> list[int]:
    out = ok(sluice(up, "submit", *args, input=input))
    assert re.fullmatch(r"(\d+\n)+", out), out
    return [int(line) for line in out.splitlines()]


def get(up: Up, job_id: int) -> dict:
    return json.loads(ok(sluice(up, "get", str(job_id), "-o", "json")))


def list_jobs(up: Up) -> list[dict]:
    return json.loads(ok(sluice(up, "list", "--limit", "0", "-o", "json")))


def wait_state(up: Up, job_id: int, states: tuple[str, ...], timeout: float = 20.0) -> dict:
    """Poll the job through the Python client (what `sluice get -o json` prints), not a CLI process per look."""
    deadline = time.monotonic() + timeout
    while True:
        job = up.client().get(job_id)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"job {job_id} not in {states} within {timeout}s: {job}"
        time.sleep(0.2)


# -- tests, in the order a user would meet them ----------------------------------------------------
def test_up_points_the_default_client_config_at_its_data_dir(up):
    link = pathlib.Path(up.env["XDG_CONFIG_HOME"]) / "sluice" / "client.yaml"
    assert link.resolve() == (up.data_dir / "client.yaml").resolve()
    config = yaml.safe_load((up.data_dir / "client.yaml").read_text())
    assert config["address"] == f"127.0.0.1:{up.port}" and config["token"]
    # --config names the same file explicitly.
    clusters = json.loads(ok(sluice(up, "--config", str(up.data_dir / "client.yaml"), "clusters", "-o", "json")))
    assert {c["name"] for c in clusters} == CLUSTERS
    for c in clusters:
        assert {"name", "tier", "site", "labels", "state", "capacitySource", "capacityAgeSeconds", "allocatable",
                "free", "largestFreeNode", "runningJobs"} <= set(c)
        assert c["capacitySource"] == "agent"


def test_kubernetes_job_runs_and_is_cancelled(up):
    [job_id] = submit(up, "-f", "examples/k8s-job.yaml")
    job = get(up, job_id)
    assert JOB_KEYS <= set(job), JOB_KEYS - set(job)
    assert job["id"] == job_id and job["name"] == "sleepy" and job["labels"] == {"project": "demo"}
    assert job["queue"] == "default" and job["serviceClass"] == "standard" and job["priority"] == 0
    assert RFC3339_UTC.match(job["createdAt"]), job["createdAt"]
    job = wait_state(up, job_id, ("DISPATCHED", "RUNNING"))
    assert job["cluster"] in CLUSTERS and job["attempt"] == 1 and RFC3339_UTC.match(job["dispatchedAt"])
    job = wait_state(up, job_id, ("RUNNING",))  # its pods run 20s: plenty of time to cancel
    assert job["startedAt"] and job["finishedAt"] is None
    ok(sluice(up, "cancel", str(job_id)))
    job = get(up, job_id)
    assert job["state"] == "CANCELLED" and RFC3339_UTC.match(job["finishedAt"])


def test_invalid_file_is_refused_and_changes_nothing(up):
    before = list_jobs(up)
    result = sluice(up, "submit", "-f", "examples/invalid.yaml")
    line = one_error_line(result)
    assert line.startswith("error: submit examples/invalid.yaml: ") and "spec.podSets[0].count" in line, line
    assert result.stdout == ""
    assert list_jobs(up) == before


def k8s_job_yaml(**spec) -> str:
    return yaml.safe_dump({"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "k", "annotations": {"sluice.io/queue": "default"}}, "spec": {**spec, "template": {
            "metadata": {"annotations": {"sluice.io/sim-duration": "0.2s"}},
            "spec": {"containers": [{"name": "m", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}}})


def test_kubernetes_job_fields_sluice_cannot_honour_are_refused_and_the_rest_mapped(up):
    before = list_jobs(up)
    result = sluice(up, "submit", "-f", "-", input=k8s_job_yaml(parallelism=2, completions=6))
    assert one_error_line(result) == (
        "error: submit -: document 1: spec.completions: 6 is not supported: Sluice runs a Job's pods once, all at "
        "the same time (a gang); set completions to parallelism (2) or leave it out")
    assert result.stdout == ""
    line = one_error_line(sluice(up, "submit", "-f", "-", input=k8s_job_yaml(backoffLimit=500)))
    assert line.startswith("error: submit -: document 1: spec.backoffLimit: 500 is not supported"), line
    assert list_jobs(up) == before
    [job_id] = submit(up, "-f", "-", input=k8s_job_yaml(parallelism=2, completions=2, backoffLimit=3))
    described = json.loads(ok(sluice(up, "describe", str(job_id), "-o", "json")))
    assert described["maxRetries"] == 3, described
    wait_state(up, job_id, FINAL)


def test_a_file_is_all_or_nothing_its_errors_name_the_document_in_the_file_and_a_key_submits_once(up):
    before = list_jobs(up)
    bad = job_yaml(name="a") + "---\n---\n" + job_yaml(name="b") + "---\n" + job_yaml(
        name="c", queue_line="  queue: nowhere\n")
    line = one_error_line(sluice(up, "submit", "-f", "-", input=bad))
    assert line == "error: submit -: document 4: spec.queue: queue 'nowhere' not found", line
    assert list_jobs(up) == before
    good = job_yaml(name="a", duration="0.2s") + "---\n" + job_yaml(name="b", duration="0.2s")
    first = submit(up, "-f", "-", "--idempotency-key", "nightly-1", input=good)
    again = submit(up, "-f", "-", "--idempotency-key", "nightly-1", input=good)
    assert len(first) == 2 and again == first and len(list_jobs(up)) == len(before) + 2


def test_submit_from_stdin_and_queue_override(up):
    [job_id] = submit(up, "-f", "-", input=job_yaml(name="from-stdin", duration="0.2s"))
    job = get(up, job_id)
    assert job["name"] == "from-stdin" and job["labels"] == {"via": "stdin"}
    # A job naming no queue needs --queue, and --queue fills it in.
    line = one_error_line(sluice(up, "submit", "-f", "-", input=job_yaml(queue_line="")))
    assert line.startswith("error: submit -: document 1: spec.queue: required"), line
    [no_queue] = submit(up, "-f", "-", "--queue", "default", input=job_yaml(name="q", duration="0.2s", queue_line=""))
    assert get(up, no_queue)["queue"] == "default"
    # --queue overrides the file's queue: an unknown one is refused and nothing is submitted.
    before = len(list_jobs(up))
    line = one_error_line(sluice(up, "submit", "-f", "examples/train.yaml", "--queue", "nope"))
    assert line.startswith("error: submit examples/train.yaml: ") and "queue 'nope' not found" in line, line
    assert len(list_jobs(up)) == before
    wait_state(up, job_id, FINAL)
    wait_state(up, no_queue, FINAL)


def test_submit_wait_exits_by_outcome(up):
    started = time.monotonic()
    result = sluice(up, "submit", "-f", "examples/train.yaml", "--wait", timeout=60)
    ids = [int(i) for i in ok(result).split()]
    assert len(ids) == 2 and time.monotonic() - started >= 3  # 3s sim pods: it really waited
    jobs = [get(up, i) for i in ids]
    assert [j["name"] for j in jobs] == ["train-resnet", "evaluate-resnet"]
    assert all(j["state"] == "SUCCEEDED" for j in jobs), jobs
    assert jobs[0]["cluster"] in ("onprem", "cloud")  # placement.tiers

    failing = sluice(up, "submit", "-f", "-", "--wait", input=job_yaml(name="fails", duration="0.1s", exit_code="3"),
                     timeout=60)
    [failed_id] = [int(i) for i in failing.stdout.split()]
    line = one_error_line(failing)
    assert line.startswith(f"error: job {failed_id}: FAILED: ") and "exited with code 3" in line, line


def test_errors_and_output_formats(up):
    result = sluice(up, "get", "999999")
    assert one_error_line(result) == "error: get 999999: job 999999 not found"
    assert result.stdout == ""
    usage = sluice(up, "get", "abc")
    assert usage.returncode == 2 and "is not a job id" in usage.stderr
    assert sluice(up, "get", "0").returncode == 2
    assert sluice(up, "list", "-o", "xml").returncode == 2

    if not any(j["state"] == "SUCCEEDED" for j in list_jobs(up)):  # run alone (-k): make one
        ok(sluice(up, "submit", "-f", "-", "--wait", input=job_yaml(duration="0.1s")))
    jobs = yaml.safe_load(ok(sluice(up, "list", "-o", "yaml")))
    assert isinstance(jobs, list) and jobs and all(JOB_KEYS <= set(j) for j in jobs)
    assert [j["id"] for j in jobs] == sorted(j["id"] for j in jobs)  # oldest first
    assert jobs == list_jobs(up)[:len(jobs)]
    table = ok(sluice(up, "list"))
    assert table.splitlines()[0].split() == ["ID", "NAME", "QUEUE", "CLASS", "STATE", "CLUSTER", "ATTEMPT", "REASON"]
    assert len(table.splitlines()) == len(jobs) + 1

    done = next(j for j in jobs if j["state"] == "SUCCEEDED")
    described = ok(sluice(up, "describe", str(done["id"])))
    assert re.search(r"^reason:\s+succeeded on \w+$", described, re.M), described
    assert re.search(r"^state:\s+SUCCEEDED$", described, re.M)
    events = described.split("events:\n", 1)[1].splitlines()
    assert events[0].split() == ["AT", "ATTEMPT", "FROM", "TO", "CLUSTER", "REASON"]
    assert [line.split()[3] for line in events[1:]] == ["QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
    info = json.loads(ok(sluice(up, "describe", str(done["id"]), "-o", "json")))
    assert [e["to"] for e in info["events"]] == ["QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
    assert one_error_line(sluice(up, "describe", "999999")) == "error: describe 999999: job 999999 not found"

    queues = json.loads(ok(sluice(up, "queues", "-o", "json")))
    default = next(q for q in queues if q["name"] == "default")
    assert {"name", "parent", "guaranteed", "max", "used", "queuedJobs", "runningJobs"} <= set(default)


def test_watch_prints_json_events_in_order(up):
    [job_id] = submit(up, "-f", "-", input=job_yaml(name="watched", duration="0.5s"))
    proc = subprocess.Popen([sys.executable, "-m", "sluice", "watch", str(job_id), "-o", "json"], env=up.env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)], daemon=True)
    reader.start()
    events = []
    try:
        deadline = time.monotonic() + 20
        while not events or events[-1]["to"] not in FINAL:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, f"watch ended early ({proc.wait()}): {proc.stderr.read()}"
            events.append(json.loads(line))
    finally:
        proc.kill()
        proc.wait()
        reader.join(5)
        proc.stdout.close()
        proc.stderr.close()
    assert [e["to"] for e in events] == ["QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"], events
    assert all(e["jobId"] == job_id for e in events)
    ids = [e["id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [e["from"] for e in events] == [None, "QUEUED", "DISPATCHED", "RUNNING"]
    assert all(RFC3339_UTC.match(e["at"]) for e in events)


def test_missing_client_config_says_so(tmp_path):
    env = base_env(tmp_path)  # an empty home: no client.yaml anywhere
    (tmp_path / "config").mkdir()
    result = run_sluice(env, "list")
    line = one_error_line(result)
    assert line.startswith("error: list: no dispatcher configured "), line
    assert result.stdout == ""
    missing = run_sluice(env, "--config", str(tmp_path / "nope.yaml"), "list")
    assert one_error_line(missing) == f"error: list: {tmp_path / 'nope.yaml'}: no such file"


def test_restart_resumes_where_it_stopped(up):
    # Nothing may still be moving, or the comparison below would race with it.
    moving = [j["id"] for j in list_jobs(up) if j["state"] not in FINAL]
    if moving:
        ok(sluice(up, "cancel", *map(str, moving)))
    if not list_jobs(up):  # run alone (-k): have something to remember
        ok(sluice(up, "submit", "-f", "-", "--wait", input=job_yaml(duration="0.1s")))
    before = list_jobs(up)
    assert before and all(j["state"] in FINAL for j in before)

    assert up.stop() == 0, f"sluice up did not exit 0 on Ctrl-C:\n{up.log.read_text()}"
    assert up.postmaster_pid() is None, "the embedded postgres is still running after a clean exit"
    assert one_error_line(sluice(up, "list", timeout=60)).startswith("error: list: dispatcher unavailable")

    up.start()
    after = list_jobs(up)
    assert [(j["id"], j["state"], j["cluster"], j["attempt"]) for j in after] == \
           [(j["id"], j["state"], j["cluster"], j["attempt"]) for j in before]
    # New ids continue after the old ones, and the restarted system still runs jobs.
    [new_id] = submit(up, "-f", "-", input=job_yaml(name="after-restart", duration="0.2s"))
    assert new_id > max(j["id"] for j in before)
    assert wait_state(up, new_id, FINAL)["state"] == "SUCCEEDED"


def test_up_prints_the_console_which_takes_the_admin_token_it_wrote(up):
    import ssl
    import urllib.request

    shown = yaml.safe_load(up.log.read_text()[up.log.read_text().index("address:"):].split("\n\n")[0])
    console = shown["console"]
    assert console.startswith("https://127.0.0.1:") and console.endswith("/")
    token = (up.data_dir / "tokens" / "admin").read_text().strip()
    request = urllib.request.Request(f"{console}api/v1/clusters", headers={"Authorization": f"Bearer {token}"})
    context = ssl.create_default_context(cafile=str(up.data_dir / "certs" / "ca.crt"))
    with urllib.request.urlopen(request, timeout=10, context=context) as reply:
        assert {c["name"] for c in json.loads(reply.read())["clusters"]} == CLUSTERS
