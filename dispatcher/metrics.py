"""The dispatcher's own metrics, served at /metrics for Prometheus (docs/metrics.md lists them).

Two kinds, kept apart:

- What happens in this process (dispatch latency, scheduling cycles and their decisions) is counted as
  it happens, in `DispatcherMetrics`, by whoever is handed the object (the scheduler, the agent link).
  Only the leader schedules, so on a follower replica the scheduling series stay at zero, and
  `sluice_scheduler_leader` is 1 on the leader only.
- What lives in Postgres (queued and active jobs, queue usage, outbox depth, cluster capacity) is read
  when Prometheus scrapes, by `StoreCollector`: one short read-only transaction of a few GROUP BY
  queries, with a statement timeout, so nothing is cached to go stale and every replica reports the
  same values (aggregate them with max, not sum).

Every Dispatcher owns a private registry (several run in one test process); nothing here is global.
Amounts are converted from Sluice's milli-units to base units: cpu cores, memory bytes, other resources
in their own unit.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dispatcher.capacity import snapshot, usable
from dispatcher.errors import StoreUnavailable
from dispatcher.policy.bursting import Spend
from dispatcher.policy.quotas import rolled_up
from dispatcher.services import admin_objects, budgets
from dispatcher.store import clusters as cluster_store
from dispatcher.store import database
from dispatcher.store import outbox as outbox_store
from dispatcher.store import usage as usage_totals
from dispatcher.store.database import Sessions
from sluice.objects import object_from_document

log = logging.getLogger(__name__)

# From a fast local dispatch to a job that waited hours for capacity.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                   1800.0, 3600.0, 7200.0, 21600.0, 86400.0)
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SUBMIT_TO_DISPATCH, DISPATCH_TO_RUNNING = "submit_to_dispatch", "dispatch_to_running"
DECISIONS = ("dispatched", "preempted", "waiting")
SUBMIT_OUTCOMES = ("accepted", "invalid", "refused", "failed")
SCRAPE_TIMEOUT_S = 5.0  # per statement of a scrape's read; Prometheus' own scrape timeout is usually 10 s


def base_units(milli: float) -> float:
    """Sluice milli-units (sluice/quantity.py) to the resource's base unit: cores, bytes, devices."""
    return float(milli) / 1000.0


