"""Checks shared by the job-file and admin-object parsers (sluice.spec, sluice.objects).

Each check takes a raw value parsed from YAML or JSON plus the dotted path it came from
('spec.podSets[0].count') and returns the value in its Python form, or raises one SpecError naming that
path and saying exactly what is wrong. Optional fields are read with get(), which treats an explicit null
like an absent field.
"""
from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from sluice.quantity import QuantityError, parse_duration, parse_quantity

T = TypeVar("T")

NAME = re.compile(r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class SpecError(ValueError):
    """A job file or admin object that is not valid.

    path is the dotted field path ('spec.podSets[0].count', '' for the document as a whole), message
    says what is wrong; document (1-based) and source say where the document came from, when known.
    """

    def __init__(self, path: str, message: str, *, document: int | None = None, source: str | None = None):
        super().__init__(path, message)
        self.path = path
        self.message = message
        self.document = document
        self.source = source

    def __str__(self) -> str:
        where = " ".join(part for part in (
            self.source, None if self.document is None else f"document {self.document}") if part)
        return ": ".join(part for part in (where, self.path, self.message) if part)


class located:
    """Stamp SpecErrors raised inside with where the document came from (a plain class: it wraps every
    job a server parses, and a generator-based context manager costs several times more)."""

    __slots__ = ("document", "source")

    def __init__(self, document: int | None, source: str | None):
        self.document, self.source = document, source

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, traceback) -> bool:
        if isinstance(err, SpecError):
            if err.document is None:
                err.document = self.document
            if err.source is None:
                err.source = self.source
        return False


MAX_DEPTH = 100  # levels of mappings and lists in one document; a Kubernetes pod template needs about 15
NESTED_TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"


def check_depth(value: object, text: str | None = None) -> None:
    """SpecError when value nests mappings and lists deeper than MAX_DEPTH. text: the JSON it was
    decoded from, when known: fewer brackets than MAX_DEPTH cannot nest that deep, and counting them costs far
    less than walking the value. Iterative: a deep value must not exhaust Python's stack here."""
    if text is not None and text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:  # one level at a time: a list of what is at the next
        depth += 1
        if depth > MAX_DEPTH:
            raise SpecError("", NESTED_TOO_DEEP)
        below = []
        for item in level:
            for child in item.values() if isinstance(item, dict) else item:
                if isinstance(child, (dict, list)):
                    below.append(child)
        level = below


def unstorable_at(value: object, path: str = "") -> tuple[str, str] | None:
    """(path, why) of the first key or string Postgres cannot store in a JSON column (a NUL character, a
    lone surrogate that decoding a JSON \\ud800 escape leaves), or None."""
    pending = [(path, value)]
    while pending:
        here, item = pending.pop()
        if isinstance(item, str):
            if (why := _unstorable(item)) is not None:
                return here, why
            continue
        pairs = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        for key, child in reversed(list(pairs)):  # reversed: popped in document order
            at = f"{here}[{key}]" if isinstance(key, int) else f"{here}.{key}" if here else str(key)
            if isinstance(key, str) and (why := _unstorable(key)) is not None:
                return at.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\u0000"), why
            pending.append((at, child))
    return None


def _unstorable(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character (\\u0000)"
    try:
        text.encode()
    except UnicodeEncodeError:
        return "contains a lone surrogate (a \\ud800-\\udfff escape not in a pair): not Unicode text"
    return None


def join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def describe(value: object) -> str:
    """How a value reads in an error message: its YAML type, and the value when short."""
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
            dict: "mapping", type(None): "null"}.get(type(value), type(value).__name__)
    if isinstance(value, (dict, list)) or value is None:
        return kind
    text = repr(value)
    return f"{kind} {text}" if len(text) <= 40 else kind


def get(mapping: dict, key: str, default: Any = None) -> Any:
    value = mapping.get(key)
    return default if value is None else value


def required(mapping: dict, key: str, path: str) -> Any:
    value = mapping.get(key)
    if value is None:
        raise SpecError(join(path, key), "required")
    return value


def optional(check: Callable[..., T], value: object, path: str, **options: Any) -> T | None:
    """check(value, path, **options), or None for an absent value."""
    return None if value is None else check(value, path, **options)


def check_fields(mapping: dict, allowed: Iterable[str], path: str) -> None:
    if not isinstance(allowed, (tuple, list)):
        allowed = list(allowed)
    for key in mapping:
        if key in allowed:
            continue
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"did you mean {close[0]}?" if close else "known: " + ", ".join(allowed)
        raise SpecError(join(path, key), f"unknown field ({hint})")


def mapping(value: object, path: str, *, allowed: Iterable[str] | None = None,
            required: bool = False) -> dict:
    """A mapping (None reads as {} unless required); with allowed, other keys are errors."""
    if value is None:
        if required:
            raise SpecError(path, "required")
        return {}
    if not isinstance(value, dict):
        raise SpecError(path, f"must be a mapping, got {describe(value)}")
    if allowed is not None:
        check_fields(value, allowed, path)
    return value


def items(value: object, path: str, *, non_empty: bool = False, max_items: int | None = None) -> list:
    """A list (None reads as [] unless non_empty)."""
    if value is None:
        if non_empty:
            raise SpecError(path, "required")
        return []
    if not isinstance(value, list):
        raise SpecError(path, f"must be a list, got {describe(value)}")
    if non_empty and not value:
        raise SpecError(path, "must not be empty")
    if max_items is not None and len(value) > max_items:
        raise SpecError(path, f"has {len(value)} entries, at most {max_items} allowed")
    return value


