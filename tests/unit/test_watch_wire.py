"""WatchBatches' messages made once for every watch (api/event_feed.Chunk): each event serialized once, framed as
inside a JobEvents message, and any run of them joined into one, byte for byte what protobuf would make."""
from __future__ import annotations

from dataclasses import dataclass

from dispatcher.api import streams
from dispatcher.api.event_feed import Chunk, batched
from sluice.v1 import jobs_pb2


@dataclass(frozen=True)
class Row:
    id: int
    job_id: int


def _events(reason_sizes: list[int]) -> list[jobs_pb2.JobEvent]:
    return [jobs_pb2.JobEvent(id=n, job_id=n * 7, attempt=1, from_state="QUEUED", to_state="DISPATCHED",
                              reason="r" * size, cluster="edge-1") for n, size in enumerate(reason_sizes, 1)]


def _chunk(events: list[jobs_pb2.JobEvent]) -> Chunk:
    return Chunk(1, [(Row(e.id, e.job_id), e) for e in events])


def test_joined_events_are_the_job_events_message_protobuf_serializes_whatever_their_lengths():
    events = _events([0, 1, 100, 126, 127, 128, 300, 16_383, 16_384, 70_000])  # one- to three-byte lengths
    assert _chunk(events).wire() == [jobs_pb2.JobEvents(events=events).SerializeToString()]
    assert _chunk(events).wire() == [m.SerializeToString() for m in batched(events)]


def test_events_past_a_messages_limit_go_in_runs_each_a_job_events_message_and_every_event_once_in_order():
    events = _events([100_000] * 100)  # about 10 MB: three runs of at most 4 MiB
    wire = _chunk(events).wire()
    assert len(wire) == 3 and all(len(message) <= streams.RUN_BYTES for message in wire)
    parsed = [jobs_pb2.JobEvents.FromString(message) for message in wire]
    assert [e for message in parsed for e in message.events] == events


def test_a_cut_or_some_rows_send_those_events_alone_serialized_once_with_the_whole_chunk():
    events = _events([10, 20, 30, 40, 50, 60])
    whole = _chunk(events)
    cut = whole.cut(2, 5)
    assert [row.id for row, _ in cut.rows] == [3, 4, 5] and cut.first == 0
    assert cut.wire() == [jobs_pb2.JobEvents(events=events[2:5]).SerializeToString()]
    assert cut.cut(1).wire() == [jobs_pb2.JobEvents(events=events[3:5]).SerializeToString()]
    assert whole.of([0, 4], wire=True) == [jobs_pb2.JobEvents(events=[events[0], events[4]]).SerializeToString()]
    assert whole.of([0, 4], wire=False) == [jobs_pb2.JobEvents(events=[events[0], events[4]])]
    assert whole.of([], wire=True) == []
    # The cuts' bytes are the whole chunk's: a thousand watches each resuming from its own event serialize none.
    assert cut.cut(1)._serialized()[0] is whole._serialized()[3]
