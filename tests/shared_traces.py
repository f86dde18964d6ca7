"""Where the public workload traces are (../shared/traces beside the repository): tests and benchmarks read
them there and never copy them in."""
from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _shared_traces() -> pathlib.Path:
    """../shared/traces beside the repository; from a git worktree, beside the main checkout."""
    git = ROOT / ".git"
    if git.is_file() and git.read_text().startswith("gitdir:"):  # a worktree: gitdir is MAIN/.git/worktrees/NAME
        main = pathlib.Path(git.read_text().split(":", 1)[1].strip()).parents[2]
        if (main.parent / "shared" / "traces").is_dir():
            return main.parent / "shared" / "traces"
    return ROOT.parent / "shared" / "traces"


SHARED_TRACES = _shared_traces()


def shared_trace(name: str) -> pathlib.Path:
    """The path of one shared trace; the test is skipped, saying why, when it is not there."""
    path = SHARED_TRACES / name
    if not path.exists():
        pytest.skip(f"the public trace {name} is not in {SHARED_TRACES}")
    return path
