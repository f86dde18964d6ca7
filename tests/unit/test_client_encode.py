"""The client's job-document encoding: orjson's speed, `json`'s text wherever the two would differ in what
the dispatcher receives (tests/integration/test_submit_json.py: what it does with NaN and the rest)."""
from __future__ import annotations

import json

import pytest

from sluice.client import _encode

EXACT = json.JSONEncoder(separators=(",", ":")).encode


def test_a_plain_document_is_compact_json_of_the_same_values():
    doc = {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": "trän", "labels": {"a": "b"}},
           "spec": {"queue": "q", "priority": -3, "podSets": [{"count": 2, "template": {"x": [1.5, True]}}]}}
    text = _encode(doc)
    assert json.loads(text) == doc
    assert " " not in text and "trän" in text  # compact, and UTF-8 rather than escapes: the same string


@pytest.mark.parametrize("doc", [
    {"a": float("nan")}, {"a": [float("inf")]}, {"a": -float("inf")},  # orjson: null; json: NaN, Infinity
    {"a": None, "b": 1},  # any null goes through json (it cannot be told from a NaN written as null)
    {"a": 2**70}, {"a": -(2**64)},  # past 64 bits: orjson refuses
    {1: "x", None: "y"},  # keys that are not strings: orjson refuses
    {"a": "\ud800"},  # a lone surrogate: orjson refuses
])
def test_what_orjson_would_write_otherwise_or_refuses_is_written_as_json_writes_it(doc):
    assert _encode(doc) == EXACT(doc)