class DispatcherMetrics:
    """The in-process counters and histograms of one dispatcher, on its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        # No `<name>_created` series beside counters and histograms: they double every series for no use
        # here. prometheus_client holds this per process; set where the metrics are made, not on import.
        disable_created_metrics()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.dispatch_latency = Histogram(
            "sluice_dispatch_latency_seconds",
            "Time from a job's submission to its first dispatch, and from each dispatch to its attempt running.",
            ["phase"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.cycle_seconds = Histogram(
            "sluice_scheduling_cycle_seconds", "Duration of one scheduling cycle, its commit included.",
            buckets=CYCLE_BUCKETS, registry=self.registry)
        self.cycles = Counter("sluice_scheduling_cycles", "Scheduling cycles committed by this replica.",
                              registry=self.registry)
        self.decisions = Counter(
            "sluice_scheduling_decisions",
            "Decisions of the scheduling cycles: jobs dispatched, attempts preempted, jobs left waiting "
            "(a job waiting through n cycles counts n times).", ["decision"], registry=self.registry)
        self.leader = Gauge(
            "sluice_scheduler_leader",
            "1 while this replica holds the scheduling leader lock (and runs the cycles), 0 otherwise.",
            registry=self.registry)
        self.queue_dispatched = Counter(
            "sluice_queue_dispatched", "Jobs the scheduling cycles of this replica dispatched, by queue (a job "
            "dispatched again after a retry or preemption counts again).", ["queue"], registry=self.registry)
        self.submits = Counter(
            "sluice_submit_requests",
            "Submits answered by this replica (a Submit call, or one submit on a SubmitStream), by outcome: "
            "accepted; invalid (a document or request that is wrong, or names a queue or class that does not "
            "exist); refused (not allowed, or over a limit); failed (the server's own failure: its database "
            "unreachable, an internal error).",
            ["outcome"], registry=self.registry)
        self.submitted = Counter("sluice_submitted_jobs", "Jobs accepted by this replica's submits (replays "
                                 "of an idempotency key not counted again).", registry=self.registry)
        for outcome in SUBMIT_OUTCOMES:
            self.submits.labels(outcome)
        for phase in (SUBMIT_TO_DISPATCH, DISPATCH_TO_RUNNING):  # every series exists from the start, at 0
            self.dispatch_latency.labels(phase)
        for decision in DECISIONS:
            self.decisions.labels(decision)

    def observe_cycle(self, seconds: float, dispatched: int, preempted: int, waiting: int,
                      submit_to_dispatch: Iterable[float] = (), dispatched_by_queue: dict[str, int] | None = None,
                      ) -> None:
        """One committed cycle; submit_to_dispatch: the waits of the jobs it dispatched for the first time."""
        self.cycles.inc()
        for queue, n in (dispatched_by_queue or {}).items():
            self.queue_dispatched.labels(queue).inc(n)
        self.cycle_seconds.observe(seconds)
        for decision, n in zip(DECISIONS, (dispatched, preempted, waiting)):
            if n:
                self.decisions.labels(decision).inc(n)
        latency = self.dispatch_latency.labels(SUBMIT_TO_DISPATCH)
        for s in submit_to_dispatch:
            latency.observe(max(0.0, s))

    def observe_dispatch_to_running(self, seconds: float) -> None:
        self.dispatch_latency.labels(DISPATCH_TO_RUNNING).observe(max(0.0, seconds))

    def observe_submit(self, outcome: str, jobs: int = 0) -> None:
        """One submit answered: its outcome (SUBMIT_OUTCOMES) and the jobs it added."""
        self.submits.labels(outcome).inc()
        if jobs:
            self.submitted.inc(jobs)


def _gauge(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


class StreamCollector(Collector):
    """The streams open on this replica, those a limit refused (api.admission), and the watches' reads of the
    store (api.event_feed), counted at scrape time.

    limits: per kind of stream ("watch", "submit"), its StreamLimits (open(), refused by "total" and
    "per_user"), or None where that kind is turned off; agent links are counted by their service; agents_first
    (api.admission.AgentsFirst), the agents connecting and the watches that waited for them; watch_reads, the
    event feed's reads by kind."""

    def __init__(self, limits: dict, *, agent_links: Callable[[], int], agents_refused: Callable[[], int],
                 agents_first, watch_reads: Mapping[str, int]):
        self._limits = limits
        self._agent_links = agent_links
        self._agents_refused = agents_refused
        self._agents_first = agents_first
        self._watch_reads = watch_reads

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        opened = GaugeMetricFamily(
            "sluice_streams_open", "Streams open on this replica, by kind: watch (Jobs.Watch and WatchBatches), "
            "submit (Jobs.SubmitStream), agent (Agents.Connect).", labels=["kind"])
        refused = CounterMetricFamily(
            "sluice_streams_refused", "Streams this replica refused with RESOURCE_EXHAUSTED, by kind and the limit "
            "met: total, per_user (watch-streams-per-user), rate (agent-admissions-per-s).", labels=["kind", "limit"])
        for kind, limits in self._limits.items():
            opened.add_metric([kind], limits.open() if limits is not None else 0)
            for limit in ("total", "per_user"):
                refused.add_metric([kind, limit], limits.refused[limit] if limits is not None else 0)
        opened.add_metric(["agent"], self._agent_links())
        refused.add_metric(["agent", "rate"], self._agents_refused())
        reads = CounterMetricFamily(
            "sluice_watch_event_reads", "Reads of stored job events for this replica's watches: tail (new events, "
            "once for every watch), shared (older events, once for every watch catching up through them), alone "
            "(one watch's own: a single job's events, or events below one still to commit).", labels=["read"])
        for read, count in dict(self._watch_reads).items():
            reads.add_metric([read], count)
        connecting = GaugeMetricFamily(
            "sluice_agent_links_connecting", "Agent links that have called and are not welcomed yet: waiting for "
            "their turn (agent-admissions-per-s) or in their hello.", value=self._agents_first.connecting_now)
        waited = CounterMetricFamily(
            "sluice_watches_waited_for_agents", "Watch streams that waited before their first read because agents "
            "were connecting (after a restart, every one of them).", value=self._agents_first.waited)
        return [opened, refused, reads, connecting, waited]


