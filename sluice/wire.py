"""What the client and the dispatcher must agree on beyond the protobuf messages."""
from __future__ import annotations

STREAM_MARK = ("sluice-submit-stream", "1")  # the header a server sends once it has taken a submit stream
