"""The commands that run a server: `sluice up`, `demo`, `dispatcher serve|migrate|token`, `agent run`.

Each imports devstack, dispatcher or agent inside its body, so the user's commands load none of them.
"""
from __future__ import annotations

import pathlib
import sys
import tempfile

import typer

from sluice.cli.common import Failed

app = typer.Typer()  # `up` and `demo`: they join the root `sluice` app
dispatcher_app = typer.Typer(no_args_is_help=True, help="Run or maintain a dispatcher (server side).")
agent_app = typer.Typer(no_args_is_help=True, help="Run a cluster agent.")


def _data_dir(value: pathlib.Path | None) -> pathlib.Path:
    import os
    if value:
        return value
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return pathlib.Path(base) / "sluice"


def _logging(verbose: bool) -> None:
    import logging
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # our own warning says what a failed query means
    # A failed start of the embedded server dumps that server's whole log; ours names the log file instead.
    logging.getLogger("pgserver").setLevel(logging.CRITICAL)


def _serve_until_interrupted(stop, ready: str = "") -> None:
    """Block until SIGTERM or Ctrl-C, then stop(). `ready` (stderr) is printed inside the handled region:
    a script that sends SIGINT as soon as it reads it gets a clean stop and exit 0, not typer's 130."""
    import signal
    import threading
    done = threading.Event()
    try:
        # Both, explicitly: a shell starts background jobs with SIGINT ignored, which Python would keep.
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        signal.signal(signal.SIGINT, lambda *_: done.set())
        if ready:
            print(ready, file=sys.stderr, flush=True)
        # In steps: a signal the kernel hands to another thread only marks its handler pending, and that runs
        # once this thread runs Python again; a wait without end never did, and serve ignored a Ctrl-C.
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        stop()


