"""Identity-provider (OIDC/JWT) tokens against a real dispatcher over real gRPC: keys generated here (an RSA
and an EC pair, with `cryptography`), their JWKS served from a file and from a loopback HTTP server.
Each check the verifier makes refuses a token with UNAUTHENTICATED and says which; a user's groups make
them a queue's member and an admin by the same rule Sluice's own tokens follow."""
from __future__ import annotations

import http.server
import json
import pathlib
import ssl
import threading
import time

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from dispatcher.api.oidc import IdentityProvider, OidcSettings
from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store import clusters as cluster_store
from dispatcher.store import tokens
from dispatcher.store.database import DatabaseSettings
from sluice import certs
from sluice.admin_client import AdminClient
from sluice.client import Client, ClientError
from sluice.config import ClientConfig
from sluice.objects import load_objects
from tests.integration.test_agent_link import OBJECTS
from tests.integration.test_spine import job_doc


def plaintext(address: str, token: str, **kw) -> ClientConfig:
    """These dispatchers serve plaintext on loopback."""
    return ClientConfig(address, token, insecure=True, **kw)

ISSUER, AUDIENCE = "https://idp.example.test", "sluice"
VISION = "apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: vision}\nspec: {members: [carol]}\n"


class Keys:
    """Signing keys the test's identity provider holds, and the JWKS it publishes."""

    def __init__(self):
        self.private = {"rsa-1": rsa.generate_private_key(public_exponent=65537, key_size=2048),
                        "ec-1": ec.generate_private_key(ec.SECP256R1())}
        self.published = ["rsa-1", "ec-1"]

    def add(self, kid: str) -> None:
        self.private[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self) -> dict:
        keys = []
        for kid in self.published:
            key = self.private[kid]
            algorithm = RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) else ECAlgorithm
            keys.append({**algorithm.to_jwk(key.public_key(), as_dict=True), "kid": kid, "use": "sig"})
        return {"keys": keys}

    def token(self, kid: str = "rsa-1", *, signer: str | None = None, lifetime: float = 300, **claims) -> str:
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + lifetime, **claims}
        body = {k: v for k, v in body.items() if v is not None}
        key = self.private[signer or kid]
        algorithm = "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"
        return jwt.encode(body, key, algorithm=algorithm, headers={"kid": kid})


class JwksServer:
    """The identity provider's JWKS over HTTP on loopback; counts the reads."""

    def __init__(self, keys: Keys, tls: tuple[pathlib.Path, pathlib.Path] | None = None):
        """tls: (certificate, key) to serve https:// with."""
        served = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                served.reads += 1
                body = json.dumps(keys.jwks()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.reads = 0
        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*map(str, tls))
            self.http.socket = context.wrap_socket(self.http.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.http.server_address[1]}/jwks.json"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self):
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def keys():
    return Keys()


@pytest.fixture
def jwks_server(keys):
    server = JwksServer(keys)
    yield server
    server.stop()


def _settings(jwks: str, **kw) -> OidcSettings:
    return OidcSettings(issuer=ISSUER, audience=AUDIENCE, jwks=jwks, group_queues={"vision-team": ("vision",)},
                        admin_groups=("sluice-admins",), **kw)


@pytest.fixture
def start(db_url):
    started = []

    def run(identity: OidcSettings) -> Dispatcher:
        d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, identity=identity,
                                      database=DatabaseSettings(url=db_url))).start()
        started.append(d)
        with d.sessions.begin() as session:
            if len(started) == 1:
                cluster_store.apply_objects(session, load_objects(OBJECTS + "---\n" + VISION))
            d.admin = tokens.create(session, "admin", "root")
            d.carol = tokens.create(session, "user", "carol")
        return d

    yield run
    for d in started:
        d.stop()


def _refused(address: str, token: str, code: str = "UNAUTHENTICATED") -> str:
    with Client(plaintext(address, token, timeout_s=10)) as client:
        with pytest.raises(ClientError) as err:
            client.list()
    assert err.value.code == code, err.value.message
    return err.value.message


