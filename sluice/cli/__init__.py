"""The `sluice` command line: the user's commands (jobs), `sluice schedule` (schedules), `sluice admin` (admin),
`sluice config` (contexts) and the commands that run a server (servers), on the helpers they share (common).

Errors print one line, `error: <what>: <why>`, and exit 1; usage errors exit 2. No module here imports
grpc at load time: main() tunes the process (sluice.process) before any command does.

`kubectl_main` runs the same app as the kubectl plugin `kubectl sluice` (sluice.cli.kubectl).

Shell completion is typer's: `--show-completion [SHELL]` prints the script, `--install-completion [SHELL]`
installs it, and the script asks `sluice` itself for completions ($_SLUICE_COMPLETE).
"""
from __future__ import annotations

import os
import pathlib
import sys
from typing import NoReturn

import typer

from sluice import process
from sluice.cli import admin, common, contexts, jobs, schedules, servers, simulate

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Sluice: queue whole jobs, place them across clusters by capacity and policy.")
app.registered_commands += (jobs.app.registered_commands + servers.app.registered_commands
                             + simulate.app.registered_commands)
app.add_typer(servers.dispatcher_app, name="dispatcher")
app.add_typer(servers.agent_app, name="agent")
app.add_typer(admin.app, name="admin")
app.add_typer(contexts.app, name="config")
app.add_typer(schedules.app, name="schedule")


SHELLS = tuple(shell.value for shell in typer.completion.Shells)  # what typer writes completion scripts for
COMPLETION_OPTIONS = ("--install-completion", "--show-completion")
VALUE_OPTIONS = ("--config", "--ca", "--context", "--sluice-context")  # main_options' options that take a value


def _detected_shell() -> str:
    """The shell this runs under, found as typer finds it, else the login shell."""
    try:
        import shellingham  # typer's dependency for the same purpose
        return shellingham.detect_shell()[0]
    except (ImportError, RuntimeError, OSError):  # shellingham's ShellDetectionFailure is an OSError
        return os.path.basename(os.environ.get("SHELL", ""))


def _completion(ctx: typer.Context, param: typer.CallbackParam, shell: str | None) -> None:
    """--show-completion and --install-completion: act, then exit. An empty SHELL is the one this runs under."""
    if shell is None or ctx.resilient_parsing:
        return
    option = f"--{param.name.replace('_', '-')}"
    if not shell:
        shell = _detected_shell()
        if shell not in SHELLS:
            raise common.Failed(option, f"cannot tell which shell this is ({shell or 'none found'}); name it: "
                                        f"sluice {option} {'|'.join(SHELLS)}")
    if shell not in SHELLS:
        raise typer.BadParameter(f"{shell!r} is not a shell sluice completes for ({', '.join(SHELLS)})")
    if param.name == "show_completion":
        print(typer.completion.get_completion_script(prog_name="sluice", complete_var="_SLUICE_COMPLETE",
                                                     shell=shell))
    else:
        try:
            _, path = typer.completion.install(shell=shell, prog_name="sluice", complete_var="_SLUICE_COMPLETE")
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            raise common.Failed(f"{option} {shell}", f"cannot write the completion script or the shell's "
                                                     f"startup file: {where}{exc.strerror or exc}") from None
        print(f"{shell} completion installed in {path}; it takes effect in new shells")
    raise typer.Exit()


def _shell_optional(args: list[str]) -> list[str]:
    """args with an empty SHELL after a completion option given without one: a click option takes a value
    or none, never an optional one. Only the options before the command are looked at."""
    out = list(args)
    i = 0
    while i < len(out) and out[i].startswith("-"):
        if out[i] in COMPLETION_OPTIONS and (i + 1 == len(out) or out[i + 1].startswith("-")):
            out.insert(i + 1, "")
        i += 2 if out[i] in COMPLETION_OPTIONS + VALUE_OPTIONS else 1
    return out


@app.callback()
def main_options(ctx: typer.Context,
                 config: pathlib.Path | None = typer.Option(
                     None, "--config", envvar="SLUICE_CONFIG",
                     help="Client config (a dispatcher, or contexts of several); default ~/.config/sluice/client.yaml"),
                 ca: pathlib.Path | None = typer.Option(
                     None, "--ca",
                     help="PEM file of the CA that signed the dispatcher's certificate (overrides the config's)"),
                 context: str | None = typer.Option(
                     None, "--context", metavar="NAME", envvar="SLUICE_CONTEXT", autocompletion=contexts.context_names,
                     help="The context (dispatcher) of the config to use instead of its current one"),
                 install_completion: str | None = typer.Option(
                     None, "--install-completion", metavar="[SHELL]", is_eager=True, expose_value=False,
                     callback=_completion, help=f"Install shell completion ({', '.join(SHELLS)}; default: this shell)"),
                 show_completion: str | None = typer.Option(
                     None, "--show-completion", metavar="[SHELL]", is_eager=True, expose_value=False,
                     callback=_completion, help="Print the shell completion script, to install it by hand"),
                 ) -> None:
    ctx.obj = {**(ctx.obj or {}), "config": config, "ca": ca, "context": context}  # kubectl_main's Plugin kept


def main() -> NoReturn:
    """The `sluice` console script (and `python -m sluice`)."""
    process.apply()  # first: `sluice up` and `sluice dispatcher serve` serve gRPC from this process
    typer.completion.completion_init()  # typer's completion of each shell, asked for through $_SLUICE_COMPLETE
    common.run(app, _shell_optional(sys.argv[1:]))


def _as_plugin(command) -> None:
    """The root command as `kubectl sluice` shows and parses it: its --context (the Sluice context) is
    --sluice-context, kubectl's --context being the Kubernetes context; the help ends with kubectl's flags."""
    from sluice.cli.kubectl import EPILOG
    from sluice.kubectx import SLUICE_CONTEXT_OPTION
    for param in command.params:
        if param.name == "context":
            param.opts = [SLUICE_CONTEXT_OPTION]
            param.help = ("The Sluice context (dispatcher) to use instead of the one named like the Kubernetes "
                          "context, else the current one")
    command.epilog = EPILOG


def kubectl_main() -> NoReturn:
    """The `kubectl-sluice` console script: `kubectl sluice ...`, the same commands, with the kubeconfig's
    context and namespace taken into account (sluice.cli.kubectl)."""
    process.apply()  # first, as main() does
    from sluice.cli.kubectl import PROG, Plugin
    from sluice.kubectx import FlagError, plugin_args
    from sluice.output import error
    try:
        parsed = plugin_args(sys.argv[1:])
    except FlagError as exc:
        error(PROG, str(exc))
        sys.exit(2)
    if parsed.passed_through:  # a server command: as `sluice` runs it
        common.run(app, _shell_optional(parsed.args), prog_name=PROG)
    common.run(app, _shell_optional(parsed.args), prog_name=PROG, obj={"kubectl": Plugin(parsed)}, adapt=_as_plugin)
