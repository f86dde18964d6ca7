"""Client commands stay light: the CLI, the client, the spec model, config and output import none of
the server's modules (dispatcher, agent), the database stack or the Kubernetes client, even while they
run a command. Each check runs in a fresh interpreter so nothing this test run imported leaks in."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEAVY = ("sqlalchemy", "alembic", "psycopg", "kubernetes", "pgserver", "dispatcher", "agent")

# Runs `sluice <args>` in-process the way the console script does (sluice.cli.main), then prints one
# JSON line: the exit code and every heavy module that got imported. The command's own output goes
# to stdout/stderr before that line.
PROBE = """
import json, sys
import sluice.cli, sluice.client, sluice.config, sluice.output, sluice.spec
heavy = {heavy!r}
codes = []
for argv in {commands!r}:
    sys.argv = ["sluice", *argv]
    try:
        sluice.cli.main()
        codes.append(0)
    except SystemExit as exc:
        codes.append(exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1))
sys.stdout.flush()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
print("\\nPROBE " + json.dumps({{"codes": codes, "loaded": loaded}}))
"""


def probe(*commands: list[str], env: dict[str, str] | None = None) -> tuple[list[int], list[str], str, str]:
    code = PROBE.format(heavy=HEAVY, commands=[list(c) for c in commands])
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    full_env.update(env or {})
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    out, _, report = done.stdout.rpartition("\nPROBE ")
    result = json.loads(report)
    return result["codes"], result["loaded"], out, done.stderr


def test_client_modules_and_help_import_nothing_heavy():
    codes, loaded, out, err = probe(["get", "--help"], ["submit", "--help"])
    assert codes == [0, 0], err
    assert "Show one job" in out and "Submit jobs" in out
    assert loaded == []


def test_a_bad_admin_file_fails_with_one_line_before_any_connection(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: q}\nspec: {guaranteed: {cpu: '-1'}}\n")
    codes, loaded, out, err = probe(["admin", "apply", "-f", str(bad)], ["admin", "get", "tenants"],
                                    env={"SLUICE_ADDRESS": "127.0.0.1:1", "SLUICE_TOKEN": "x"})
    assert codes == [1, 2]
    lines = err.splitlines()
    assert lines[0] == f"error: admin apply {bad}: document 1: spec.guaranteed.cpu: '-1' is not a quantity " \
                       "(examples: '500m', '2', '32Gi', '1.5')"
    assert lines[1].startswith("error: sluice admin get: ") and len(lines) == 2, err
    assert out.strip() == "" and loaded == []


@pytest.fixture
def invalid_example() -> pathlib.Path:
    path = ROOT / "examples" / "invalid.yaml"
    for _ in range(12):  # a colleague may still be writing it
        if path.is_file():
            return path
        time.sleep(5)
    pytest.fail("examples/invalid.yaml is missing")


def test_a_bad_job_file_fails_with_one_line_before_any_connection(invalid_example):
    codes, loaded, out, err = probe(["submit", "-f", "examples/invalid.yaml"],
                                    env={"SLUICE_ADDRESS": "127.0.0.1:1", "SLUICE_TOKEN": "x"})
    assert codes == [1]
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: submit examples/invalid.yaml: ")
    assert "spec.podSets[0].count" in lines[0]
    assert "Traceback" not in err and out.strip() == ""
    assert loaded == []


def test_import_sluice_loads_no_grpc_until_the_client_is_asked_for():
    code = ("import sys, sluice; assert 'grpc' not in sys.modules; from sluice import process; "
            "assert 'grpc' not in sys.modules; from sluice import Client, ClientError; "
            "assert 'grpc' in sys.modules and Client.__module__ == 'sluice.client'; print(ClientError.__name__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "ClientError\n", done.stderr
