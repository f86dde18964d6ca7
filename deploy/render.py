"""Render deploy/ without kustomize or helm: the subset of both that deploy/ uses, and nothing more.

No kustomize or helm binary can be installed on the machine that runs the tests from its package
registries (Debian bookworm has no helm, and its `kubernetes-client` 1.20 embeds kustomize v2.0.3, older
than the kustomization fields used here; PyPI has neither). So this module renders:

- **Kustomize**: `resources` (files, and directories holding a kustomization), `components`
  (directories holding a `kind: Component` with the same fields), `labels` (`pairs` on
  `metadata.labels` only: `includeSelectors` and `includeTemplates` left false), `images` (`newName`,
  `newTag`) and `patches` given inline as RFC 6902 JSON patches with a `target` of `kind` and `name`.
  Any other kustomization field is refused. When a kubectl with kustomize v4 or newer is on PATH,
  tests/unit/test_deploy.py checks this output equals `kubectl kustomize` for every kustomization.
- **Helm**: the chart's templates through a small Go-template interpreter: text, `{{- -}}` trimming,
  comments, `if`/`else`, `range` over a list, `with`, `define`/`include`; pipelines of fields
  (`.Values.x`, `$.Release.Name`), string and number literals and the functions in FUNCTIONS. A field
  the values do not have is an error (Helm would print an empty string), so are unknown functions and
  actions. Files whose names start with `_` are partials and NOTES.txt is not a manifest, as in Helm.

    python deploy/render.py kustomize deploy/overlays/kind
    python deploy/render.py helm deploy/helm/sluice [-f values.yaml ...] [--release sluice] [--namespace sluice]
"""
from __future__ import annotations

import argparse
import copy
import json
import pathlib
import re
import sys
from collections.abc import Callable
from typing import Any

import yaml


class RenderError(Exception):
    """The input uses something this renderer does not implement, or is wrong."""


# -- kustomize --------------------------------------------------------------------------------------
KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "components", "labels", "images", "patches"}


def kustomize(directory: str | pathlib.Path) -> list[dict]:
    """The objects `kustomize build DIRECTORY` prints, in resource order."""
    return _build(pathlib.Path(directory), [], "Kustomization")


def _build(root: pathlib.Path, objects: list[dict], kind: str) -> list[dict]:
    """A Kustomization's objects; a Component's (kind="Component") added to `objects`, the objects of the
    kustomization that lists it, and its patches, images and labels applied to all of them, as kustomize
    does before that kustomization's own."""
    found = [root / n for n in KUSTOMIZATION_NAMES if (root / n).is_file()]
    if not found:
        raise RenderError(f"{root}: no kustomization.yaml")
    spec = yaml.safe_load(found[0].read_text()) or {}
    unknown = set(spec) - KUSTOMIZATION_FIELDS
    if unknown:
        raise RenderError(f"{found[0]}: fields this renderer does not implement: {', '.join(sorted(unknown))}")
    if spec.get("kind", "Kustomization") != kind:
        raise RenderError(f"{found[0]}: kind {spec.get('kind', 'Kustomization')} where a {kind} is expected "
                          "(a Component is used only through `components`)")
    for entry in spec.get("resources") or []:
        path = root / entry
        if path.is_dir():
            objects.extend(kustomize(path))
        elif path.is_file():
            objects.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
        else:
            raise RenderError(f"{found[0]}: resource {entry} does not exist")
    _check_unique(objects, found[0])
    for entry in spec.get("components") or []:
        objects = _build(root / entry, objects, "Component")
    for patch in spec.get("patches") or []:
        _patch(objects, patch, found[0])
    for image in spec.get("images") or []:
        _set_image(objects, image)
    for label in spec.get("labels") or []:
        if set(label) - {"pairs", "includeSelectors", "includeTemplates"} or label.get("includeSelectors") \
                or label.get("includeTemplates"):
            raise RenderError(f"{found[0]}: labels: only `pairs` (metadata.labels) is implemented")
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    return objects


def _key(obj: dict) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")


def _check_unique(objects: list[dict], where: pathlib.Path) -> None:
    seen = set()
    for obj in objects:
        if _key(obj) in seen:
            raise RenderError(f"{where}: {'/'.join(_key(obj))} appears twice")
        seen.add(_key(obj))


