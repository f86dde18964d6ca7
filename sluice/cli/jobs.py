"""The user's commands: submit, get, list, describe, explain, cancel, logs, watch, clusters, queues, usage.

They import the client (grpc, the stubs) only inside their bodies.
"""
from __future__ import annotations

import re
from dataclasses import replace

import typer

from sluice.cli.common import Failed, OutputOpt, call, make_client, read_documents
from sluice.output import Format, ReportFormat, emit, emit_csv, error, table

app = typer.Typer()  # its commands join the root `sluice` app

JOB_COLUMNS = [("ID", "id"), ("NAME", "name"), ("QUEUE", "queue"), ("CLASS", "serviceClass"), ("STATE", "state"),
               ("CLUSTER", "cluster"), ("ATTEMPT", "attempt"), ("REASON", "reason")]


def _job_id(value: str) -> int:
    try:
        job_id = int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a job id") from None
    if not 0 < job_id < 1 << 63:  # ids are positive int64s
        raise typer.BadParameter(f"{value!r} is not a job id")
    return job_id


@app.command()
def submit(ctx: typer.Context,
           file: str = typer.Option(..., "-f", "--file", help="Job file (YAML/JSON, many documents); - reads stdin"),
           queue: str | None = typer.Option(None, "--queue",
                                            help="Queue of every job in the file: a queue a job names is replaced"),
           service_class: str | None = typer.Option(None, "--class", help="Service class of every job in the "
                                                    "file: a class a job names is replaced"),
           wait: bool = typer.Option(False, "--wait", help="Wait until every job ends; exit 1 unless all succeed"),
           key: str | None = typer.Option(None, "--idempotency-key",
                                          help="Name this submit: run again with the same key (within a day), "
                                               "it prints the same ids and creates nothing"),
           array: str | None = typer.Option(None, "--array", help="Submit each job as an array, as Slurm writes "
                                            "it: 0-99 (indexes 0 to 99), 0-99%10 (at most 10 at once), or a count"),
           start_after: str | None = typer.Option(None, "--start-after", help="Each job waits until this time "
                                                  "(2026-12-01T03:00:00Z) or for this long after the submit (30m)"),
           depends_on: list[str] = typer.Option([], "--depends-on", help="Each job waits for this job (an id or a "
                                                "name), as ID or ID:succeeded|failed|finished; repeat for more"),
           output: Format = typer.Option(Format.table, "--output", "-o")) -> None:
    """Submit jobs, all or none; prints their ids."""
    from sluice.documents import parse_numbered_documents
    from sluice.spec import job_from_document
    what = f"submit {file}"
    when = _when_options(what, array, start_after, depends_on)
    clients: list = []  # the one client, made when first needed

    def client_():
        if not clients:
            clients.append(make_client(ctx, what))
        return clients[0]
    plugin = (ctx.obj or {}).get("kubectl")  # `kubectl sluice`: a job naming no queue gets the namespace's
    default_queue = (lambda: plugin.queue(what, client_())) if plugin is not None and queue is None else None
    numbered = read_documents(what, file, lambda text: [
        (number, replace(job_from_document(doc, queue=queue, service_class=service_class, document=number,
                                           source=None, default_queue=default_queue), **when))
        for number, doc in parse_numbered_documents(text, source=None)])
    if not numbered:
        raise Failed(what, "the file holds no jobs")
    client = client_()
    ids = call(what, lambda: _in_file_terms([n for n, _ in numbered],
                                            lambda: client.submit([s for _, s in numbered], key=key)))
    if output == Format.table:
        print("\n".join(str(i) for i in ids))
    else:
        emit(ids, output)
    if wait:
        final = call(what, lambda: client.wait(ids))
        failed = [j for j in final if j["state"] != "SUCCEEDED"]
        for j in failed:
            error(f"job {j['id']}", f"{j['state']}: {j['reason']}")
        if failed:
            raise typer.Exit(1)


def _when_options(what: str, array: str | None, start_after: str | None, depends_on: list[str]) -> dict:
    """The JobSpec fields --array, --start-after and --depends-on set on every job of a file."""
    from sluice.spec import SpecError
    try:
        return _when_fields(array, start_after, depends_on)
    except SpecError as exc:
        raise Failed(what, str(exc)) from None


