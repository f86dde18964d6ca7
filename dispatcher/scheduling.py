"""The scheduling loop: run by exactly one dispatcher replica at a time (the leader).

Leadership is a Postgres session advisory lock held on a dedicated connection: when the leader dies,
its connection closes, the lock is released and another replica takes it within `leader_retry_s`.
Each cycle reads `now` once, reads the head of every queue, what is running, the quotas and each
cluster's usable capacity, asks the pure policy (policy/planning.py) for decisions, and commits them
in one transaction: dispatches, preemptions, their events and outbox commands, pending reasons.
New work and freed capacity wake the loop through NOTIFY; the timeout is only a safety net.
"""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

import psycopg
from sqlalchemy import Engine, text
from sqlalchemy.orm import sessionmaker

from dispatcher.capacity import snapshot
from dispatcher.metrics import DispatcherMetrics
from dispatcher.notifying import Notifier, libpq_url
from dispatcher import budgets, reports
from dispatcher.policy.placing import QueuedJob
from dispatcher.policy.planning import Active, Candidate, ClassPolicy, Hold, VictimsNeeded, active_needs, plan_cycle
from dispatcher.policy.quotas import QueueQuota
from dispatcher.store import clusters as cluster_store
from dispatcher.store import jobs as job_store
from dispatcher.store import outbox as outbox_store
from sluice.objects import object_from_document
from sluice.quantity import add, parse_duration

log = logging.getLogger(__name__)
LEADER_LOCK = 7302


@dataclass(frozen=True)
class SchedulerSettings:
    per_queue: int = 64  # queued jobs read per queue and cycle, in order (never the whole backlog)
    reason_interval_s: float = 1.0  # pending reasons are rewritten at most this often (they are for people)
    idle_wait_s: float = 2.0  # safety-net wake-up when no notification comes (clusters going stale)
    wake_pace_max_s: float = 0.25  # after a cycle that started nothing, the next waits up to its length (at most this)
    leader_retry_s: float = 1.0  # how often a follower tries to become leader
    # TCP keepalive on the leader lock's connection, both ways (seconds idle before the first probe; probes
    # then go 1 s apart and 2 unanswered ones drop the connection). A leader that dies with its machine
    # sends no FIN: without this Postgres would keep its lock for the kernel's default (hours).
    leader_keepalive_s: int = 1
    unreachable_after_s: float = 5.0  # no heartbeat this long: the cluster takes no new jobs
    prometheus_staleness_s: float = snapshot.DEFAULT_STALENESS_S  # older Prometheus readings: use the agent's
    avoid_unschedulable_s: float = 600.0  # a cluster where a job's attempt could not start is left out this long
    # The leader deletes acked outbox commands older than this that nothing reads any more (outbox.prune),
    # at most every outbox_prune_interval_s, up to outbox_prune_limit per cluster each time: one row per
    # dispatch and cancel would otherwise stay for ever.
    outbox_retention_s: float = 3600.0
    outbox_prune_interval_s: float = 60.0
    outbox_prune_limit: int = 10_000


@dataclass(frozen=True)
class CycleResult:
    dispatched: int
    preempted: int
    waiting: int
    seconds: float
    holds: dict[int, Hold]
    # Submit-to-dispatch seconds of the jobs dispatched for the first time (a requeued job's submit time
    # says nothing about its later waits).
    first_waits: tuple[float, ...] = ()
    planned: int | None = None  # queues planned while the others stayed parked (None: every queue)
    more: bool = False  # a queue had more queued jobs than the cycle read: the next cycle may place them
    idle: bool = False  # it planned every queue and left no job queued (it dispatched every one it read)


class LostLeadership(Exception):
    pass


def queue_quotas(session) -> list[QueueQuota]:
    out = []
    for row in cluster_store.list_queues(session):
        q = object_from_document(row.spec)
        out.append(QueueQuota(q.name, q.parent, dict(q.guaranteed), dict(q.max), q.weight))
    return out


