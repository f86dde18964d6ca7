"""gRPC settings of Sluice's own processes, which gRPC reads once, when `grpc` is first imported.

`apply()` runs before that in the `sluice` command (sluice.cli) and whenever the server side is imported
first (the `dispatcher` package): a process that imported `grpc` before it keeps gRPC's defaults, as does
one whose environment already sets GRPC_EXPERIMENTS (the operator's choice wins).

EXPERIMENTS turns off gRPC's EventEngine listener: a server then reads and writes the connections it
accepted on the threads polling its completion queue, as gRPC did before EventEngine, instead of
handing each read to EventEngine's own thread pool first. A client's channels are not affected. (An
echo server answering each stream message after 2 ms, 8 client processes: the server's CPU 152-167 ->
133-138 us a message. The dispatcher, single-job submits from 8 clients, alternating: 1,904-2,084 ->
2,107-2,234 jobs/s, its CPU 320-364 -> 290-315 us a job. docs/performance.md, session 15.)
"""
from __future__ import annotations

import os
import sys

EXPERIMENTS = "-event_engine_listener"


def apply() -> bool:
    """Set EXPERIMENTS for this process and its children, unless grpc is imported already or the
    environment names experiments of its own; whether it did."""
    if "grpc" in sys.modules or "GRPC_EXPERIMENTS" in os.environ:
        return False
    os.environ["GRPC_EXPERIMENTS"] = EXPERIMENTS
    return True