def _patch(objects: list[dict], patch: dict, where: pathlib.Path) -> None:
    target = patch.get("target") or {}
    if set(patch) - {"target", "patch"} or set(target) - {"kind", "name"} or not target:
        raise RenderError(f"{where}: patches: only inline `patch` with a `target` of kind and name is implemented")
    operations = yaml.safe_load(patch["patch"])
    if not isinstance(operations, list):
        raise RenderError(f"{where}: patches: only JSON 6902 patches (a list of operations) are implemented")
    matched = [o for o in objects if o.get("kind") == target.get("kind", o.get("kind"))
               and o["metadata"]["name"] == target.get("name", o["metadata"]["name"])]
    if not matched:
        raise RenderError(f"{where}: patch target {target} matches no resource")
    for obj in matched:
        for op in operations:
            _json_patch(obj, op, where)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise RenderError(f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json_patch(obj: dict, op: dict, where: pathlib.Path) -> None:
    *parents, last = _pointer(op["path"])
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    kind = op["op"]
    if kind not in ("add", "replace", "remove"):
        raise RenderError(f"{where}: JSON patch op {kind!r} is not implemented")
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if kind == "add":
            node.insert(index, copy.deepcopy(op["value"]))
        elif kind == "replace":
            node[index] = copy.deepcopy(op["value"])
        else:
            del node[index]
        return
    if kind in ("replace", "remove") and last not in node:
        raise RenderError(f"{where}: JSON patch {kind} {op['path']}: no such field")
    if kind == "remove":
        del node[last]
    else:
        node[last] = copy.deepcopy(op["value"])


def _set_image(objects: list[dict], image: dict) -> None:
    if set(image) - {"name", "newName", "newTag"}:
        raise RenderError(f"images: only name, newName and newTag are implemented: {image}")

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    for container in value:
                        name, tag = _split_image(container.get("image", ""))
                        if name == image["name"]:
                            container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}" \
                                if image.get("newTag", tag) else image.get("newName", name)
                else:
                    visit(value)
        elif isinstance(node, list):
            for item in node:
                visit(item)
    for obj in objects:
        visit(obj)


def _split_image(ref: str) -> tuple[str, str]:
    if "@" in ref:
        raise RenderError(f"image {ref}: digests are not implemented")
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:  # no tag; the colon was a registry port
        return ref, ""
    return name, tag


# -- helm -------------------------------------------------------------------------------------------
# An action ends at the first }} outside a string literal: {{ "}}" }} prints }} (as in Go's templates).
ACTION = re.compile(r'\{\{(-\s)?((?:"(?:[^"\\]|\\.)*"|[^"])*?)(\s-)?\}\}', re.DOTALL)
TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>-?\d+(?:\.\d+)?)|(?P<pipe>\|)|(?P<open>\()|(?P<close>\))
                       |(?P<field>\$?(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\$|\.)"""
                   r"""|(?P<ident>[A-Za-z_][A-Za-z0-9_]*))""", re.VERBOSE)


def helm(chart: str | pathlib.Path, values_files: list[str | pathlib.Path] = (), release: str = "sluice",
         namespace: str = "sluice") -> list[dict]:
    """The objects `helm template RELEASE CHART -n NAMESPACE -f VALUES...` prints (hooks included)."""
    chart = pathlib.Path(chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    values = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    for path in values_files:
        values = _merge(values, yaml.safe_load(pathlib.Path(path).read_text()) or {})
    root = {"Values": values,
            "Release": {"Name": release, "Namespace": namespace, "Service": "Helm", "IsInstall": True,
                        "IsUpgrade": False, "Revision": 1},
            "Chart": {k[:1].upper() + k[1:]: v for k, v in meta.items()}}
    templates = sorted((chart / "templates").glob("*"))
    defines: dict[str, list] = {}
    parsed = {}
    for path in templates:
        if path.suffix not in (".yaml", ".yml", ".tpl", ".txt"):
            continue
        nodes = _parse(_tokens(path.read_text(), path.name), path.name)
        defines.update(_defines(nodes))
        parsed[path] = nodes
    objects: list[dict] = []
    for path, nodes in parsed.items():
        if path.name.startswith("_") or path.name == "NOTES.txt":
            continue
        text = _Renderer(root, defines, path.name).render(nodes, root)
        try:
            objects.extend(d for d in yaml.safe_load_all(text) if d)
        except yaml.YAMLError as exc:
            raise RenderError(f"{path.name}: rendered text is not YAML: {exc}\n{text}") from None
    return objects


def _merge(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = _merge(base.get(key), value) if key in base else value
        return out
    return copy.deepcopy(override)


def _tokens(text: str, name: str) -> list:
    """Text and actions, with Go's trim markers applied to the neighbouring text."""
    out: list = []
    pos = 0
    trim_next = False
    for match in ACTION.finditer(text):
        chunk = text[pos:match.start()]
        if trim_next:
            chunk = chunk.lstrip()
        if match.group(1):
            chunk = chunk.rstrip()
        out.append(("text", chunk))
        body = match.group(2).strip()
        if not (body.startswith("/*") and body.endswith("*/")):
            out.append(("action", body))
        trim_next = bool(match.group(3))
        pos = match.end()
    chunk = text[pos:]
    out.append(("text", chunk.lstrip() if trim_next else chunk))
    if "{{" in "".join(t for kind, t in out if kind == "text"):
        raise RenderError(f"{name}: an action this renderer cannot read")
    return out


