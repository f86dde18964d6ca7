"""docs/api.md against the code, so the reference cannot drift from what Sluice does.

Each list below comes from the code, not from this file: the job-file and admin-object fields by asking
the parsers themselves (a mapping they check refuses an unknown key by listing the keys it knows), the
commands and options by walking the typer app, the `-o json` keys by calling the real client against a
gRPC server that answers every call with a message whose every list holds one entry.
"""
from __future__ import annotations

import copy
import inspect
import pathlib
import re
import subprocess
import sys
from concurrent import futures

import grpc
import pytest

from sluice import objects, spec
from sluice._validate import SpecError

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "api.md").read_text()
PROBE = "zzzzzz"  # a key no parser knows (nor is close to one it knows)
UNKNOWN = "unknown field (known: "


# -- sections of the doc ---------------------------------------------------------------------------

def section(title: str, doc: str = DOC) -> str:
    """The text under the first heading that contains `title`, up to the next heading of its level or above."""
    lines, headings, fenced = doc.splitlines(), [], False
    for n, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:
            headings.append((n, len(line) - len(line.lstrip("#")), line))
    for i, (start, level, line) in enumerate(headings):
        if title in line:
            end = next((n for n, lvl, _ in headings[i + 1:] if lvl <= level), len(lines))
            return "\n".join(lines[start:end])
    raise AssertionError(f"docs/api.md has no heading with {title!r}")


def first_cells(text: str) -> set[str]:
    """The backticked names in the first cell of every table row (`a`, `b` names two)."""
    out = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            out.update(re.findall(r"`([^`]+)`", line.split(" | ")[0]))
    return out


# -- fields, from the parsers ----------------------------------------------------------------------

def _name(keys: list) -> str:
    """A field's path as the doc writes it: 'spec.podSets[].count'."""
    return _error_path(keys).replace("[0]", "[]")


def _error_path(keys: list) -> str:
    """A field's path as a SpecError names it: 'spec.podSets[0].count'."""
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out


def _at(doc, keys: list):
    for key in keys:
        doc = doc[key]
    return doc


def _lookup(doc, keys: list):
    try:
        return _at(doc, keys)
    except (KeyError, IndexError, TypeError):
        return None


def _with(doc, keys: list, value):
    doc = copy.deepcopy(doc)
    _at(doc, keys[:-1])[keys[-1]] = value
    return doc


def known_fields(parse, doc: dict, bases: dict[str, dict]) -> set[str]:
    """Every field path `parse` accepts in documents like `doc` ('spec.podSets[].count'). `bases`: the
    least valid value of a mapping that has required fields, by its path."""
    found: set[str] = set()

    def known(probe: dict, keys: list) -> list[str] | None:
        """The keys the mapping at `keys` allows, if parsing `probe` (PROBE put in it) says so."""
        try:
            parse(probe)
        except SpecError as err:
            if err.path == _error_path([*keys, PROBE]) and err.message.startswith(UNKNOWN):
                return err.message[len(UNKNOWN):-1].split(", ")
        return None

    def walk(current: dict, keys: list) -> None:
        names = known(_with(current, [*keys, PROBE], 1), keys)
        assert names, f"{_name(keys) or 'the document'} lists no fields"
        for name in names:
            here = [*keys, name]
            found.add(_name(here))
            now = _lookup(current, here)
            base = now if isinstance(now, dict) else bases.get(_name(here), {})
            mapping = _with(current, here, copy.deepcopy(base))
            if known(_with(mapping, [*here, PROBE], 1), here) is not None:
                walk(mapping, here)
                continue
            first = now[0] if isinstance(now, list) and now and isinstance(now[0], dict) else {}
            listed = _with(current, here, [copy.deepcopy(first)])
            if known(_with(listed, [*here, 0, PROBE], 1), [*here, 0]) is not None:
                walk(listed, [*here, 0])

    walk(doc, [])
    return found


