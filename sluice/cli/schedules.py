"""`sluice schedule`: recurring jobs (create -f FILE, list, get, suspend, resume, delete, trigger).

They import the client (grpc, the stubs) only inside their bodies.
"""
from __future__ import annotations

import typer

from sluice.cli.common import OutputOpt, call, make_client, read_documents
from sluice.output import Format, emit, table

app = typer.Typer(no_args_is_help=True, help="Recurring jobs: a cron expression and a job template.")

COLUMNS = [("NAME", "name"), ("SCHEDULE", "schedule"), ("TIMEZONE", "timeZone"), ("SUSPENDED", "suspended"),
           ("LAST SCHEDULED", "lastScheduledAt"), ("NEXT DUE", "nextDueAt"), ("ACTIVE", "active")]
RUN_COLUMNS = [("ID", "id"), ("NAME", "name"), ("STATE", "state"), ("CREATED", "createdAt"),
               ("FINISHED", "finishedAt")]


def _row(info: dict) -> dict:
    return {**info, "active": ",".join(map(str, info["activeJobs"])) or None}


def _show(info: dict, output: Format) -> None:
    """A schedule: as JSON or YAML, or as its fields, its status, its last error and its runs."""
    if output != Format.table:
        emit(info, output)
        return
    for key in ("name", "owner", "schedule", "timeZone", "concurrencyPolicy", "suspended", "lastScheduledAt",
                "nextDueAt", "status", "lastError", "lastErrorAt"):
        value = info[key]
        print(f"{key + ':':<19}{'-' if value is None or value == '' else value}")
    print("runs:")
    print("\n".join("  " + line for line in table(info["runs"], RUN_COLUMNS).splitlines()))


def _one(ctx: typer.Context, verb: str, name: str, output: Format, act) -> None:
    client = make_client(ctx, f"schedule {verb} {name}")
    _show(call(f"schedule {verb} {name}", lambda: act(client)), output)


@app.command()
def create(ctx: typer.Context,
           file: str = typer.Option(..., "-f", "--file", help="One Schedule document (YAML/JSON); - reads stdin"),
           output: Format = OutputOpt) -> None:
    """Create a schedule; a schedule of that name must not exist (delete it first to change it)."""
    from sluice.schedules import load_schedule
    what = f"schedule create {file}"
    schedule = read_documents(what, file, lambda text: load_schedule(text, source=None))  # checked here first
    client = make_client(ctx, what)
    _show(call(what, lambda: client.create_schedule(schedule.to_document())), output)


@app.command("list")
def list_schedules(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """List schedules (a user's own; an admin's every one) with their next due time and active jobs."""
    client = make_client(ctx, "schedule list")
    emit([_row(s) for s in call("schedule list", client.schedules)] if output == Format.table
         else call("schedule list", client.schedules), output, COLUMNS)


@app.command()
def get(ctx: typer.Context, name: str = typer.Argument(..., help="Schedule name"),
        output: Format = OutputOpt) -> None:
    """Show a schedule: its status, last error and recent runs with their state."""
    _one(ctx, "get", name, output, lambda client: client.schedule(name))


@app.command()
def suspend(ctx: typer.Context, name: str = typer.Argument(...), output: Format = OutputOpt) -> None:
    """Suspend a schedule: it starts nothing until resumed."""
    _one(ctx, "suspend", name, output, lambda client: client.suspend_schedule(name))


@app.command()
def resume(ctx: typer.Context, name: str = typer.Argument(...), output: Format = OutputOpt) -> None:
    """Resume a schedule; of the due times missed meanwhile only the latest starts, within startingDeadline."""
    _one(ctx, "resume", name, output, lambda client: client.resume_schedule(name))


@app.command()
def delete(ctx: typer.Context, name: str = typer.Argument(...), output: Format = OutputOpt) -> None:
    """Delete a schedule; the jobs it started stay, running ones run on."""
    _one(ctx, "delete", name, output, lambda client: client.delete_schedule(name))


@app.command()
def trigger(ctx: typer.Context, name: str = typer.Argument(...), output: Format = OutputOpt) -> None:
    """Start one run now, under the schedule's concurrency policy; prints the job id."""
    client = make_client(ctx, f"schedule trigger {name}")
    done = call(f"schedule trigger {name}", lambda: client.trigger_schedule(name))
    if output == Format.table:
        print(done["jobId"])
    else:
        emit(done, output)
