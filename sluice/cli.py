"""The `sluice` command line.

Client commands (submit, get, list, describe, cancel, watch, clusters, queues, usage) import only the light
client (grpc, the stubs, the spec model); server commands (up, demo, dispatcher, agent) import the
server side inside their own bodies. Errors print one line, `error: <what>: <why>`, and exit 1; usage
errors exit 2.
"""
from __future__ import annotations

import pathlib
import sys
from typing import List, Optional

import typer

from sluice import grpc_defaults

grpc_defaults.apply()  # before sluice.admin_cli imports grpc: `sluice up` and `sluice dispatcher serve` serve it

from sluice.admin_cli import app as admin_app  # noqa: E402
from sluice.output import Format, ReportFormat, emit, emit_csv, error, table  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Sluice: queue whole jobs, place them across clusters by capacity and policy.")
dispatcher_app = typer.Typer(no_args_is_help=True, help="Run or maintain a dispatcher (server side).")
agent_app = typer.Typer(no_args_is_help=True, help="Run a cluster agent.")
app.add_typer(dispatcher_app, name="dispatcher")
app.add_typer(agent_app, name="agent")
app.add_typer(admin_app, name="admin")

JOB_COLUMNS = [("ID", "id"), ("NAME", "name"), ("QUEUE", "queue"), ("CLASS", "serviceClass"), ("STATE", "state"),
               ("CLUSTER", "cluster"), ("ATTEMPT", "attempt"), ("REASON", "reason")]
OutputOpt = typer.Option(Format.table, "--output", "-o", help="table, json or yaml")


class Failed(Exception):
    """A command failed in a way the user should read: printed as one line, exit 1."""

    def __init__(self, what: str, why: str):
        super().__init__(why)
        self.what, self.why = what, why


@app.callback()
def main_options(ctx: typer.Context,
                 config: Optional[pathlib.Path] = typer.Option(
                     None, "--config", envvar="SLUICE_CONFIG",
                     help="Client config (address, token); default ~/.config/sluice/client.yaml")) -> None:
    ctx.obj = {"config": config}


def _client(ctx: typer.Context, what: str, client_class=None):
    from sluice.client import Client
    from sluice.config import ConfigError, load
    try:
        return (client_class or Client)(load(ctx.obj.get("config") if ctx.obj else None))
    except ConfigError as exc:
        raise Failed(what, str(exc)) from None


def _call(what: str, fn):
    from sluice.client import ClientError
    try:
        return fn()
    except ClientError as exc:
        if exc.code == "UNAVAILABLE":
            raise Failed(what, f"dispatcher unavailable: {exc.message}") from None
        raise Failed(what, exc.message) from None


def _job_id(value: str) -> int:
    try:
        job_id = int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a job id") from None
    if job_id <= 0:
        raise typer.BadParameter(f"{value!r} is not a job id")
    return job_id


# -- client commands --------------------------------------------------------------------------------
@app.command()
def submit(ctx: typer.Context,
           file: str = typer.Option(..., "-f", "--file", help="Job file (YAML/JSON, many documents); - reads stdin"),
           queue: Optional[str] = typer.Option(None, "--queue", help="Queue for jobs that name none (overrides)"),
           service_class: Optional[str] = typer.Option(None, "--class", help="Service class (overrides)"),
           wait: bool = typer.Option(False, "--wait", help="Wait until every job ends; exit 1 unless all succeed"),
           output: Format = typer.Option(Format.table, "--output", "-o")) -> None:
    """Submit jobs; prints their ids."""
    from sluice.spec import SpecError, load_jobs
    what = f"submit {file}"
    try:
        text = sys.stdin.read() if file == "-" else pathlib.Path(file).read_text()
    except OSError as exc:
        raise Failed(what, exc.strerror or str(exc)) from None
    try:
        specs = load_jobs(text, queue=queue, service_class=service_class, source=None)  # `what` names the file
    except SpecError as exc:
        raise Failed(what, str(exc)) from None
    if not specs:
        raise Failed(what, "the file holds no jobs")
    client = _client(ctx, what)
    ids = _call(what, lambda: client.submit(specs))
    if output == Format.table:
        print("\n".join(str(i) for i in ids))
    else:
        emit(ids, output)
    if wait:
        final = _wait_for(client, ids, what)
        failed = [j for j in final if j["state"] != "SUCCEEDED"]
        for j in failed:
            error(f"job {j['id']}", f"{j['state']}: {j['reason']}")
        if failed:
            raise typer.Exit(1)