@pytest.mark.parametrize("source", ["file", "http"])
def test_identity_provider_tokens_are_verified_and_each_refusal_says_why(start, keys, jwks_server, tmp_path, source):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(keys.jwks()))
    d = start(_settings(str(path) if source == "file" else jwks_server.url))
    for token in (keys.token("rsa-1"), keys.token("ec-1")):  # both key types verify
        with Client(plaintext(d.address, token, timeout_s=10)) as client:
            assert client.list() == []
    now = int(time.time())
    refusals = {
        "identity token: expired (exp is in the past)": keys.token(lifetime=-10),
        "identity token: not valid yet (nbf or iat is in the future)": keys.token(nbf=now + 600),
        f"identity token: wrong audience (aud must include {AUDIENCE!r})": keys.token(aud="another-app"),
        f"identity token: wrong issuer (iss must be {ISSUER!r})": keys.token(iss="https://evil.example.test"),
        "identity token: bad signature (key 'rsa-1' does not verify it)": _forged(keys),
        "identity token: no 'exp' claim": keys.token(exp=None),
        "identity token: no 'sub' claim naming the user": keys.token(sub=None),
        "identity token: key 'nobody' is not among the issuer's keys": keys.token("nobody", signer="rsa-1"),
    }
    for why, token in refusals.items():
        assert _refused(d.address, token) == why
    # Unsigned ("none") and shared-secret tokens never verify against the issuer's public keys.
    unsigned = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "exp": now + 60}, None, algorithm="none",
                          headers={"kid": "rsa-1"})
    assert _refused(d.address, unsigned).startswith("identity token: invalid")
    secret = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "exp": now + 60}, "k" * 32,
                        algorithm="HS256", headers={"kid": "rsa-1"})
    assert _refused(d.address, secret).startswith("identity token: invalid")
    assert _refused(d.address, "sl_not-a-token") == "invalid, expired or revoked token"
    with Client(plaintext(d.address, d.admin, timeout_s=10)) as client:  # Sluice's own tokens still work
        assert client.list() == []


def _forged(keys: Keys) -> str:
    keys.add("forger")
    return keys.token("rsa-1", signer="forger")


def test_groups_make_members_and_admins_by_the_rule_sluice_tokens_follow(start, keys, jwks_server):
    d = start(_settings(jwks_server.url))
    vision_doc = job_doc(queue="vision")
    team = Client(plaintext(d.address, keys.token(sub="alice", groups=["vision-team"]), timeout_s=10))
    loner = Client(plaintext(d.address, keys.token("ec-1", sub="dave", groups="other-team"), timeout_s=10))
    carol = Client(plaintext(d.address, d.carol, timeout_s=10))
    [hers] = carol.submit([vision_doc])  # carol is listed in the queue's members
    [mine] = team.submit([vision_doc])  # alice is a member through her group
    with pytest.raises(ClientError) as err:
        loner.submit([vision_doc])
    assert (err.value.code, err.value.message) == ("PERMISSION_DENIED", "job: dave may not submit to queue 'vision'")
    [own] = loner.submit([job_doc()])  # the default queue lists no members: open to anyone
    assert {j["id"] for j in team.list()} == {hers, mine}
    assert {j["id"] for j in carol.list()} == {hers, mine}
    assert {j["id"] for j in loner.list()} == {own}
    with pytest.raises(ClientError) as err:
        loner.get(hers)
    assert (err.value.code, err.value.message) == ("NOT_FOUND", f"job {hers} not found")
    assert team.cancel([hers])[0]["state"] == "CANCELLED"
    with AdminClient(plaintext(d.address, keys.token(sub="root2", groups=["sluice-admins"]))) as admin:
        assert any(t["subject"] == "carol" for t in admin.tokens())
    with AdminClient(plaintext(d.address, keys.token(sub="alice", groups=["vision-team"]))) as not_admin:
        with pytest.raises(ClientError) as err:
            not_admin.tokens()
    assert (err.value.code, err.value.message) == ("PERMISSION_DENIED", "alice (user) may not call this; needs admin")
    for client in (team, loner, carol):
        client.close()