BLOCKS = ("if", "range", "with", "define")


def _parse(tokens: list, name: str) -> list:
    """A tree: ("text", s), ("print", pipeline), (block, argument, body, else_body)."""
    stack: list = [("root", None, [], None)]
    for kind, value in tokens:
        body = stack[-1][3] if stack[-1][3] is not None else stack[-1][2]
        if kind == "text":
            if value:
                body.append(("text", value))
            continue
        word, _, rest = value.partition(" ")
        if word in BLOCKS:
            stack.append((word, rest.strip(), [], None))
        elif word == "else":
            if rest.strip() or stack[-1][0] not in ("if", "range", "with") or stack[-1][3] is not None:
                raise RenderError(f"{name}: {{{{ {value} }}}} is not implemented here")
            block, arg, then, _ = stack.pop()
            stack.append((block, arg, then, []))
        elif word == "end":
            if len(stack) == 1:
                raise RenderError(f"{name}: unmatched end")
            block, arg, then, otherwise = stack.pop()
            parent = stack[-1][3] if stack[-1][3] is not None else stack[-1][2]
            parent.append((block, arg, then, otherwise or []))
        elif word in ("template", "block", "break", "continue") or ":=" in value or re.match(r"\$\w", value):
            raise RenderError(f"{name}: {{{{ {value} }}}} is not implemented")
        else:
            body.append(("print", value))
    if len(stack) != 1:
        raise RenderError(f"{name}: {stack[-1][0]} without end")
    return stack[0][2]


def _defines(nodes: list) -> dict[str, list]:
    out = {}
    for node in nodes:
        if node[0] == "define":
            out[json.loads(node[1])] = node[2]
    return out


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, "") and not (isinstance(value, (list, dict)) and not value)


def _to_text(value: Any, where: str) -> str:
    if value is None:
        raise RenderError(f"{where}: a value is null (Helm would print nothing)")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (dict, list)):
        raise RenderError(f"{where}: printing a map or list needs toYaml")
    return str(value)


def _to_yaml(value: Any) -> str:
    if value is None:
        return "null"
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n").removesuffix("\n...")


def _required(message: str, value: Any) -> Any:
    if not _truthy(value):
        raise RenderError(f"required: {message}")
    return value


def _fail(message: str) -> None:
    raise RenderError(f"fail: {message}")


FUNCTIONS: dict[str, Callable] = {
    "quote": lambda v: json.dumps(_to_text(v, "quote")),
    "toYaml": _to_yaml,
    "indent": lambda n, s: "\n".join(" " * int(n) + line for line in s.split("\n")),
    "nindent": lambda n, s: "\n" + "\n".join(" " * int(n) + line for line in s.split("\n")),
    "default": lambda default, value=None: value if _truthy(value) else default,
    "required": _required,
    "fail": _fail,
    "not": lambda v: not _truthy(v),
    "toString": lambda v: _to_text(v, "toString"),
}


