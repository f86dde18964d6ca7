"""Policy scenarios through the real dispatcher: Postgres, the scheduling loop, gRPC and sim agents.

Each test starts its own Embedded (dispatcher plus in-process sim agents) on the objects it needs,
drives it with the real Client and checks both what happens and the reason every waiting job shows.
Pod durations are scaled by TIME_SCALE (a "30s" pod runs 3 s); policy times (reservationAfter) are not.
"""
from __future__ import annotations

import itertools
import re
import threading
import time
from typing import Self

from sluice.quantity import parse_quantity
from tests.integration.scenarios import ACTIVE, CLASSES, FINAL, by_id, cluster, job, queue, ts, wait_final, wait_for

UNSEEN = re.compile(r"waiting behind \d+ jobs in queue \S+")


def reason(job: dict) -> str:
    """The job's reason, with "not looked at yet" (however get() words it) read as "submitted"."""
    return "submitted" if UNSEEN.fullmatch(job["reason"]) else job["reason"]


class Sampler:
    """Calls `sample()` every `interval` seconds in a thread, keeping every result, until stopped."""

    def __init__(self, sample, interval: float = 0.01):
        self.samples: list = []
        self.errors: list[BaseException] = []
        self._sample, self._interval = sample, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), self._sample()))
            except BaseException as exc:  # noqa: BLE001 - surfaced by stop()
                self.errors.append(exc)
                return
            self._stop.wait(self._interval)


# ---------------------------------------------------------------------------------------------
# 1. Fair share


def test_fair_share_a_late_small_queue_starts_within_a_few_cycles_of_a_flood(sluice):
    slots = 8
    s = sluice(CLASSES + queue("a", weight=1) + queue("b", weight=1) + cluster("c1", slots))
    c = s.client
    flood = c.submit([job("a", "1", "5s", name="flood") for _ in range(1000)])  # one call, 0.5 s each
    assert len(flood) == 1000
    wait_for(lambda: len(c.list(queue="a", state="RUNNING")) == slots, 15, "the flood fills the cluster")

    small = c.submit([job("b", "1", "5s", name="small") for _ in range(10)])
    seen_b: set[str] = set()

    def b_started():
        jobs = [c.get(i) for i in small]
        seen_b.update(reason(j) for j in jobs if j["state"] == "QUEUED")
        return jobs if all(j["startedAt"] for j in jobs) else None
    b_jobs = wait_for(b_started, 15, "all 10 jobs of queue b started")

    a_jobs = c.list(queue="a")
    b_submitted = min(ts(j["createdAt"]) for j in b_jobs)
    b_last_start = max(ts(j["startedAt"]) for j in b_jobs)
    backlog = [j for j in a_jobs if not j["startedAt"] or ts(j["startedAt"]) > b_submitted]
    a_meanwhile = [j for j in backlog if j["startedAt"] and ts(j["startedAt"]) <= b_last_start]
    # Fair share gives b every freed slot until it holds as many as a: its 10 jobs (at most ~4 at once)
    # start within a few job lengths, while a starts about as many. FIFO would make b wait ~60 s.
    assert (b_last_start - b_submitted).total_seconds() < 5.0, (b_submitted, b_last_start)
    assert len(a_meanwhile) <= 10 + slots * 3, (len(a_meanwhile), len(backlog))
    assert len(a_meanwhile) < 0.1 * len(backlog), (len(a_meanwhile), len(backlog))
    # What b showed while it waited (if a reason was written in time): the cluster was full.
    assert seen_b <= {"submitted", "no cluster fits: c1: needs 1 cpu, 0 free"}, seen_b
    assert all(j["state"] == "SUCCEEDED" for j in wait_final(c, small, 15))

    # a's waiting head says why, specifically (the backlog beyond the per-queue head keeps "submitted").
    def head_reasons():
        head = c.list(queue="a", state="QUEUED", limit=32)
        reasons = {j["reason"] for j in head}
        return reasons if reasons == {"no cluster fits: c1: needs 1 cpu, 0 free"} else None
    wait_for(head_reasons, 10, "the head of queue a names the full cluster")
    print(f"\nfair share: b's 10 jobs all started {(b_last_start - b_submitted).total_seconds():.2f}s after "
          f"submit; meanwhile {len(a_meanwhile)} of a's {len(backlog)} backlog started")


# ---------------------------------------------------------------------------------------------
# 2. Quota maximum


