"""Binary COPY encoding of new jobs and their submit events, and the JSON writer the submit path uses.

COPY's binary format: a header, then per row a field count and each field as its length and bytes
(-1: NULL), then a trailer. jsonb is a version byte (1) and the JSON text; ints are big-endian.
"""
from __future__ import annotations

import json
import struct
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from dispatcher.store.lifecycle import NewJob


class ExactJSON(dict):
    """A job document to encode exactly as `json` does: its call held a document orjson would not decode
    (NaN, Infinity, a lone surrogate, an integer past 64 bits...), so its values may be ones orjson
    would write otherwise (NaN as null) or refuse. Postgres then takes or refuses it as before."""


def dumps(value) -> bytes:
    """Compact JSON, UTF-8: orjson (faster); `json` for what orjson refuses or would write differently (an
    ExactJSON, lone surrogates, integers past 64 bits, nesting past 254 levels), so such a document reaches
    Postgres as `json` writes it (ASCII: Postgres refuses the escapes of lone surrogates, failing the call)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_PASSTHROUGH_SUBCLASS)
    except TypeError:  # orjson.JSONEncodeError too
        return _json(value).encode()


COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
COPY_TRAILER = b"\xff\xff"
JOB_COLUMNS = ("id", "name", "queue", "service_class", "class_priority", "priority", "max_retries", "spec",
               "requests", "largest_pod", "placement", "labels", "submitted_by", "pods", "state", "reason")
# A submit with waiting jobs or arrays writes these too, and each row's own state (lifecycle.submit_waiting).
HOLD_COLUMNS = ("hold", "start_after", "array_id", "array_index")
EVENT_COLUMNS = ("job_id", "attempt", "from_state", "to_state", "reason")
_NULL = b"\xff\xff\xff\xff"
_row_and_id = struct.Struct(">hiq").pack  # field count, then an int8 field
_int8 = struct.Struct(">iq").pack
_POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_int4 = struct.Struct(">ii").pack
_length = struct.Struct(">i").pack
# What orjson does not write (see dumps).
_json = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def _field_writers():
    """(text_field, jsonb_field): a str (or None) and a JSON value as COPY fields, each written once per
    distinct value (a jsonb by id(): the documents jobs of one batch share, as submitting interns them)."""
    texts: dict[str | None, bytes] = {None: _NULL}
    values: dict[int, bytes] = {}

    def text_field(value: str | None) -> bytes:
        field = texts.get(value)
        if field is None:
            data = value.encode()
            field = texts[value] = _length(len(data)) + data
        return field

    def jsonb_field(value) -> bytes:
        field = values.get(id(value))
        if field is None:
            data = dumps(value)
            field = values[id(value)] = _length(len(data) + 1) + b"\x01" + data
        return field

    return text_field, jsonb_field


def encode_jobs(ids: list[int], jobs: list[NewJob], state: str, reason: str) -> bytes:
    """The jobs' rows (JOB_COLUMNS) in binary COPY format, each in `state` with `reason` (or its own)."""
    text_field, jsonb_field = _field_writers()
    state_field, tail = text_field(state), text_field(state) + text_field(reason)
    out = [COPY_HEADER]
    for job_id, j in zip(ids, jobs):
        spec = dumps(j.spec)
        out.append(b"".join((
            _row_and_id(len(JOB_COLUMNS), 8, job_id), text_field(j.name), text_field(j.queue),
            text_field(j.service_class), _int4(4, j.class_priority), _int4(4, j.priority), _int4(4, j.max_retries),
            _length(len(spec) + 1), b"\x01", spec, jsonb_field(j.requests), jsonb_field(j.largest_pod),
            jsonb_field(j.placement), jsonb_field(j.labels), text_field(j.submitted_by),
            _NULL if j.pods is None else jsonb_field(j.pods),
            tail if j.reason is None else state_field + text_field(j.reason))))
    out.append(COPY_TRAILER)
    return b"".join(out)


def encode_held_jobs(ids: list[int], jobs: list[NewJob], reason: str) -> bytes:
    """The jobs' rows (JOB_COLUMNS + HOLD_COLUMNS) in binary COPY format, each in its own state, with its
    own reason or `reason`."""
    out = [COPY_HEADER]
    count = len(JOB_COLUMNS) + len(HOLD_COLUMNS)
    text, jsonb = _field_writers()
    for job_id, j in zip(ids, jobs):
        at = None if j.start_after is None else (j.start_after - _POSTGRES_EPOCH) // _MICROSECOND
        out.append(b"".join((
            _row_and_id(count, 8, job_id), text(j.name), text(j.queue), text(j.service_class),
            _int4(4, j.class_priority), _int4(4, j.priority), _int4(4, j.max_retries), jsonb(j.spec),
            jsonb(j.requests), jsonb(j.largest_pod), jsonb(j.placement), jsonb(j.labels), text(j.submitted_by),
            _NULL if j.pods is None else jsonb(j.pods), text(j.state), text(reason if j.reason is None else j.reason),
            text(j.hold), _NULL if at is None else _int8(8, at),
            _NULL if j.array_id is None else _int8(8, j.array_id),
            _NULL if j.array_index is None else _int4(4, j.array_index))))
    out.append(COPY_TRAILER)
    return b"".join(out)


_MICROSECOND = timedelta(microseconds=1)


def encode_first_events(ids: list[int], jobs: list[NewJob], reason: str) -> bytes:
    """Each job's first event (EVENT_COLUMNS): attempt 0, from '' to its own state, with its own reason or
    `reason`."""
    out = [COPY_HEADER]
    for job_id, j in zip(ids, jobs):
        to, why = j.state.encode(), (reason if j.reason is None else j.reason).encode()
        out.append(_row_and_id(len(EVENT_COLUMNS), 8, job_id) + _int4(4, 0) + _length(0) + _length(len(to)) + to
                   + _length(len(why)) + why)
    out.append(COPY_TRAILER)
    return b"".join(out)


def encode_events(ids: list[int], state: str, reason: str) -> bytes:
    """Each job's first event (EVENT_COLUMNS): attempt 0, from '' to `state`, with `reason`."""
    to, why = state.encode(), reason.encode()
    rest = _int4(4, 0) + _length(0) + _length(len(to)) + to + _length(len(why)) + why
    count = len(EVENT_COLUMNS)
    return b"".join((COPY_HEADER, *[_row_and_id(count, 8, job_id) + rest for job_id in ids], COPY_TRAILER))