@app.command()
def up(config: pathlib.Path | None = typer.Option(None, "--config", help="Cluster/Queue/ServiceClass objects (YAML)"),
       data_dir: pathlib.Path | None = typer.Option(None, "--data-dir", envvar="SLUICE_DATA_DIR"),
       listen: str = typer.Option("127.0.0.1:7070", "--listen", help="HOST:PORT for the dispatcher"),
       prometheus: bool = typer.Option(False, "--prometheus",
                                       help="Run a real Prometheus (the `prometheus` binary) scraping the sim "
                                            "clusters and the dispatcher, with Sluice's alert rules"),
       insecure: bool = typer.Option(False, "--insecure",
                                     help="Plaintext instead of TLS with the data dir's own CA (loopback only)"),
       verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Run everything locally: embedded Postgres, a dispatcher and sim agents, until Ctrl-C.

    On first start it makes a CA and the dispatcher's certificate under DATA_DIR/certs and writes the CA
    into the client config, so even this is encrypted."""
    _logging(verbose)
    from devstack.embedded import Embedded, UpSettings, load_config, summary_line
    from sluice.spec import SpecError
    try:
        objects = load_config(config)
    except (OSError, SpecError) as exc:
        raise Failed(f"up --config {config}", str(exc)) from None
    except UnicodeDecodeError:
        raise Failed(f"up --config {config}", "not UTF-8 text") from None
    _check_token_files(_data_dir(data_dir) / "tokens", None)
    embedded = _start("up", lambda: Embedded(UpSettings(_data_dir(data_dir), listen, prometheus=prometheus,
                                                        insecure=insecure), objects).start())
    try:
        _check_token_files(_data_dir(data_dir) / "tokens", embedded.dispatcher.sessions)
    except Failed:
        embedded.stop()
        raise
    print(summary_line(embedded), end="", flush=True)
    _serve_until_interrupted(embedded.stop, ready="ready: Ctrl-C stops")


def _check_token_files(directory: pathlib.Path, sessions) -> None:
    """Failed naming the first token file `sluice up` keeps that it cannot use: one it cannot read as a token
    (before it starts), or, given the dispatcher's sessions, one its database does not accept."""
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        secret, why = _read_token(path)
        if why is None and sessions is not None:
            from dispatcher.store import tokens
            with sessions() as session:
                if secret not in tokens.authenticate(session, [secret]):
                    why = "not a token this dispatcher accepts (corrupted, revoked or expired)"
        if why is not None:
            raise Failed("up", f"{path}: {why}; delete it and `sluice up` makes a new one")


def _read_token(path: pathlib.Path) -> tuple[str, str | None]:
    """(the token a file holds, None), or ("", why it holds none)."""
    from sluice.config import printable
    try:
        secret = path.read_bytes().decode("ascii").strip()
    except OSError as exc:
        return "", exc.strerror or str(exc)
    except UnicodeDecodeError:
        secret = ""
    return (secret, None) if printable(secret) else ("", "not a token (not one word of printable ASCII)")


def _start(what: str, fn):
    from dispatcher.errors import DispatcherError
    try:
        return fn()
    except (DispatcherError, OSError, TimeoutError) as exc:
        raise Failed(what, str(exc)) from None


@app.command()
def demo(jobs: int = typer.Option(200, "--jobs", min=1, max=100_000),
         json_out: bool = typer.Option(False, "--json", help="Print the summary as one JSON object"),
         data_dir: pathlib.Path | None = typer.Option(None, "--data-dir", help="Default: a fresh temporary dir"),
         verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Run a mixed workload over three simulated clusters and summarise it."""
    _logging(verbose)
    from devstack.demo import run_demo
    ok = _start("demo", lambda: run_demo(jobs=jobs, data_dir=data_dir, json_out=json_out))
    raise typer.Exit(0 if ok else 1)


@dispatcher_app.command("serve")
def dispatcher_serve(
        database_url: str | None = typer.Option(None, "--database-url", envvar="SLUICE_DATABASE_URL",
                                                   help="Postgres URL; none: embedded server under --data-dir"),
        data_dir: pathlib.Path | None = typer.Option(None, "--data-dir", envvar="SLUICE_DATA_DIR"),
        listen: str = typer.Option("127.0.0.1:7070", "--listen"),
        migrate: bool = typer.Option(False, "--migrate", help="Bring the schema to head before serving"),
        metrics_listen: str = typer.Option("127.0.0.1:9464", "--metrics-listen", envvar="SLUICE_METRICS_LISTEN",
                                           help="HOST:PORT for Prometheus /metrics; '' serves none"),
        schedule: bool = typer.Option(True, "--schedule/--no-schedule",
                                      help="--no-schedule: serve the API and agents only, never lead; the "
                                           "scheduling replicas then need no client or agent traffic"),
        scheduler_process: bool = typer.Option(
            True, "--scheduler-process/--scheduler-thread", envvar="SLUICE_SCHEDULER_PROCESS",
            help="Run the scheduler in a child process of its own, so that its cycles never hold up calls and "
                 "agents (default); --scheduler-thread: on a thread of the serving process"),
        tls_cert: pathlib.Path | None = typer.Option(None, "--tls-cert", envvar="SLUICE_TLS_CERT",
                                                     help="PEM certificate (chain) served on every port"),
        tls_key: pathlib.Path | None = typer.Option(None, "--tls-key", envvar="SLUICE_TLS_KEY",
                                                    help="PEM private key of --tls-cert"),
        client_ca: pathlib.Path | None = typer.Option(None, "--client-ca", envvar="SLUICE_CLIENT_CA",
                                                      help="PEM CA whose client certificates authenticate agents "
                                                           "on --agent-listen (mTLS)"),
        agent_listen: str = typer.Option("", "--agent-listen", envvar="SLUICE_AGENT_LISTEN",
                                         help="HOST:PORT where agents authenticate with client certificates "
                                              "(needs --client-ca); '' serves none"),
        insecure: bool = typer.Option(False, "--insecure", envvar="SLUICE_INSECURE",
                                      help="Plaintext, without TLS: only on a loopback --listen"),
        health_listen: str = typer.Option("", "--health-listen", envvar="SLUICE_HEALTH_LISTEN",
                                          help="HOST:PORT serving only the gRPC health check, in plaintext (for "
                                               "the kubelet's probes, which cannot speak TLS); '' serves none"),
        oidc_issuer: str = typer.Option("", "--oidc-issuer", envvar="SLUICE_OIDC_ISSUER",
                                        help="Accept JWTs of this OIDC issuer (their iss) beside Sluice's tokens"),
        oidc_audience: str = typer.Option("", "--oidc-audience", envvar="SLUICE_OIDC_AUDIENCE",
                                          help="The aud the issuer's tokens must carry"),
        oidc_jwks: str = typer.Option("", "--oidc-jwks", envvar="SLUICE_OIDC_JWKS",
                                      help="The issuer's keys (JWKS): a file, or an https:// URL"),
        oidc_ca: str = typer.Option("", "--oidc-ca", envvar="SLUICE_OIDC_CA",
                                    help="PEM file of the CA that signed an https --oidc-jwks URL's certificate "
                                         "(default: the system's roots)"),
        oidc_user_claim: str = typer.Option("sub", "--oidc-user-claim", envvar="SLUICE_OIDC_USER_CLAIM",
                                            help="The claim naming the user"),
        oidc_groups_claim: str = typer.Option("groups", "--oidc-groups-claim", envvar="SLUICE_OIDC_GROUPS_CLAIM",
                                              help="The claim listing the user's groups"),
        oidc_group_queues: list[str] = typer.Option(
            [], "--oidc-group-queues", metavar="GROUP=QUEUE[,QUEUE...]",
            help="Members of GROUP are members of these queues (repeatable)"),
        oidc_admin_groups: list[str] = typer.Option([], "--oidc-admin-group", metavar="GROUP",
                                                    help="Members of GROUP are admins (repeatable)"),
        # The three defaults are ServerSettings' (tests/unit/test_cli_defaults.py holds them equal).
        watch_streams: int = typer.Option(10_000, "--watch-streams", min=0,
                                          envvar="SLUICE_WATCH_STREAMS",
                                          help="Watch streams open at once, in all (0: no limit)"),
        watch_streams_per_user: int = typer.Option(100, "--watch-streams-per-user",
                                                   min=0, envvar="SLUICE_WATCH_STREAMS_PER_USER",
                                                   help="Watch streams one user may have open (0: no limit)"),
        agent_admissions: float = typer.Option(200.0, "--agent-admissions-per-s",
                                               min=0, envvar="SLUICE_AGENT_ADMISSIONS_PER_S",
                                               help="Agent connections admitted a second, after a burst of as "
                                                    "many (0: no limit)"),
        heartbeat_s: int = typer.Option(1, "--heartbeat-s", min=1, envvar="SLUICE_HEARTBEAT_S",
                                        help="Seconds between an agent's capacity reports (told to each agent "
                                             "when it connects); longer with many clusters: 5 for a thousand"),
        unreachable_after_s: float | None = typer.Option(
            None, "--unreachable-after-s", min=0.1, envvar="SLUICE_UNREACHABLE_AFTER_S",
            help="A cluster whose agent sent nothing this long takes no new jobs [default: three heartbeats, "
                 "5 s at least]"),
        verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Serve the API and run the scheduler (when this replica is the leader).

    TLS on every port: give --tls-cert and --tls-key (`sluice dispatcher certs` makes them), or --insecure
    for plaintext on loopback. Changed certificate files are picked up without a restart."""
    _logging(verbose)
    from dispatcher.api.oidc import OidcSettings
    from dispatcher.scheduler.settings import SchedulerSettings
    from dispatcher.server import Dispatcher, ServerSettings
    from dispatcher.store.database import DatabaseSettings
    from sluice.serving import ServerTls
    if insecure and (tls_cert or tls_key or client_ca):
        raise typer.BadParameter("--insecure is plaintext: give it without --tls-cert, --tls-key and --client-ca")
    if agent_listen and not client_ca:
        raise typer.BadParameter("--agent-listen needs --client-ca (the CA that signs the agents' certificates)")
    tls = None if insecure else ServerTls(tls_cert, tls_key, client_ca)
    identity = OidcSettings(issuer=oidc_issuer, audience=oidc_audience, jwks=oidc_jwks, ca=oidc_ca,
                            user_claim=oidc_user_claim, groups_claim=oidc_groups_claim,
                            group_queues=_group_queues(oidc_group_queues), admin_groups=tuple(oidc_admin_groups))
    if not oidc_issuer and (oidc_audience or oidc_jwks or oidc_ca or oidc_group_queues or oidc_admin_groups):
        raise typer.BadParameter("the other --oidc-* options need --oidc-issuer")
    if problems := identity.problems():
        raise typer.BadParameter("; ".join(problems))
    unreachable_after_s = unreachable_after_s or max(SchedulerSettings.unreachable_after_s, 3.0 * heartbeat_s)
    if unreachable_after_s < 2 * heartbeat_s:
        raise typer.BadParameter(f"--unreachable-after-s {unreachable_after_s:g} is less than two heartbeats "
                                 f"(--heartbeat-s {heartbeat_s}): every cluster would be unreachable between two of "
                                 f"its heartbeats")
    if not insecure and not (tls_cert and tls_key):
        raise Failed("dispatcher serve", "no TLS certificate: give --tls-cert and --tls-key (`sluice dispatcher "
                                         "certs` makes them), or --insecure for plaintext on a loopback address")
    settings = ServerSettings(listen=listen, migrate=migrate, metrics_listen=metrics_listen or None, schedule=schedule,
                              scheduler_process=scheduler_process,
                              tls=tls, agent_listen=agent_listen or None, health_listen=health_listen or None,
                              database=DatabaseSettings(url=database_url, data_dir=_data_dir(data_dir)),
                              identity=identity, watch_streams=watch_streams,
                              watch_streams_per_user=watch_streams_per_user, agent_admissions_per_s=agent_admissions,
                              heartbeat_s=heartbeat_s,
                              scheduler=SchedulerSettings(unreachable_after_s=unreachable_after_s))
    server = _start("dispatcher serve", lambda: Dispatcher(settings).start())
    metrics = f", metrics on {server.metrics_server.address}" if server.metrics_server else ""
    agents = f", agents with certificates on port {server.agent_port}" if server.agent_port else ""
    how = "plaintext" if insecure else "TLS"
    _serve_until_interrupted(server.stop, ready=f"serving on {server.address}{metrics}{agents} ({how})")


def _group_queues(values: list[str]) -> dict[str, tuple[str, ...]]:
    """--oidc-group-queues GROUP=QUEUE[,QUEUE...], repeated: each group's queues."""
    out: dict[str, tuple[str, ...]] = {}
    for value in values:
        group, _, queues = value.partition("=")
        names = tuple(q.strip() for q in queues.split(",") if q.strip())
        if not group.strip() or not names:
            raise typer.BadParameter(f"--oidc-group-queues: {value!r} is not GROUP=QUEUE[,QUEUE...]")
        out[group.strip()] = out.get(group.strip(), ()) + names
    return out


@dispatcher_app.command("migrate")
def dispatcher_migrate(
        database_url: str | None = typer.Option(None, "--database-url", envvar="SLUICE_DATABASE_URL"),
        data_dir: pathlib.Path | None = typer.Option(None, "--data-dir", envvar="SLUICE_DATA_DIR")) -> None:
    """Bring the database schema to the newest revision."""
    from dispatcher.store import database
    settings = database.DatabaseSettings(url=database_url, data_dir=_data_dir(data_dir))

    def run():
        db = database.connect(settings)
        try:
            before = database.current_revision(db.engine)
            database.migrate(db.engine)
            return before, database.current_revision(db.engine)
        finally:
            db.close()
    before, after = _start("dispatcher migrate", run)
    print(f"schema {before or 'empty'} -> {after}")


@dispatcher_app.command("certs")
def dispatcher_certs(
        directory: pathlib.Path = typer.Option(..., "--dir", help="Where the CA and certificates are kept"),
        host: list[str] = typer.Option([], "--host", help="A DNS name or IP address clients dial the dispatcher "
                                                           "by (repeat); writes dispatcher.crt/.key"),
        cluster: list[str] = typer.Option([], "--cluster", help="An agent certificate for this cluster "
                                                                 "(repeat); writes agent-<cluster>.crt/.key")) -> None:
    """Make a CA (once: ca.crt, ca.key) and certificates it signs: the dispatcher's, and agents' (mTLS).

    Run again with the same --dir to rotate: the CA is kept, the certificates named are issued anew, and a
    running dispatcher picks its new ones up at the next connection."""
    from sluice import certs
    if not host and not cluster:
        raise typer.BadParameter("give --host (a dispatcher certificate) and/or --cluster (an agent certificate)")
    ca_cert, ca_key = directory / "ca.crt", directory / "ca.key"

    def run() -> list[pathlib.Path]:
        written = []
        if not (ca_cert.exists() and ca_key.exists()):
            certs.make_ca().write(ca_cert, ca_key)
            written.append(ca_cert)
        ca = certs.load(ca_cert, ca_key)
        if host:
            certs.make_server(ca, host).write(directory / "dispatcher.crt", directory / "dispatcher.key")
            written.append(directory / "dispatcher.crt")
        for name in cluster:
            certs.make_agent(ca, name).write(directory / f"agent-{name}.crt", directory / f"agent-{name}.key")
            written.append(directory / f"agent-{name}.crt")
        return written
    try:
        written = run()
    except ValueError as exc:
        raise Failed("dispatcher certs", f"{ca_cert} or {ca_key} is not a usable CA: {exc}") from None
    except OSError as exc:
        raise Failed("dispatcher certs", f"{exc.filename or directory}: {exc.strerror or exc}") from None
    for path in written:
        print(f"wrote {path} (key beside it)" if path.name != "ca.crt" else f"wrote {path} and {ca_key}")


@dispatcher_app.command("token")
def dispatcher_token(
        role: str = typer.Option(..., "--role", help="admin, user or agent"),
        subject: str = typer.Option(..., "--subject", help="User name, or the agent's name"),
        cluster: str | None = typer.Option(None, "--cluster", help="The cluster an agent token is bound to"),
        database_url: str | None = typer.Option(None, "--database-url", envvar="SLUICE_DATABASE_URL"),
        data_dir: pathlib.Path | None = typer.Option(None, "--data-dir", envvar="SLUICE_DATA_DIR")) -> None:
    """Create an API token directly in the database (bootstrap); prints the secret once."""
    from dispatcher.services import administering
    from dispatcher.store import database, tokens
    if role not in tokens.ROLES:
        raise typer.BadParameter(f"--role must be one of {', '.join(tokens.ROLES)}")
    if (role == "agent") != bool(cluster):
        raise typer.BadParameter("--cluster is required for agent tokens and only for them")

    def run():
        db = database.connect(database.DatabaseSettings(url=database_url, data_dir=_data_dir(data_dir)))
        try:
            database.check_schema(db.engine)
            with db.sessions().begin() as session:
                if cluster:
                    administering.require_cluster(session, cluster)
                return tokens.create(session, role, subject, cluster)
        finally:
            db.close()
    print(_start("dispatcher token", run))


@agent_app.command("run")
def agent_run(cluster: str = typer.Option(..., "--cluster"),
              dispatcher: str = typer.Option(..., "--dispatcher",
                                             help="HOST:PORT[,HOST:PORT...] (replicas, tried in turn)"),
              token_file: pathlib.Path | None = typer.Option(None, "--token-file",
                                                             help="The agent token; not needed with --tls-cert"),
              ca: pathlib.Path | None = typer.Option(None, "--ca", envvar="SLUICE_CA",
                                                     help="PEM CA to verify the dispatcher by (default: the "
                                                          "system's trusted roots)"),
              tls_cert: pathlib.Path | None = typer.Option(None, "--tls-cert", envvar="SLUICE_TLS_CERT",
                                                           help="PEM client certificate naming this cluster "
                                                                "(mTLS, to the dispatcher's --agent-listen port)"),
              tls_key: pathlib.Path | None = typer.Option(None, "--tls-key", envvar="SLUICE_TLS_KEY"),
              insecure: bool = typer.Option(False, "--insecure", help="Plaintext, to a loopback dispatcher only"),
              backend: str = typer.Option("sim", "--backend", help="sim (in-process simulated cluster) or kubernetes"),
              kubeconfig: pathlib.Path | None = typer.Option(
                  None, "--kubeconfig",
                  help="kubernetes: kubeconfig file (default: the in-cluster service account inside a pod, "
                       "else ~/.kube/config)"),
              context: str | None = typer.Option(None, "--context", help="kubernetes: kubeconfig context"),
              sim_nodes: int = typer.Option(4, "--sim-nodes", min=1),
              sim_node: str = typer.Option("cpu=32,memory=128Gi", "--sim-node", help="Per-node capacity"),
              metrics_listen: str = typer.Option("127.0.0.1:9465", "--metrics-listen",
                                                 envvar="SLUICE_AGENT_METRICS_LISTEN",
                                                 help="HOST:PORT for the agent's /metrics ('' turns it off)"),
              metrics_tls_cert: pathlib.Path | None = typer.Option(
                  None, "--metrics-tls-cert", envvar="SLUICE_AGENT_METRICS_TLS_CERT",
                  help="Certificate to serve /metrics with over HTTPS (default off loopback: one of its own, "
                       "made at start, which scrapers cannot verify)"),
              metrics_tls_key: pathlib.Path | None = typer.Option(None, "--metrics-tls-key",
                                                                  envvar="SLUICE_AGENT_METRICS_TLS_KEY"),
              verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Connect this cluster's agent to a dispatcher and run its jobs, until Ctrl-C."""
    _logging(verbose)
    if backend not in ("sim", "kubernetes"):
        raise typer.BadParameter(f"backend {backend!r} is not available; use sim or kubernetes")
    if backend == "sim" and (context is not None or kubeconfig is not None):
        raise typer.BadParameter("--kubeconfig and --context are for --backend kubernetes")
    if bool(tls_cert) != bool(tls_key):
        raise typer.BadParameter("--tls-cert and --tls-key go together")
    if bool(metrics_tls_cert) != bool(metrics_tls_key):
        raise typer.BadParameter("--metrics-tls-cert and --metrics-tls-key go together")
    if token_file is None and tls_cert is None:
        raise typer.BadParameter("give --token-file, or --tls-cert and --tls-key (a certificate naming the cluster)")
    if insecure and (ca or tls_cert):
        raise typer.BadParameter("--insecure is plaintext: give it without --ca, --tls-cert and --tls-key")
    from agent.connection import Agent, AgentSettings, dispatcher_addresses
    from sluice import transport
    from sluice.quantity import QuantityError, parse_resources
    token = ""
    if token_file is not None:
        token, why = _read_token(token_file)
        if why is not None:
            raise Failed(f"agent run --token-file {token_file}", why)
    tls = transport.Tls(ca=str(ca) if ca else None, cert=str(tls_cert) if tls_cert else None,
                        key=str(tls_key) if tls_key else None, insecure=insecure)
    for address in dispatcher_addresses(dispatcher):
        try:  # the files and the address are checked now: a mistake is reported, not retried for ever
            transport.channel(address, tls).close()
        except transport.TransportError as exc:
            raise Failed("agent run", str(exc)) from None
    if backend == "kubernetes":
        from agent.backends.kubernetes.api import ConfigError
        from agent.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings
        try:
            cluster_backend = KubernetesBackend(KubernetesSettings(
                kubeconfig=str(kubeconfig) if kubeconfig is not None else None, context=context))
        except ConfigError as exc:
            raise Failed("agent run --backend kubernetes", str(exc)) from None
    else:
        from agent.backends.sim.cluster import SimCluster, SimConfig
        try:
            node = parse_resources(dict(item.split("=", 1) for item in sim_node.split(",") if item))
        except (ValueError, QuantityError) as exc:
            raise Failed("agent run --sim-node", str(exc)) from None
        cluster_backend = SimCluster(SimConfig(nodes=sim_nodes, node=node, name=cluster))
    agent = Agent(AgentSettings(cluster, dispatcher, token, tls=tls), cluster_backend)
    server = None
    own_tls = tempfile.TemporaryDirectory(prefix="sluice-agent-metrics-")  # removed, key and all, at the end
    if metrics_listen:
        from sluice import serving
        from sluice.transport import host_of
        try:
            metrics_tls = serving.ServerTls(metrics_tls_cert, metrics_tls_key) if metrics_tls_cert else None
            if metrics_tls is None and not serving.is_loopback(metrics_listen):
                metrics_tls = serving.self_signed(pathlib.Path(own_tls.name), host_of(metrics_listen))
            server = serving.MetricsServer(metrics_listen, agent.metrics.registry, metrics_tls)
        except OSError as exc:
            own_tls.cleanup()
            raise Failed(f"agent run --metrics-listen {metrics_listen}", str(exc)) from None
        print(f"agent metrics on {server.url}", file=sys.stderr, flush=True)
    agent.start()

    def stop() -> None:
        agent.stop()
        if server is not None:
            server.stop()
        own_tls.cleanup()
    _serve_until_interrupted(stop)
