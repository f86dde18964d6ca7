"""Process tuning for Sluice's own processes, applied by their entry points (the `sluice` command, the
benchmark's processes, the test session) before anything imports grpc, which reads it only then.

`apply()` turns off gRPC's EventEngine listener: a server then reads the connections it accepted on the
threads polling its completion queue instead of handing each read to EventEngine's thread pool first,
which costs the dispatcher CPU per call (docs/performance.md). Clients' channels are not affected.

It also turns off gRPC's fork support: Sluice's processes fork only to exec (subprocess) and start the
benchmark's workers by spawn, so no child uses gRPC after a fork, and with it on, a fork while the server's
event loop is inside gRPC logs a line ("skipping fork() handlers") on the user's terminal.
"""
from __future__ import annotations

import os
import sys

EXPERIMENTS = "-event_engine_listener"


def apply() -> bool:
    """Set GRPC_EXPERIMENTS and GRPC_ENABLE_FORK_SUPPORT for this process and its children, unless grpc is
    imported already (it would not read them); a variable the environment sets already is left alone (the
    operator's choice wins). Whether it set GRPC_EXPERIMENTS."""
    if "grpc" in sys.modules:
        return False
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    if "GRPC_EXPERIMENTS" in os.environ:
        return False
    os.environ["GRPC_EXPERIMENTS"] = EXPERIMENTS
    return True


def tune_interpreter(switch_interval_s: float | None, gc_thresholds: tuple[int, int, int] | None) -> None:
    """The GIL's switch interval and the cyclic collector's thresholds for this whole process, as a server
    process of Sluice sets them at start (dispatcher.server.ServerSettings says why); None keeps Python's."""
    if switch_interval_s:
        sys.setswitchinterval(switch_interval_s)
    if gc_thresholds:
        import gc
        gc.set_threshold(*gc_thresholds)
