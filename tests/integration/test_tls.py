"""TLS on every port: real certificates (sluice.certs, the `cryptography` package), a real dispatcher on
loopback, real gRPC and HTTPS clients. Trust, refusal of plaintext where it would leak tokens, rotation
without a restart, and agents bound to their cluster by their client certificate (mTLS)."""
from __future__ import annotations

import os
import queue
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime

import grpc
import pytest
from prometheus_client import CollectorRegistry, Gauge

from agent.backends.sim.cluster import SimCluster, SimConfig
from agent.connection import Agent, AgentSettings
from dispatcher.errors import Unauthenticated
from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store import clusters as cluster_store
from dispatcher.store import lifecycle, tokens
from dispatcher.store.database import DatabaseSettings
from sluice import certs
from sluice.admin_client import AdminClient
from sluice.client import Client, ClientError
from sluice.config import ClientConfig
from sluice.objects import load_objects
from sluice.serving import MetricsServer, ServerTls, self_signed
from sluice.transport import Tls
from sluice.v1 import jobs_pb2, jobs_pb2_grpc
from tests.integration.test_agent_link import ScriptedAgent

CLUSTERS = """
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: alpha}
spec: {tier: onprem}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: beta}
spec: {tier: onprem}
"""
CPU8 = {"cpu": 8000, "memory": 32 * 2**30 * 1000}


def issue(tmp_path, ca: certs.Issued, name: str = "dispatcher") -> ServerTls:
    cert, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    certs.make_server(ca, certs.local_hosts()).write(cert, key)
    (tmp_path / "ca.crt").write_bytes(ca.cert)
    return ServerTls(cert, key, client_ca=tmp_path / "ca.crt")


def write_ca(path, ca: certs.Issued) -> str:
    path.write_bytes(ca.cert)
    return str(path)


@pytest.fixture
def served(db_url, tmp_path):
    """A dispatcher serving TLS (with an mTLS agent port) with an admin token; the CA it was issued by."""
    ca = certs.make_ca()
    tls = issue(tmp_path, ca)
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", tls=tls,
                                  agent_listen="127.0.0.1:0", database=DatabaseSettings(url=db_url))).start()
    with d.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(CLUSTERS))
        d.admin = tokens.create(session, "admin", "ops")
    d.ca, d.tls = ca, tls
    yield d
    d.stop()


def client(d, ca_file: str | None, **kw) -> Client:
    return Client(ClientConfig(d.address, d.admin, timeout_s=10, ca=ca_file, **kw))


def test_a_client_trusting_the_ca_is_served_and_any_other_is_refused_in_words(served, tmp_path):
    with client(served, str(served.tls.client_ca)) as trusted:
        assert trusted.list() == []
    other_ca = write_ca(tmp_path / "other-ca.crt", certs.make_ca("someone else"))
    with client(served, other_ca) as fooled, pytest.raises(ClientError) as refused:
        fooled.list()
    assert refused.value.code == "UNAVAILABLE" and "not signed by the CA" in refused.value.message
    with client(served, None, insecure=True) as plaintext, pytest.raises(ClientError) as refused:
        plaintext.list()  # a plaintext client on a TLS port: no token leaves it in clear
    assert refused.value.code == "UNAVAILABLE" and "TLS" in refused.value.message, refused.value.message


def test_plaintext_is_refused_off_loopback_on_both_ends(db_url):
    with pytest.raises(OSError, match="refusing plaintext on 0.0.0.0:0: not a loopback address"):
        Dispatcher(ServerSettings(listen="0.0.0.0:0", metrics_listen=None, database=DatabaseSettings(url=db_url)))
    with pytest.raises(OSError, match="refusing plaintext /metrics on 0.0.0.0:0"):
        Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen="0.0.0.0:0",
                                  database=DatabaseSettings(url=db_url)))
    with pytest.raises(ClientError, match="would send the token in clear"):
        Client(ClientConfig("10.1.2.3:7070", "sl_x", insecure=True))
    with pytest.raises(OSError, match="the agent port needs TLS"):
        Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, agent_listen="127.0.0.1:0",
                                  database=DatabaseSettings(url=db_url)))


def test_unusable_tls_files_are_refused_at_start_naming_the_file(db_url, tmp_path):
    ca = certs.make_ca()
    good = issue(tmp_path, ca)
    other = issue(tmp_path, ca, "other")
    (tmp_path / "junk.crt").write_text("not a certificate")
    for tls, words in ((ServerTls(tmp_path / "missing.crt", good.key), "missing.crt: No such file"),
                       (ServerTls(tmp_path / "junk.crt", good.key), "junk.crt: not a PEM file"),
                       (ServerTls(good.cert, other.key), "do not load as a pair")):
        with pytest.raises(OSError, match=words):
            Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, tls=tls,
                                      database=DatabaseSettings(url=db_url)))