def class_policies(session) -> dict[str, ClassPolicy]:
    out = {}
    for row in cluster_store.service_classes(session).values():
        c = object_from_document(row.spec)
        out[c.name] = ClassPolicy(c.name, c.priority, c.preemptible, c.can_preempt, c.weight, c.reservation_after_s,
                                  c.burst_allowed, c.burst_after_s, c.price_multiplier)
    return out


def _seconds(text: str | None) -> float | None:
    return parse_duration(text) if text else None


def candidate(row, now: datetime, avoid: tuple[str, ...] = ()) -> Candidate:
    placement = row.placement or {}
    job = QueuedJob(row.id, row.requests, row.largest_pod, dict(placement.get("clusterSelector", {})),
                    tuple(placement.get("tiers", ())), tuple(placement.get("sites", ())),
                    _seconds(getattr(row, "max_runtime", None)), avoid)
    return Candidate(job, row.queue, row.service_class, row.class_priority, row.priority,
                     (now - row.created_at).total_seconds(), row.preempted_by)


def _candidates(rows: list[tuple], now: float, avoid: dict[int, tuple[str, ...]]
                ) -> tuple[dict[str, list[Candidate]], dict[int, str]]:
    """The heads per queue, as candidate() makes them, and each one's current reason. Heads repeat a few
    shapes: each distinct JSON text is decoded once and its dicts shared (the policy never changes them)."""
    decoded: dict[str, dict] = {}
    shapes: dict[tuple, tuple] = {}
    heads: dict[str, list[Candidate]] = {}
    current: dict[int, str] = {}
    for (job_id, queue, service_class, class_priority, priority, requests, largest_pod, placement, reason, created,
         preempted_by, _attempt, max_runtime) in rows:
        shape = shapes.get((requests, largest_pod, placement, max_runtime))
        if shape is None:
            for document in (requests, largest_pod, placement):
                if document not in decoded:
                    decoded[document] = json.loads(document) if document else {}
            where = decoded[placement] or {}
            shape = shapes[(requests, largest_pod, placement, max_runtime)] = (
                decoded[requests], decoded[largest_pod], dict(where.get("clusterSelector", {})),
                tuple(where.get("tiers", ())), tuple(where.get("sites", ())), _seconds(max_runtime))
        job = QueuedJob(job_id, *shape, avoid.get(job_id, ()))
        heads.setdefault(queue, []).append(Candidate(job, queue, service_class, class_priority, priority,
                                                     now - created, preempted_by))
        current[job_id] = reason
    return heads, current


def _active(rows, classes: dict[str, ClassPolicy]) -> list[Active]:
    return [Active(r.id, r.queue, r.service_class, r.class_priority, r.priority, r.cluster, r.requests,
                   classes[r.service_class].preemptible if r.service_class in classes else False,
                   r.since.timestamp() + parse_duration(r.max_runtime) if r.max_runtime and r.since else None)
            for r in rows]


# One digest of every document the cycle's policy objects come from (classes, queues, burst policies).
_DIGEST_SQL = """md5(concat_ws('|',
           (SELECT string_agg(name || spec::text, ',' ORDER BY name) FROM service_classes),
           (SELECT string_agg(name || spec::text, ',' ORDER BY name) FROM queues),
           (SELECT string_agg(name || spec::text, ',' ORDER BY name) FROM burst_policies)))"""
_POLICY_DIGEST = text(f"SELECT {_DIGEST_SQL}")
# Leader fencing, and the digest in the same round trip: whether the backend %(pid)s still holds the
# session advisory lock %(key)s (the leader's lock connection), then the policy documents' digest.
_FENCED_DIGEST = f"""SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
                                    AND pid = %(pid)s AND classid = 0 AND objid = %(key)s AND objsubid = 1),
                            {_DIGEST_SQL}"""


