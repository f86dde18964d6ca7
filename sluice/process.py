"""Process tuning for Sluice's own processes, applied by their entry points (the `sluice` command, the
benchmark's processes, the test session) before anything imports grpc, which reads it only then.

`apply()` turns off gRPC's EventEngine listener: a server then reads the connections it accepted on the
threads polling its completion queue instead of handing each read to EventEngine's thread pool first,
which costs the dispatcher CPU per call (docs/performance.md). Clients' channels are not affected.
"""
from __future__ import annotations

import os
import sys

EXPERIMENTS = "-event_engine_listener"


def apply() -> bool:
    """Set GRPC_EXPERIMENTS for this process and its children, unless grpc is imported already (it would
    not read it) or the environment names experiments of its own (the operator's choice wins); whether it did."""
    if "grpc" in sys.modules or "GRPC_EXPERIMENTS" in os.environ:
        return False
    os.environ["GRPC_EXPERIMENTS"] = EXPERIMENTS
    return True