def _metrics(d, ca_file: str) -> bytes:
    trusting = ssl.create_default_context(cafile=ca_file)
    with urllib.request.urlopen(f"https://127.0.0.1:{d.metrics_port}/metrics", context=trusting, timeout=10) as r:
        return r.read()


def test_metrics_are_served_over_tls_and_a_plaintext_scrape_gets_nothing(served):
    assert b"sluice_database_up 1.0" in _metrics(served, str(served.tls.client_ca))
    with pytest.raises((OSError, urllib.error.URLError)):
        urllib.request.urlopen(f"http://127.0.0.1:{served.metrics_port}/metrics", timeout=5).read()


def test_a_server_given_no_certificate_serves_metrics_over_tls_with_one_of_its_own(tmp_path):
    """What an agent does off loopback without --metrics-tls-cert: encrypted, though not verifiable."""
    registry = CollectorRegistry()
    Gauge("sluice_probe", "a probe", registry=registry).set(7)
    server = MetricsServer("127.0.0.1:0", registry, self_signed(tmp_path, "127.0.0.1"))
    try:
        assert server.url.startswith("https://127.0.0.1:")
        unverified = ssl.create_default_context()
        unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
        with urllib.request.urlopen(server.url, context=unverified, timeout=5) as reply:
            assert b"sluice_probe 7.0" in reply.read()
        with pytest.raises(OSError):  # a plaintext scrape gets nothing
            urllib.request.urlopen(server.url.replace("https:", "http:"), timeout=5).read()
    finally:
        server.stop()
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0
    with pytest.raises(OSError, match="refusing plaintext /metrics on 0.0.0.0:9"):
        MetricsServer("0.0.0.0:9", registry)  # refused before anything binds


def test_rotated_certificates_are_served_without_a_restart(served, tmp_path):
    """New files (here from a new CA, so the change is plain to see) are picked up at the next handshake, by
    the gRPC port and by /metrics alike; a half-written pair is not taken."""
    old_ca = str(served.tls.client_ca)
    with client(served, old_ca) as before:
        assert before.list() == []
    new_ca = certs.make_ca("rotated")
    served.tls.key.write_text("-----BEGIN PRIVATE KEY-----\ntruncated")  # a rotation caught half way
    with client(served, old_ca) as during:
        assert during.list() == []  # the old pair is kept
    rotated = certs.make_server(new_ca, certs.local_hosts())
    rotated.write(served.tls.cert, served.tls.key)
    new_file = write_ca(tmp_path / "new-ca.crt", new_ca)
    with client(served, new_file) as after:
        assert after.list() == []
    with client(served, old_ca) as stale, pytest.raises(ClientError, match="not signed by the CA"):
        stale.list()
    assert b"sluice_database_up" in _metrics(served, new_file)


def _agent(d, tmp_path, cluster: str, cert_for: str | None, port: int | None = None) -> Agent:
    tls = Tls(ca=str(d.tls.client_ca))
    if cert_for is not None:
        cert, key = tmp_path / f"agent-{cert_for}.crt", tmp_path / f"agent-{cert_for}.key"
        certs.make_agent(d.ca, cert_for).write(cert, key)
        tls = Tls(ca=str(d.tls.client_ca), cert=str(cert), key=str(key))
    settings = AgentSettings(cluster, f"127.0.0.1:{port or d.agent_port}", "", heartbeat_s=0.2,
                             backoff_initial_s=0.1, backoff_max_s=0.3, tls=tls)
    return Agent(settings, SimCluster(SimConfig(nodes=1, node=CPU8))).start()


def _state(d, cluster: str) -> str:
    with client(d, str(d.tls.client_ca)) as c:
        return {x["name"]: x["state"] for x in c.clusters()}[cluster]


def test_an_agent_certificate_authenticates_it_as_its_own_cluster_only(served, tmp_path):
    own = _agent(served, tmp_path, "alpha", cert_for="alpha")
    try:
        assert own.connected.wait(15)
        assert _state(served, "alpha") == "active"
    finally:
        own.stop()
    impostor = _agent(served, tmp_path, "beta", cert_for="alpha")  # alpha's certificate, saying it is beta
    try:
        assert not impostor.connected.wait(2)
        assert _state(served, "beta") != "active"
    finally:
        impostor.stop()
    anonymous = _agent(served, tmp_path, "beta", cert_for=None)  # no certificate: the handshake fails
    try:
        assert not anonymous.connected.wait(2)
    finally:
        anonymous.stop()