@dataclass
class PolicyConfig:
    """The service classes, queue quotas and burst rules of the last cycle, kept by the leader and read
    again (and parsed) only when their documents' digest, computed in the cycle's transaction, changed."""

    digest: str = ""
    classes: dict[str, ClassPolicy] = field(default_factory=dict)
    quotas: list[QueueQuota] = field(default_factory=list)
    rules: list = field(default_factory=list)

    def refresh(self, session, digest: str | None = None) -> "PolicyConfig":
        """`digest`: the documents' digest, when the caller read it already in this transaction."""
        digest = digest if digest is not None else session.scalar(_POLICY_DIGEST)
        if digest != self.digest:
            self.classes, self.quotas = class_policies(session), queue_quotas(session)
            self.rules = budgets.rules(session)
            self.digest = digest
        return self


class Parking:
    """The queues a cycle may leave out, kept by the leader between cycles (as it keeps PolicyConfig).

    After a cycle that started nothing (no dispatch, no preemption, no hold, no burst to weigh, no head
    avoiding a cluster) and wrote its reasons, each head it planned stays unable to start until one of
    that cycle's inputs changes: the policy documents (their digest), a cluster's usable capacity or
    state, a queue's usage (what runs there, and how many jobs), the burst spend; or until time alone
    could change a verdict (a head reaching its class's reservation time). Until then its queues are
    parked: a cycle plans only the queues a wake-up named since (a submit or a cancel names its queue).
    A wake-up naming no queue, or the listener reconnecting, has every queue planned again. A parked
    queue costs a cycle nothing and keeps the reasons last written for its jobs.

    A submit's wake-up also gives the queue order of its best new job (store.jobs.submit_wake). When the
    parking cycle read a parked queue's heads to the limit (`per_queue`: more may wait behind them) and
    the new job comes after the last head it read, the heads a cycle would read are the same ones and
    the submit changes nothing: it wakes no cycle (`touch` returns False). Such a submit is kept until
    the next settle, which has the queue planned after all when its heads changed meanwhile and the job
    is no longer behind them (`rewake`).

    `touch` runs on the notifier's thread; the rest on the scheduler's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirty: set[str] | None = None  # queues to plan again; None: every queue
        self.inputs: tuple | None = None  # the inputs under which the parked queues' heads could not start
        self.until = math.inf  # epoch seconds: when a parked head's verdict may change by itself
        self.waiting: dict[str, int] = {}  # per parked queue, how many of its heads wait
        # Per parked queue whose heads were read to the limit, its last head's order key (see _order).
        self._last: dict[str, tuple[int, int, int]] = {}
        self._behind: dict[str, tuple[int, int, int]] = {}  # per queue, the best submit let pass since the last settle
        self._rewake = False

    def touch(self, payload: str = "") -> bool:
        """Plan a queue in the next cycle: a queue's name, optionally with the order of a submit's best
        new job (store.jobs.submit_wake); every queue when "". ROOM names no queue: what changed (a
        cluster's capacity, a queue's usage) is among the inputs `only` compares. False: a submit behind
        a parked queue's heads, which needs no cycle."""
        if payload == job_store.ROOM:
            return True
        queue, _, order = payload.partition(" ")
        with self._lock:
            if not queue:
                self._dirty = None
            elif self._dirty is not None:
                last = self._last.get(queue)
                key = _order(order) if order and last is not None else None
                if key is not None and key > last:
                    self._behind[queue] = min(key, self._behind.get(queue, key))
                    return False
                self._dirty.add(queue)
        return True

    def rewake(self) -> bool:
        """Whether the last settle has queues planned again for submits it had let pass (the caller then
        runs a cycle for them); asked once."""
        with self._lock:
            rewake, self._rewake = self._rewake, False
            return rewake

    def take(self) -> set[str] | None:
        """The queues touched since the last take (None: every queue), forgotten by this take."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            return dirty

    def plans_all(self, dirty: set[str] | None, now: float) -> bool:
        """Whether the cycle will plan every queue whatever its inputs turn out to be (only() is then None)."""
        return dirty is None or self.inputs is None or now >= self.until

    def only(self, dirty: set[str] | None, inputs: tuple, now: float) -> list[str] | None:
        """The queues this cycle must plan: those touched, when the parked ones may stay parked; else None
        (every queue)."""
        if self.plans_all(dirty, now) or inputs != self.inputs:
            return None
        return sorted(dirty)

    def settle(self, inputs: tuple, only: list[str] | None, heads: dict[str, list[Candidate]], waits: dict[int, str],
               quiet: bool, reasons_written: bool, classes: dict[str, ClassPolicy], now: float,
               per_queue: int = 0) -> int:
        """Take a cycle's outcome (`only`: the queues it was limited to, None for all; `per_queue`: the
        most heads it read of a queue); returns how many heads wait, those of parked queues included."""
        if not quiet or (only is None and not reasons_written):
            self.inputs, self.waiting, self.until = None, {}, math.inf
            with self._lock:
                self._last = {}
                self._settle_behind()
            return len(waits)
        with self._lock:
            if only is None:
                self.waiting, self.until, self._last = {}, math.inf, {}
            for queue in only or ():
                self.waiting.pop(queue, None)
                self._last.pop(queue, None)
                if not reasons_written and self._dirty is not None:  # their new reasons are not written
                    self._dirty.add(queue)  # yet: plan them again when they are
            for queue, candidates in heads.items():
                self.waiting[queue] = len(candidates)  # a quiet cycle placed none of them
                if per_queue and len(candidates) >= per_queue:
                    last = candidates[-1]
                    self._last[queue] = _order_key(last.class_priority, last.priority, last.job.id)
                for c in candidates:
                    cls = classes.get(c.service_class)
                    if cls is not None and cls.reservation_after_s is not None and c.waited_s < cls.reservation_after_s:
                        self.until = min(self.until, now + cls.reservation_after_s - c.waited_s)
            self._settle_behind()
        self.inputs = inputs
        return sum(self.waiting.values())

    def _settle_behind(self) -> None:
        """The submits let pass since the last settle, against the heads now parked (under the lock): a
        queue whose best one is not behind its last head any more is planned again."""
        for queue, key in self._behind.items():
            last = self._last.get(queue)
            if last is None or key < last:
                if self._dirty is not None:
                    self._dirty.add(queue)
                self._rewake = True
        self._behind = {}


def _order(text: str) -> tuple[int, int, int] | None:
    """A job's place in its queue's order, comparable with < (earlier first), from a wake-up's
    "class_priority priority id"; None for anything else (the queue is then planned, as for its name)."""
    try:
        return _order_key(*map(int, text.split()))
    except (TypeError, ValueError):
        return None


def _order_key(class_priority: int, priority: int, job_id: int) -> tuple[int, int, int]:
    """The queue order's key (store.jobs.queue_heads: class priority and priority descending, then id)."""
    return -class_priority, -priority, job_id


