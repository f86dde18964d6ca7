"""`sluice config`: the dispatchers of the client config file, by context (as kubectl's), and which one
commands use. Tokens are written to the file (mode 0600) and never printed.

Reads and writes the file only (sluice.config): no client, no grpc.
"""
from __future__ import annotations

import pathlib

import typer

from sluice.cli.common import Failed, OutputOpt
from sluice.output import Format, emit

app = typer.Typer(no_args_is_help=True, help="Client contexts: the dispatchers this user's config file holds.")


def context_names(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion of a context's name: those of the config file the command line names."""
    from sluice.config import ConfigError, chosen_path, read
    try:
        names = read(chosen_path(ctx.find_root().params.get("config"))).names
    except ConfigError:
        return []
    return [name for name in names if name.startswith(incomplete)]


def _edit(ctx: typer.Context, what: str, change):
    """change(path) on the config file `--config` names, its ConfigError as Failed(what, ...)."""
    from sluice.config import ConfigError, chosen_path
    try:
        return change(chosen_path((ctx.obj or {}).get("config")))
    except ConfigError as exc:
        raise Failed(what, str(exc)) from None


def _absolute(value: pathlib.Path | None) -> str | None:
    """A file named on the command line, as the config file keeps it: from where the command runs, not from
    the file's directory."""
    return str(value.expanduser().absolute()) if value is not None else None


@app.command("get-contexts")
def get_contexts(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """The contexts of the config file, the current one marked *."""
    from sluice.config import read
    found = _edit(ctx, "config get-contexts", read)
    current = found.chosen()
    rows = [{"current": c["name"] == current, "name": c["name"], "address": c.get("address")}
            for c in found.contexts]
    if output == Format.table:
        rows = [{**row, "current": "*" if row["current"] else ""} for row in rows]
    emit(rows, output, [("CURRENT", "current"), ("NAME", "name"), ("ADDRESS", "address")])


@app.command("current-context")
def current_context(ctx: typer.Context) -> None:
    """The name of the context commands use unless --context names another."""
    from sluice.config import ConfigError, read

    def current(path: pathlib.Path) -> str:
        found = read(path)
        if found.chosen() is None:
            held = f"contexts: {', '.join(found.names)}" if found.contexts else "it holds none"
            raise ConfigError(f"no current context in {path} ({held}); pick one with "
                              "`sluice config use-context NAME`")
        return found.chosen()
    print(_edit(ctx, "config current-context", current))


@app.command("use-context")
def use_context(ctx: typer.Context, name: str = typer.Argument(..., autocompletion=context_names)) -> None:
    """Make NAME the context commands use."""
    from sluice.config import use_context as use
    _edit(ctx, f"config use-context {name}", lambda path: use(path, name))
    print(f"current context: {name}")


@app.command("set-context")
def set_context(ctx: typer.Context, name: str = typer.Argument(..., autocompletion=context_names),
                address: str | None = typer.Option(None, "--address", help="HOST:PORT of the dispatcher"),
                token: str | None = typer.Option(None, "--token", help="The token, kept in the config file"),
                token_file: pathlib.Path | None = typer.Option(
                    None, "--token-file", help="A file holding the token, read at each command"),
                ca: pathlib.Path | None = typer.Option(
                    None, "--ca", help="PEM file of the CA that signed the dispatcher's certificate"),
                insecure: bool | None = typer.Option(
                    None, "--insecure/--no-insecure", help="Plaintext, without TLS (loopback addresses only)"),
                ) -> None:
    """Create the context NAME, or change the fields given of it. A file of one dispatcher keeps it as the
    context `default`."""
    from sluice.config import set_context as put
    if token is not None and token_file is not None:
        raise typer.BadParameter("give --token or --token-file, not both")
    created = _edit(ctx, f"config set-context {name}", lambda path: put(
        path, name, address=address, token=token, token_file=_absolute(token_file), ca=_absolute(ca),
        insecure=insecure))
    print(f"context {name}: {'created' if created else 'updated'}")


@app.command("delete-context")
def delete_context(ctx: typer.Context, name: str = typer.Argument(..., autocompletion=context_names)) -> None:
    """Remove the context NAME (not the current one)."""
    from sluice.config import delete_context as delete
    _edit(ctx, f"config delete-context {name}", lambda path: delete(path, name))
    print(f"context {name}: deleted")
