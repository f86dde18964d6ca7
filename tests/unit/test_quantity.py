"""Quantities and durations: exact milli-units, rounding up, and clear refusals."""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.quantity import (
    MAX_MILLI,
    QuantityError,
    add,
    fits,
    format_duration,
    format_duration_exact,
    format_quantity,
    format_resources,
    parse_duration,
    parse_quantity,
    parse_resources,
    shortfall,
    subtract,
)


@pytest.mark.parametrize("text, milli", [
    ("1", 1000), ("500m", 500), (" 2 ", 2000), ("+3", 3000), ("0", 0), ("0.5", 500), (".5", 500),
    ("1k", 1_000_000), ("1M", 10**9), ("1G", 10**12), ("1T", 10**15), ("1P", 10**18),
    ("1Ki", 1024 * 1000), ("1Mi", 2**20 * 1000), ("32Gi", 32 * 2**30 * 1000), ("1Ti", 2**40 * 1000),
    ("1e3", 1_000_000), ("1E-3", 1), ("1500u", 2), ("1n", 1), ("100n", 1), ("1000000n", 1), ("1000000000n", 1000),
    (8, 8000), (0, 0), (1.5, 1500), (0.0001, 1),
])
def test_parse_quantity(text, milli):
    assert parse_quantity(text) == milli


@pytest.mark.parametrize("value", ["0.0001", "1u", "1n", "0.1m", 1e-9])
def test_fractions_of_a_milli_unit_round_up(value):
    assert parse_quantity(value) == 1


@pytest.mark.parametrize("value", [True, False, None, [], {}, object()])
def test_non_quantities_are_refused(value):
    with pytest.raises(QuantityError, match="expected a quantity"):
        parse_quantity(value)


@pytest.mark.parametrize("value", ["-1", -1, -0.5, "abc", "", "1 Gi", "1gi", "1KiB", "Gi", "1.2.3", "nan",
                                   "inf", float("nan"), float("inf"), "0x10", "1_000"])
def test_garbage_and_negative_quantities_are_refused(value):
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(value)


def test_too_large_quantities_are_refused():
    with pytest.raises(QuantityError, match="too large"):
        parse_quantity("10Ei")
    with pytest.raises(QuantityError, match="too large"):
        parse_quantity("1E")  # E alone is the exa suffix
    assert parse_quantity(MAX_MILLI // 1000) <= MAX_MILLI


def test_parse_resources():
    assert parse_resources({"cpu": "8", "memory": "32Gi"}) == {"cpu": 8000, "memory": 32 * 2**30 * 1000}
    assert parse_resources(None) == {}
    with pytest.raises(QuantityError, match="mapping"):
        parse_resources(["cpu"])


@pytest.mark.parametrize("name, milli, text", [
    ("cpu", 500, "500m"), ("cpu", 8000, "8"), ("memory", 32 * 2**30 * 1000, "32Gi"),
    ("memory", 1536 * 2**20 * 1000, "1536Mi"), ("memory", 1000, "1"), ("memory", 0, "0"),
    ("ephemeral-storage", 2**40 * 1000, "1Ti"), ("nvidia.com/gpu", 2000, "2"),
])
def test_format_quantity(name, milli, text):
    assert format_quantity(name, milli) == text


@given(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), st.integers(0, MAX_MILLI))
def test_format_quantity_round_trips(name, milli):
    assert parse_quantity(format_quantity(name, milli)) == milli


def test_format_resources_sorts_by_name():
    assert list(format_resources({"memory": 2**30 * 1000, "cpu": 1000})) == ["cpu", "memory"]


def test_arithmetic():
    a, b = {"cpu": 1000, "memory": 5}, {"cpu": 500, "gpu": 1000}
    assert add(a, b) == {"cpu": 1500, "memory": 5, "gpu": 1000}
    assert add(a, b, 3) == {"cpu": 2500, "memory": 5, "gpu": 3000}
    assert subtract(a, b) == {"cpu": 500, "memory": 5, "gpu": -1000}
    assert a == {"cpu": 1000, "memory": 5}  # inputs untouched
    assert fits({"cpu": 1000, "gpu": 0}, {"cpu": 1000})
    assert not fits({"gpu": 1}, {"cpu": 1000})
    assert shortfall({"cpu": 2000, "gpu": 1000, "memory": 1}, {"cpu": 1000, "memory": 1}) == [
        ("cpu", 2000, 1000), ("gpu", 1000, 0)]


@pytest.mark.parametrize("text, seconds", [
    ("90s", 90.0), ("10m", 600.0), ("2h", 7200.0), ("1d", 86400.0), ("250ms", 0.25), ("1.5h", 5400.0),
    (" 5s ", 5.0), ("0s", 0.0), (30, 30.0), (0.5, 0.5),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("value, message", [
    (True, "expected a duration"), (None, "expected a duration"), ([], "expected a duration"),
    (-1, "negative"), ("-5s", "not a duration"), ("5", "not a duration"), ("5 min", "not a duration"),
    ("1h30m", "not a duration"), ("", "not a duration"),
])
def test_bad_durations_are_refused(value, message):
    with pytest.raises(QuantityError, match=message):
        parse_duration(value)


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (90, "90s"), (600, "10m"), (7200, "2h"), (86400, "1d"),
                                           (0.25, "0.25s"), (5400, "90m")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [1e-7, 1234567.5, 1e20, 0.1 + 0.2, 3 * 86400.0])
def test_format_duration_exact_reads_back_exactly(seconds):
    assert parse_duration(format_duration_exact(seconds)) == seconds


@given(st.floats(min_value=0, max_value=1e30, allow_nan=False))
def test_format_duration_exact_round_trips(seconds):
    assert parse_duration(format_duration_exact(seconds)) == seconds


@pytest.mark.parametrize("seconds", [-1.0, math.inf, math.nan])
def test_format_duration_exact_refuses_non_durations(seconds):
    with pytest.raises(QuantityError):
        format_duration_exact(seconds)


def test_a_duration_past_a_floats_range_is_refused_in_words():
    with pytest.raises(QuantityError, match="too large"):
        parse_duration(10**400)