def test_queue_maximum_caps_what_runs_and_the_rest_say_so(sluice):
    s = sluice(CLASSES + queue("capped", guaranteed={"cpu": "2"}, max={"cpu": "4"}) + cluster("c1", 16))
    c = s.client
    # 3 s each, two waves of two. Long enough to see the reasons: a cycle writes them at most once a
    # second, and with nothing changing the next cycle may be the scheduler's 2 s safety-net wake-up.
    ids = c.submit([job("capped", "2", "30s") for _ in range(4)])
    expected = "queue capped: cpu 4/4 in use (guaranteed 2, max 4)"

    def sample():
        q = next(q for q in c.queues() if q["name"] == "capped")
        jobs = c.list(queue="capped")
        return parse_quantity(q["used"].get("cpu", "0")), jobs

    with Sampler(sample, 0.02) as sampler:
        wait_final(c, ids, 30)
    assert sampler.samples, "no samples taken"
    max_used = max(used for _, (used, _) in sampler.samples)
    max_active = max(sum(j["state"] in ACTIVE for j in jobs) for _, (_, jobs) in sampler.samples)
    assert max_used == 4000 and max_active == 2, (max_used, max_active)  # the cap, reached, never passed
    waiting = {j["reason"] for _, (_, jobs) in sampler.samples for j in jobs if j["state"] == "QUEUED"}
    assert waiting <= {"submitted", expected}, waiting
    # At some moment two ran while every other waiting job showed the quota reason.
    assert any(sum(j["state"] in ACTIVE for j in jobs) == 2
               and [j["reason"] for j in jobs if j["state"] == "QUEUED"] == [expected] * 2
               for _, (_, jobs) in sampler.samples), "the quota reason was never shown by both waiting jobs"
    assert all(j["state"] == "SUCCEEDED" for j in c.list(queue="capped"))
    print(f"\nquota: max cpu used {max_used / 1000:g}/4, max running {max_active}, waiting reasons {waiting}")


# ---------------------------------------------------------------------------------------------
# 3. Preemption


def preempted_by(client, job_id: int) -> list[int]:
    """The jobs that evicted any attempt of `job_id`, from its events."""
    out = []
    for e in client.describe(job_id)["events"]:
        if e["to"] == "QUEUED" and e["from"] in ACTIVE:
            assert e["reason"].startswith("preempted by job "), e
            out.append(int(e["reason"].removeprefix("preempted by job ")))
    return out


def preemptor_reasons(victims: list[int]) -> set[str]:
    """What a preemptor may show while it waits for its victims (named in any order) to stop."""
    out = {"submitted"}
    for order in itertools.permutations(victims):
        names = ", ".join(map(str, order))
        out |= {f"preempting jobs {names} on c1", f"holding capacity on c1: waiting for preempted jobs {names} to stop"}
    return out