def test_an_unknown_kid_reads_the_keys_again_once(start, keys, jwks_server):
    d = start(_settings(jwks_server.url))
    with Client(plaintext(d.address, keys.token("rsa-1"), timeout_s=10)) as client:
        client.list()
    assert jwks_server.reads == 1
    keys.add("rsa-2")  # the issuer rotates in a new key
    keys.published.append("rsa-2")
    with Client(plaintext(d.address, keys.token("rsa-2"), timeout_s=10)) as client:
        client.list()
    assert jwks_server.reads == 2
    for kid in ("made-up-1", "made-up-2", "made-up-3"):  # within refetch_s of the last read: none read again
        assert _refused(d.address, keys.token(kid, signer="rsa-1")) == \
            f"identity token: key {kid!r} is not among the issuer's keys"
    assert jwks_server.reads == 2


def test_keys_are_read_again_by_the_clock(keys, tmp_path):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(keys.jwks()))
    now = [0.0]
    provider = IdentityProvider(_settings(str(path), refetch_s=30, max_age_s=900), clock=lambda: now[0])
    assert provider.principal(keys.token()).subject == "alice" and provider.reads == 1
    keys.add("rsa-2")
    keys.published = ["rsa-2"]  # the issuer withdrew rsa-1
    path.write_text(json.dumps(keys.jwks()))
    now[0] = 10.0
    assert provider.principal(keys.token("rsa-2")).subject == "alice" and provider.reads == 2
    now[0] = 20.0
    with pytest.raises(Exception, match="key 'made-up' is not among"):
        provider.principal(keys.token("made-up", signer="rsa-1"))
    assert provider.reads == 2  # 10 s after the last read: not again
    now[0] = 41.0
    with pytest.raises(Exception, match="key 'rsa-1' is not among"):  # withdrawn: gone with the next read
        provider.principal(keys.token("rsa-1"))
    assert provider.reads == 3


def test_an_expiring_identity_token_ends_its_watch(start, keys, jwks_server):
    d = start(_settings(jwks_server.url))
    token = keys.token(sub="erin", lifetime=2)
    made = time.monotonic()
    with Client(plaintext(d.address, token, timeout_s=10)) as client:
        events = client.watch()
        client.submit([job_doc()])
        assert next(events)["to"] == "QUEUED"
        with pytest.raises(ClientError) as err:
            for _ in events:
                pass
    assert err.value.code == "UNAUTHENTICATED"
    assert time.monotonic() - made < 2 + 5


def test_the_keys_are_read_over_https_verified_against_the_given_ca(start, keys, tmp_path):
    ca, stranger = certs.make_ca("identity provider CA"), certs.make_ca("someone else")
    certs.make_server(ca, ["127.0.0.1"]).write(tmp_path / "idp.crt", tmp_path / "idp.key")
    (tmp_path / "ca.pem").write_bytes(ca.cert)
    (tmp_path / "stranger.pem").write_bytes(stranger.cert)
    server = JwksServer(keys, tls=(tmp_path / "idp.crt", tmp_path / "idp.key"))
    try:
        assert server.url.startswith("https://")
        d = start(_settings(server.url, ca=str(tmp_path / "ca.pem")))
        with Client(plaintext(d.address, keys.token(sub="dave"), timeout_s=10)) as client:
            assert client.list() == []
        assert server.reads == 1
        # Keys served by a certificate the configured CA did not sign are not read.
        untrusted = start(_settings(server.url, ca=str(tmp_path / "stranger.pem")))
        why = _refused(untrusted.address, keys.token(sub="dave"))
        assert why.startswith(f"identity token: the issuer's keys could not be read (cannot read {server.url}: ")
        assert "CERTIFICATE_VERIFY_FAILED" in why, why
    finally:
        server.stop()