class StoreCollector(Collector):
    """Gauges read from Postgres at scrape time."""

    def __init__(self, sessions: Sessions, *, unreachable_after_s: float,
                 staleness_s: float = usable.DEFAULT_STALENESS_S, timeout_s: float = SCRAPE_TIMEOUT_S):
        # The same bounds as the scheduler's: the gauges show the capacity it schedules against.
        self._sessions = sessions
        self._unreachable_after_s = unreachable_after_s
        self._staleness_s = staleness_s
        self._timeout_s = timeout_s

    def describe(self) -> Iterable[Metric]:
        return []  # collect() reads the database: never at registration

    def collect(self) -> Iterable[Metric]:
        up = _gauge("sluice_database_up", "Whether this scrape could read the dispatcher's Postgres "
                                          "(0: the other database gauges are missing from it).", [])
        try:
            families = self._read(datetime.now(UTC))
        except StoreUnavailable:  # the health check says so already; the scrape's sluice_database_up shows it
            up.add_metric([], 0.0)
            return [up]
        except Exception:
            # A failed read must not hide the in-process series, which matter most during an outage.
            log.warning("metrics: cannot read the database", exc_info=True)
            up.add_metric([], 0.0)
            return [up]
        up.add_metric([], 1.0)
        return [up, *families]

    def _read(self, now: datetime) -> list[Metric]:
        with self._sessions() as session:  # read only: closed without a commit
            database.statement_timeout(session, self._timeout_s)
            queued = usage_totals.queued_per_class(session)
            active = usage_totals.active_per_cluster(session)
            used = usage_totals.used_per_cluster(session)
            outbox = outbox_store.unacked_per_cluster(session)
            capacity = snapshot.read(session, now, unreachable_after_s=self._unreachable_after_s,
                                     staleness_s=self._staleness_s)
            classes = sorted(cluster_store.service_classes(session))
            rows = cluster_store.list_queues(session)
            queues = {q.name: q.spec.get("spec", {}).get("serviceClasses") or classes for q in rows}
            quotas = [admin_objects.quota_of(object_from_document(q.spec)) for q in rows]
            burst_rules = budgets.rules(session)
            spend = budgets.spend(session, now) if burst_rules else {}
            session.rollback()
        clusters = [c.state.name for c in capacity]

        g_queued = _gauge("sluice_jobs_queued", "Jobs waiting in a queue, by service class.",
                          ["queue", "service_class"])
        # Every queue and class it accepts, and every queue and cluster, has a series, at 0 when empty:
        # a drained queue reads 0, not "no data".
        counts = {(q, c): 0 for q, accepted in queues.items() for c in accepted}
        counts.update({(r.queue, r.service_class): r.jobs for r in queued})
        for (queue, service_class), n in sorted(counts.items()):
            g_queued.add_metric([queue, service_class], n)
        g_active = _gauge("sluice_jobs_active", "Jobs dispatched to or running on a cluster (DISPATCHED + RUNNING).",
                          ["queue", "cluster"])
        counts = {(q, c): 0 for q in queues for c in clusters}
        counts.update({(r.queue, r.cluster or ""): r.jobs for r in active})
        for (queue, cluster), n in sorted(counts.items()):
            g_active.add_metric([queue, cluster], n)
        oldest: dict[str, datetime] = {}
        for r in queued:
            oldest[r.queue] = min(oldest.get(r.queue, r.oldest), r.oldest)
        g_oldest_queued = _gauge("sluice_queue_oldest_queued_age_seconds",
                                 "Age of the oldest queued job of a queue (0: none queued).", ["queue"])
        for queue in sorted(queues):
            g_oldest_queued.add_metric([queue], max(0.0, (now - oldest[queue]).total_seconds())
                                       if queue in oldest else 0.0)
        g_used = _gauge("sluice_queue_used", "Resources requested by the active jobs of a queue and of the queues "
                                             "below it (as quotas count them) on a cluster, in base units (cpu: "
                                             "cores, memory: bytes, others: count).", ["queue", "cluster", "resource"])
        own: dict[tuple[str, str], dict[str, float]] = {}
        for r in used:
            own.setdefault((r.queue, r.cluster or ""), {})[r.resource] = float(r.milli)
        for (queue, cluster), amounts in sorted(rolled_up(quotas, own).items()):
            for resource, milli in sorted(amounts.items()):
                g_used.add_metric([queue, cluster, resource], base_units(milli))
        g_guaranteed = _gauge("sluice_queue_guaranteed", "A queue's guarantee of each resource it names, in base "
                                                         "units.", ["queue", "resource"])
        g_max = _gauge("sluice_queue_max", "A queue's maximum of each resource it names, in base units.",
                       ["queue", "resource"])
        for q in quotas:
            for gauge, amounts in ((g_guaranteed, q.guaranteed), (g_max, q.max)):
                for resource, milli in sorted(amounts.items()):
                    gauge.add_metric([q.name, resource], base_units(milli))
        g_unacked = _gauge("sluice_outbox_unacked_commands", "Commands for a cluster's agent not acked yet.",
                           ["cluster"])
        g_oldest = _gauge("sluice_outbox_oldest_unacked_age_seconds",
                          "Age of the oldest command a cluster's agent has not acked (0: none).", ["cluster"])
        for r in outbox:
            g_unacked.add_metric([r.cluster], r.commands)
            g_oldest.add_metric([r.cluster], float(r.oldest_age_s))
        g_capacity = _gauge("sluice_cluster_capacity",
                            "A cluster's capacity as the scheduler sees it, in base units: allocatable, and free "
                            "after the attempts its source does not show yet.", ["cluster", "resource", "kind"])
        g_age = _gauge("sluice_cluster_capacity_age_seconds",
                       "Age of the capacity reading in use, by its source (prometheus | agent | none; "
                       "+Inf: no reading ever).", ["cluster", "source"])
        g_reachable = _gauge("sluice_cluster_reachable", "1 while the dispatcher hears from a cluster's agent "
                                                         "(within unreachable-after), 0 otherwise.", ["cluster"])
        for c in capacity:
            name = c.state.name
            g_reachable.add_metric([name], 0.0 if c.status == "unreachable" else 1.0)
            for resource, milli in sorted(c.allocatable.items()):
                g_capacity.add_metric([name, resource, "allocatable"], base_units(milli))
            for resource, milli in sorted(c.state.free.items()):
                g_capacity.add_metric([name, resource, "free"], base_units(milli))
            g_age.add_metric([name, c.source], c.age_seconds if c.age_seconds >= 0 else math.inf)
        return [g_queued, g_oldest_queued, g_active, g_used, g_guaranteed, g_max, g_unacked, g_oldest, g_capacity,
                g_age, g_reachable, *_burst_families(burst_rules, spend)]


