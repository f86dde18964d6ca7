"""Kubernetes quantities and Sluice durations, parsed into exact integers.

Every resource amount inside Sluice is an int of milli-units (cpu "1" = 1000, "500m" = 500; memory
"1Ki" = 1024000, i.e. bytes x 1000; nvidia.com/gpu "2" = 2000). One unit for every resource keeps
sums, comparisons and JSON exact. Amounts that are not whole milli-units round up, as Kubernetes does
for requests.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIX = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_DURATION = re.compile(r"^([0-9]*\.?[0-9]+)(ms|s|m|h|d)$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_MILLI = 2**62  # far above any real cluster; keeps sums inside Postgres BIGINT


class QuantityError(ValueError):
    """A quantity or duration that cannot be parsed; the message says why."""


def parse_quantity(value: object) -> int:
    """A Kubernetes quantity ("500m", "32Gi", 8, 1.5) as milli-units, rounded up."""
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity such as '500m', '32Gi' or 8, got {value!r}")
    if isinstance(value, (int, float)):
        text = repr(value) if isinstance(value, float) else str(value)
    elif isinstance(value, str):
        text = value.strip()
    else:
        raise QuantityError(f"expected a quantity such as '500m', '32Gi' or 8, got {type(value).__name__}")
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"{value!r} is not a quantity (examples: '500m', '2', '32Gi', '1.5')")
    try:
        amount = Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""] * 1000
    except InvalidOperation as exc:
        raise QuantityError(f"{value!r} is not a quantity") from exc
    milli = math.ceil(amount)
    if milli > MAX_MILLI:
        raise QuantityError(f"{value!r} is too large")
    return milli


def parse_resources(mapping: object) -> dict[str, int]:
    """{"cpu": "8", "memory": "32Gi"} -> {"cpu": 8000, "memory": 34359738368000}."""
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise QuantityError(f"expected a mapping of resource name to quantity, got {type(mapping).__name__}")
    return {str(name): parse_quantity(amount) for name, amount in mapping.items()}


def format_quantity(name: str, milli: int) -> str:
    """Milli-units back to the shortest readable Kubernetes notation for that resource."""
    if milli % 1000:
        return f"{milli}m"
    units = milli // 1000
    if name == "memory" or name.endswith("storage"):
        for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if units and units % size == 0:
                return f"{units // size}{suffix}"
    return str(units)


def format_resources(resources: dict[str, int]) -> dict[str, str]:
    return {name: format_quantity(name, amount) for name, amount in sorted(resources.items())}


def add(a: dict[str, int], b: dict[str, int], times: int = 1) -> dict[str, int]:
    out = dict(a)
    for name, amount in b.items():
        out[name] = out.get(name, 0) + amount * times
    return out


def subtract(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = dict(a)
    for name, amount in b.items():
        out[name] = out.get(name, 0) - amount
    return out


def fits(request: dict[str, int], free: dict[str, int]) -> bool:
    """Every requested amount is available (a resource the free map lacks has none)."""
    for name, amount in request.items():  # a loop, not all(...): placement asks this millions of times a replay
        if amount > 0 and amount > free.get(name, 0):
            return False
    return True


def shortfall(request: dict[str, int], free: dict[str, int]) -> list[tuple[str, int, int]]:
    """(resource, needed, available) for every resource that does not fit."""
    return [(name, amount, free.get(name, 0)) for name, amount in sorted(request.items())
            if amount > free.get(name, 0)]


def parse_duration(value: object) -> float:
    """'90s', '10m', '2h', '1d', '250ms' or a number of seconds, as seconds."""
    if isinstance(value, bool):
        raise QuantityError(f"expected a duration such as '90s', '10m', '2h', got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise QuantityError(f"duration {value!r} is negative")
        try:
            return float(value)
        except OverflowError:  # an integer past a float's range
            raise QuantityError(f"duration {str(value)[:20]}... is too large") from None
    if not isinstance(value, str):
        raise QuantityError(f"expected a duration such as '90s', '10m', '2h', got {type(value).__name__}")
    match = _DURATION.match(value.strip())
    if not match:
        raise QuantityError(f"{value!r} is not a duration (examples: '90s', '10m', '2h', '1d')")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def format_duration(seconds: float) -> str:
    for suffix, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{suffix}"
    return f"{seconds:g}s"


def format_duration_exact(seconds: float) -> str:
    """Like format_duration, but parse_duration of the result is exactly `seconds` (for round trips)."""
    if not math.isfinite(seconds) or seconds < 0:
        raise QuantityError(f"duration {seconds!r} is not a finite, non-negative number of seconds")
    text = format_duration(seconds)
    try:
        if parse_duration(text) == seconds:
            return text
    except QuantityError:  # format_duration wrote an exponent, e.g. '1e-07s'
        pass
    # repr() is the shortest decimal that reads back as the same float; 'f' spells it without exponent.
    return f"{Decimal(repr(float(seconds))):f}s"
