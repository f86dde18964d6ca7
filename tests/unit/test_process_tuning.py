"""Process tuning (sluice.process) is applied by entry points, not by importing a package: the `sluice`
command sets gRPC's experiments before grpc loads, never over the operator's own, and never once grpc
is loaded (grpc would not read them). Each check runs in a fresh interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sluice import process

# Records GRPC_EXPERIMENTS as it is when `grpc` starts to load, then runs `sluice <args>` the way the
# console script does (sluice.cli.main) and prints what it saw and what the environment holds after.
ENTRY = """
import json, os, sys
seen = []

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" and not seen:
            seen.append(os.environ.get("GRPC_EXPERIMENTS", "<unset>"))
        return None

sys.meta_path.insert(0, Watch())
{before}
import sluice.cli
sys.argv = ["sluice", *{args!r}]
try:
    sluice.cli.main()
except SystemExit:
    pass
print("\\nPROBE " + json.dumps({{"atGrpcImport": seen[0] if seen else None,
                                "after": os.environ.get("GRPC_EXPERIMENTS", "<unset>")}}))
"""
SHOW = "import os; print(os.environ.get('GRPC_EXPERIMENTS', '<unset>'))"
# A command that loads the client (grpc) and fails at once: nothing listens on port 1.
CALLS_A_DISPATCHER = ["clusters"]


def _env(**env: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS" and not k.startswith("SLUICE_")}
    return {**clean, "SLUICE_ADDRESS": "127.0.0.1:1", "SLUICE_TOKEN": "x", **env}


def _run(code: str, **env: str) -> str:
    return subprocess.run([sys.executable, "-c", code], env=_env(**env), capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


def _sluice(args: list[str], before: str = "", **env: str) -> dict:
    out = _run(ENTRY.format(before=before, args=args), **env)
    return json.loads(out.rpartition("PROBE ")[2])


def test_the_sluice_command_sets_them_before_grpc_loads():
    seen = _sluice(CALLS_A_DISPATCHER)
    assert seen == {"atGrpcImport": process.EXPERIMENTS, "after": process.EXPERIMENTS}


@pytest.mark.parametrize("first", ["import dispatcher", "import dispatcher.server", "import sluice.cli",
                                   "import sluice.client"])
def test_importing_a_package_sets_nothing(first):
    assert _run(f"{first}; {SHOW}") == "<unset>"


@pytest.mark.parametrize("own", ["-some_experiment", ""])
def test_the_operators_own_experiments_are_kept(own):
    seen = _sluice(CALLS_A_DISPATCHER, GRPC_EXPERIMENTS=own)
    assert seen == {"atGrpcImport": own, "after": own}


def test_the_benchmarks_set_them_before_grpc_loads():
    """`python -m bench` applies them first thing in main(), so that the dispatcher and clients it spawns
    inherit them: importing the benchmark's modules must not load grpc before that."""
    code = ENTRY.split("{before}")[0] + """
import bench.__main__
loaded = "grpc" in sys.modules
try:
    bench.__main__.main(["--help"])
except SystemExit:
    pass
print("\\nPROBE " + json.dumps({"loadedByImport": loaded, "after": os.environ.get("GRPC_EXPERIMENTS", "<unset>")}))
"""
    seen = json.loads(_run(code).rpartition("PROBE ")[2])
    assert seen == {"loadedByImport": False, "after": process.EXPERIMENTS}


def test_nothing_is_set_once_grpc_is_imported_since_grpc_would_not_read_it():
    seen = _sluice(CALLS_A_DISPATCHER, before="import grpc")
    assert seen == {"atGrpcImport": "<unset>", "after": "<unset>"}
