"""Interactive sessions (spec.interactive): a notebook or a shell a user works in. They come before the batch
work of their class in their queue's order, no cycle evicts one (preemption or reclaim), and one nobody
has attached to for its idle timeout is ended. Pure: the clock is a parameter."""
from __future__ import annotations

from datetime import datetime

from sluice.spec import MAX_PRIORITY, MIN_PRIORITY

# Added to an interactive job's priority in its queue's order: above any batch job's of its class.
ORDER_BOOST = MAX_PRIORITY - MIN_PRIORITY + 1


def order_priority(priority: int, interactive: bool) -> int:
    """A job's place within its queue and class (the jobs.priority column): its priority, boosted for a session."""
    return priority + ORDER_BOOST if interactive else priority


def is_interactive(order: int) -> bool:
    """Whether a job is a session, from its place in the order (the jobs.priority column)."""
    return order > MAX_PRIORITY


def own_priority(order: int) -> int:
    """The priority a job was submitted with, from its place in the order."""
    return order - ORDER_BOOST if order > MAX_PRIORITY else order


def idle_since(started_at: datetime | None, attached_at: datetime | None) -> datetime | None:
    """Since when nobody has been attached to a running session: its last attach (or its start)."""
    return attached_at or started_at


def idle_over(idle_timeout_s: float | None, since: datetime | None, now: datetime) -> bool:
    """Whether a session has been idle past its timeout."""
    return idle_timeout_s is not None and since is not None and (now - since).total_seconds() >= idle_timeout_s