def test_a_certificate_from_another_ca_is_refused_on_the_agent_port(served, tmp_path):
    stranger = certs.make_ca("stranger")
    cert, key = tmp_path / "s.crt", tmp_path / "s.key"
    certs.make_agent(stranger, "alpha").write(cert, key)
    credentials = grpc.ssl_channel_credentials(served.ca.cert, key.read_bytes(), cert.read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{served.agent_port}", credentials) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            jobs_pb2_grpc.JobsStub(channel).ListClusters(jobs_pb2.ListClustersRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


BOUND_S = 3.0  # how long a revoked or expired certificate may keep an open link (RECHECK_S, and some slack)


def _link(d, issued: certs.Issued, cluster: str) -> ScriptedAgent:
    """A hand-driven agent on the agent port, authenticated by the client certificate `issued` alone."""
    credentials = grpc.ssl_channel_credentials(d.ca.cert, issued.key, issued.cert)
    return ScriptedAgent(f"127.0.0.1:{d.agent_port}", "", cluster, credentials=credentials)


def _admin(d) -> AdminClient:
    return AdminClient(ClientConfig(d.address, d.admin, timeout_s=10, ca=str(d.tls.client_ca)))


def _ends_unauthenticated(agent: ScriptedAgent, within_s: float) -> str:
    """The link's end: its status is UNAUTHENTICATED, within `within_s`; its details."""
    with pytest.raises(grpc.RpcError) as ended:
        agent.next("status_ack", timeout=within_s)
    assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED, ended.value.details()
    return ended.value.details()


def test_a_revoked_agent_certificate_ends_its_link_and_is_refused_after(served):
    issued, spare = certs.make_agent(served.ca, "alpha"), certs.make_agent(served.ca, "alpha")
    identity = certs.agent_identity(issued.cert)
    agent, other = _link(served, issued, "alpha"), _link(served, spare, "alpha")
    agent.next("welcome")
    other.next("welcome")
    with _admin(served) as admin:
        started = time.monotonic()
        revoked = admin.revoke_certificate(identity.serial.upper(), "alpha", identity.not_after)
        assert (revoked["serial"], revoked["cluster"], revoked["alreadyRevoked"]) == (identity.serial, "alpha", False)
        assert revoked["notAfter"] and revoked["revokedAt"]
        details = _ends_unauthenticated(agent, BOUND_S + 5)
        assert time.monotonic() - started < BOUND_S
        assert details == f"the agent's client certificate (serial {identity.serial}) is revoked"
        # As `openssl x509 -serial` or a browser writes it: the same serial, already revoked.
        with_colons = ":".join(identity.serial.zfill(40)[i:i + 2] for i in range(0, 40, 2))
        assert admin.revoke_certificate(with_colons)["alreadyRevoked"]
        assert [c["serial"] for c in admin.revoked_certificates()] == [identity.serial]
        last = admin.audit()[-1]
        assert (last["action"], last["kind"], last["name"]) == ("revoke", "Certificate", identity.serial)
        for serial in ("", "xyz", "0x", "1" * 41):
            with pytest.raises(ClientError) as refused:
                admin.revoke_certificate(serial)
            assert refused.value.code == "INVALID_ARGUMENT"
            assert refused.value.message.startswith("serial: ") and "hex digits" in refused.value.message
        assert len(admin.revoked_certificates()) == 1  # nothing changed
    again = _link(served, issued, "alpha")  # the same certificate, a new connection: refused at its hello
    assert "is revoked" in _ends_unauthenticated(again, 10)
    with pytest.raises(queue.Empty):  # the cluster's other certificate still serves: its link holds
        other.next("status_ack", timeout=BOUND_S)
    for link in (agent, other, again):
        link.close()


def test_a_report_is_applied_only_while_its_certificate_holds(served):
    """The reports of a batch are judged in the transaction that locks their jobs (tokens.held): a
    revocation committed just before is seen there, whatever a replica's cache still believes."""
    held = tokens.Principal("agent-alpha", "agent", "alpha", certificate="abc123")
    with served.sessions.begin() as session:
        assert lifecycle.lock_for_reports(session, [1], held_by=held) == []
    with served.sessions.begin() as session:
        tokens.revoke_certificate(session, "abc123", "alpha")
    with served.sessions.begin() as session, pytest.raises(Unauthenticated) as refused:
        lifecycle.lock_for_reports(session, [1], held_by=held)
    assert str(refused.value) == tokens.CERTIFICATE_REFUSED


def test_an_agent_certificate_that_expires_ends_its_open_link(served):
    issued = certs.make_agent(served.ca, "alpha", days=4 / 86400)  # valid for 4 more seconds
    identity = certs.agent_identity(issued.cert)
    agent = _link(served, issued, "alpha")
    agent.next("welcome")
    left = (identity.not_after - datetime.now(UTC)).total_seconds()
    details = _ends_unauthenticated(agent, left + BOUND_S + 5)
    assert datetime.now(UTC) >= identity.not_after
    assert (datetime.now(UTC) - identity.not_after).total_seconds() < BOUND_S
    assert details.startswith(f"the agent's client certificate (serial {identity.serial}) expired at ")
    agent.close()


def test_sluice_admin_cert_revokes_a_certificate_file_and_lists_it(served, tmp_path):
    issued = certs.make_agent(served.ca, "beta")
    issued.write(tmp_path / "beta.crt", tmp_path / "beta.key")
    env = {**os.environ, "SLUICE_ADDRESS": served.address, "SLUICE_TOKEN": served.admin,
           "SLUICE_CA": str(served.tls.client_ca)}

    def sluice(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sluice", "admin", "cert", *args], env=env, capture_output=True,
                              text=True, timeout=60)

    serial = certs.agent_identity(issued.cert).serial
    done = sluice("revoke", str(tmp_path / "beta.crt"))
    assert done.returncode == 0 and done.stdout == f"certificate {serial} (cluster beta): revoked\n", done.stderr
    listed = sluice("list", "-o", "json")
    assert listed.returncode == 0 and f'"serial": "{serial}"' in listed.stdout and '"cluster": "beta"' in listed.stdout
    (tmp_path / "ca-only.crt").write_bytes(served.ca.cert)  # a certificate, but not an agent's
    for args, says in [(("revoke", str(tmp_path / "ca-only.crt")), "is not an agent certificate"),
                       (("revoke", "not-hex"), "serial: 'not-hex' is not a certificate serial number")]:
        refused = sluice(*args)
        assert refused.returncode == 1 and says in refused.stderr and "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_a_user_token_cannot_pass_for_an_agent_on_the_main_port(served):
    """The main port never asks for client certificates, so only a token can say who is calling there."""
    channel = grpc.secure_channel(served.address, grpc.ssl_channel_credentials(served.ca.cert))
    with channel, pytest.raises(grpc.RpcError) as refused:
        jobs_pb2_grpc.JobsStub(channel).ListClusters(jobs_pb2.ListClustersRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_sluice_up_makes_its_ca_once_and_writes_it_into_the_client_config(system):
    data = system.settings.data_dir.resolve()
    written = (data / "client.yaml").read_text()
    assert f"ca: {data / 'certs' / 'ca.crt'}" in written
    assert os.stat(data / "certs" / "ca.key").st_mode & 0o077 == 0
    assert system.client.clusters()  # the fixture's client went over TLS with that CA
    with socket.create_connection(("127.0.0.1", system.dispatcher.port), timeout=5) as raw:
        context = ssl.create_default_context(cafile=str(data / "certs" / "ca.crt"))
        context.set_alpn_protocols(["h2"])
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls_socket:
            assert tls_socket.version() in ("TLSv1.2", "TLSv1.3")
    first = (data / "certs" / "ca.crt").read_bytes()
    from devstack.embedded import local_tls
    local_tls(data / "certs", "127.0.0.1:0")
    assert (data / "certs" / "ca.crt").read_bytes() == first  # a restart keeps the CA clients trust


def test_the_health_port_answers_probes_in_plaintext_and_serves_nothing_else(db_url, tmp_path):
    """The kubelet's gRPC probes speak no TLS: the health check alone is served in plaintext on its own port."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    tls = issue(tmp_path, certs.make_ca())
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, tls=tls, health_listen="127.0.0.1:0",
                                  database=DatabaseSettings(url=db_url))).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{d.health_port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as refused:
                jobs_pb2_grpc.JobsStub(channel).ListClusters(jobs_pb2.ListClustersRequest(), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        d.stop()


def test_the_cli_refuses_plaintext_off_loopback_in_one_line(db_url, tmp_path):
    from tests.integration.test_cli import base_env, run_sluice
    url = db_url.replace("postgresql+psycopg://", "postgresql://")
    env = base_env(tmp_path)
    for args in (["dispatcher", "serve", "--database-url", url, "--insecure", "--listen", "0.0.0.0:0"],
                 ["up", "--data-dir", str(tmp_path / "up"), "--insecure", "--listen", "0.0.0.0:0"]):
        refused = run_sluice(env, *args)
        assert refused.returncode == 1, refused
        assert refused.stderr.count("\n") == 1 and "refusing plaintext on 0.0.0.0:0" in refused.stderr, refused.stderr
    both = run_sluice(env, "dispatcher", "serve", "--database-url", url, "--insecure", "--tls-cert", "c",
                      "--tls-key", "k")
    assert both.returncode == 2 and "--insecure is plaintext" in both.stderr
    (tmp_path / "t").write_text("sl_token\n")
    agent = run_sluice(env, "agent", "run", "--cluster", "c", "--dispatcher", "10.1.2.3:7070", "--insecure",
                       "--token-file", str(tmp_path / "t"))
    assert agent.returncode == 1 and agent.stderr.count("\n") == 1 and "in clear" in agent.stderr, agent.stderr
