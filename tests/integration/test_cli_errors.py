"""The client never prints a traceback: hostile or broken input given to the real `sluice` command (a
subprocess, as a user runs it) ends in one line, `error: <what>: <why>`, and a non-zero exit.

No case needs a dispatcher: each fails before any call (the client config points at a port nothing listens
on), except the token file case, which starts a real `sluice up` on a data dir whose admin token file was
corrupted and checks that it refuses to start.
"""
from __future__ import annotations

import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.conftest import SCRATCH
from tests.integration.test_cli import REPO, Up, base_env, free_port, job_yaml, one_error_line

MEMORY_CAP = 2 << 30  # bytes of address space the alias bomb's commands get: it once took 3.8 GB


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def sluice(env: dict, *args: str, input: str | None = None, timeout: float = 60,
           capped: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sluice", *args], env=env, cwd=REPO, input=input,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=_capped if capped else None)


def no_traceback(result: subprocess.CompletedProcess, code: int = 1) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    return one_error_line(result, code)


@pytest.fixture
def env(tmp_path) -> dict:
    """A user whose client config points at a port nothing listens on (no call gets that far)."""
    env = base_env(tmp_path)
    config = tmp_path / "config" / "sluice" / "client.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(f"address: 127.0.0.1:{free_port()}\ntoken: sl_x\n")
    return env


def bomb(levels: int = 9) -> str:
    """The billion laughs: each level a list of nine aliases of the level before, as flow mappings' entries."""
    entries = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    entries += [f"a{i}: &a{i} [{','.join(f'*a{i - 1}' for _ in range(9))}]" for i in range(1, levels)]
    return ", ".join(entries)


def bomb_job() -> str:
    """A job, about 1 KB, whose pod template (passed through to the cluster as written) holds the bomb."""
    return ("apiVersion: sluice.io/v1\nkind: Job\nspec:\n  queue: default\n  podSets:\n  - name: w\n    count: 1\n"
            f"    template:\n      spec: {{{bomb()}, containers: [{{name: m, image: x}}]}}\n")


def test_a_yaml_alias_bomb_is_refused_in_a_line(env, tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb_job())
    assert len(path.read_bytes()) < 1200
    line = no_traceback(sluice(env, "submit", "-f", str(path), capped=True))
    assert line.startswith(f"error: submit {path}: invalid YAML: ") and "aliases" in line, line
    path.write_text("apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: q}\n"
                    f"spec: {{guaranteed: {{{bomb()}}}}}\n")
    applied = no_traceback(sluice(env, "admin", "apply", "-f", str(path), capped=True))
    assert "aliases" in applied, applied
    # A few aliases, as people write them to share a template, are fine: the file reaches the (absent) server.
    shared = ("apiVersion: sluice.io/v1\nkind: Job\nspec:\n  queue: default\n  podSets:\n"
              "  - {name: a, count: 1, template: &t {spec: {containers: [{name: m, image: x}]}}}\n"
              "  - {name: b, count: 1, template: *t}\n")
    assert "dispatcher unavailable" in no_traceback(sluice(env, "submit", "-f", "-", input=shared))


@pytest.mark.parametrize("form", ["yaml-flow", "yaml-block", "json"])
def test_nesting_a_thousand_levels_deep_is_refused_in_a_line(env, form):
    if form == "yaml-flow":
        text = "apiVersion: sluice.io/v1\nkind: Job\nspec: " + "[" * 1000 + "]" * 1000 + "\n"
    elif form == "yaml-block":
        text = "apiVersion: sluice.io/v1\nkind: Job\nspec:\n" + "".join(
            "  " * i + f"k{i}:\n" for i in range(1, 1001)) + "  " * 1001 + "x: 1\n"
    else:
        text = '{"apiVersion": "sluice.io/v1", "kind": "Job", "spec": ' + "[" * 1000 + "]" * 1000 + "}"
    line = no_traceback(sluice(env, "submit", "-f", "-", input=text))
    assert "nested deeper than" in line, line
    assert "nested deeper than" in no_traceback(sluice(env, "admin", "apply", "-f", "-", input=text))


def test_a_non_utf8_job_file_is_refused_in_a_line(env, tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(job_yaml(name="caf\xe9").encode("latin-1"))
    assert no_traceback(sluice(env, "submit", "-f", str(path))) == f"error: submit {path}: not UTF-8 text"


@pytest.mark.parametrize("job_id", ["9223372036854775808", "18446744073709551617", "1" * 400])
def test_a_job_id_past_int64_is_a_usage_error(env, job_id):
    for command in ("get", "describe", "explain", "cancel", "watch"):
        result = sluice(env, command, job_id)
        assert result.returncode == 2 and "is not a job id" in result.stderr, (command, result.stderr)
        assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.parametrize("args", [("watch", "--after", "99999999999999999999"),
                                  ("admin", "audit", "--after", "99999999999999999999")])
def test_an_event_or_audit_id_past_int64_is_a_usage_error(env, args):
    result = sluice(env, *args)
    assert no_traceback(result, 2).endswith("Input should be less than or equal to 9223372036854775807")


@pytest.mark.parametrize("case", ["non-utf8", "malformed-yaml", "not-a-mapping", "directory", "address-list",
                                  "timeout-word", "token-non-ascii", "bomb", "deep"])
def test_a_broken_client_config_is_refused_in_a_line(tmp_path, case):
    env = base_env(tmp_path)
    path = tmp_path / "client.yaml"
    port = free_port()
    contents = {
        "non-utf8": f"address: 127.0.0.1:{port}\ntoken: caf\xe9\n".encode("latin-1"),
        "malformed-yaml": b"address: [127.0.0.1\ntoken: x\n",
        "not-a-mapping": b"- address\n- token\n",
        "address-list": b"address: [a, b]\ntoken: sl_x\n",
        "timeout-word": f"address: 127.0.0.1:{port}\ntoken: sl_x\ntimeout: soon\n".encode(),
        "token-non-ascii": f"address: 127.0.0.1:{port}\ntoken: sl_\u00e9\u00e9\n".encode(),
        "bomb": f"{{{bomb()}, address: 127.0.0.1:{port}, token: sl_x}}\n".encode(),
        "deep": f"address: 127.0.0.1:{port}\ntoken: ".encode() + b"[" * 1000 + b"]" * 1000 + b"\n",
    }
    if case == "directory":
        path.mkdir()
    else:
        path.write_bytes(contents[case])
    line = no_traceback(sluice(env, "--config", str(path), "list"))
    assert line.startswith(f"error: list: {path}: "), line
    env["SLUICE_CONFIG"] = str(path)  # the same through the environment
    assert no_traceback(sluice(env, "list")) == line


def test_files_a_server_command_reads_are_refused_in_a_line_when_not_text(tmp_path):
    env = base_env(tmp_path)
    bad = tmp_path / "latin1"
    bad.write_bytes(b"caf\xe9: 1\n")
    up = no_traceback(sluice(env, "up", "--config", str(bad), "--data-dir", str(tmp_path / "d")))
    assert up == f"error: up --config {bad}: not UTF-8 text"
    simulated = no_traceback(sluice(env, "simulate", "--trace", str(bad), "--config", str(bad)))
    assert simulated == f"error: simulate --config {bad}: not UTF-8 text"
    agent = no_traceback(sluice(env, "agent", "run", "--cluster", "c", "--dispatcher", "127.0.0.1:1", "--token-file",
                                str(bad)))
    assert agent == f"error: agent run --token-file {bad}: not a token (not one word of printable ASCII)"


@pytest.fixture
def corrupted_up():
    """A `sluice up` data dir whose admin token file holds garbage, and the Up that would start on it."""
    home = pathlib.Path(tempfile.mkdtemp(prefix="sl-home-", dir="/tmp"))
    data_dir = pathlib.Path(tempfile.mkdtemp(prefix="sl-up-", dir=SCRATCH))
    server = Up(home, data_dir, free_port())
    try:
        yield server
    finally:
        server.stop()
        server.stop_leftover_postgres()
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.parametrize("garbage", [b"\xff\xfe\x00garbage\n", b"sl_truncat\n"])
def test_up_refuses_a_token_file_it_cannot_use(corrupted_up, garbage):
    up = corrupted_up
    tokens = up.data_dir / "tokens"
    tokens.mkdir()
    (tokens / "admin").write_bytes(garbage)
    result = subprocess.run(
        [sys.executable, "-m", "sluice", "up", "--data-dir", str(up.data_dir), "--listen", f"127.0.0.1:{up.port}"],
        env=up.env, cwd=REPO, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert "ready" not in result.stderr, result.stderr
    line = no_traceback(result)
    assert line.startswith(f"error: up: {tokens / 'admin'}: "), line
    if garbage != b"sl_truncat\n":  # refused before anything is written; a token the database does not know, after
        assert not (up.data_dir / "client.yaml").exists()
    assert up.postmaster_pid() is None  # the embedded Postgres it started is stopped again