def _inputs(digest: str, clusters: list, usage: dict, spend: dict) -> tuple:
    """What a verdict of the policy depends on beyond the heads and the clock, comparable with ==. A
    cluster's unavailability counts by kind, not by its text (which says for how long). `usage` is made
    afresh each cycle and never changed after (QuotaTree.charge builds new dicts): kept as it is."""
    return (digest, tuple(replace(c.state, unavailable=c.status if c.state.unavailable else "") for c in clusters),
            usage, spend)


def run_cycle(sessions: sessionmaker, settings: SchedulerSettings, now: datetime, *,
              holds: dict[int, Hold] | None = None, write_reasons: bool = True,
              leader_pid: int | None = None, config: PolicyConfig | None = None,
              parking: Parking | None = None) -> CycleResult:
    """One scheduling cycle. With leader_pid, it commits only while that backend holds the leader lock.
    With `parking`, queues whose heads cannot start are left out while nothing changes for them."""
    started = time.perf_counter()
    dirty = parking.take() if parking is not None else None
    try:
        with sessions.begin() as session:
            # The first reads in one round trip: the in-flight sums and the cluster rows, then what runs
            # per queue, then (when every queue will be planned, as while jobs keep starting) the heads of
            # every queue, then leader fencing with the policy digest.
            everything = parking is None or bool(holds) or parking.plans_all(dirty, now.timestamp())
            also = [job_store.heads_query(settings.per_queue)] if everything else []
            if leader_pid is not None:
                also.append((_FENCED_DIGEST, {"pid": leader_pid, "key": LEADER_LOCK}))
            after_report, rows, running, *also = snapshot.readings(session, (job_store.ACTIVE_USAGE, None), *also)
            heads_read = also.pop(0) if everything else None
            digest = None
            if also:
                held, digest = also[0][0]
                if not held:
                    raise LostLeadership("the leader lock is no longer held")
            read = (after_report, rows)
            if reports.expire_leases(session, now, rows):  # after the in-flight sums: see snapshot.readings
                running = job_store.active_usage(session)  # some went back to their queues
                heads_read = None
            capacities = snapshot.read(session, now, unreachable_after_s=settings.unreachable_after_s,
                                       staleness_s=settings.prometheus_staleness_s, read=read)
            clusters = [c.state for c in capacities]
            config = (config if config is not None else PolicyConfig()).refresh(session, digest)
            classes, quotas, rules = config.classes, config.quotas, config.rules
            # What runs counts in its queue's usage, summed in Postgres; the cycle sees one by one only the
            # attempts it may need (planning.active_needs): the victims only once a search for them starts.
            usage: dict[str, dict[str, int]] = {}
            for r in running:
                usage[r.queue] = add(usage.get(r.queue, {}), r.requests, r.jobs)
            spend = budgets.spend(session, now) if rules else {}
            inputs = _inputs(config.digest, capacities, usage, spend)
            only = None if everything else parking.only(dirty, inputs, now.timestamp())
            rows = heads_read if heads_read is not None else job_store.queue_heads(session, settings.per_queue, only)
            avoid = job_store.recently_unschedulable(session, [r[0] for r in rows if r[11] > 0],
                                                     settings.avoid_unschedulable_s)
            heads, current = _candidates(rows, now.timestamp(), avoid)
            needs = active_needs(heads, clusters, quotas, classes, usage)
            active = _active(job_store.active_attempts(session, clusters=needs.clusters, timed=True), classes) \
                if needs.timed else []
            # A deep backlog's places go to Postgres while the rest is planned (job_store.DispatchAhead).
            ahead = job_store.DispatchAhead(session, [c.name for c in clusters])
            try:
                try:
                    plan = plan_cycle(heads, active, clusters, quotas, classes, holds or {}, now.timestamp(), rules,
                                      spend, usage=usage, victims=not needs.victims, placed=ahead.placed)
                except VictimsNeeded:
                    ahead.undo()
                    seen = {a.job_id for a in active}
                    active += [a for a in _active(job_store.active_attempts(
                        session, clusters=needs.clusters, preemptible=needs.preemptible, below=needs.below,
                        queues=needs.queues), classes) if a.job_id not in seen]
                    plan = plan_cycle(heads, active, clusters, quotas, classes, holds or {}, now.timestamp(), rules,
                                      spend, usage=usage, placed=ahead.placed)
                dispatched = ahead.end()
            finally:
                ahead.close()
            preempted = sum(reports.preempt(session, p.victim, p.by, p.cluster) for p in plan.preemptions)
            reasons = {i: r for i, r in plan.waits.items() if current.get(i) != r} \
                if write_reasons or plan.preemptions else {}
            # The reasons, the dispatches not sent ahead and, when the cycle began its transaction (not a
            # caller's, joined), the COMMIT, in one round trip.
            rest = plan.places[ahead.sent:]
            dispatched += job_store.dispatch(session, [(p.job_id, p.cluster) for p in rest],
                                             {p.job_id: plan.bursts[p.job_id].record() for p in rest
                                              if p.job_id in plan.bursts},
                                             reasons=reasons, commit=isinstance(session.get_bind(), Engine))
    except BaseException:
        if parking is not None:
            parking.touch()  # what this cycle took may not have been planned: plan every queue next time
        raise
    waiting = len(plan.waits)
    if parking is not None:
        quiet = not (plan.places or plan.preemptions or plan.holds or needs.timed or avoid)
        waiting = parking.settle(inputs, only, heads, plan.waits, quiet, write_reasons, classes, now.timestamp(),
                                 settings.per_queue)
    first_waits = tuple((d.dispatched_at - d.created_at).total_seconds() for d in dispatched
                        if d.attempt == 1 and d.created_at and d.dispatched_at)
    more = any(n >= settings.per_queue for n in Counter(r[1] for r in rows).values())
    return CycleResult(len(dispatched), preempted, waiting, time.perf_counter() - started, plan.holds,
                       first_waits, planned=len(heads) if only is not None else None, more=more,
                       idle=only is None and not more and len(dispatched) == len(rows))


