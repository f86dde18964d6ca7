"""What every `sluice` command shares: the client it talks through, the one-line error it fails with and
the exit codes (1 for a failed command, 2 for a usage error, 130 when interrupted), the output option.

Imports no other sluice.cli module, and the client (grpc) only inside the calls.
"""
from __future__ import annotations

import pathlib
import sys
from typing import NoReturn

import typer

from sluice.output import Format, error

OutputOpt = typer.Option(Format.table, "--output", "-o", help="table, json or yaml")

# typer vendors click: its UsageError is BadParameter's base, reached without a private import.
UsageError = typer.BadParameter.__mro__[1]


class Failed(Exception):
    """A command failed in a way the user should read: printed as one line, exit 1."""

    def __init__(self, what: str, why: str):
        super().__init__(why)
        self.what, self.why = what, why


def make_client(ctx: typer.Context, what: str, client_class=None):
    """A client (sluice.client.Client unless client_class) from the config `--config` names, of the context
    `--context` names. Run as `kubectl sluice` (ctx.obj["kubectl"], sluice.cli.kubectl), the context is
    otherwise the one the Kubernetes context selects, and the client an AdminClient (it reads the Cluster
    objects that map namespaces to queues, when its token may)."""
    from sluice.client import Client, ClientError
    from sluice.config import ConfigError, load
    options = ctx.obj or {}
    context, plugin = options.get("context"), options.get("kubectl")
    if plugin is not None:
        from sluice.admin_client import AdminClient
        client_class = client_class or AdminClient
        if context is None:
            context = plugin.sluice_context(what, options.get("config"))
    try:
        return (client_class or Client)(load(options.get("config"), ca=options.get("ca"), context=context))
    except ConfigError as exc:
        raise Failed(what, str(exc)) from None
    except ClientError as exc:
        raise Failed(what, exc.message) from None


def call(what: str, fn):
    """fn(), its client errors raised as Failed(what, ...)."""
    from sluice.client import ClientError
    try:
        return fn()
    except ClientError as exc:
        if exc.code == "UNAVAILABLE":
            raise Failed(what, f"dispatcher unavailable: {exc.message}") from None
        raise Failed(what, exc.message) from None


def read_documents(what: str, file: str, load):
    """load(text) of `file` (stdin for "-"): what it parsed, or Failed with the OS's or the parser's words
    (`what` names the file, so the parser is given none)."""
    from sluice.spec import SpecError
    try:
        text = sys.stdin.read() if file == "-" else pathlib.Path(file).read_text()
    except OSError as exc:
        raise Failed(what, exc.strerror or str(exc)) from None
    except UnicodeDecodeError:
        raise Failed(what, "not UTF-8 text") from None
    try:
        return load(text)
    except SpecError as exc:
        raise Failed(what, str(exc)) from None


def run(app: typer.Typer, args: list[str] | None = None, *, prog_name: str = "sluice", obj: dict | None = None,
        adapt=None) -> NoReturn:
    """Run the command line (`args`, else sys.argv's) and exit: a Failed prints `error: <what>: <why>` and
    exits 1, a usage error prints one line and exits 2. Anything else is a bug, printed as one line too, exit 1.
    `obj` starts the commands' ctx.obj; adapt(command) may change the root click command before it runs."""
    try:
        command = typer.main.get_command(app)
        if adapt is not None:
            adapt(command)
        code = command.main(args=args, standalone_mode=False, prog_name=prog_name, obj=obj)
    except Failed as exc:
        error(exc.what, exc.why)
        sys.exit(1)
    except UsageError as exc:
        if exc.format_message():  # empty when help was printed for a bare group
            error(exc.ctx.command_path if exc.ctx else prog_name, exc.format_message())
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except Exception as exc:  # a bug: still one line, never a traceback
        error(prog_name, f"unexpected error ({type(exc).__name__}: {exc}); please report it")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