class _Renderer:
    def __init__(self, root: dict, defines: dict[str, list], name: str):
        self.root, self.defines, self.name = root, defines, name

    def render(self, nodes: list, dot: Any) -> str:
        out = []
        for node in nodes:
            kind = node[0]
            if kind == "text":
                out.append(node[1])
            elif kind == "print":
                out.append(_to_text(self.pipeline(node[1], dot), f"{self.name}: {{{{ {node[1]} }}}}"))
            elif kind == "define":
                continue
            else:
                _, arg, then, otherwise = node
                value = self.pipeline(arg, dot)
                if kind == "if":
                    out.append(self.render(then if _truthy(value) else otherwise, dot))
                elif kind == "with":
                    out.append(self.render(then, value) if _truthy(value) else self.render(otherwise, dot))
                elif kind == "range":
                    if isinstance(value, dict):
                        raise RenderError(f"{self.name}: range over a map is not implemented")
                    items = value or []
                    out.append("".join(self.render(then, item) for item in items) if items
                               else self.render(otherwise, dot))
        return "".join(out)

    def pipeline(self, text: str, dot: Any) -> Any:
        tokens = self._lex(text)
        value, rest = self._pipeline(tokens, dot)
        if rest:
            raise RenderError(f"{self.name}: cannot read {text!r}")
        return value

    def _lex(self, text: str) -> list[tuple[str, str]]:
        out, pos = [], 0
        text = text.rstrip()
        while pos < len(text):
            match = TOKEN.match(text, pos)
            if not match or match.end() == pos:
                raise RenderError(f"{self.name}: cannot read {text[pos:]!r}")
            out.append((match.lastgroup, match.group(match.lastgroup)))
            pos = match.end()
        return out

    def _pipeline(self, tokens: list, dot: Any) -> tuple[Any, list]:
        value, tokens = self._command(tokens, dot, None, piped=False)
        while tokens and tokens[0][0] == "pipe":
            value, tokens = self._command(tokens[1:], dot, value, piped=True)
        return value, tokens

    def _command(self, tokens: list, dot: Any, piped_value: Any, piped: bool) -> tuple[Any, list]:
        if not tokens:
            raise RenderError(f"{self.name}: empty command")
        if tokens[0][0] == "ident" and tokens[0][1] not in ("true", "false", "nil"):
            name = tokens[0][1]
            args, tokens = [], tokens[1:]
            while tokens and tokens[0][0] not in ("pipe", "close"):
                arg, tokens = self._operand(tokens, dot)
                args.append(arg)
            if piped:
                args.append(piped_value)
            if name == "include":
                template, context = args
                if template not in self.defines:
                    raise RenderError(f"{self.name}: include of undefined template {template!r}")
                return self.render(self.defines[template], context), tokens
            if name not in FUNCTIONS:
                raise RenderError(f"{self.name}: function {name!r} is not implemented")
            return FUNCTIONS[name](*args), tokens
        if piped:
            raise RenderError(f"{self.name}: only a function can follow |")
        value, tokens = self._operand(tokens, dot)
        if tokens and tokens[0][0] not in ("pipe", "close"):
            raise RenderError(f"{self.name}: a value cannot take arguments")
        return value, tokens

    def _operand(self, tokens: list, dot: Any) -> tuple[Any, list]:
        kind, text = tokens[0]
        if kind == "str":
            return json.loads(text), tokens[1:]
        if kind == "num":
            return (float(text) if "." in text else int(text)), tokens[1:]
        if kind == "ident" and text in ("true", "false", "nil"):
            return {"true": True, "false": False, "nil": None}[text], tokens[1:]
        if kind == "open":
            value, rest = self._pipeline(tokens[1:], dot)
            if not rest or rest[0][0] != "close":
                raise RenderError(f"{self.name}: unbalanced parenthesis")
            return value, rest[1:]
        if kind == "field":
            return self._field(text, dot), tokens[1:]
        raise RenderError(f"{self.name}: unexpected {text!r}")

    def _field(self, text: str, dot: Any) -> Any:
        value = self.root if text.startswith("$") else dot
        for part in [p for p in text.lstrip("$").split(".") if p]:
            if not isinstance(value, dict) or part not in value:
                raise RenderError(f"{self.name}: {text}: no field {part!r} (give it in values.yaml)")
            value = value[part]
        return value


# -- command line -----------------------------------------------------------------------------------
def dump(objects: list[dict]) -> str:
    return yaml.safe_dump_all(objects, default_flow_style=False, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="tool", required=True)
    k = sub.add_parser("kustomize", help="render a kustomization directory")
    k.add_argument("directory")
    h = sub.add_parser("helm", help="render a chart's templates")
    h.add_argument("chart")
    h.add_argument("-f", "--values", action="append", default=[])
    h.add_argument("--release", default="sluice")
    h.add_argument("--namespace", "-n", default="sluice")
    args = parser.parse_args(argv)
    try:
        objects = kustomize(args.directory) if args.tool == "kustomize" else \
            helm(args.chart, args.values, args.release, args.namespace)
    except (RenderError, OSError, yaml.YAMLError) as exc:
        print(f"error: render {args.tool}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(dump(objects))
    return 0


if __name__ == "__main__":
    sys.exit(main())
