"""Shell completion, as a user's shell meets it: `sluice --show-completion [SHELL]` prints a script that
completes the command named `sluice` (the console script pyproject.toml installs), `--install-completion`
installs it, and the script's questions ($_SLUICE_COMPLETE) are answered by the real command line.
Every command is a subprocess, as the shell runs it."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def environment(home: pathlib.Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "_SLUICE_", "_TYPER_"))}
    return {**env, "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"), "PYTHONPATH": str(ROOT), **extra}


def sluice(home: pathlib.Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sluice", *args], cwd=ROOT, env=environment(home, **env),
                          capture_output=True, text=True, timeout=60)


def completions(home: pathlib.Path, line: str) -> list[str]:
    """What bash's completion asks of `sluice` for `line` (the word after its last space being completed)."""
    words = line.split(" ")
    done = sluice(home, _SLUICE_COMPLETE="complete_bash", COMP_WORDS=line, COMP_CWORD=str(len(words) - 1))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout.split()


def test_the_console_script_is_named_sluice():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"sluice": "sluice.cli:main", "kubectl-sluice": "sluice.cli:kubectl_main"}  # and the plugin
    installed = [e.value for e in metadata.entry_points(group="console_scripts") if e.name == "sluice"]
    assert installed in ([], ["sluice.cli:main"])  # where the package is installed at all


@pytest.mark.parametrize("shell, completes", [
    ("bash", "complete -o default -F _sluice_completion sluice"),
    ("zsh", "compdef _sluice_completion sluice"),
    ("fish", "complete --command sluice "),
])
def test_show_completion_prints_the_script_of_a_shell(tmp_path, shell, completes):
    done = sluice(tmp_path, "--show-completion", shell)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert completes in done.stdout and f"_SLUICE_COMPLETE=complete_{shell}" in done.stdout, done.stdout
    assert not (tmp_path / ".bashrc").exists()  # shown, not installed


def test_show_completion_without_a_shell_takes_the_one_it_runs_under(tmp_path):
    # `; true` keeps bash from exec-ing the command in its own place: bash stays its parent.
    command = f"{sys.executable} -m sluice --show-completion; true"
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=environment(tmp_path), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "_SLUICE_COMPLETE=complete_bash" in done.stdout


def test_an_unknown_shell_is_a_usage_error_in_one_line(tmp_path):
    done = sluice(tmp_path, "--show-completion", "tcsh")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr == ("error: sluice: Invalid value for '--show-completion': 'tcsh' is not a shell sluice "
                           "completes for (bash, zsh, fish, powershell, pwsh)\n")


def test_completion_offers_commands_and_their_options(tmp_path):
    assert completions(tmp_path, "sluice su") == ["submit"]
    assert {"--file", "--queue", "--class", "--wait", "--idempotency-key", "--output"} \
        <= set(completions(tmp_path, "sluice submit --"))
    assert completions(tmp_path, "sluice config ") == ["get-contexts", "current-context", "use-context",
                                                       "set-context", "delete-context"]
    assert {"--config", "--context", "--install-completion", "--show-completion"} <= set(completions(tmp_path,
                                                                                                    "sluice --"))


def test_completion_offers_the_contexts_of_the_config_file(tmp_path):
    path = tmp_path / "contexts.yaml"
    path.write_text("current-context: prod\ncontexts:\n- {name: prod, address: 'a:1', token: t}\n"
                    "- {name: local, address: 'b:1', token: t}\n- {name: lab, address: 'c:1', token: t}\n")
    assert completions(tmp_path, f"sluice --config {path} --context l") == ["local", "lab"]
    assert completions(tmp_path, f"sluice --config {path} config use-context ") == ["prod", "local", "lab"]


@pytest.fixture
def sluice_on_path(tmp_path) -> pathlib.Path:
    """A directory holding a `sluice` command that runs this checkout's code, as the console script does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sluice"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m sluice \"$@\"\n")
    script.chmod(0o755)
    return bin_dir


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_installed_bash_script_completes_through_the_sluice_command(tmp_path, sluice_on_path):
    done = sluice(tmp_path, "--install-completion", "bash")
    assert done.returncode == 0, done.stderr
    installed = tmp_path / ".bash_completions" / "sluice.sh"
    assert f"source '{installed}'" in (tmp_path / ".bashrc").read_text()
    assert f"bash completion installed in {installed}" in done.stdout
    # What bash does on `sluice su<TAB>` and `sluice submit --w<TAB>`, with the script the user now sources.
    ask = (f"source '{installed}'; COMP_WORDS=(sluice su); COMP_CWORD=1; _sluice_completion sluice; "
           "echo \"${COMPREPLY[@]}\"; COMP_WORDS=(sluice submit --w); COMP_CWORD=2; _sluice_completion sluice; "
           "echo \"${COMPREPLY[@]}\"")
    env = environment(tmp_path, PATH=f"{sluice_on_path}{os.pathsep}{os.environ['PATH']}")
    answered = subprocess.run(["bash", "--norc", "-c", ask], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=60)
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.splitlines() == ["submit", "--wait"], answered


def test_installing_where_it_cannot_write_fails_in_one_line(tmp_path):
    home = tmp_path / "home"
    home.write_text("a file where the home directory should be\n")
    done = sluice(home, "--install-completion", "bash")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == ("error: --install-completion bash: cannot write the completion script or the shell's "
                           f"startup file: {home}: File exists\n")
