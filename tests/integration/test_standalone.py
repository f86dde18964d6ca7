"""Sluice without `sluice up`: a dispatcher on a given database, a token made with
`sluice dispatcher token`, and a separate `sluice agent run` process for one cluster."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

from dispatcher.store import clusters as cluster_store
from sluice.objects import load_objects
from tests.integration.test_cli import REPO, base_env, free_port, run_sluice

OBJECTS = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: default}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: solo}
spec: {tier: onprem, site: dc-9}
"""


def test_dispatcher_serve_with_a_separate_sim_agent(db_url, tmp_path):
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session
    engine = create_engine(db_url)
    with Session(engine) as session, session.begin():
        cluster_store.apply_objects(session, load_objects(OBJECTS))
    engine.dispose()
    url = db_url.replace("postgresql+psycopg://", "postgresql://")
    env = base_env(tmp_path)
    made = [run_sluice(env, "dispatcher", "token", "--database-url", url, "--role", role, "--subject", subject, *extra)
            for role, subject, extra in (("admin", "ops", ()), ("agent", "agent-solo", ("--cluster", "solo")))]
    assert [m.returncode for m in made] == [0, 0], [m.stderr for m in made]
    admin, agent_token = (m.stdout.strip() for m in made)
    refused = run_sluice(env, "dispatcher", "token", "--database-url", url, "--role", "agent", "--subject", "x")
    assert refused.returncode == 2 and "--cluster is required" in refused.stderr
    (tmp_path / "agent.token").write_text(agent_token + "\n")
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "sluice", "dispatcher", "serve", "--database-url", url,
                              "--listen", f"127.0.0.1:{port}", "--metrics-listen", "127.0.0.1:0"], env=env, cwd=REPO,
                             stderr=subprocess.PIPE, text=True)
    agent = subprocess.Popen([sys.executable, "-m", "sluice", "agent", "run", "--cluster", "solo", "--dispatcher",
                              f"127.0.0.1:{port}", "--token-file", str(tmp_path / "agent.token"), "--backend", "sim",
                              "--sim-nodes", "2", "--sim-node", "cpu=4,memory=8Gi", "--metrics-listen", "127.0.0.1:0"],
                             env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    client_env = {**env, "SLUICE_ADDRESS": f"127.0.0.1:{port}", "SLUICE_TOKEN": admin}
    try:
        deadline = time.monotonic() + 30
        while True:
            shown = run_sluice(client_env, "clusters", "-o", "json")
            if shown.returncode == 0 and '"state": "active"' in shown.stdout:
                break
            assert time.monotonic() < deadline, shown.stderr
            time.sleep(0.3)
        submitted = run_sluice(client_env, "submit", "-f", "examples/train.yaml", "--wait")
        assert submitted.returncode == 0, submitted.stderr
        ids = submitted.stdout.split()
        assert len(ids) == 2
        for job_id in ids:
            assert '"cluster": "solo"' in run_sluice(client_env, "get", job_id, "-o", "json").stdout
    finally:
        for proc in (agent, serve):
            proc.send_signal(signal.SIGINT)
        assert agent.wait(15) == 0 and serve.wait(15) == 0
    assert "agent metrics on 127.0.0.1:" in agent.stderr.read()


def test_agent_run_refuses_bad_input(tmp_path):
    env = base_env(tmp_path)
    missing = run_sluice(env, "agent", "run", "--cluster", "c", "--dispatcher", "127.0.0.1:1",
                         "--token-file", str(tmp_path / "nope"))
    assert missing.returncode == 1 and missing.stderr.startswith(f"error: agent run --token-file {tmp_path / 'nope'}:")
    (tmp_path / "t").write_text("x")
    bad_node = run_sluice(env, "agent", "run", "--cluster", "c", "--dispatcher", "127.0.0.1:1",
                          "--token-file", str(tmp_path / "t"), "--sim-node", "cpu=lots")
    assert bad_node.returncode == 1 and "error: agent run --sim-node:" in bad_node.stderr
    backend = run_sluice(env, "agent", "run", "--cluster", "c", "--dispatcher", "127.0.0.1:1",
                         "--token-file", str(tmp_path / "t"), "--backend", "kubernetes")
    assert backend.returncode == 1 and backend.stderr.startswith(
        "error: agent run --backend kubernetes: cannot load the default kubeconfig"), backend.stderr


def test_an_agent_token_for_a_cluster_not_defined_says_which_command_defines_it(db_url, tmp_path):
    url = db_url.replace("postgresql+psycopg://", "postgresql://")
    result = run_sluice(base_env(tmp_path), "dispatcher", "token", "--database-url", url, "--role", "agent",
                        "--subject", "agent-x", "--cluster", "nowhere")
    assert result.returncode == 1 and result.stdout == "", result
    assert result.stderr.strip() == (
        "error: dispatcher token: cluster 'nowhere' not found: an agent token is bound to a defined cluster; "
        "define it first with `sluice admin apply -f FILE` (a Cluster object) or `sluice up --config FILE`")
