"""The layers and the lint, as part of the test run: import-linter's contracts (.importlinter) and ruff
(pyproject.toml [tool.ruff]) over the whole tree. A broken contract or a lint error fails here with the
tool's own report."""
from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_import_contracts_hold():
    script = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"
    result = _run(sys.executable, "-c", script)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_ruff_finds_nothing():
    result = _run(sys.executable, "-m", "ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr
