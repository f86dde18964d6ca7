"""The `sluice` command line: the user's commands (jobs), `sluice admin` (admin) and the commands that run
a server (servers), on the helpers they share (common).

Errors print one line, `error: <what>: <why>`, and exit 1; usage errors exit 2. No module here imports
grpc at load time: main() tunes the process (sluice.process) before any command does.
"""
from __future__ import annotations

import pathlib
from typing import NoReturn

import typer

from sluice import process
from sluice.cli import admin, common, jobs, servers, simulate

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Sluice: queue whole jobs, place them across clusters by capacity and policy.")
app.registered_commands += (jobs.app.registered_commands + servers.app.registered_commands
                             + simulate.app.registered_commands)
app.add_typer(servers.dispatcher_app, name="dispatcher")
app.add_typer(servers.agent_app, name="agent")
app.add_typer(admin.app, name="admin")


@app.callback()
def main_options(ctx: typer.Context,
                 config: pathlib.Path | None = typer.Option(
                     None, "--config", envvar="SLUICE_CONFIG",
                     help="Client config (address, token); default ~/.config/sluice/client.yaml"),
                 ca: pathlib.Path | None = typer.Option(
                     None, "--ca",
                     help="PEM file of the CA that signed the dispatcher's certificate (overrides the config's)"),
                 ) -> None:
    ctx.obj = {"config": config, "ca": ca}


def main() -> NoReturn:
    """The `sluice` console script (and `python -m sluice`)."""
    process.apply()  # first: `sluice up` and `sluice dispatcher serve` serve gRPC from this process
    common.run(app)
