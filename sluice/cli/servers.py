"""The commands that run a server: `sluice up`, `demo`, `dispatcher serve|migrate|token`, `agent run`.

Each imports devstack, dispatcher or agent inside its body, so the user's commands load none of them.
"""
from __future__ import annotations

import pathlib
import sys

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
        done.wait()
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
                                            "clusters"),
       verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Run everything locally: embedded Postgres, a dispatcher and sim agents, until Ctrl-C."""
    _logging(verbose)
    from devstack.embedded import Embedded, UpSettings, load_config, summary_line
    from sluice.spec import SpecError
    try:
        objects = load_config(config)
    except (OSError, SpecError) as exc:
        raise Failed(f"up --config {config}", str(exc)) from None
    embedded = _start("up", lambda: Embedded(UpSettings(_data_dir(data_dir), listen, prometheus=prometheus),
                                             objects).start())
    print(summary_line(embedded), end="", flush=True)
    _serve_until_interrupted(embedded.stop, ready="ready: Ctrl-C stops")


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
        verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Serve the API and run the scheduler (when this replica is the leader)."""
    _logging(verbose)
    from dispatcher.server import Dispatcher, ServerSettings
    from dispatcher.store.database import DatabaseSettings
    settings = ServerSettings(listen=listen, migrate=migrate, metrics_listen=metrics_listen or None, schedule=schedule,
                              database=DatabaseSettings(url=database_url, data_dir=_data_dir(data_dir)))
    server = _start("dispatcher serve", lambda: Dispatcher(settings).start())
    metrics = f", metrics on {server.metrics_server.address}" if server.metrics_server else ""
    _serve_until_interrupted(server.stop, ready=f"serving on {server.address}{metrics}")


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
              token_file: pathlib.Path = typer.Option(..., "--token-file"),
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
              verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Connect this cluster's agent to a dispatcher and run its jobs, until Ctrl-C."""
    _logging(verbose)
    if backend not in ("sim", "kubernetes"):
        raise typer.BadParameter(f"backend {backend!r} is not available; use sim or kubernetes")
    if backend == "sim" and (context is not None or kubeconfig is not None):
        raise typer.BadParameter("--kubeconfig and --context are for --backend kubernetes")
    from agent.connection import Agent, AgentSettings
    from sluice.quantity import QuantityError, parse_resources
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise Failed(f"agent run --token-file {token_file}", exc.strerror or str(exc)) from None
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
        cluster_backend = SimCluster(SimConfig(nodes=sim_nodes, node=node))
    agent = Agent(AgentSettings(cluster, dispatcher, token), cluster_backend)
    server = None
    if metrics_listen:
        from agent.metrics import serve
        host, _, port = metrics_listen.rpartition(":")
        try:
            server, bound = serve(agent.metrics.registry, host or "127.0.0.1", int(port))
        except (OSError, ValueError) as exc:
            raise Failed(f"agent run --metrics-listen {metrics_listen}", str(exc)) from None
        print(f"agent metrics on {host or '127.0.0.1'}:{bound}", file=sys.stderr, flush=True)
    agent.start()

    def stop() -> None:
        agent.stop()
        if server is not None:
            server.stop()
    _serve_until_interrupted(stop)