def _burst_families(rules: list, spend: dict) -> list[Metric]:
    """Each burst policy's spend and its budgets (queue "": the policy as a whole), this UTC day."""
    labels = ["policy", "queue"]
    today = _gauge("sluice_burst_spend_today", "Money a burst policy (or one queue under it) committed this UTC "
                                               "day: finished bursts' cost and running ones' expected cost.", labels)
    rate = _gauge("sluice_burst_spend_rate_per_hour", "Money per hour of the bursts running now.", labels)
    per_day = _gauge("sluice_burst_budget_per_day", "A burst policy's budget per UTC day (where it sets one).",
                     labels)
    per_hour = _gauge("sluice_burst_budget_per_hour", "A burst policy's budget per hour of running bursts (where it "
                                                      "sets one).", labels)
    for rule in rules:
        queues = sorted(q for (p, q) in spend if p == rule.name and q is not None)
        for queue, budget in ((None, rule.budget), *((q, rule.queue_budget) for q in queues)):
            key = [rule.name, queue or ""]
            spent = spend.get((rule.name, queue), Spend())
            today.add_metric(key, spent.today)
            rate.add_metric(key, spent.rate)
            if budget.per_day is not None:
                per_day.add_metric(key, budget.per_day)
            if budget.per_hour is not None:
                per_hour.add_metric(key, budget.per_hour)
    return [today, rate, per_day, per_hour]