def _when_fields(array: str | None, start_after: str | None, depends_on: list[str]) -> dict:
    from sluice.spec import CONDITIONS, Dependency, SpecError, parse_array, parse_start_after
    out: dict = {}
    if array is not None:
        out["array"] = parse_array(array)
    if start_after is not None:
        out["start_after"] = parse_start_after(start_after, "--start-after")
    if depends_on:
        dependencies = []
        for text in depends_on:
            job, _, condition = text.partition(":")
            if not job or (condition and condition not in CONDITIONS):
                raise SpecError("--depends-on", f"{text!r}: write JOB or JOB:{'|'.join(CONDITIONS)}")
            dependencies.append(Dependency(int(job) if job.isdigit() else job, condition or "succeeded"))
        out["depends_on"] = tuple(dependencies)
    return out


def _in_file_terms(numbers: list[int], submit):
    """submit(), an error that names a document of the submit (`document 7: ...`) naming its place in the
    file instead (they differ after an empty document)."""
    from sluice.client import ClientError
    try:
        return submit()
    except ClientError as exc:
        found = re.match(r"document (\d+):", exc.message)
        if found and 0 < int(found[1]) <= len(numbers):
            raise ClientError(exc.code, f"document {numbers[int(found[1]) - 1]}:{exc.message[found.end():]}") \
                from None
        raise


@app.command()
def get(ctx: typer.Context, job: str = typer.Argument(..., help="Job id"), output: Format = OutputOpt) -> None:
    """Show one job."""
    job_id = _job_id(job)
    client = make_client(ctx, f"get {job}")
    emit(call(f"get {job}", lambda: client.get(job_id)), output, JOB_COLUMNS)


@app.command("list")
def list_jobs(ctx: typer.Context, queue: str = typer.Option("", "--queue"), state: str = typer.Option("", "--state"),
              user: str = typer.Option("", "--user", help="Only the jobs this user submitted"),
              cluster: str = typer.Option("", "--cluster", help="Only the jobs dispatched to this cluster"),
              name: str = typer.Option("", "--name", help="Only the jobs whose name contains this (any case)"),
              array: int = typer.Option(0, "--array", min=0, max=(1 << 63) - 1, help="Only the elements of this array"),
              limit: int = typer.Option(100, "--limit", min=0, help="0: all"), output: Format = OutputOpt) -> None:
    """List jobs, oldest first."""
    client = make_client(ctx, "list")
    plugin = (ctx.obj or {}).get("kubectl")
    if plugin is not None and not queue:  # `kubectl sluice list`: the namespace's queue, unless -A
        queue = plugin.queue("list", client) or ""
    emit(call("list", lambda: client.list(queue=queue, state=state.upper(), limit=limit, user=user, cluster=cluster,
                                          name=name, array=array)), output, JOB_COLUMNS)


def _job_view(ctx: typer.Context, verb: str, job: str, output: Format, read) -> dict | None:
    """A job's `verb` view, read(client, job_id): printed here as JSON or YAML (None), or returned for the
    caller's table."""
    job_id = _job_id(job)
    client = make_client(ctx, f"{verb} {job}")
    info = call(f"{verb} {job}", lambda: read(client, job_id))
    if output != Format.table:
        emit(info, output)
        return None
    return info


