"""What the streaming calls (Jobs.WatchBatches, Agents.Connect) send together as one message."""
from __future__ import annotations

from collections.abc import Callable

RUN_BYTES = 4 << 20  # one message's batch at most: far under gRPC's 64 MiB here, and clients' 4 MiB default


def runs(messages: list, limit: int = RUN_BYTES, size: Callable[[object], int] = lambda m: m.ByteSize()) -> list[list]:
    """The messages in order, in runs of at most `limit` bytes each (a larger message is a run alone).
    One run is sent as one message: a read of 500 commands of large job documents, or of 1,000 events
    with long reasons, in one message would pass gRPC's limit, and the stream would fail on it every
    time it was read again. `size`: a message's bytes (serialized messages: len)."""
    out: list[list] = []
    total = 0
    for message in messages:
        n = size(message)
        if not out or total + n > limit:
            out.append([])
            total = 0
        out[-1].append(message)
        total += n
    return out
