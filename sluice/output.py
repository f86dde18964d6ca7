"""Printing results: `-o table|json|yaml` for every read command (reports add csv), and the one-line
error format."""
from __future__ import annotations

import csv
import json
import sys
from enum import Enum

import yaml


class Format(str, Enum):  # noqa: UP042 - a typer option type; StrEnum would change str() and f-strings of members
    table = "table"
    json = "json"
    yaml = "yaml"


class ReportFormat(str, Enum):  # noqa: UP042 - a typer option type; StrEnum would change str() and f-strings of members
    """Reports (`sluice usage`) also print as CSV for spreadsheets."""

    table = "table"
    json = "json"
    yaml = "yaml"
    csv = "csv"


def emit(value, fmt: Format, columns: list[tuple[str, str]] | None = None) -> None:
    """Print a dict or a list of dicts; `columns` are (header, key) pairs for the table form."""
    if fmt == Format.json:
        print(json.dumps(value, indent=2))
    elif fmt == Format.yaml:
        print(yaml.safe_dump(value, sort_keys=False), end="")
    else:
        rows = value if isinstance(value, list) else [value]
        print(table(rows, columns or [(k.upper(), k) for k in (rows[0] if rows else {})]))


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    cells = [[h for h, _ in columns]] + [[_cell(r.get(k)) for _, k in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def error(what: str, why: str) -> None:
    """The one error line: `error: <what>: <why>` on stderr."""
    why = " ".join(str(why).split())
    print(f"error: {what}: {why}", file=sys.stderr)


def emit_csv(rows: list[dict], columns: list[str]) -> None:
    """Print rows as CSV (csv module quoting) with a header line of `columns`; missing values are empty."""
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
