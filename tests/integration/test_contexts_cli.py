"""`--context` and $SLUICE_CONTEXT choose the dispatcher a real command talks to: a config file whose current
context leads nowhere, and a context for a real dispatcher (the `system` fixture) that the commands reach
over TLS when it is named."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.test_cli import REPO, base_env, free_port


def sluice(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sluice", *args], env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_a_command_reaches_the_dispatcher_of_the_context_it_names(system, tmp_path):
    env = base_env(tmp_path)
    path = tmp_path / "contexts.yaml"
    settings = system.client_settings()
    (tmp_path / "admin.token").write_text(settings.token + "\n")
    assert sluice(env, "--config", str(path), "config", "set-context", "nowhere", "--address",
                  f"127.0.0.1:{free_port()}", "--token", "sl_nothing").returncode == 0
    done = sluice(env, "--config", str(path), "config", "set-context", "local", "--address", settings.address,
                  "--token-file", str(tmp_path / "admin.token"), "--ca", settings.ca)
    assert done.returncode == 0, done.stderr
    assert sluice(env, "--config", str(path), "config", "current-context").stdout == "nowhere\n"

    done = sluice(env, "--config", str(path), "--context", "local", "queues", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert "default" in {queue["name"] for queue in json.loads(done.stdout)}
    done = sluice({**env, "SLUICE_CONFIG": str(path), "SLUICE_CONTEXT": "local"}, "list", "-o", "json")
    assert done.returncode == 0 and json.loads(done.stdout) == [], done.stderr

    refused = sluice(env, "--config", str(path), "queues")  # the current context: nothing listens there
    assert refused.returncode == 1 and refused.stderr.startswith("error: queues: dispatcher unavailable"), \
        refused.stderr

    assert sluice(env, "--config", str(path), "config", "use-context", "local").returncode == 0
    done = sluice(env, "--config", str(path), "clusters", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert {cluster["name"] for cluster in json.loads(done.stdout)} == {"onprem", "cloud", "edge"}