@pytest.mark.parametrize(("settings", "why"), [
    (OidcSettings(issuer=ISSUER, jwks="/x"), "audience is required with an issuer"),
    (OidcSettings(issuer=ISSUER, audience=AUDIENCE), "jwks is required with an issuer"),
    (OidcSettings(issuer=ISSUER, audience=AUDIENCE, jwks="http://idp.example.test/jwks"),
     "jwks: http://idp.example.test/jwks is plain http on a non-loopback host; use https://"),
    (OidcSettings(issuer=ISSUER, audience=AUDIENCE, jwks="/x", ca="/ca.pem"),
     "ca: verifies an https:// JWKS URL; the jwks given is not one"),
    (OidcSettings(issuer=ISSUER, audience=AUDIENCE, jwks="https://idp.example.test/jwks", ca="/no/such/ca.pem"),
     "ca: /no/such/ca.pem is not a readable file"),
])
def test_unusable_settings_are_refused_at_start(settings, why):
    with pytest.raises(ValueError, match=why):
        IdentityProvider(settings)


def test_an_unreadable_jwks_refuses_with_the_reason(start, keys, tmp_path):
    d = start(_settings(str(tmp_path / "missing.json")))
    assert _refused(d.address, keys.token()).startswith(
        f"identity token: the issuer's keys could not be read (cannot read {tmp_path / 'missing.json'}")


def test_a_grpc_status_is_unauthenticated_for_a_raw_call(start, keys, jwks_server):
    d = start(_settings(jwks_server.url))
    from sluice.v1 import jobs_pb2, jobs_pb2_grpc
    with grpc.insecure_channel(d.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            jobs_pb2_grpc.JobsStub(channel).List(jobs_pb2.ListJobsRequest(), timeout=10,
                                                 metadata=[("authorization", f"Bearer {keys.token(lifetime=-5)}")])
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert err.value.details() == "identity token: expired (exp is in the past)"


def test_dispatcher_serve_takes_the_identity_provider_from_its_flags(db_url, keys, tmp_path):
    import signal
    import subprocess
    import sys

    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from tests.integration.test_cli import REPO, base_env, free_port, run_sluice
    from tests.integration.test_migrations import plain_url
    engine = create_engine(db_url)
    with Session(engine) as session, session.begin():
        cluster_store.apply_objects(session, load_objects(OBJECTS + "---\n" + VISION))
    engine.dispose()
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(keys.jwks()))
    env = base_env(tmp_path)
    bad = run_sluice(env, "dispatcher", "serve", "--oidc-issuer", ISSUER, "--oidc-audience", AUDIENCE,
                     "--oidc-jwks", str(path), "--oidc-group-queues", "vision-team")
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        "error: sluice dispatcher serve: Invalid value: --oidc-group-queues: 'vision-team' is not "
        "GROUP=QUEUE[,QUEUE...]"]
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "sluice", "dispatcher", "serve", "--database-url",
                              plain_url(db_url), "--listen", f"127.0.0.1:{port}", "--metrics-listen", "", "--insecure",
                              "--oidc-issuer", ISSUER, "--oidc-audience", AUDIENCE, "--oidc-jwks", str(path),
                              "--oidc-group-queues", "vision-team=vision", "--oidc-admin-group", "sluice-admins"],
                             env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        assert serve.stderr.readline().startswith("serving on ")
        with Client(plaintext(f"127.0.0.1:{port}", keys.token(sub="alice", groups=["vision-team"]))) as alice:
            assert alice.submit([job_doc(queue="vision")])
        with AdminClient(plaintext(f"127.0.0.1:{port}", keys.token(sub="ops", groups=["sluice-admins"]))) as ops:
            assert ops.tokens() == []
    finally:
        serve.send_signal(signal.SIGINT)
        assert serve.wait(15) == 0


def test_an_issuer_whose_keys_cannot_be_read_is_asked_again_only_after_refetch_s(keys, tmp_path):
    path = tmp_path / "jwks.json"
    now = [0.0]
    provider = IdentityProvider(_settings(str(path), refetch_s=30), clock=lambda: now[0])
    for at in (0.0, 1.0, 29.0):  # a flood of tokens while the issuer is down: one read, each refused with why
        now[0] = at
        with pytest.raises(Exception, match=r"the issuer's keys could not be read \(cannot read "):
            provider.principal(keys.token())
    assert provider.attempts == 1
    path.write_text(json.dumps(keys.jwks()))
    now[0] = 31.0
    assert provider.principal(keys.token()).subject == "alice" and (provider.attempts, provider.reads) == (2, 1)
