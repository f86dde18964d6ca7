"""sluice._validate.resources remembers the quantities it parsed from strings: the same answers, errors
included, whatever was parsed before, and numbers are never taken for one another."""
from __future__ import annotations

import pytest

from sluice import _validate as v
from sluice._validate import SpecError
from sluice.quantity import parse_quantity


@pytest.mark.parametrize("amount", ["1", "500m", "2Gi", " 3 ", "1.5", 1, 2.5, 0, 0.0])
def test_a_remembered_quantity_reads_as_a_fresh_parse(amount):
    for _ in range(2):
        assert v.resources({"cpu": amount}, "r") == {"cpu": parse_quantity(amount)}


@pytest.mark.parametrize("first, then", [(0, False), (1, True), (0.0, False), (0.0, -0.0), ("0", False)])
def test_numbers_equal_in_python_are_not_taken_for_one_another(first, then):
    v.resources({"cpu": first}, "r")
    try:
        expected = {"cpu": parse_quantity(then)}
    except ValueError:
        with pytest.raises(SpecError, match=r"r\.cpu"):
            v.resources({"cpu": then}, "r")
    else:
        assert v.resources({"cpu": then}, "r") == expected


def test_an_invalid_quantity_fails_every_time_with_its_path():
    for _ in range(2):
        with pytest.raises(SpecError, match=r"^r\.memory: 'lots' is not a quantity"):
            v.resources({"memory": "lots"}, "r")


def test_the_memory_of_quantities_is_bounded():
    for n in range(v._MAX_QUANTITIES + 100):
        v.resources({"cpu": f"{n}m"}, "r")
    assert len(v._QUANTITIES) <= v._MAX_QUANTITIES
    assert v.resources({"cpu": f"{v._MAX_QUANTITIES + 50}m"}, "r") == {"cpu": v._MAX_QUANTITIES + 50}
