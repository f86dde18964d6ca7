"""Submit decodes documents with orjson and writes them with orjson, falling back to `json` wherever the two
would differ (dispatcher/submitting.py _decode, dispatcher/store/copy_codec.py dumps): the specs, the rows
written and the errors are those `json` gives, both ways of writing (one statement, COPY)."""
from __future__ import annotations

import json

import psycopg
import pytest

from dispatcher.errors import InvalidRequest
from dispatcher.services import submitting
from dispatcher.store import copy_codec, lifecycle
from sluice.spec import job_from_document
from tests.integration.test_spine import job_doc
from tests.integration.test_submit_groups import ADMIN, store  # noqa: F401 - store is a fixture


def _doc(**template_extra) -> dict:
    doc = job_doc(name="j")
    doc["spec"]["podSets"][0]["template"]["metadata"]["annotations"].update(template_extra)
    return doc


ODD_VALUES = {  # what each decoder reads alike, or where the documents go to `json`
    "unicode": "é ✓ \"quoted\" \\ \n \U0001F600", "float": 1.5e16, "tiny": 5e-324, "negative-zero": -0.0,
    "int64": -(2 ** 63), "uint64": 2 ** 64 - 1, "big-int": 2 ** 70, "digits-in-a-string": "1" * 30,
    "nested": [[[[{"a": [1, 2.5, None, True]}]]]], "empty": {}, "nul-escape-free": "a\tb",
}


def _expected_specs(documents: list[str]) -> list:
    return [job_from_document(json.loads(d), document=n if len(documents) > 1 else None, owned=True)
            for n, d in enumerate(documents, 1)]


def test_the_specs_are_those_json_decodes():
    documents = [json.dumps(_doc(**{k: v})) for k, v in ODD_VALUES.items()]
    documents.append(json.dumps(_doc(**ODD_VALUES), ensure_ascii=False, indent=2))
    assert submitting.parse(documents) == _expected_specs(documents)
    for d in documents:
        assert submitting._decode(d)[0] == json.loads(d)


def test_a_plain_document_is_decoded_by_orjson_and_an_odd_one_by_json():
    assert submitting._decode(json.dumps(job_doc()))[1] is False
    for odd in ['{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": 1E400}', '{"a": "\\ud800"}',
                '{"a": 12345678901234567890123}', "[" * 400 + "]" * 400]:
        decoded, by_json = submitting._decode(odd)
        assert by_json and repr(decoded) == repr(json.loads(odd))  # repr: nan is no nan


@pytest.mark.parametrize("document", ['{', '{"a":}', '{"a": 1,}', '[1', '"\\x"', '{"a": 01}', '\ufeff{}',
                                      '{"a": "\t"}', "", "nul"])
def test_not_json_is_refused_with_jsons_own_words(document):
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(document)
    with pytest.raises(InvalidRequest) as err:
        submitting.parse([json.dumps(job_doc()), document])
    assert str(err.value) == f"document 2: not JSON: {expected.value}"


def test_dumps_falls_back_to_json_where_orjson_would_differ():
    assert copy_codec.dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()
    assert copy_codec.dumps(copy_codec.ExactJSON({"a": float("nan")})) == b'{"a":NaN}'  # orjson: null
    assert copy_codec.dumps({"a": "\ud800"}) == b'{"a":"\\ud800"}'  # orjson refuses lone surrogates
    assert copy_codec.dumps({"a": 2 ** 70}) == b'{"a":1180591620717411303424}'


def _stored_templates(libpq: str, ids: list[int]) -> list:
    with psycopg.connect(libpq, autocommit=True) as conn:
        return [row[0] for row in conn.execute(
            "SELECT spec -> 'spec' -> 'podSets' -> 0 -> 'template' FROM jobs WHERE id = ANY(%s) ORDER BY id",
            (ids,))]


@pytest.mark.parametrize("copy_from", [1, 10 ** 6], ids=["copy", "one-statement"])
def test_the_documents_stored_are_those_json_decodes(store, copy_from):
    sessions, libpq = store
    documents = [json.dumps(_doc(**{k: v})) for k, v in ODD_VALUES.items()]
    specs = submitting.parse(documents)
    with sessions.begin() as session:
        rows = submitting.SubmitConfig.read(session, {"default"}).rows(ADMIN, specs)
        ids = lifecycle.submit(session, rows, copy_from=copy_from)
    stored = _stored_templates(libpq, ids)
    assert stored == [json.loads(d)["spec"]["podSets"][0]["template"] for d in documents]


@pytest.mark.parametrize("copy_from", [1, 10 ** 6], ids=["copy", "one-statement"])
@pytest.mark.parametrize("odd", ["NaN", "Infinity", "-Infinity", "1E400"])
def test_nan_and_infinity_are_refused_by_postgres_as_before_never_stored_as_null(store, copy_from, odd):
    """`json` decodes them to floats Postgres' jsonb refuses; orjson would write them as null."""
    sessions, libpq = store
    documents = [json.dumps(_doc(fine="1")), json.dumps(_doc(x="PLACEHOLDER")).replace('"PLACEHOLDER"', odd)]
    specs = submitting.parse(documents)
    with pytest.raises(Exception) as err:
        with sessions.begin() as session:
            rows = submitting.SubmitConfig.read(session, {"default"}).rows(ADMIN, specs)
            lifecycle.submit(session, rows, copy_from=copy_from)
    assert isinstance(getattr(err.value, "orig", err.value), psycopg.DataError)
    with psycopg.connect(libpq, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