@app.command()
def describe(ctx: typer.Context, job: str = typer.Argument(...), output: Format = OutputOpt) -> None:
    """Show a job with its events, its place in the queue and why it waits."""
    info = _job_view(ctx, "describe", job, output, lambda client, job_id: client.describe(job_id))
    if info is None:
        return
    for key in ("id", "name", "queue", "serviceClass", "priority", "state", "cluster", "attempt", "createdAt",
                "dispatchedAt", "startedAt", "finishedAt", "submittedBy"):
        print(f"{key + ':':<14}{info[key] if info[key] is not None else '-'}")
    if info["state"] == "QUEUED":
        print(f"{'position:':<14}{info['queuePosition']} in queue {info['queue']}")
    if info["arrayId"] is not None:
        print(f"{'array:':<14}{info['arrayId']}, index {info['arrayIndex']}")
    if info["interactive"]:
        print(f"{'session:':<14}interactive: `sluice attach {info['id']}` keeps it and says how to reach it")
    current = next((a for a in info["attempts"] if a["attempt"] == info["attempt"]), None)
    if current is not None and current["address"] and current["state"] == "RUNNING":
        print(f"{'address:':<14}{current['address']}")  # how to reach its first pod (an interactive session)
    print(f"{'reason:':<14}{info['reason']}")
    for key, title in (("dependsOn", "waits for:"), ("dependants", "waited on by:")):
        if info[key]:  # the dependency graph around it
            print(title)
            print(_indent(table(info[key], [("JOB", "jobId"), ("NAME", "name"), ("CONDITION", "condition"),
                                            ("STATE", "state"), ("STATUS", "status")])))
    print("events:")
    print(_indent(table(
        info["events"], [("AT", "at"), ("ATTEMPT", "attempt"), ("FROM", "from"), ("TO", "to"),
                         ("CLUSTER", "cluster"), ("REASON", "reason")])))


@app.command()
def explain(ctx: typer.Context, job: str = typer.Argument(...), output: Format = OutputOpt) -> None:
    """Why a job waits: its queue's quota verdict and, per cluster, why it cannot start there."""
    info = _job_view(ctx, "explain", job, output, lambda client, job_id: client.explain(job_id))
    if info is None:
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
def cancel(ctx: typer.Context, jobs: list[str] = typer.Argument(None, help="Job ids"),
           arrays: list[int] = typer.Option([], "--array", min=1, max=(1 << 63) - 1,
                                            help="Every element not yet ended of this array; repeat for more"),
           output: Format = OutputOpt) -> None:
    """Cancel jobs: waiting and queued ones at once, running ones are stopped in their cluster."""
    jobs = jobs or []
    if not jobs and not arrays:
        raise typer.BadParameter("give job ids, or --array")
    ids = [_job_id(j) for j in jobs]
    client = make_client(ctx, "cancel")
    what = "cancel " + " ".join([*jobs, *(f"--array {a}" for a in arrays)])
    emit(call(what, lambda: client.cancel(ids, arrays=arrays)), output, JOB_COLUMNS)


@app.command()
def attach(ctx: typer.Context, job: str = typer.Argument(..., help="An interactive session's job id"),
           once: bool = typer.Option(False, "--once", help="Attach once and return, instead of staying")) -> None:
    """Attach to an interactive session: print how to reach it, and keep it from idling until Ctrl-C."""
    import time
    job_id = _job_id(job)
    client = make_client(ctx, f"attach {job}")
    shown = None
    try:
        while True:
            found = call(f"attach {job}", lambda: client.attach(job_id))
            state = found["job"]["state"]
            if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
                raise Failed(f"attach {job}", f"the session ended: {state}: {found['job']['reason']}")
            seen = (state, found["address"])
            if seen != shown:
                shown = seen
                where = found["address"] or "no address yet (its agent says once its pod runs)"
                print(f"job {job_id} {state}: {where}", flush=True)
            if once:
                return
            idle = found["idleTimeoutSeconds"]
            time.sleep(min(30.0, idle / 3) if idle else 30.0)
    except KeyboardInterrupt:
        pass


@app.command()
def logs(ctx: typer.Context, job: str = typer.Argument(..., help="Job id"),
         pod: str = typer.Option("", "--pod", help="Only this pod"),
         pod_set: str = typer.Option("", "--pod-set", help="Only the pods of this pod set"),
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until the pods end"),
         tail: int = typer.Option(0, "--tail", min=0, max=(1 << 31) - 1, help="Each pod's last N lines (0: all)"),
         attempt: int = typer.Option(0, "--attempt", min=0, max=(1 << 31) - 1,
                                     help="This attempt's pods (0: the latest attempt)"),
         output: Format = OutputOpt) -> None:
    """Print a job's pod logs, read from the cluster that ran it (Ctrl-C stops --follow)."""
    import json
    if pod and pod_set:
        raise typer.BadParameter("give --pod or --pod-set, not both")
    job_id = _job_id(job)
    client = make_client(ctx, "logs")

    def show() -> None:  # lines print as they come; an error ends them in one line, as a call's
        for line in client.logs(job_id, attempt=attempt, pod=pod, pod_set=pod_set, tail=tail, follow=follow):
            if output == Format.table:
                print(line["line"] if pod else f"[{line['pod']}] {line['line']}", flush=True)
            else:
                print(json.dumps(line), flush=True)
    try:
        call(f"logs {job}", show)
    except KeyboardInterrupt:
        pass


