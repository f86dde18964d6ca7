"""gRPC's settings for Sluice's own processes (sluice.grpc_defaults): in place before grpc is imported,
never over the operator's own."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sluice import grpc_defaults

SHOW = "import os; print(os.environ.get('GRPC_EXPERIMENTS', '<unset>'))"


def _run(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    return subprocess.run([sys.executable, "-c", code], env={**environ, **env}, capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


@pytest.mark.parametrize("first", ["import dispatcher", "import dispatcher.server", "import sluice.cli"])
def test_the_server_side_and_the_command_set_them_before_grpc_is_imported(first):
    assert _run(f"{first}; {SHOW}") == grpc_defaults.EXPERIMENTS


def test_the_operators_own_experiments_are_kept():
    assert _run(f"import dispatcher.server; {SHOW}", GRPC_EXPERIMENTS="-some_experiment") == "-some_experiment"
    assert _run(f"import dispatcher.server; {SHOW}", GRPC_EXPERIMENTS="") == ""


def test_nothing_is_set_once_grpc_is_imported_since_grpc_would_not_read_it():
    assert _run(f"import grpc, dispatcher.server; {SHOW}") == "<unset>"


def test_a_light_client_leaves_them_alone():
    assert _run(f"import sluice.client; {SHOW}") == "<unset>"
