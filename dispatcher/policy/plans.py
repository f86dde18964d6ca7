"""What one scheduling cycle reads and decides, as data: the service classes and queued heads it plans,
the active attempts it sees, the room it holds for jobs, and the plan it returns (planning.py makes it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from dispatcher.policy.bursting import BurstDecision
from dispatcher.policy.placing import Place, QueuedJob

PREEMPTION_HOLD_S = 120.0  # how long room freed by preemption stays held for the preemptor
# A plan's places are written in parts of this many, each part in job id order (store.lifecycle.DispatchAhead),
# and that order is the order a cluster gets them in: the replay cuts its plans the same way.
DISPATCH_PART = 2_000


@dataclass(frozen=True)
class ClassPolicy:
    name: str
    priority: int = 0
    preemptible: bool = False
    can_preempt: bool = False
    weight: float = 1.0
    reservation_after_s: float | None = None
    burst_allowed: bool = False
    burst_after_s: float | None = None
    price_multiplier: float = 1.0


def class_weight(c: Candidate, classes: dict[str, ClassPolicy]) -> float:
    """The weight of the head's class, which divides its queue's share in the cycle's order (1 for no class)."""
    return classes[c.service_class].weight if c.service_class in classes else 1.0


def may_reserve(c: Candidate, classes: dict[str, ClassPolicy]) -> bool:
    """Whether the head has waited past its class's reservation time (it may hold room for itself now)."""
    cls = classes.get(c.service_class)
    return cls is not None and cls.reservation_after_s is not None and c.waited_s >= cls.reservation_after_s


@dataclass(slots=True)  # not frozen: a cycle makes one per head, and a frozen one costs six times as much to make
class Candidate:
    """A queued job at the head of its queue (never changed once made)."""

    job: QueuedJob
    queue: str
    service_class: str
    class_priority: int
    priority: int
    waited_s: float = 0.0
    preempted_by: int | None = None  # the job that evicted its last attempt, never evicted back by it


@dataclass(frozen=True)
class Active:
    """A dispatched or running attempt, holding capacity on its cluster."""

    job_id: int
    queue: str
    service_class: str
    class_priority: int
    priority: int
    cluster: str
    requests: dict[str, int]
    preemptible: bool = False
    ends_at: float | None = None  # epoch seconds it is expected to end by (its maxRuntime), when known
    pods: tuple[tuple[int, dict[str, int]], ...] = ()  # its pod sets (count, per-pod requests); (): one pod
    evictable: bool = True  # False for an interactive session (policy.sessions): no preemption or reclaim takes it
    # What its pods hold on each node they are bound to, as its agent reports it: (node, requests there); ()
    # where not known (an older agent), or while none is bound.
    nodes: tuple[tuple[str, dict[str, int]], ...] = ()


@dataclass(frozen=True)
class Hold:
    """Room on one cluster kept for one queued job: a reservation or the room its preemption frees."""

    job_id: int
    cluster: str
    requests: dict[str, int]
    kind: str  # reservation | preemption
    since: float
    victims: tuple[int, ...] = ()
    # A reservation's expected start (epoch seconds), from the expected ends (maxRuntime) of what runs on
    # its cluster; None when unknown. A job whose maxRuntime ends by then may use the held room; any other
    # job is kept only from what the reserved job will still need then (`short`: its requests less what
    # those ends free), as EASY backfill does.
    starts_by: float | None = None
    short: dict[str, int] | None = None
    pods: tuple[tuple[int, dict[str, int]], ...] = ()  # its job's pod sets: the room kept on the nodes


@dataclass(frozen=True)
class Preempt:
    victim: int
    by: int
    cluster: str


@dataclass
class CyclePlan:
    places: list[Place] = field(default_factory=list)
    waits: dict[int, str] = field(default_factory=dict)
    preemptions: list[Preempt] = field(default_factory=list)
    holds: dict[int, Hold] = field(default_factory=dict)
    bursts: dict[int, BurstDecision] = field(default_factory=dict)  # of the places that go to paid clusters
    # Queues none of whose heads started though an unpaid cluster has room of every kind they all ask for,
    # which no hold keeps from a job that ends in time: jobs behind those heads might fit it (the caller may
    # read deeper next time).
    room_behind: set[str] = field(default_factory=set)

    def mark(self) -> tuple:
        """How far the plan has got, as far as any verdict depends on it: two equal marks, nothing changed
        in between (no place, preemption or burst made, no hold made, moved or given up). plan_cycle's
        holds are Holds, which count their changes; a plan made otherwise has none to count."""
        return len(self.places), len(self.preemptions), len(self.bursts), getattr(self.holds, "version", None)


@dataclass(frozen=True)
class Dispatched:
    """A place as the store wrote it: the attempt it made and the command that carries it."""

    job_id: int
    attempt: int
    cluster: str
    command_id: int
    created_at: datetime | None = None  # when the job was submitted
    dispatched_at: datetime | None = None  # this dispatch (the transaction's time)


class Holds(dict):
    """A plan's holds, counting every change (`version`): a cycle asks whether any happened once per head."""

    version = 0

    def __setitem__(self, job_id: int, hold: Hold) -> None:
        self.version += 1
        super().__setitem__(job_id, hold)

    def __delitem__(self, job_id: int) -> None:
        self.version += 1
        super().__delitem__(job_id)

    def pop(self, job_id: int, *default):
        if job_id in self:
            self.version += 1
        return super().pop(job_id, *default)