def test_critical_job_preempts_fewest_batch_jobs_which_rerun_after_it(sluice):
    s = sluice(CLASSES + queue("work", serviceClasses=["batch", "critical"]) + cluster("c1", 8))
    c = s.client
    batch = c.submit([job("work", "2", "30s", name="batch", service_class="batch") for _ in range(4)])
    wait_for(lambda: len(c.list(queue="work", state="RUNNING")) == 4, 10, "batch jobs fill the cluster")

    with Sampler(lambda: by_id(c, "work"), 0.02) as sampler:
        [critical] = c.submit([job("work", "4", "10s", name="critical", service_class="critical")])
        # Its preemption reason shows only until the victims' room is reported free (tens of ms): poll fast.
        with Sampler(lambda: c.get(critical), 0) as fast:
            wait_for(lambda: c.get(critical)["state"] != "QUEUED", 10, "the critical job is dispatched")
        wait_for(lambda: c.get(critical)["state"] in ("RUNNING", *FINAL), 10, "the critical job runs")
        victims = [b for b in batch if preempted_by(c, b)]
        # The victims wait for the critical job to end, then rerun.
        wait_final(c, [critical, *batch], 20)

    final = {i: c.get(i) for i in [critical, *batch]}
    crit = final[critical]
    assert crit["state"] == "SUCCEEDED" and crit["attempt"] == 1, crit
    assert [e["to"] for e in c.describe(critical)["events"]] == ["QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
    # Two 2-cpu victims free the 4 cpu it needs: the fewest possible. Each was evicted by it, exactly once.
    assert len(victims) == 2, victims
    for v in victims:
        assert preempted_by(c, v) == [critical]
        assert final[v]["state"] == "SUCCEEDED" and final[v]["attempt"] == 2, final[v]
        assert [e["to"] for e in c.describe(v)["events"]] == [
            "QUEUED", "DISPATCHED", "RUNNING", "QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
        assert ts(final[v]["startedAt"]) >= ts(crit["finishedAt"]), (final[v], crit)  # rerun after it
    for b in set(batch) - set(victims):
        assert final[b]["state"] == "SUCCEEDED" and final[b]["attempt"] == 1, final[b]

    crit_reasons = [reason(j) for _, j in fast.samples if j["state"] == "QUEUED"]
    assert crit_reasons and set(crit_reasons) <= preemptor_reasons(victims), set(crit_reasons)
    assert set(crit_reasons) - {"submitted"}, "the critical job's preemption reason was never seen"
    victim_reasons = {jobs[v]["reason"] for _, jobs in sampler.samples for v in victims
                      if jobs[v]["state"] == "QUEUED"}
    assert f"preempted by job {critical}" in victim_reasons, victim_reasons
    assert victim_reasons <= {f"preempted by job {critical}", f"reserved capacity for job {critical} on c1",
                              "no cluster fits: c1: needs 2 cpu, 0 free"}, victim_reasons
    assert s.sims["c1"].max_overcommit == {}
    shown = sum(r != "submitted" for r in crit_reasons)
    print(f"\npreemption: critical {critical} evicted {victims}; its reasons {sorted(set(crit_reasons))} "
          f"({shown} samples); "
          f"victims showed {sorted(victim_reasons)}")


def test_preemption_evicts_one_big_job_rather_than_three_small_ones(sluice):
    s = sluice(CLASSES + queue("work", serviceClasses=["batch", "critical"]) + cluster("c1", 8))
    c = s.client
    batch = c.submit([job("work", cpu, "30s", name=f"batch-{cpu}", service_class="batch") for cpu in "4211"])
    wait_for(lambda: len(c.list(queue="work", state="RUNNING")) == 4, 10, "batch jobs fill the cluster")
    # A capacity report may briefly count an in-flight job twice (free -1, conservatively): wait it out.
    wait_for(lambda: c.clusters()[0]["free"]["cpu"] == "0", 5, "the cluster reports exactly full")
    [critical] = c.submit([job("work", "4", "5s", name="critical", service_class="critical")])
    wait_for(lambda: c.get(critical)["state"] in ("RUNNING", *FINAL), 10, "the critical job runs")
    victims = [b for b in batch if preempted_by(c, b)]
    c.cancel([critical, *batch])
    # Greedy youngest-first would take 1 + 1 + 2 cpu (three jobs); the 4-cpu job alone frees enough.
    assert victims == [batch[0]], f"evicted {victims}; the 4-cpu job {batch[0]} alone frees enough"


# ---------------------------------------------------------------------------------------------
# 4. Reservation and backfill

LARGE = """
---
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: large}
spec: {priority: 500, reservationAfter: 1s}
"""
SMALL_LENGTHS = ("10s", "17s", "23s", "30s", "37s")  # 1 to 3.7 s at TIME_SCALE


def test_big_job_reserves_capacity_and_is_not_starved_by_a_stream_of_small_ones(sluice):
    s = sluice(CLASSES + LARGE + queue("stream") + queue("big") + cluster("c1", 8))
    c = s.client
    stop = threading.Event()
    submitted: list[int] = []

    # 16 small jobs a second against a cluster that runs ~3.5: it never runs dry. Their lengths vary
    # (1 to 3.7 s), so slots free one at a time: without a reservation each would go to the next small job
    # and 6 cpu would never be free at once.
    lengths = itertools.cycle(SMALL_LENGTHS)

    def stream():
        deadline = time.monotonic() + 30
        while not stop.is_set() and time.monotonic() < deadline:
            submitted.extend(c.submit([job("stream", "1", next(lengths), name="small") for _ in range(8)]))
            stop.wait(0.5)

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    try:
        wait_for(lambda: len(c.list(queue="stream", state="RUNNING")) == 8, 10, "small jobs fill the cluster")
        [big] = c.submit([job("big", "6", "40s", name="big", service_class="large")])

        def sample():
            return c.get(big), c.list(queue="stream", state="QUEUED", limit=20), s.sims["c1"].pods()

        with Sampler(sample, 0.01) as sampler:
            started = wait_for(lambda: (j := c.get(big))["startedAt"] and j, 15, "the big job starts")
            # Keep streaming while it runs, long enough for the small jobs left running to end.
            wait_for(lambda: c.get(big)["state"] in FINAL, 10, "the big job ends", 0.05)
        assert streamer.is_alive(), "the stream stopped before the big job started: it proves nothing"
    finally:
        stop.set()
        streamer.join(10)

    jobs = {j["id"]: j for j in c.list(queue="stream")}
    big_job = c.get(big)
    assert big_job["state"] == "SUCCEEDED" and big_job["attempt"] == 1, big_job
    waited = (ts(started["startedAt"]) - ts(started["createdAt"])).total_seconds()
    # Reservation after 1 s, then at most the longest small job (3.7 s) for the room to drain.
    assert waited < 1.0 + 3.7 + 2.0, waited

    big_reasons = [reason(b) for _, (b, _, _) in sampler.samples if b["state"] == "QUEUED"]
    allowed = re.compile(r"submitted|no cluster fits: c1: needs 6 cpu, [0-5] free"
                         r"|reserved capacity on c1 \(waited past 1s\)|reserved capacity on c1: waiting for room")
    assert all(allowed.fullmatch(r) for r in big_reasons), set(big_reasons)
    held = [r for r in big_reasons if r.startswith(("reserved capacity on c1", "holding capacity on c1"))]
    assert held, f"the big job never showed its reservation: {sorted(set(big_reasons))}"
    small_reasons = {j["reason"] for _, (_, queued, _) in sampler.samples for j in queued}
    assert f"reserved capacity for job {big} on c1" in small_reasons, small_reasons
    assert small_reasons <= {"submitted", "no cluster fits: c1: needs 1 cpu, 0 free",
                             f"reserved capacity for job {big} on c1"}, small_reasons
    # Backfill: while the big job ran, small jobs still started, in the 2 cpu it left, and never more.
    big_start, big_end = ts(big_job["startedAt"]), ts(big_job["finishedAt"])
    backfilled = [j for j in jobs.values() if j["startedAt"] and big_start < ts(j["startedAt"]) < big_end]
    assert backfilled, "no small job started while the big job ran"
    # Judged by the cluster's own pods: the dispatcher may hear of the big job's end after the room it freed,
    # and a small job may start there before the dispatcher says the big one ended.
    during = [pods for _, (_, _, pods) in sampler.samples if any(p.job_id == big and p.phase == "Running"
                                                                   for p in pods)]
    assert during and all(sum(p.job_id != big and p.phase == "Running" for p in pods) <= 2 for pods in during)
    assert s.sims["c1"].max_overcommit == {}
    queued = [j["id"] for j in jobs.values() if j["state"] not in FINAL]
    assert queued, "the stream never built a backlog"
    c.cancel(queued)
    print(f"\nreservation: big job waited {waited:.2f}s with {len(submitted)} small jobs streamed; "
          f"its reasons {sorted(set(big_reasons))}; {len(backfilled)} small jobs backfilled while it ran")


def test_reservations_of_a_whole_backlog_do_not_leave_the_cluster_idle(sluice):
    # As test_big_job_reserves_..., but the small jobs share the big job's class (and so its reservationAfter),
    # like `standard` with `reservationAfter: 30m` in docs/api.md: after 1 s of backlog they all reserve too.
    s = sluice(CLASSES + LARGE + queue("stream") + queue("big") + cluster("c1", 8))
    c = s.client
    stop = threading.Event()

    lengths = itertools.cycle(SMALL_LENGTHS)

    def stream():
        deadline = time.monotonic() + 15
        while not stop.is_set() and time.monotonic() < deadline:
            c.submit([job("stream", "1", next(lengths), name="small", service_class="large") for _ in range(8)])
            stop.wait(0.5)

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    try:
        wait_for(lambda: len(c.list(queue="stream", state="RUNNING")) == 8, 10, "small jobs fill the cluster")
        [big] = c.submit([job("big", "6", "10s", name="big", service_class="large")])
        try:
            wait_for(lambda: c.get(big)["startedAt"], 8, "the big job starts")
        except AssertionError:
            pods = s.sims["c1"].pods()
            queued = c.list(queue="stream", state="QUEUED", limit=3)
            raise AssertionError(f"the big job never started; the cluster runs {len(pods)} pods while small jobs "
                                 f"wait with {[j['reason'] for j in queued]} and the big job with "
                                 f"{c.get(big)['reason']!r}") from None
    finally:
        stop.set()
        streamer.join(10)
        c.cancel([j["id"] for j in c.list() if j["state"] not in FINAL])


# ---------------------------------------------------------------------------------------------
# 5. Reclaim of guaranteed quota


def test_queue_within_its_guarantee_reclaims_capacity_from_a_borrower(sluice):
    # Every resource a job asks for must be guaranteed for it to reclaim (memory too: jobs ask 1Gi).
    s = sluice(CLASSES + queue("g", guaranteed={"cpu": "4", "memory": "8Gi"}) + queue("h") + cluster("c1", 8))
    c = s.client
    borrowers = c.submit([job("h", "1", "300s", name="borrow") for _ in range(8)])
    wait_for(lambda: len(c.list(queue="h", state="RUNNING")) == 8, 10, "queue h fills the cluster")

    with Sampler(lambda: (by_id(c, "g"), by_id(c, "h")), 0.02) as sampler:
        [mine] = c.submit([job("g", "4", "50s", name="mine")])
        with Sampler(lambda: c.get(mine), 0) as fast:  # its preemption reason shows for tens of ms
            wait_for(lambda: c.get(mine)["state"] != "QUEUED", 10, "g's job is dispatched")
        wait_for(lambda: c.get(mine)["state"] in ("RUNNING", *FINAL), 10, "g's job runs")
        victims = [b for b in borrowers if preempted_by(c, b)]
        assert len(victims) == 4, victims  # four 1-cpu borrowers free the 4 cpu of g's guarantee
        assert all(preempted_by(c, v) == [mine] for v in victims)
        # At its guarantee (4 of 4), g may not reclaim more: this one just waits. (Cancelled before g's
        # first job ends: alone, g would be below its guarantee again and rightly reclaim.)
        [beyond] = c.submit([job("g", "1", "10s", name="beyond")])
        wait_for(lambda: c.get(beyond)["reason"] == "no cluster fits: c1: needs 1 cpu, 0 free", 5,
                 "the job beyond g's guarantee waits for room")
        assert c.get(mine)["state"] == "RUNNING", "g's first job ended too soon for this check"
        c.cancel([beyond])
        [done] = wait_final(c, [mine], 10)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 1
    assert [b for b in borrowers if preempted_by(c, b)] == victims, "more borrowers were evicted"

    mine_reasons = {reason(j) for _, j in fast.samples if j["state"] == "QUEUED"}
    assert mine_reasons - {"submitted"}, "g's job never showed why it waited"
    assert mine_reasons <= preemptor_reasons(victims), mine_reasons
    victim_reasons = {h[v]["reason"] for _, (_, h) in sampler.samples for v in victims if h[v]["state"] == "QUEUED"}
    assert f"preempted by job {mine}" in victim_reasons, victim_reasons
    # The victims never take g's room back; when it ends they run again as attempt 2.
    wait_for(lambda: all(c.get(v)["attempt"] == 2 and c.get(v)["state"] in ACTIVE for v in victims), 10,
             "the victims run again")
    assert s.sims["c1"].max_overcommit == {}
    c.cancel(borrowers)
    print(f"\nreclaim: g's job {mine} evicted borrowers {victims}; its reasons {sorted(mine_reasons)}; "
          f"victims showed {sorted(victim_reasons)}")


def test_a_job_its_guarantee_holds_whole_takes_a_borrowers_last_job(sluice):
    # h borrows 1 cpu (5 of its 4), with a 1-cpu and a 4-cpu job; 3 cpu are free. g's 5-cpu job stays
    # within g's guarantee of 6: it may take h's 4-cpu job, though h then runs 1 cpu, below its own 4.
    s = sluice(CLASSES + queue("g", guaranteed={"cpu": "6", "memory": "8Gi"})
               + queue("h", guaranteed={"cpu": "4", "memory": "8Gi"}) + cluster("c1", 8))
    c = s.client
    [small] = c.submit([job("h", "1", "300s", name="small")])
    wait_for(lambda: c.get(small)["state"] == "RUNNING", 10, "h's small job runs")
    [large] = c.submit([job("h", "4", "300s", name="large")])
    wait_for(lambda: c.get(large)["state"] == "RUNNING", 10, "h's large job runs")
    [mine] = c.submit([job("g", "5", "30s", name="mine")])
    wait_for(lambda: c.get(mine)["state"] in ("RUNNING", *FINAL), 20, "g's job runs")
    assert preempted_by(c, large) == [mine] and preempted_by(c, small) == []
    # h, now below its guarantee, may not take it back from g, which is within its own.
    wait_for(lambda: c.get(large)["reason"].startswith("no cluster fits"), 10, "h's job waits for room")
    assert c.get(mine)["state"] == "RUNNING" and preempted_by(c, mine) == []
    c.cancel([small, large, mine])


def test_reclaim_evicts_the_small_jobs_on_one_node_together_to_make_room_for_a_bigger_pod(sluice):
    # Two 4-cpu nodes, each running two of h's 2-cpu jobs. g's 4-cpu pod needs a whole node: the agent says
    # on which node each job runs, so the two on one node are evicted together (neither alone holds the pod;
    # before the dispatcher knew the nodes, g waited for h's jobs to end).
    s = sluice(CLASSES + queue("g", guaranteed={"cpu": "4", "memory": "8Gi"}) + queue("h") + cluster("c1", 4, nodes=2))
    c = s.client
    borrowers = c.submit([job("h", "2", "300s", name="borrow") for _ in range(4)])
    wait_for(lambda: len(c.list(queue="h", state="RUNNING")) == 4, 10, "queue h fills both nodes")
    [mine] = c.submit([job("g", "4", "30s", name="mine")])
    wait_for(lambda: c.get(mine)["state"] in ("RUNNING", *FINAL), 15, "g's job runs")
    victims = [b for b in borrowers if preempted_by(c, b)]
    assert len(victims) == 2 and all(preempted_by(c, v) == [mine] for v in victims), victims
    assert s.sims["c1"].max_overcommit == {}
    c.cancel([*borrowers, mine])


def test_a_job_placed_beside_a_held_node_is_kept_off_it_and_the_preemptor_starts(sluice):
    # Three 4-cpu nodes: h's two 2-cpu jobs fill node-0, k's 3-cpu job leaves 1 cpu on node-2, node-1 is free.
    # g's gang of two 4-cpu pods needs two whole nodes: it evicts h's jobs and holds node-1 with node-0. h's 1-cpu
    # job, submitted with it, fits node-2's free cpu; the agent, told to keep it off node-1, does not bind it
    # there first fit, and g starts once h's jobs stop (not when its hold lapses and it evicts again).
    s = sluice(CLASSES + queue("g", guaranteed={"cpu": "8", "memory": "16Gi"}) + queue("h")
               + queue("k", guaranteed={"cpu": "8", "memory": "16Gi"}) + cluster("c1", 4, nodes=3))
    c = s.client
    borrowers = c.submit([job("h", "2", "300s", name="borrow") for _ in range(2)])
    wait_for(lambda: len(c.list(queue="h", state="RUNNING")) == 2, 10, "h fills node-0")
    [placeholder] = c.submit([job("k", "4", "300s", name="placeholder")])
    wait_for(lambda: c.get(placeholder)["state"] == "RUNNING", 10, "k's placeholder takes node-1")
    [stays] = c.submit([job("k", "3", "300s", name="stays")])
    wait_for(lambda: c.get(stays)["state"] == "RUNNING", 10, "k's job takes node-2")
    c.cancel([placeholder])
    wait_for(lambda: c.get(placeholder)["state"] in FINAL, 10, "node-1 is free")
    # ... and the dispatcher has heard so from the cluster: a hold made from an older report counts node-1 as
    # taken and keeps the small job off node-0 only (ADR 0009, consequences).
    wait_for(lambda: {cl["name"]: cl for cl in c.clusters()}["c1"]["free"].get("cpu") == "5", 10,
             "c1 reports node-1's room and node-2's cpu free")
    gang = job("g", "4", "30s", name="gang")
    gang["spec"]["podSets"][0]["count"] = 2
    mine, small = c.submit([gang, job("h", "1", "300s", name="small")])
    try:
        wait_for(lambda: c.get(mine)["state"] in ("RUNNING", *FINAL), 15, "g's gang runs")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; pods {[(p.name, p.node, p.phase) for p in s.sims['c1'].pods()]}; "
                             f"{c.explain(mine)}; {c.get(small)}") from None
    assert sorted(b for b in borrowers if preempted_by(c, b)) == sorted(borrowers)
    nodes = {p.name: p.node for p in s.sims["c1"].pods() if p.node is not None}
    assert sorted(node for name, node in nodes.items() if name.startswith(f"{mine}-")) == ["node-0", "node-1"]
    assert [node for name, node in nodes.items() if name.startswith(f"{small}-")] == ["node-2"]
    assert s.sims["c1"].max_overcommit == {}
    c.cancel([*borrowers, mine, small, stays])
