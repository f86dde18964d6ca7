"""The scheduler's settings: one frozen dataclass, built at the entry point."""
from __future__ import annotations

from dataclasses import dataclass

from dispatcher.capacity import usable


@dataclass(frozen=True)
class SchedulerSettings:
    # Queued jobs read per queue and cycle, in order (never the whole backlog): how deep backfill looks.
    per_queue: int = 64
    # Read of a queue none of whose heads could start while room of their kind was left (backfill reaches
    # further there, next cycle): about as deep as Slurm's backfill tests by default (bf_max_job_test), so
    # that a saturated queue's short jobs start around a reservation as EASY starts them (docs/simulate.md).
    backfill_per_queue: int = 512
    reason_interval_s: float = 1.0  # pending reasons are rewritten at most this often (they are for people)
    idle_wait_s: float = 2.0  # safety-net wake-up when no notification comes (clusters going stale)
    wake_pace_max_s: float = 0.25  # after a cycle that started nothing, the next waits up to its length (at most this)
    release_interval_s: float = 1.0  # how often the leader queues waiting jobs whose hold is over (services.waiting)
    leader_retry_s: float = 1.0  # how often a follower tries to become leader
    # TCP keepalive on the leader lock's connection, both ways (seconds idle before the first probe; probes
    # then go 1 s apart and 2 unanswered ones drop the connection). A leader that dies with its machine
    # sends no FIN: without this Postgres would keep its lock for the kernel's default (hours).
    leader_keepalive_s: int = 1
    unreachable_after_s: float = 5.0  # no heartbeat this long: the cluster takes no new jobs
    # A leader that has just taken over starts no job until the clusters reachable before are back, or for this
    # long at most (scheduler/takeover.py): after a restart it lets every agent reconnect first. 0: no wait.
    takeover_wait_s: float = 60.0
    prometheus_staleness_s: float = usable.DEFAULT_STALENESS_S  # older Prometheus readings: use the agent's
    avoid_unschedulable_s: float = 600.0  # a cluster where a job's attempt could not start is left out this long
    # The leader deletes acked outbox commands older than this that nothing reads any more (outbox.prune),
    # at most every outbox_prune_interval_s, up to outbox_prune_limit per cluster each time: one row per
    # dispatch and cancel would otherwise stay for ever.
    outbox_retention_s: float = 3600.0
    outbox_prune_interval_s: float = 60.0
    outbox_prune_limit: int = 10_000
    # Submit idempotency keys (store.submit_keys) are kept this long, far past any client's retries (a
    # client retries for seconds; `sluice submit --idempotency-key` may be run again later), and pruned
    # with the outbox, up to submit_key_prune_limit each time (one key per submit: as many as jobs, at worst).
    submit_key_retention_s: float = 86_400.0
    submit_key_prune_limit: int = 100_000
    # Schedules (services.recurring) are fired between cycles at most this often; a due time starts within
    # about this, or idle_wait_s when the loop is idle, after it comes.
    schedule_interval_s: float = 1.0