def string(value: object, path: str, max_len: int | None = None, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        quotable = isinstance(value, (int, float)) and not isinstance(value, bool)
        hint = f" (quote it: \"{value}\")" if quotable else ""
        raise SpecError(path, f"must be a string, got {describe(value)}{hint}")
    if not value and not allow_empty:
        raise SpecError(path, "must not be empty")
    if max_len is not None and len(value) > max_len:
        raise SpecError(path, f"is {len(value)} characters long, at most {max_len} allowed")
    return value


def integer(value: object, path: str, lo: int | None = None, hi: int | None = None) -> int:
    # bool is an int subclass, and YAML 'yes' or '4.0' is almost certainly a mistake here.
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(path, f"must be an integer, got {describe(value)}")
    if lo is not None and value < lo:
        raise SpecError(path, f"must be at least {lo}")
    if hi is not None and value > hi:
        raise SpecError(path, f"must be at most {hi}")
    return value


def number(value: object, path: str, minimum: float | None = None, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(path, f"must be a number, got {describe(value)}")
    if not math.isfinite(value):
        raise SpecError(path, "must be a finite number")
    if positive and value <= 0:
        raise SpecError(path, "must be greater than 0")
    if minimum is not None and value < minimum:
        raise SpecError(path, f"must be at least {minimum}")
    return float(value)


def boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(path, f"must be true or false, got {describe(value)}")
    return value


def choice(value: object, path: str, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise SpecError(path, f"must be one of {', '.join(choices)}, got {describe(value)}")
    return value  # type: ignore[return-value]


def _short_matching(value: object, path: str, pattern: re.Pattern, what: str) -> str:
    """A string of at most 63 characters that `pattern` matches; else "<value> is not <what>"."""
    string(value, path, max_len=63)
    if not pattern.fullmatch(value):  # type: ignore[arg-type]  # not match: '$' would take "name\n"
        raise SpecError(path, f"{value!r} is not {what}")
    return value  # type: ignore[return-value]


def name(value: object, path: str) -> str:
    """A Sluice object name: queues, service classes, clusters, burst policies."""
    return _short_matching(value, path, NAME, "a valid name (lowercase letters, digits, '-', '_' and '.', "
                                              "starting and ending with a letter or digit)")


def dns_label(value: object, path: str) -> str:
    return _short_matching(value, path, DNS_LABEL, "a DNS label (lowercase letters, digits and '-', "
                                                   "starting and ending with a letter or digit)")


def label_key(value: object, path: str) -> str:
    """A Kubernetes label key: name, or prefix/name with a DNS subdomain prefix."""
    if not isinstance(value, str) or not value:
        raise SpecError(path, f"label keys must be non-empty strings, got {describe(value)}")
    prefix, _, label = value.rpartition("/")
    key_path = join(path, value)
    if "/" in value and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise SpecError(key_path, f"key prefix {prefix!r} must be a DNS subdomain of at most 253 characters")
    if len(label) > 63 or not _LABEL_NAME.match(label):
        raise SpecError(key_path, "key must be at most 63 letters, digits, '-', '_' or '.', starting and "
                                  "ending with a letter or digit (optionally after a prefix such as 'a.b/')")
    return value


def labels(value: object, path: str) -> dict[str, str]:
    """Labels or a label selector: string keys (see label_key) to strings of at most 63 characters."""
    out: dict[str, str] = {}
    for key, item in mapping(value, path).items():
        out[label_key(key, path)] = string(item, join(path, key), max_len=63, allow_empty=True)
    return out


def strings(value: object, path: str, check: Callable[[object, str], str] = string) -> tuple[str, ...]:
    """A list of strings, each checked by check(item, path)."""
    return tuple(check(item, f"{path}[{i}]") for i, item in enumerate(items(value, path)))


def unique_names(value: object, path: str) -> tuple[str, ...]:
    """A list of object names, each once."""
    names = strings(value, path, name)
    for i, item in enumerate(names):
        if item in names[:i]:
            raise SpecError(f"{path}[{i}]", f"{item!r} is listed twice")
    return names


def duration(value: object, path: str, positive: bool = False) -> float:
    """A duration ('90s', '10m', '2h', '1d' or seconds) as seconds."""
    try:
        seconds = parse_duration(value)
    except QuantityError as err:
        raise SpecError(path, str(err)) from err
    if not math.isfinite(seconds):
        raise SpecError(path, "must be a finite duration")
    if positive and seconds <= 0:
        raise SpecError(path, "must be longer than 0s")
    return seconds


def resources(value: object, path: str) -> dict[str, int]:
    """Resource name -> quantity, as milli-units (sluice.quantity)."""
    out: dict[str, int] = {}
    for key, amount in mapping(value, path).items():
        if not isinstance(key, str) or not key:
            raise SpecError(path, f"resource names must be non-empty strings, got {describe(key)}")
        try:
            out[key] = milli_units(amount)
        except QuantityError as err:
            raise SpecError(join(path, key), str(err)) from err
    return out


def milli_units(amount: object) -> int:
    """sluice.quantity.parse_quantity, remembered for strings; raises QuantityError."""
    milli = _QUANTITIES.get(amount) if type(amount) is str else None
    if milli is None:
        milli = parse_quantity(amount)
        if type(amount) is str:
            if len(_QUANTITIES) >= _MAX_QUANTITIES:
                _QUANTITIES.clear()
            _QUANTITIES[amount] = milli
    return milli


# Quantities as written ("500m", "2Gi") -> milli-units. Job documents repeat a few quantities, and the
# server parses thousands of documents a second: a Decimal parse costs several dictionary lookups.
# Only strings: 0.0 == -0.0 == False would make numbers share an entry they must not share.
_QUANTITIES: dict[str, int] = {}
_MAX_QUANTITIES = 4096
