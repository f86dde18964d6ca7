"""gRPC settings of Sluice's own processes, which gRPC reads once, when `grpc` is first imported.

`apply()` runs before that in the `sluice` command (sluice.cli) and whenever the server side is imported
first (the `dispatcher` package): a process that imported `grpc` before it keeps gRPC's defaults, as does
one whose environment already sets GRPC_EXPERIMENTS (the operator's choice wins).

EXPERIMENTS turns off gRPC's EventEngine listener: a server then reads and writes the connections it
accepted on the threads polling its completion queue, as gRPC did before EventEngine, instead of
handing each read to EventEngine's own thread pool first. A client's channels are not affected. (Echo
server answering each stream message after 2 ms, 8 client processes: the server's CPU 152-160 -> 134-135
us a message; the dispatcher, single-job submits from 8 clients, alternating: 1,774-1,852 -> 1,867-2,107
jobs/s; docs/performance.md.)
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
