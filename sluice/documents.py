"""Reading YAML and JSON documents safely: what job files, admin object files and client configs are made of.

A text is one or more documents: YAML with '---', or JSON (one object or an array of objects). Reading
refuses, as errors naming the line, what would make a small file large or deep (YAML aliases standing for
more than MAX_ALIAS_VALUES values, nesting deeper than _validate.MAX_DEPTH), so a hostile file costs little.
"""
from __future__ import annotations

import json

import yaml

from sluice import _validate as v
from sluice._validate import SpecError


def parse_numbered_documents(text: str, *, source: str = "<input>") -> list[tuple[int, dict]]:
    """(1-based position in the file, document) for every non-empty document in text."""
    documents = _json_documents(text, source)
    if documents is None:
        documents = _yaml_documents(text, source)
    out = []
    for number, document in enumerate(documents, 1):
        if document is None:
            continue
        if not isinstance(document, dict):
            raise SpecError("", f"must be a mapping with apiVersion, kind, metadata and spec, "
                                f"got {v.describe(document)}", document=number, source=source)
        out.append((number, document))
    return out


def parse_documents(text: str, *, source: str = "<input>") -> list[dict]:
    """The non-empty documents of a YAML (multi-document) or JSON (object or array) text."""
    return [document for _, document in parse_numbered_documents(text, source=source)]


def _json_documents(text: str, source: str) -> list | None:
    stripped = text.lstrip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        parsed = json.loads(stripped)
    except ValueError:
        return None  # perhaps YAML flow style: let the YAML parser have it and report
    except RecursionError:
        raise SpecError("", v.NESTED_TOO_DEEP, source=source) from None
    documents = parsed if isinstance(parsed, list) else [parsed]
    for number, document in enumerate(documents, 1):
        with v.located(number if isinstance(parsed, list) else None, source):
            v.check_depth(document, stripped if len(documents) == 1 else None)
    return documents


def json_document(text: str) -> object:
    """One JSON document as the dispatcher takes it (an Apply or Submit call's document): json.JSONDecodeError
    when it is not JSON, SpecError when it nests deeper than _validate.MAX_DEPTH."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise SpecError("", v.NESTED_TOO_DEEP) from None
    v.check_depth(value, text)
    return value


MAX_ALIAS_VALUES = 100_000  # values YAML aliases may stand for in one file, in all (a "billion laughs" is 10^9)


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses, as YAML errors, what would make a small file large or deep: aliases that
    stand for more than MAX_ALIAS_VALUES values in all, an alias inside the node it names (a loop), and
    nesting deeper than _validate.MAX_DEPTH (PyYAML composes nodes recursively)."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0
        self._alias_values = 0
        self._sizes: dict[int, int] = {}  # id(node) -> the values it stands for, itself included

    def compose_document(self):
        self._sizes = {}
        return super().compose_document()

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            size = self._sizes.get(id(node))
            if size is None:
                raise yaml.composer.ComposerError(None, None, "an alias inside the node it names", mark)
            self._alias_values += size
            if self._alias_values > MAX_ALIAS_VALUES:
                raise yaml.composer.ComposerError(
                    None, None, f"aliases stand for more than {MAX_ALIAS_VALUES} values (write them out)", mark)
            return node
        self._depth += 1
        try:
            if self._depth > v.MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, v.NESTED_TOO_DEEP, self.peek_event().start_mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self._sizes[id(item)] for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            size = 1 + sum(self._sizes[id(key)] + self._sizes[id(item)] for key, item in node.value)
        else:
            size = 1
        self._sizes[id(node)] = size
        return node


def yaml_documents(text: str) -> list:
    """Every document of a YAML text, as yaml.safe_load_all reads them; raises yaml.YAMLError, also for
    what _BoundedLoader refuses."""
    return list(yaml.load_all(text, Loader=_BoundedLoader))


def _yaml_documents(text: str, source: str) -> list:
    try:
        return yaml_documents(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise SpecError("", f"invalid YAML: {where}{problem}", source=source) from err
