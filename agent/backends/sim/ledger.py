"""The simulated cluster's ledger: what it created and how attempts ended, appended to a file so that a
restarted sim (a `sluice up` after kill -9) restores its pods instead of creating them twice.

Format (one line per record, appended, fsynced per batch):
    created <job_id> <attempt> <pod_name>
    ended <job_id> <attempt> <STATE> <exit_code> <at>   (at: seconds since the epoch; absent from older ledgers)
    deleted <job_id> <attempt>          (a non-final attempt was deleted; it vanishes on restore)
"""
from __future__ import annotations

import collections
import pathlib
from collections.abc import Iterable

from agent.backends.base import FINAL_STATES


def ledger_duplicates(path: pathlib.Path | str) -> int:
    """How many pod names a ledger records as created more than once (always 0 when correct)."""
    counts: collections.Counter[str] = collections.Counter()
    for record in read_ledger(pathlib.Path(path)):
        if record[0] == "created":
            counts[record[3]] += 1
    return sum(1 for count in counts.values() if count > 1)


def read_ledger(path: pathlib.Path) -> Iterable[tuple]:
    """Parsed ledger records; a torn or unknown line (a crash mid-write) is skipped."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        parts = line.split()
        try:
            if parts[0] == "created" and len(parts) == 4:
                records.append(("created", int(parts[1]), int(parts[2]), parts[3]))
            elif parts[0] == "ended" and len(parts) in (5, 6) and parts[3] in FINAL_STATES:
                at = float(parts[5]) if len(parts) == 6 else None
                records.append(("ended", int(parts[1]), int(parts[2]), parts[3], int(parts[4]), at))
            elif parts[0] == "deleted" and len(parts) == 3:
                records.append(("deleted", int(parts[1]), int(parts[2])))
        except (IndexError, ValueError):
            continue
    return records
