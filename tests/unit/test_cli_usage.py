"""Usage errors: exit 2 and one line on stderr, `error: <command>: <why>`; no traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args, expected", [
    (["get", "abc"], "error: sluice get: Invalid value: 'abc' is not a job id"),
    (["get"], "error: sluice get: Missing argument 'job'."),
    (["bogus"], "error: sluice: No such command 'bogus'."),
    (["list", "-o", "xml"], "error: sluice list: "),
])
def test_usage_errors_are_one_line_and_exit_2(args, expected):
    result = subprocess.run([sys.executable, "-m", "sluice", *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(expected), result.stderr
    assert result.stdout == ""


def test_help_exits_0():
    result = subprocess.run([sys.executable, "-m", "sluice", "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "submit" in result.stdout