@app.command()
def watch(ctx: typer.Context, job: str | None = typer.Argument(None, help="Only this job"),
          after: int = typer.Option(0, "--after", min=0, max=(1 << 63) - 1, help="Resume after this event id"),
          output: Format = OutputOpt) -> None:
    """Follow job events as they happen (Ctrl-C to stop)."""
    import json
    job_id = _job_id(job) if job else 0
    client = make_client(ctx, "watch")
    def follow() -> None:  # the stream's errors come while it is read: each one line, as a call's
        for event in client.watch(job_id, after):
            if output == Format.table:
                print(f"{event['at']}  #{event['id']}  job {event['jobId']} attempt {event['attempt']}  "
                      f"{event['from'] or '-'} -> {event['to']}  {event['cluster'] or ''}  {event['reason']}",
                      flush=True)
            else:
                print(json.dumps(event), flush=True)
    try:
        call("watch", follow)
    except KeyboardInterrupt:
        pass


@app.command()
def clusters(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Clusters with their state, capacity source and free capacity."""
    client = make_client(ctx, "clusters")
    emit(call("clusters", client.clusters), output,
         [("NAME", "name"), ("TIER", "tier"), ("SITE", "site"), ("STATE", "state"), ("SOURCE", "capacitySource"),
          ("AGE", "capacityAgeSeconds"), ("FREE", "free"), ("ALLOCATABLE", "allocatable"), ("JOBS", "runningJobs")])


@app.command()
def queues(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Queues with their quota, use and fair share."""
    client = make_client(ctx, "queues")
    emit(call("queues", client.queues), output,
         [("NAME", "name"), ("PARENT", "parent"), ("QUEUED", "queuedJobs"), ("RUNNING", "runningJobs"),
          ("USED", "used"), ("GUARANTEED", "guaranteed"), ("MAX", "max"), ("SHARE", "fairShare"),
          ("RANK", "fairShareRank")])


USAGE_GROUPINGS = ("queue", "class", "cluster", "user", "array")
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
          by: str = typer.Option("queue", "--by", callback=_by, help="Group by queue, class, cluster, user or array"),
          output: ReportFormat = typer.Option(ReportFormat.table, "--output", "-o", help="table, json, yaml or csv")
          ) -> None:
    """Chargeback: resource-hours and cost (cluster price x class multiplier) per group, from the attempts."""
    since_s = _since(since)
    client = make_client(ctx, "usage")
    info = call("usage", lambda: client.usage(since_s=since_s, by=by))
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
        def limit(value, fmt):
            return "-" if value is None else fmt.format(value)
        cells = [{"policy": b["policy"], "queue": b["queue"] or "(all)", "attempts": b["attempts"],
                  "window": f"{b['spentInWindow']:.2f}",
                  "today": f"{b['spentToday']:.2f} / {limit(b['budgetPerDay'], '{:.2f}')}",
                  "rate": f"{b['ratePerHour']:.2f} / {limit(b['budgetPerHour'], '{:.2f}')}",
                  "resources": ", ".join(f"{r} {b['resourcesInUse'].get(r, '0')} / {cap}"
                                         for r, cap in b["maxResources"].items()) or "-"} for b in info["burst"]]
        print(table(cells, [("POLICY", "policy"), ("QUEUE", "queue"), ("ATTEMPTS", "attempts"),
                            ("SPENT IN WINDOW", "window"), ("TODAY / PER DAY", "today"),
                            ("RATE / PER HOUR", "rate"), ("IN USE / MAX", "resources")]))