class Scheduler:
    """Runs cycles while this process holds the leader lock.

    on_leadership(True) is called, on the scheduler thread, right after the lock is taken and before the
    first cycle; on_leadership(False) when leading ends for any reason (lost lock, error, stop). Work
    that only the leader should do (the Prometheus refresher) is started and stopped there.
    """

    def __init__(self, engine: Engine, sessions: sessionmaker, notifier: Notifier, settings: SchedulerSettings,
                 metrics: DispatcherMetrics | None = None,
                 on_leadership: Callable[[bool], None] | None = None):
        self._url = libpq_url(engine)
        self._metrics = metrics
        self._on_leadership = on_leadership
        self._sessions = sessions
        self._settings = settings
        self._wake = threading.Event()  # any wake-up since the last cycle began
        self._work = threading.Event()  # one other than ROOM (see store.jobs.ROOM) since the last cycle began
        self._stop = threading.Event()
        self.is_leader = threading.Event()
        self._holds: dict[int, Hold] = {}  # reservations and preemption holds, kept between cycles
        self._config = PolicyConfig()
        self._parking = Parking()
        notifier.subscribe(job_store.WAKE_CHANNEL, self._woken)
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def _woken(self, payload: str) -> None:
        if not self._parking.touch(payload):  # a queue's name (with a submit's order), ROOM, or "" for anything
            return  # a submit behind a parked queue's heads: no cycle would read it
        if payload != job_store.ROOM:
            self._work.set()
        self._wake.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock_connection() as lock_conn:
                    while not self._stop.is_set():
                        got = lock_conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)).fetchone()[0]
                        if got:
                            break
                        self._stop.wait(self._settings.leader_retry_s)
                    else:
                        return
                    log.info("became the scheduling leader", extra={"backend_pid": lock_conn.info.backend_pid})
                    self._holds = {}  # an earlier term's holds (on this replica) describe a past others moved on from
                    self._config = PolicyConfig()
                    self._parking = Parking()
                    self.is_leader.set()
                    self._leadership(True)
                    try:
                        self._lead(lock_conn)
                    finally:
                        self.is_leader.clear()
                        self._leadership(False)
            except LostLeadership:
                log.warning("lost the leader lock; following again")
            except Exception:
                log.exception("scheduler failed; retrying")
                self._stop.wait(1.0)

    def _lock_connection(self) -> psycopg.Connection:
        """An autocommit connection for the leader lock, with keepalives on both ends of TCP.

        The server-side settings let Postgres drop a silent leader (its machine or network gone) within
        about 3 s, releasing the lock for a follower; the client-side ones let the leader notice a silent
        Postgres. Over a Unix socket none apply: the kernel closes the socket when the process dies.
        """
        k = self._settings.leader_keepalive_s
        conn = psycopg.connect(self._url, autocommit=True, connect_timeout=10, keepalives=1, keepalives_idle=k,
                               keepalives_interval=1, keepalives_count=2, tcp_user_timeout=(k + 2) * 1000)
        try:
            conn.execute(f"SET tcp_keepalives_idle = {int(k)}; SET tcp_keepalives_interval = 1; "
                         f"SET tcp_keepalives_count = 2; SET tcp_user_timeout = {(int(k) + 2) * 1000}")
        except Exception:
            conn.close()
            raise
        return conn

    def _prune_outbox(self) -> None:
        """Between cycles, in a short transaction of its own; a failure is logged and tried again later."""
        try:
            with self._sessions.begin() as session:
                pruned = outbox_store.prune(session, self._settings.outbox_retention_s,
                                            self._settings.outbox_prune_limit)
            if pruned:
                log.info("outbox pruned", extra={"commands": pruned})
        except Exception:
            log.exception("outbox pruning failed")

    def _leadership(self, leading: bool) -> None:
        if self._metrics is not None:
            self._metrics.leader.set(1 if leading else 0)
        if self._on_leadership is not None:
            try:
                self._on_leadership(leading)
            except Exception:  # leader-only side work must not stop scheduling (or keep a dead term alive)
                log.exception("leadership callback failed", extra={"leading": leading})

    def _lead(self, lock_conn: psycopg.Connection) -> None:
        reasons_at = 0.0
        pruned_at = time.monotonic()
        while not self._stop.is_set():
            self._wake.clear()
            self._work.clear()
            write_reasons = time.monotonic() - reasons_at >= self._settings.reason_interval_s
            if write_reasons:
                reasons_at = time.monotonic()
            result = run_cycle(self._sessions, self._settings, datetime.now(timezone.utc), holds=self._holds,
                               write_reasons=write_reasons, leader_pid=lock_conn.info.backend_pid,
                               config=self._config, parking=self._parking)
            self._holds = result.holds
            if self._parking.rewake():  # submits let pass while this cycle ran are among the heads after all
                self._work.set()
                self._wake.set()
            if self._metrics is not None:
                self._metrics.observe_cycle(result.seconds, result.dispatched, result.preempted, result.waiting,
                                            result.first_waits)
            ended = time.monotonic()
            if ended - pruned_at >= self._settings.outbox_prune_interval_s:
                pruned_at = ended
                self._prune_outbox()
            if result.dispatched:
                log.debug("cycle", extra={"dispatched": result.dispatched, "seconds": result.seconds})
                if result.more:
                    continue  # the heads it read are gone: the next ones in line may start too
            due = ended + self._settings.idle_wait_s
            if not write_reasons:  # reasons were left unwritten: come back when they are due
                due = min(due, reasons_at + self._settings.reason_interval_s)
            while (self._wake.wait(max(0.0, due - time.monotonic())) and result.idle and not self._work.is_set()
                   and not self._stop.is_set()):
                # Only room freed (a capacity change, an attempt that finished) and no job was queued at
                # the last cycle: nothing could use it. A submit, or anything else, runs a cycle.
                self._wake.clear()
                if self._work.is_set() or self._stop.is_set():  # came in between: do not lose it
                    self._wake.set()
            if not self._wake.is_set():
                lock_conn.execute("SELECT 1")  # still leader: a dead lock connection raises here
            elif not result.dispatched:
                # Woken (a submit, freed capacity) after a cycle that started nothing: the next one starts
                # no sooner than that cycle's length after it ended, so that the wake-ups of that moment
                # join into one cycle. A stream of submits that cannot start then costs the scheduler
                # about half its time at most; a wake-up after a quiet spell starts a cycle at once, and
                # so does one after a cycle that dispatched (those that came since wait for no one).
                pause = ended + min(result.seconds, self._settings.wake_pace_max_s) - time.monotonic()
                if pause > 0:
                    self._stop.wait(pause)
