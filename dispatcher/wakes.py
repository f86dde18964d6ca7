"""What a wake-up of the scheduler says (the payloads of store.channels.WAKE_CHANNEL), encoded and decoded in
this one place, with no store: those who change things write them, and scheduler.parking.Parking reads them
(in the leader, and in a replay).

A payload is a queue's name (a queued job was cancelled, or went back to its queue), a submit's (submit_wake:
the name, a space, its best new job's order), ROOM (room may have freed: a cluster's capacity changed or an
attempt ended; no job became queued), or "" (anything may have changed). Queue names never start with "+"
and hold no space.
"""
from __future__ import annotations

ROOM = "+room"


def submit_wake(queue: str, class_priority: int, priority: int, job_id: int) -> str:
    """The wake-up of a submit to `queue`: its name, then the place of its best new job in the queue's
    order (class priority and priority, higher first, then id), which scheduler.parking.Parking
    compares with the heads it parked."""
    return f"{queue} {class_priority} {priority} {job_id}"


def parse_wake(payload: str) -> tuple[str, tuple[int, int, int] | None]:
    """A WAKE_CHANNEL payload read back: (the queue it names, "" for none; the order key of a submit's best
    new job, or None). ROOM names no queue."""
    if payload == ROOM:
        return "", None
    queue, _, order = payload.partition(" ")
    return queue, (order_key_of(order) if order else None)


def order_key(class_priority: int, priority: int, job_id: int) -> tuple[int, int, int]:
    """A queued job's place in its queue's order, comparable with < (earlier first): class priority and
    priority descending, then id (the order cycle_reads.queue_heads reads in)."""
    return -class_priority, -priority, job_id


def order_key_of(text: str) -> tuple[int, int, int] | None:
    """order_key from a wake-up's "class_priority priority id"; None for anything else."""
    try:
        return order_key(*map(int, text.split()))
    except (TypeError, ValueError):
        return None