JOB = {"apiVersion": "sluice.io/v1", "kind": "Job",
       "spec": {"queue": "q", "podSets": [{"name": "a", "count": 1,
                                           "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}]}}
ADMIN_BASES = {"spec.prometheus": {"url": "http://127.0.0.1:9090"}, "spec.elastic": {"maxNodes": 1},
               "spec.simulated": {"nodes": 1, "node": {"cpu": "1"}}}


def test_the_probe_finds_what_the_parser_knows():
    """The field finder itself: it finds nested mappings, lists of mappings, and nothing that is not there."""
    fields = known_fields(spec.job_from_document, JOB, {})
    assert {"spec.podSets[].count", "spec.placement.tiers", "metadata.labels"} <= fields
    assert not any(PROBE in f for f in fields)


def test_every_job_file_field_is_in_the_doc_and_every_documented_one_exists():
    fields = known_fields(spec.job_from_document, JOB, {})
    part = section("### Sluice Job")
    assert not [f for f in sorted(fields) if f"`{f}`" not in part]
    assert first_cells(part) <= fields


def test_the_kubernetes_job_form_is_in_the_doc():
    part = section("### Kubernetes Job")
    annotations = [value for name, value in vars(spec).items() if name.endswith("_ANNOTATION")]
    assert annotations
    for annotation in annotations:
        assert f"`metadata.annotations[{annotation}]`" in part
    read = set(re.findall(r'"(spec\.[A-Za-z]+)"', inspect.getsource(spec._kubernetes_job)))
    assert read and not [f for f in sorted(read) if f"`{f}`" not in part]
    assert f"`{spec.KUBERNETES_API_VERSION}`" in DOC and f"`{spec.KUBERNETES_POD_SET}`" in part


@pytest.mark.parametrize("kind", sorted(objects.KINDS))
def test_every_admin_kind_and_field_is_in_the_doc_and_every_documented_one_exists(kind):
    doc = {"apiVersion": "sluice.io/v1", "kind": kind, "metadata": {"name": "x"}, "spec": {}}
    fields = known_fields(objects.object_from_document, doc, ADMIN_BASES)
    part = section(f"### {kind}")
    assert not [f for f in sorted(fields) if f"`{f}`" not in part]
    assert first_cells(part) <= fields
    # `sluice admin get` prints the canonical document: every key it writes is documented too.
    written = set(_paths(objects.object_from_document(doc).to_document()))
    assert not [p for p in sorted(written) if f"`{p}`" not in part]


def test_every_sluice_io_name_in_the_code_is_in_the_doc():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    names = set()
    for name in files:
        if name.startswith(("tests/", "bench/", "migrations/")):
            continue
        path = ROOT / name
        if path.is_file():
            names.update(re.findall(r'"(sluice\.io/[a-z0-9-]+)"', path.read_text()))
    assert "sluice.io/queue" in names
    assert not [n for n in sorted(names) if n not in DOC]


# -- commands and options, from the typer app ------------------------------------------------------

def _commands():
    """(path, click command) of every command `sluice` runs, groups walked whatever module defines them."""
    import typer

    from sluice.cli import app

    out = []

    def walk(command, path):
        sub = getattr(command, "commands", None)
        if sub:
            for name, child in sub.items():
                walk(child, [*path, name])
        else:
            out.append((" ".join(path), command))
    root = typer.main.get_command(app)
    walk(root, [])
    return root, out


def test_every_command_and_its_options_are_in_the_doc():
    root, commands = _commands()
    assert len(commands) > 20
    rows = {line.split(" | ")[0][len("| `sluice "):-1]: line for line in section("## Command line").splitlines()
            if line.startswith("| `sluice ")}
    missing, options = [], []
    for path, command in commands:
        row = rows.get(path)
        if row is None:
            missing.append(path)
            continue
        for param in command.params:
            if param.param_type_name != "option":
                continue
            for opt in [*param.opts, *param.secondary_opts]:
                if opt.startswith("--") and opt not in row:
                    options.append(f"{path} {opt}")
            for var in [param.envvar] if isinstance(param.envvar, str) else (param.envvar or []):
                if f"`${var}`" not in DOC:
                    options.append(f"{path} ${var}")
    assert not missing and not options
    assert set(rows) <= {path for path, _ in commands}  # nothing documented that does not exist
    for param in root.params:  # the options every command takes
        assert all(opt in section("## Command line") for opt in param.opts)
        if isinstance(param.envvar, str):
            assert f"`${param.envvar}`" in DOC


# -- exit codes ------------------------------------------------------------------------------------

def _sluice(args: list[str], tmp_path) -> tuple[int, str, str]:
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "sluice", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def test_the_exit_codes_and_the_error_line_are_as_documented(tmp_path):
    codes = section("## Exit codes")
    for code in ("0", "1", "2"):
        assert f"\n| {code} | " in codes
    assert "`error: <what>: <why>`" in codes

    code, out, err = _sluice(["get", "--help"], tmp_path)
    assert code == 0 and "Show one job" in out
    code, out, err = _sluice(["get", "12"], tmp_path)  # no dispatcher configured: a user error
    assert code == 1 and len(err.splitlines()) == 1 and err.startswith("error: get 12: no dispatcher configured")
    code, out, err = _sluice(["get", "twelve"], tmp_path)  # not a job id: a usage error
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    code, out, err = _sluice(["no-such-command"], tmp_path)
    assert code == 2 and err.startswith("error: "), err


# -- `-o json` shapes, from the client -------------------------------------------------------------

def _paths(value, prefix: str = ""):
    """Every key path of a JSON value: 'bursts[].alternatives[].verdict'."""
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path
            yield from _paths(item, path)
    elif isinstance(value, list):
        for item in value:
            yield from _paths(item, f"{prefix}[]")


def _repeated(field) -> bool:
    flag = getattr(field, "is_repeated", None)
    return flag if flag is not None else field.label == field.LABEL_REPEATED


def _filled(message):
    """`message` with one entry in every list, recursively, and "{}" in every *_json text (maps stay
    empty: their keys are data, not shape)."""
    for field in message.DESCRIPTOR.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            continue
        if _repeated(field):
            if field.message_type is not None:
                _filled(getattr(message, field.name).add())
            elif field.name.endswith("_json"):
                getattr(message, field.name).append("{}")
        elif field.message_type is not None:
            _filled(getattr(message, field.name))
        elif field.name.endswith("_json"):
            setattr(message, field.name, "{}")
    return message


def _handler(service, module):
    handlers = {}
    for method in service.methods:
        request, response = getattr(module, method.input_type.name), getattr(module, method.output_type.name)

        def answer(*_, response=response):
            return _filled(response())

        def answers(*_, response=response):
            yield _filled(response())
        kind = {(False, False): grpc.unary_unary_rpc_method_handler,
                (False, True): grpc.unary_stream_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler}[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = kind(answers if method.server_streaming else answer,
                                     request_deserializer=request.FromString,
                                     response_serializer=response.SerializeToString)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


@pytest.fixture(scope="module")
def shapes():
    """What each read command's client call returns, against a server whose every answer is full."""
    from sluice.admin_client import AdminClient
    from sluice.config import ClientConfig
    from sluice.v1 import admin_pb2, jobs_pb2, schedules_pb2

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers([_handler(jobs_pb2.DESCRIPTOR.services_by_name["Jobs"], jobs_pb2),
                                     _handler(admin_pb2.DESCRIPTOR.services_by_name["Admin"], admin_pb2),
                                     _handler(schedules_pb2.DESCRIPTOR.services_by_name["Schedules"], schedules_pb2)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with AdminClient(ClientConfig(f"127.0.0.1:{port}", "t", timeout_s=10, insecure=True)) as client:
            yield {"get": client.get(1), "list": client.list(limit=1), "cancel": client.cancel([1]),
                   "describe": client.describe(1), "explain": client.explain(1), "watch": next(iter(client.watch())),
                   "clusters": client.clusters(), "queues": client.queues(), "usage": client.usage(),
                   "admin quota set": client.set_quota("q", {"cpu": "1"}),
                   "admin queue add-member": client.add_member("q", "u"),
                   "admin token create": client.create_token("user", "u"), "admin token list": client.tokens(),
                   "admin audit": client.audit(), "schedule get": client.schedule("s"),
                   "schedule list": client.schedules(), "schedule trigger": client.trigger_schedule("s")}
    finally:
        server.stop(None)


# Parts of a shape the doc gives by naming another command's: (command, where) -> that command.
SAME_AS = {("describe", ""): "get", ("describe", "events[]"): "watch", ("explain", ""): "get",
           ("list", ""): "get", ("cancel", ""): "get", ("schedule trigger", "schedule"): "schedule get"}
COMMANDS = ["get", "list", "cancel", "describe", "explain", "watch", "clusters", "queues", "usage",
            "admin quota set", "admin queue add-member", "admin token create", "admin token list", "admin audit",
            "schedule get", "schedule trigger"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_key_of_the_json_output_is_in_the_doc(shapes, command):
    value = shapes[command]
    if isinstance(value, list):  # an array of objects: the doc gives one object's keys
        assert len(value) == 1
        value = value[0]
    paths = set(_paths(value))
    assert paths, command
    part = section(f"`sluice {command}`")
    for (name, where), other in SAME_AS.items():
        if name != command:
            continue
        theirs = shapes[other][0] if isinstance(shapes[other], list) else shapes[other]
        prefix = f"{where}." if where else ""
        assert f"`sluice {other}`" in part
        paths -= {prefix + p for p in _paths(theirs)}
    assert not [p for p in sorted(paths) if f"`{p}`" not in part]


def test_the_job_states_are_in_the_doc():
    from dispatcher.policy.states import STATES
    part = section("`sluice get`")
    assert not [s for s in STATES if f"`{s}`" not in part]


# -- links -----------------------------------------------------------------------------------------

def test_nothing_shipped_points_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        if name.startswith(("tests/", "bench/", ".ci/")):
            continue
        path = ROOT / name
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if "../shared" in text or "/work/shared" in text:
            found.append(name)
    assert found == []
