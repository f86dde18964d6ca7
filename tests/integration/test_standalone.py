"""Sluice without `sluice up`: a dispatcher on a given database over TLS with certificates made by
`sluice dispatcher certs`, an admin token made with `sluice dispatcher token`, and a separate `sluice agent
run` process for one cluster that authenticates with its client certificate (mTLS) instead of a token."""
from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import time
import urllib.request

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
    admin = made[0].stdout.strip()
    refused = run_sluice(env, "dispatcher", "token", "--database-url", url, "--role", "agent", "--subject", "x")
    assert refused.returncode == 2 and "--cluster is required" in refused.stderr
    certs = tmp_path / "certs"
    made = run_sluice(env, "dispatcher", "certs", "--dir", str(certs), "--host", "127.0.0.1", "--cluster", "solo")
    assert made.returncode == 0 and (certs / "agent-solo.key").stat().st_mode & 0o077 == 0, made.stderr
    no_tls = run_sluice(env, "dispatcher", "serve", "--database-url", url, "--listen", "127.0.0.1:0")
    assert no_tls.returncode == 1 and no_tls.stderr.count("\n") == 1 and "--tls-cert" in no_tls.stderr
    port, agent_port = free_port(), free_port()
    serve = subprocess.Popen([sys.executable, "-m", "sluice", "dispatcher", "serve", "--database-url", url,
                              "--listen", f"127.0.0.1:{port}", "--metrics-listen", "127.0.0.1:0",
                              "--tls-cert", str(certs / "dispatcher.crt"), "--tls-key", str(certs / "dispatcher.key"),
                              "--client-ca", str(certs / "ca.crt"), "--agent-listen", f"127.0.0.1:{agent_port}"],
                             env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    agent = subprocess.Popen([sys.executable, "-m", "sluice", "agent", "run", "--cluster", "solo", "--dispatcher",
                              f"127.0.0.1:{agent_port}", "--ca", str(certs / "ca.crt"),
                              "--tls-cert", str(certs / "agent-solo.crt"), "--tls-key", str(certs / "agent-solo.key"),
                              "--backend", "sim", "--sim-nodes", "2", "--sim-node", "cpu=4,memory=8Gi",
                              "--metrics-listen", "127.0.0.1:0", "--metrics-tls-cert", str(certs / "dispatcher.crt"),
                              "--metrics-tls-key", str(certs / "dispatcher.key")],
                             env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    client_env = {**env, "SLUICE_ADDRESS": f"127.0.0.1:{port}", "SLUICE_TOKEN": admin,
                  "SLUICE_CA": str(certs / "ca.crt")}
    try:
        ready = serve.stderr.readline()
        assert ready.startswith(f"serving on 127.0.0.1:{port}, metrics on 127.0.0.1:") and "(TLS)" in ready, ready
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
        # Without the CA the client does not trust the dispatcher, and says so in one line.
        untrusted = run_sluice({**client_env, "SLUICE_CA": ""}, "list")
        assert untrusted.returncode == 1 and "not signed by the CA" in untrusted.stderr, untrusted.stderr
        # /metrics is served over TLS too, with the same certificate.
        metrics_port = int(ready.split("metrics on 127.0.0.1:")[1].split()[0].rstrip(","))
        trusting = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        with urllib.request.urlopen(f"https://127.0.0.1:{metrics_port}/metrics", context=trusting, timeout=10) as r:
            assert b"sluice_database_up 1.0" in r.read()
        # So is the agent's, with the certificate it was given.
        said = agent.stderr.readline()
        assert said.startswith("agent metrics on https://127.0.0.1:"), said
        with urllib.request.urlopen(said.split()[-1], context=trusting, timeout=10) as r:
            assert b'sluice_agent_connected{cluster="solo"} 1.0' in r.read()
    finally:
        for proc in (agent, serve):
            proc.send_signal(signal.SIGINT)
        assert agent.wait(15) == 0 and serve.wait(15) == 0


def test_agent_run_refuses_bad_input(tmp_path):
    env = base_env(tmp_path)
    missing = run_sluice(env, "agent", "run", "--cluster", "c", "--dispatcher", "127.0.0.1:1",
                         "--token-file", str(tmp_path / "nope"))
    assert missing.returncode == 1 and missing.stderr.startswith(f"error: agent run --token-file {tmp_path / 'nope'}:")
    (tmp_path / "t").write_text("x")
    bad_node = run_sluice(env, "agent", "run", "--cluster", "c", "--dispatcher", "127.0.0.1:1",
                          "--token-file", str(tmp_path / "t"), "--sim-node", "cpu=lots")
    assert bad_node.returncode == 1 and "error: agent run --sim-node:" in bad_node.stderr
    half = run_sluice(env, "agent", "run", "--cluster", "c", "--dispatcher", "127.0.0.1:1",
                      "--token-file", str(tmp_path / "t"), "--metrics-tls-cert", str(tmp_path / "t"))
    assert half.returncode == 2 and "--metrics-tls-cert and --metrics-tls-key go together" in half.stderr
    not_pem = run_sluice(env, "agent", "run", "--cluster", "c", "--dispatcher", "127.0.0.1:1", "--token-file",
                         str(tmp_path / "t"), "--metrics-tls-cert", str(tmp_path / "t"), "--metrics-tls-key",
                         str(tmp_path / "t"))
    assert not_pem.returncode == 1 and not_pem.stderr == (
        f"error: agent run --metrics-listen 127.0.0.1:9465: certificate {tmp_path / 't'}: not a PEM file\n")
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