def _wait_for(client, ids: list[int], what: str) -> list[dict]:
    remaining = set(ids)
    final: dict[int, dict] = {}
    for job_id in list(remaining):
        job = _call(what, lambda: client.get(job_id))
        if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            final[job_id] = job
            remaining.discard(job_id)
    if remaining:
        for event in _call(what, lambda: client.watch()):
            if event["jobId"] in remaining and event["to"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                remaining.discard(event["jobId"])
                final[event["jobId"]] = _call(what, lambda: client.get(event["jobId"]))
                if not remaining:
                    break
    return [final[i] for i in ids]


@app.command()
def get(ctx: typer.Context, job: str = typer.Argument(..., help="Job id"), output: Format = OutputOpt) -> None:
    """Show one job."""
    job_id = _job_id(job)
    client = _client(ctx, f"get {job}")
    emit(_call(f"get {job}", lambda: client.get(job_id)), output, JOB_COLUMNS)


@app.command("list")
def list_jobs(ctx: typer.Context, queue: str = typer.Option("", "--queue"), state: str = typer.Option("", "--state"),
              limit: int = typer.Option(100, "--limit", min=0, help="0: all"), output: Format = OutputOpt) -> None:
    """List jobs, oldest first."""
    client = _client(ctx, "list")
    emit(_call("list", lambda: client.list(queue=queue, state=state.upper(), limit=limit)), output, JOB_COLUMNS)


@app.command()
def describe(ctx: typer.Context, job: str = typer.Argument(...), output: Format = OutputOpt) -> None:
    """Show a job with its events, its place in the queue and why it waits."""
    job_id = _job_id(job)
    client = _client(ctx, f"describe {job}")
    info = _call(f"describe {job}", lambda: client.describe(job_id))
    if output != Format.table:
        emit(info, output)
        return
    for key in ("id", "name", "queue", "serviceClass", "priority", "state", "cluster", "attempt", "createdAt",
                "dispatchedAt", "startedAt", "finishedAt", "submittedBy"):
        print(f"{key + ':':<14}{info[key] if info[key] is not None else '-'}")
    if info["state"] == "QUEUED":
        print(f"{'position:':<14}{info['queuePosition']} in queue {info['queue']}")
    print(f"{'reason:':<14}{info['reason']}")
    print("events:")
    print(_indent(table(
        info["events"], [("AT", "at"), ("ATTEMPT", "attempt"), ("FROM", "from"), ("TO", "to"),
                         ("CLUSTER", "cluster"), ("REASON", "reason")])))


@app.command()
def explain(ctx: typer.Context, job: str = typer.Argument(...), output: Format = OutputOpt) -> None:
    """Why a job waits: its queue's quota verdict and, per cluster, why it cannot start there."""
    job_id = _job_id(job)
    client = _client(ctx, f"explain {job}")
    info = _call(f"explain {job}", lambda: client.explain(job_id))
    if output != Format.table:
        emit(info, output)
        return
    print(f"job {info['id']} ({info['state']}, queue {info['queue']}"
          + (f", position {info['queuePosition']}" if info["queuePosition"] else "") + ")")
    print(f"reason: {info['reason']}")
    print(f"quota:  {info['quota']}")
    print(_indent(table(info["clusters"], [("CLUSTER", "cluster"), ("VERDICT", "verdict")])))
    for b in info["bursts"]:
        print(f"attempt {b['attempt']} burst to {b['cluster']} under policy {b['policy']}: {b['trigger']}")
        starts = f", started after {b['startsInSeconds']:g}s of provisioning" if b["startsInSeconds"] else ""
        print(f"  expected cost {b['expectedCost']:.2f} ({b['ratePerHour']:.2f}/h for {b['expectedHours']:g}h){starts}")
        print(_indent(table(b["alternatives"], [("PAID CLUSTER", "cluster"), ("VERDICT", "verdict")])))


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


@app.command()
def cancel(ctx: typer.Context, jobs: List[str] = typer.Argument(..., help="Job ids"), output: Format = OutputOpt) -> None:
    """Cancel jobs: queued ones at once, running ones are stopped in their cluster."""
    ids = [_job_id(j) for j in jobs]
    client = _client(ctx, "cancel")
    emit(_call(f"cancel {' '.join(jobs)}", lambda: client.cancel(ids)), output, JOB_COLUMNS)


@app.command()
def watch(ctx: typer.Context, job: Optional[str] = typer.Argument(None, help="Only this job"),
          after: int = typer.Option(0, "--after", help="Resume after this event id"),
          output: Format = OutputOpt) -> None:
    """Follow job events as they happen (Ctrl-C to stop)."""
    import json
    job_id = _job_id(job) if job else 0
    client = _client(ctx, "watch")
    try:
        for event in _call("watch", lambda: client.watch(job_id, after)):
            if output == Format.table:
                print(f"{event['at']}  #{event['id']}  job {event['jobId']} attempt {event['attempt']}  "
                      f"{event['from'] or '-'} -> {event['to']}  {event['cluster'] or ''}  {event['reason']}", flush=True)
            else:
                print(json.dumps(event), flush=True)
    except KeyboardInterrupt:
        pass


@app.command()
def clusters(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Clusters with their state, capacity source and free capacity."""
    client = _client(ctx, "clusters")
    emit(_call("clusters", client.clusters), output,
         [("NAME", "name"), ("TIER", "tier"), ("SITE", "site"), ("STATE", "state"), ("SOURCE", "capacitySource"),
          ("AGE", "capacityAgeSeconds"), ("FREE", "free"), ("ALLOCATABLE", "allocatable"), ("JOBS", "runningJobs")])


@app.command()
def queues(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Queues with their quota and use."""
    client = _client(ctx, "queues")
    emit(_call("queues", client.queues), output,
         [("NAME", "name"), ("PARENT", "parent"), ("QUEUED", "queuedJobs"), ("RUNNING", "runningJobs"),
          ("USED", "used"), ("GUARANTEED", "guaranteed"), ("MAX", "max")])


USAGE_GROUPINGS = ("queue", "class", "cluster", "user")
# The unit of an hour of each resource, for table headers (others: unit-hours).
HOUR_UNITS = {"cpu": "core-h", "memory": "GiB-h", "nvidia.com/gpu": "GPU-h"}


def _since(value: str) -> float:
    """--since: a duration back from now, or 'all'; as seconds, 0 meaning all time."""
    from sluice.quantity import QuantityError, parse_duration
    if value.strip().lower() == "all":
        return 0.0
    try:
        seconds = parse_duration(value)
    except QuantityError as exc:
        raise typer.BadParameter(f"{exc}, or 'all'") from None
    if seconds <= 0:
        raise typer.BadParameter(f"{value!r} is an empty window; use a duration such as '30d', or 'all'")
    return seconds


def _valid_since(value: str) -> str:
    _since(value)
    return value


def _by(value: str) -> str:
    if value not in USAGE_GROUPINGS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(USAGE_GROUPINGS)}")
    return value


def _rounded(value):
    """Floats to 6 decimals (a micro-unit of money, 3.6 ms of an hour): no binary noise in reports."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


@app.command()
def usage(ctx: typer.Context,
          since: str = typer.Option("30d", "--since", callback=_valid_since,
                                    help="The window: this long back from now (90m, 12h, 30d), or 'all'"),
          by: str = typer.Option("queue", "--by", callback=_by, help="Group by queue, class, cluster or user"),
          output: ReportFormat = typer.Option(ReportFormat.table, "--output", "-o", help="table, json, yaml or csv")
          ) -> None:
    """Chargeback: resource-hours and cost (cluster price x class multiplier) per group, from the attempts."""
    since_s = _since(since)
    client = _client(ctx, "usage")
    info = _call("usage", lambda: client.usage(since_s=since_s, by=by))
    resources = list(info["total"]["resourceHours"])
    if output == ReportFormat.csv:
        emit_csv([{"group": g["group"], "cost": _rounded(g["cost"]), "attempts": g["attempts"],
                   **{r: _rounded(g["resourceHours"].get(r, 0.0)) for r in resources}} for g in info["groups"]],
                 ["group", "cost", "attempts", *resources])
        return
    if output != ReportFormat.table:
        emit(_rounded(info), Format(output.value))
        return
    window = f"since {info['since']}" if info["since"] else "all time"
    print(f"usage by {info['by']}, {window} until {info['until']}")
    rows = [*info["groups"], {"group": "TOTAL", **info["total"]}]
    cells = [{"group": r["group"], "attempts": r["attempts"], "cost": f"{r['cost']:.2f}",
              **{res: f"{r['resourceHours'].get(res, 0.0):.2f}" for res in resources}} for r in rows]
    print(table(cells, [(info["by"].upper(), "group"), ("ATTEMPTS", "attempts"),
                        *[(f"{res.upper()} ({HOUR_UNITS.get(res, 'unit-h')})", res) for res in resources],
                        (f"COST ({info['currency']})", "cost")]))
    if info["burst"]:
        print(f"\nburst spend against budgets ({info['currency']}; the budget day is the UTC day)")
        limit = lambda value, fmt: "-" if value is None else fmt.format(value)
        cells = [{"policy": b["policy"], "queue": b["queue"] or "(all)", "attempts": b["attempts"],
                  "window": f"{b['spentInWindow']:.2f}",
                  "today": f"{b['spentToday']:.2f} / {limit(b['budgetPerDay'], '{:.2f}')}",
                  "rate": f"{b['ratePerHour']:.2f} / {limit(b['budgetPerHour'], '{:.2f}')}",
                  "resources": ", ".join(f"{r} {b['resourcesInUse'].get(r, '0')} / {cap}"
                                         for r, cap in b["maxResources"].items()) or "-"} for b in info["burst"]]
        print(table(cells, [("POLICY", "policy"), ("QUEUE", "queue"), ("ATTEMPTS", "attempts"),
                            ("SPENT IN WINDOW", "window"), ("TODAY / PER DAY", "today"),
                            ("RATE / PER HOUR", "rate"), ("IN USE / MAX", "resources")]))


# -- server commands --------------------------------------------------------------------------------
def _data_dir(value: Optional[pathlib.Path]) -> pathlib.Path:
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
def up(config: Optional[pathlib.Path] = typer.Option(None, "--config", help="Cluster/Queue/ServiceClass objects (YAML)"),
       data_dir: Optional[pathlib.Path] = typer.Option(None, "--data-dir", envvar="SLUICE_DATA_DIR"),
       listen: str = typer.Option("127.0.0.1:7070", "--listen", help="HOST:PORT for the dispatcher"),
       prometheus: bool = typer.Option(False, "--prometheus",
                                       help="Run a real Prometheus (the `prometheus` binary) scraping the sim clusters"),
       verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Run everything locally: embedded Postgres, a dispatcher and sim agents, until Ctrl-C."""
    _logging(verbose)
    from devstack.embedded import Embedded, UpSettings, load_config, summary_line
    from sluice.spec import SpecError
    try:
        objects = load_config(config)
    except (OSError, SpecError) as exc:
        raise Failed(f"up --config {config}", str(exc)) from None
    embedded = _start("up", lambda: Embedded(UpSettings(_data_dir(data_dir), listen, prometheus=prometheus), objects).start())
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
         data_dir: Optional[pathlib.Path] = typer.Option(None, "--data-dir", help="Default: a fresh temporary dir"),
         verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Run a mixed workload over three simulated clusters and summarise it."""
    _logging(verbose)
    from devstack.demo import run_demo
    ok = _start("demo", lambda: run_demo(jobs=jobs, data_dir=data_dir, json_out=json_out))
    raise typer.Exit(0 if ok else 1)


@dispatcher_app.command("serve")
def dispatcher_serve(
        database_url: Optional[str] = typer.Option(None, "--database-url", envvar="SLUICE_DATABASE_URL",
                                                   help="Postgres URL; none: embedded server under --data-dir"),
        data_dir: Optional[pathlib.Path] = typer.Option(None, "--data-dir", envvar="SLUICE_DATA_DIR"),
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
        database_url: Optional[str] = typer.Option(None, "--database-url", envvar="SLUICE_DATABASE_URL"),
        data_dir: Optional[pathlib.Path] = typer.Option(None, "--data-dir", envvar="SLUICE_DATA_DIR")) -> None:
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
        cluster: Optional[str] = typer.Option(None, "--cluster", help="The cluster an agent token is bound to"),
        database_url: Optional[str] = typer.Option(None, "--database-url", envvar="SLUICE_DATABASE_URL"),
        data_dir: Optional[pathlib.Path] = typer.Option(None, "--data-dir", envvar="SLUICE_DATA_DIR")) -> None:
    """Create an API token directly in the database (bootstrap); prints the secret once."""
    from dispatcher.store import database, tokens
    from sqlalchemy.orm import Session
    if role not in tokens.ROLES:
        raise typer.BadParameter(f"--role must be one of {', '.join(tokens.ROLES)}")
    if (role == "agent") != bool(cluster):
        raise typer.BadParameter("--cluster is required for agent tokens and only for them")

    def run():
        db = database.connect(database.DatabaseSettings(url=database_url, data_dir=_data_dir(data_dir)))
        try:
            database.check_schema(db.engine)
            with Session(db.engine) as session, session.begin():
                return tokens.create(session, role, subject, cluster)
        finally:
            db.close()
    print(_start("dispatcher token", run))


@agent_app.command("run")
def agent_run(cluster: str = typer.Option(..., "--cluster"),
              dispatcher: str = typer.Option(..., "--dispatcher", help="HOST:PORT[,HOST:PORT...] (replicas, tried in turn)"),
              token_file: pathlib.Path = typer.Option(..., "--token-file"),
              backend: str = typer.Option("sim", "--backend", help="sim (in-process simulated cluster) or kubernetes"),
              kubeconfig: Optional[pathlib.Path] = typer.Option(
                  None, "--kubeconfig",
                  help="kubernetes: kubeconfig file (default: the in-cluster service account inside a pod, "
                       "else ~/.kube/config)"),
              context: Optional[str] = typer.Option(None, "--context", help="kubernetes: kubeconfig context"),
              sim_nodes: int = typer.Option(4, "--sim-nodes", min=1),
              sim_node: str = typer.Option("cpu=32,memory=128Gi", "--sim-node", help="Per-node capacity"),
              metrics_listen: str = typer.Option("127.0.0.1:9465", "--metrics-listen", envvar="SLUICE_AGENT_METRICS_LISTEN",
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
        from agent.backends.kube_api import ConfigError
        from agent.backends.kubernetes import KubernetesBackend, KubernetesSettings
        try:
            cluster_backend = KubernetesBackend(KubernetesSettings(
                kubeconfig=str(kubeconfig) if kubeconfig is not None else None, context=context))
        except ConfigError as exc:
            raise Failed("agent run --backend kubernetes", str(exc)) from None
    else:
        from agent.backends.sim import SimCluster, SimConfig
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


# typer vendors click: its UsageError is BadParameter's base, reached without a private import.
UsageError = typer.BadParameter.__mro__[1]


def main() -> None:
    try:
        code = app(standalone_mode=False, prog_name="sluice")
    except Failed as exc:
        error(exc.what, exc.why)
        sys.exit(1)
    except UsageError as exc:
        if exc.format_message():  # empty when help was printed for a bare group
            error(exc.ctx.command_path if exc.ctx else "sluice", exc.format_message())
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
