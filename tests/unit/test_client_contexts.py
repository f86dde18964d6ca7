"""Client contexts: one config file holding several dispatchers, `sluice config` editing it and `--context`
(or $SLUICE_CONTEXT) choosing one. The file of one dispatcher, as `sluice up` writes it, still reads as it
did, as the context `default`. Every failure is one line and leaves the file as it was; files written are
mode 0600 (they hold tokens).

The commands run as a user runs them (subprocesses); none needs a dispatcher (test_contexts_cli.py runs one).
"""
from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import sys

import pytest
import yaml

from sluice import config

ROOT = pathlib.Path(__file__).resolve().parents[2]
TWO = ("current-context: prod\ncontexts:\n"
       "- {name: prod, address: 'sluice.example.com:443', token: sl_prod_secret, ca: prod-ca.pem}\n"
       "- {name: local, address: '127.0.0.1:7300', token: sl_local_secret, insecure: true}\n")


def sluice(home: pathlib.Path, *args: str, cwd: pathlib.Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    base.update(HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "sluice", *args], cwd=cwd, env=base, capture_output=True,
                          text=True, timeout=60)


def one_error(done: subprocess.CompletedProcess, code: int = 1) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stdout == "", done.stdout
    return done.stderr.rstrip("\n")


def state(path: pathlib.Path):
    """All a failed command must leave as it was: the bytes, mode and time of the file, and whether it is a link."""
    if not path.exists() and not path.is_symlink():
        return None
    info = path.lstat()
    return path.is_symlink(), path.read_bytes(), stat.S_IMODE(info.st_mode), info.st_mtime_ns


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in ("SLUICE_CONFIG", "SLUICE_CONTEXT", "SLUICE_ADDRESS", "SLUICE_TOKEN", "SLUICE_CA", "SLUICE_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture
def two(tmp_path) -> pathlib.Path:
    path = tmp_path / "contexts.yaml"
    path.write_text(TWO)
    path.chmod(0o600)
    return path


# -- reading -------------------------------------------------------------------------------------------

def test_the_current_context_is_used_and_another_is_chosen_by_name(clean_env, two, monkeypatch):
    prod = config.load(two)
    assert (prod.address, prod.token, prod.ca, prod.insecure) == ("sluice.example.com:443", "sl_prod_secret",
                                                                 str(two.parent / "prod-ca.pem"), False)
    local = config.load(two, context="local")
    assert (local.address, local.token, local.ca, local.insecure) == ("127.0.0.1:7300", "sl_local_secret", None, True)
    monkeypatch.setenv("SLUICE_CONTEXT", "local")
    assert config.load(two) == local
    assert config.load(two, context="prod") == prod  # --context wins over $SLUICE_CONTEXT
    monkeypatch.setenv("SLUICE_ADDRESS", "10.0.0.1:7070")  # the overrides apply to the context chosen
    assert config.load(two).address == "10.0.0.1:7070"


def test_a_file_of_one_dispatcher_reads_as_it_did_as_the_context_default(clean_env, tmp_path):
    path = tmp_path / "client.yaml"
    path.write_text("address: 127.0.0.1:7070\ntoken: sl_x\nca: certs/ca.crt\ntimeout: 5\n")
    expected = config.ClientConfig("127.0.0.1:7070", "sl_x", 5.0, ca=str(tmp_path / "certs" / "ca.crt"))
    assert config.load(path) == expected == config.load(path, context="default")
    found = config.read(path)
    assert found.single and found.names == ["default"] and found.chosen() == "default"
    with pytest.raises(config.ConfigError, match=rf"^no context 'prod' in {path}; contexts: default$"):
        config.load(path, context="prod")


def test_a_token_file_is_read_from_beside_the_config(clean_env, tmp_path):
    (tmp_path / "prod.token").write_text("sl_from_file\n")
    path = tmp_path / "contexts.yaml"
    path.write_text("contexts:\n- {name: prod, address: 'a:1', tokenFile: prod.token}\n")
    assert config.load(path).token == "sl_from_file"  # the only context, though not named current
    (tmp_path / "prod.token").write_text("two words\n")
    with pytest.raises(config.ConfigError, match=r"context 'prod': tokenFile: .*prod.token: expected one word"):
        config.load(path)


@pytest.mark.parametrize("text, message", [
    ("contexts:\n- {name: a, address: 'a:1', token: t}\n- {name: b, address: 'b:1', token: t}\n",
     "{path}: 2 contexts and no current-context; pick one with `sluice config use-context NAME` or --context NAME"),
    ("current-context: gone\ncontexts:\n- {name: a, address: 'a:1', token: t}\n",
     "{path}: current-context 'gone' is not among its contexts (a); pick one with `sluice config use-context NAME`"),
    ("current-context: a\ncontexts:\n- {name: a, token: t}\n",
     "{path}: context 'a': has no address; give it with `sluice config set-context a --address HOST:PORT`"),
    ("current-context: a\ncontexts:\n- {name: a, address: 'a:1'}\n",
     "{path}: context 'a': has no token; give it with `sluice config set-context a --token or --token-file`"),
    ("current-context: a\ncontexts:\n- {name: a, address: 'a b', token: t}\n",
     "{path}: context 'a': address: expected HOST:PORT, got 'a b'"),
    ("contexts:\n- {name: a, address: 'a:1', token: t}\n- {name: a, address: 'b:1', token: t}\n",
     "{path}: contexts: 'a' is named twice"),
    ("contexts:\n- {address: 'a:1', token: t}\n",
     "{path}: contexts[0]: expected a mapping with a name, got {{'address': 'a:1', 'token': 't'}}"),
    ("contexts: {a: 1}\n", "{path}: contexts: expected a list of mappings, each with a name, got {{'a': 1}}"),
    ("address: 'a:1'\ncontexts: []\n", "{path}: address: not expected beside contexts"),
])
def test_a_file_of_contexts_it_cannot_use_is_refused_in_a_line(clean_env, tmp_path, text, message):
    path = tmp_path / "contexts.yaml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as caught:
        config.load(path)
    assert str(caught.value).startswith(message.format(path=path)), str(caught.value)
    done = sluice(tmp_path, "--config", str(path), "list")  # the command says the same, in one line
    assert one_error(done).startswith(f"error: list: {message.format(path=path)}")


# -- the commands --------------------------------------------------------------------------------------

def test_get_contexts_marks_the_current_one_and_never_shows_a_token(tmp_path, two):
    done = sluice(tmp_path, "--config", str(two), "config", "get-contexts")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["CURRENT  NAME   ADDRESS",
                                        "*        prod   sluice.example.com:443",
                                        "         local  127.0.0.1:7300"]
    as_json = sluice(tmp_path, "--config", str(two), "config", "get-contexts", "-o", "yaml")
    assert yaml.safe_load(as_json.stdout) == [{"current": True, "name": "prod", "address": "sluice.example.com:443"},
                                              {"current": False, "name": "local", "address": "127.0.0.1:7300"}]
    assert "secret" not in done.stdout + as_json.stdout


def test_current_and_use_context(tmp_path, two):
    assert sluice(tmp_path, "--config", str(two), "config", "current-context").stdout == "prod\n"
    done = sluice(tmp_path, "config", "use-context", "local", SLUICE_CONFIG=str(two))
    assert done.returncode == 0 and done.stdout == "current context: local\n", done.stderr
    assert sluice(tmp_path, "--config", str(two), "config", "current-context").stdout == "local\n"
    assert stat.S_IMODE(two.stat().st_mode) == 0o600
    assert config.read(two).names == ["prod", "local"]  # nothing else changed
    assert config.load(two, context="prod").token == "sl_prod_secret"


def test_set_context_creates_a_file_then_updates_a_context(tmp_path):
    path = tmp_path / "config" / "sluice" / "client.yaml"  # the default: created with its directories
    (tmp_path / "ca.pem").write_text("not checked until used\n")
    (tmp_path / "token").write_text("sl_in_a_file\n")
    done = sluice(tmp_path, "config", "set-context", "prod", "--address", "sluice.example.com:443",
                  "--token", "sl_secret", "--ca", "ca.pem", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "context prod: created\n", done.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert yaml.safe_load(path.read_text()) == {
        "current-context": "prod",  # the first context of a file is its current one
        "contexts": [{"name": "prod", "address": "sluice.example.com:443", "token": "sl_secret",
                      "ca": str(tmp_path / "ca.pem")}]}  # a path given on the command line: from where it ran
    done = sluice(tmp_path, "config", "set-context", "prod", "--token-file", str(tmp_path / "token"))
    assert done.stdout == "context prod: updated\n", done.stderr
    assert yaml.safe_load(path.read_text())["contexts"] == [
        {"name": "prod", "address": "sluice.example.com:443", "tokenFile": str(tmp_path / "token"),
         "ca": str(tmp_path / "ca.pem")}]
    sluice(tmp_path, "config", "set-context", "local", "--address", "127.0.0.1:7070", "--token", "t", "--insecure")
    sluice(tmp_path, "config", "set-context", "local", "--no-insecure")
    found = config.read(path)
    assert found.current == "prod" and found.names == ["prod", "local"]
    assert found.find("local") == {"name": "local", "address": "127.0.0.1:7070", "token": "t"}


def test_set_context_keeps_a_file_of_one_dispatcher_as_the_context_default(tmp_path):
    """As `sluice up` leaves it: the default config a symlink to the data dir's file. The link is replaced by a
    file of contexts; the data dir's file, which `sluice up` rewrites, is left alone."""
    data_file = tmp_path / "data" / "client.yaml"
    data_file.parent.mkdir()
    data_file.write_text("address: 127.0.0.1:7070\ntoken: sl_up\nca: /data/certs/ca.crt\n")
    before = data_file.read_bytes()
    link = tmp_path / "config" / "sluice" / "client.yaml"
    link.parent.mkdir(parents=True)
    link.symlink_to(data_file)
    done = sluice(tmp_path, "config", "set-context", "prod", "--address", "sluice.example.com:443", "--token", "t")
    assert done.returncode == 0, done.stderr
    assert not link.is_symlink() and data_file.read_bytes() == before
    assert yaml.safe_load(link.read_text()) == {
        "current-context": "default",
        "contexts": [{"name": "default", "address": "127.0.0.1:7070", "token": "sl_up", "ca": "/data/certs/ca.crt"},
                     {"name": "prod", "address": "sluice.example.com:443", "token": "t"}]}


def test_delete_context(tmp_path, two):
    done = sluice(tmp_path, "--config", str(two), "config", "delete-context", "local")
    assert done.returncode == 0 and done.stdout == "context local: deleted\n", done.stderr
    assert config.read(two).names == ["prod"] and config.read(two).current == "prod"


@pytest.mark.parametrize("args, message", [
    (["--context", "nope", "list"], "list: no context 'nope' in {path}; contexts: prod, local"),
    (["config", "use-context", "nope"], "config use-context nope: no context 'nope' in {path}; contexts: prod, local"),
    (["config", "delete-context", "nope"],
     "config delete-context nope: no context 'nope' in {path}; contexts: prod, local"),
    (["config", "delete-context", "prod"], "config delete-context prod: {path}: context 'prod' is the current "
                                           "context; switch first with `sluice config use-context local`"),
    (["config", "set-context", "new"], "config set-context new: {path}: context 'new': needs an address: give "
                                       "--address HOST:PORT"),
    (["config", "set-context", "new", "--address", "a:1"],
     "config set-context new: {path}: context 'new': needs a token: give --token TOKEN or --token-file FILE"),
    (["config", "set-context", "new", "--address", "two words", "--token", "t"],
     "config set-context new: {path}: context 'new': address: expected HOST:PORT, got 'two words'"),
    (["config", "set-context", "prod", "--token", "sl_\u00e9"], "config set-context prod: {path}: context 'prod': "
                                                              "token: expected one word of printable ASCII"),
    (["config", "set-context", "prod", "--ca", "/no/such/ca.pem"],
     "config set-context prod: --ca /no/such/ca.pem: no such file"),
    (["config", "set-context", "prod", "--token-file", "/no/such/token"],
     "config set-context prod: --token-file /no/such/token: no such file"),
])
def test_a_refused_command_says_why_in_a_line_and_changes_nothing(tmp_path, two, args, message):
    before = state(two)
    line = one_error(sluice(tmp_path, "--config", str(two), *args))
    assert line.startswith(f"error: {message.format(path=two)}"), line
    assert state(two) == before


def test_token_and_token_file_together_are_a_usage_error(tmp_path, two):
    before = state(two)
    line = one_error(sluice(tmp_path, "--config", str(two), "config", "set-context", "prod", "--token", "t",
                            "--token-file", str(two)), code=2)
    assert line == "error: sluice config set-context: Invalid value: give --token or --token-file, not both"
    assert state(two) == before


def test_current_context_of_a_file_without_one(tmp_path):
    line = one_error(sluice(tmp_path, "config", "current-context"))
    path = tmp_path / "config" / "sluice" / "client.yaml"
    assert line == (f"error: config current-context: no current context in {path} (it holds none); pick one "
                    "with `sluice config use-context NAME`")
    assert state(path) is None


@pytest.mark.parametrize("where", ["parent-is-a-file", "a-directory"])
def test_a_file_it_cannot_write_is_refused_in_a_line(tmp_path, where):
    blocker = tmp_path / "blocker"
    if where == "parent-is-a-file":
        blocker.write_text("a file\n")
        path, why = blocker / "client.yaml", f"{blocker} is not a directory"
    else:
        blocker.mkdir()
        (blocker / "client.yaml").mkdir()
        path, why = blocker / "client.yaml", "Is a directory"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    line = one_error(sluice(tmp_path, "--config", str(path), "config", "set-context", "x", "--address", "a:1",
                            "--token", "t"))
    assert line.startswith("error: config set-context x: ") and line.endswith(why), line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no file left half-written beside it


# -- `sluice up` and a file of contexts -------------------------------------------------------------------

def test_sluice_up_makes_its_file_the_default_as_before(clean_env, tmp_path):
    data_file = tmp_path / "data" / "client.yaml"
    config.write(data_file, config.ClientConfig("127.0.0.1:7070", "sl_up", ca="/data/ca.crt"))
    assert stat.S_IMODE(data_file.stat().st_mode) == 0o600
    config.make_default(data_file)
    assert config.default_path().is_symlink() and config.default_path().resolve() == data_file.resolve()
    assert config.load() == config.ClientConfig("127.0.0.1:7070", "sl_up", ca="/data/ca.crt")


def test_sluice_up_keeps_the_contexts_of_a_default_file_and_becomes_current(clean_env, tmp_path, two):
    default = config.default_path()
    default.parent.mkdir(parents=True)
    default.write_text(TWO)
    data_file = tmp_path / "data" / "client.yaml"
    ca = tmp_path / "data" / "ca.crt"
    config.write(data_file, config.ClientConfig("127.0.0.1:7070", "sl_up", ca=str(ca)))
    ca.write_text("the data dir's CA\n")
    config.make_default(data_file)
    found = config.read(default)
    assert found.names == ["prod", "local", "up"] and found.current == "up" and not default.is_symlink()
    assert config.load() == config.ClientConfig("127.0.0.1:7070", "sl_up", ca=str(ca))
    assert stat.S_IMODE(default.stat().st_mode) == 0o600
    config.use_context(default, "prod")
    config.make_default(data_file)  # a restart: the same context again, current again, no second one
    assert config.read(default).names == ["prod", "local", "up"] and config.read(default).current == "up"
    # A context the user made from that file (set-context on the link `sluice up` left) is found, not doubled.
    config.delete_context(default, "local")
    config.set_context(default, "mine", address="127.0.0.1:7070", token="sl_up", ca=str(ca))
    config.use_context(default, "prod")
    config.delete_context(default, "up")
    config.make_default(data_file)
    assert config.read(default).names == ["prod", "mine"] and config.read(default).current == "mine"
