"""Burst policy: who may spill to a paid cluster (class, policy coverage, cluster selector), when (waiting,
or no unpaid start expected in time), where (the cheapest fit, then the sooner start, then the name;
elastic headroom against the unpaid start), within which budgets (per hour, per day, concurrent
resources, per policy and per queue), what recorded bursts have committed, and how one scheduling
cycle uses all of that (plan_cycle), with invariants over random cycles."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.policy import bursting
from dispatcher.policy.bursting import (
    DEFAULT_EXPECTED_HOURS,
    EPSILON,
    Budget,
    BurstDecision,
    BurstRule,
    BurstRun,
    Running,
    Spend,
    committed,
    unpaid_start,
)
from dispatcher.policy.placing import ClusterState, Place, QueuedJob
from dispatcher.policy.planning import plan_cycle
from dispatcher.policy.plans import Active, Candidate, ClassPolicy, CyclePlan
from dispatcher.policy.quotas import QueueQuota

CPU = 1000  # milli-units per core
GPU = 1000
GI = 2**30 * 1000  # one Gi of memory in milli-units
G = "nvidia.com/gpu"
NOW = 1_000_000.0
HOUR = 3600.0

CLASSES = {
    "critical": ClassPolicy("critical", priority=100, can_preempt=True, burst_allowed=True),
    "standard": ClassPolicy("standard", priority=50, burst_allowed=True),
    "patient": ClassPolicy("patient", priority=50, burst_allowed=True, burst_after_s=1800),
    "premium": ClassPolicy("premium", priority=50, burst_allowed=True, price_multiplier=2.0),
    "batch": ClassPolicy("batch", priority=10, preemptible=True),
}


def res(**amounts: int) -> dict[str, int]:
    """Resources in milli-units; gpu= is nvidia.com/gpu."""
    return {(G if k == "gpu" else k): v for k, v in amounts.items()}


def job(job_id: int = 1, runtime: float | None = None, selector: dict | None = None, tiers: tuple = (),
        sites: tuple = (), avoid: tuple = (), pods: int = 1, **per_pod: int) -> QueuedJob:
    """A job of `pods` identical pods, each asking for `per_pod` milli-units; runtime is its maxRuntime (s)."""
    pod = res(**per_pod)
    return QueuedJob(job_id, {r: v * pods for r, v in pod.items()}, pod, dict(selector or {}), tuple(tiers),
                     tuple(sites), runtime, tuple(avoid))


def cluster(name: str, active=(), *, tier: str = "onprem", site: str = "dc1", labels: dict | None = None,
            unavailable: str = "", paid: bool = False, price: dict | None = None, headroom: dict | None = None,
            node: dict | None = None, delay: float = 0.0, **allocatable: int) -> ClusterState:
    """A cluster of `allocatable`, less what `active` runs on it; its largest node holds all that is free."""
    alloc = res(**allocatable)
    free = dict(alloc)
    for a in active:
        if a.cluster == name:
            for r, v in a.requests.items():
                free[r] = free.get(r, 0) - v
    return ClusterState(name, tier, site, dict(labels or {}), free, dict(free), unavailable, alloc, paid,
                        dict(price or {}), dict(headroom or {}), dict(node or {}), delay)


def cloud(name: str, per_core: float = 0.10, *, site: str = "eu-west", labels: dict | None = None,
          unavailable: str = "", **allocatable: int) -> ClusterState:
    """A paid cloud cluster pricing only cpu, per core-hour."""
    return cluster(name, tier="cloud", site=site, labels=labels, unavailable=unavailable, paid=True,
                   price={"cpu": per_core}, **allocatable)


def elastic(name: str, per_core: float = 0.10, *, max_cores: int = 64, node_cores: int = 16,
            delay: float = 600.0) -> ClusterState:
    """A paid cloud cluster at zero nodes that may grow to `max_cores` after `delay` seconds."""
    return cluster(name, tier="cloud", site="eu-west", paid=True, price={"cpu": per_core},
                   headroom=res(cpu=max_cores * CPU), node=res(cpu=node_cores * CPU), delay=delay)


def rule(name: str = "p", queues: tuple = (), classes: tuple = (), selector: dict | None = None, after: float = 0.0,
         budget: Budget | None = None, queue_budget: Budget | None = None) -> BurstRule:
    return BurstRule(name, tuple(queues), tuple(classes), dict(selector or {}), after, budget or Budget(),
                     queue_budget or Budget())


def consider(j: QueuedJob, clusters, rules, *, queue: str = "a", path: list[str] | None = None,
             cls: str = "standard", allowed: bool = True, class_after: float | None = None,
             multiplier: float = 1.0, waited: float = 0.0, eta: float | None = None, spend: dict | None = None):
    return bursting.consider(j, queue, path or [queue], cls, allowed=allowed, class_after_s=class_after,
                             multiplier=multiplier, waited_s=waited, unpaid_eta_s=eta, clusters=list(clusters),
                             rules=list(rules), spend=dict(spend or {}))


def chosen(decision) -> str:
    assert isinstance(decision, BurstDecision), decision
    return decision.cluster


# -- who may burst ------------------------------------------------------------------------------------

def test_nothing_to_say_when_no_paid_cluster_matches_the_placement():
    four = job(cpu=4 * CPU, tiers=("onprem",))
    assert consider(four, [cluster("onprem", cpu=8 * CPU), cloud("c", cpu=32 * CPU)], [rule()]) is None
    assert consider(job(cpu=4 * CPU), [cluster("onprem", cpu=8 * CPU)], [rule()]) is None
    assert consider(job(cpu=4 * CPU, sites=("dc1",)), [cloud("c", cpu=32 * CPU)], [rule()]) is None


def test_a_class_that_may_not_burst_is_told_so_by_name():
    reason = consider(job(cpu=4 * CPU), [cloud("c", cpu=32 * CPU)], [rule()], cls="batch", allowed=False,
                      waited=HOUR)
    assert reason == "class batch may not burst to paid clusters"


@pytest.mark.parametrize("policy", [rule(queues=("other",)), rule(classes=("gold",)),
                                    rule(queues=("a",), classes=("gold",))])
def test_without_a_policy_covering_queue_and_class_the_reason_says_so(policy):
    reason = consider(job(cpu=4 * CPU), [cloud("c", cpu=32 * CPU)], [policy], waited=HOUR)
    assert reason == "no burst policy covers queue a and class standard"


def test_without_any_policy_nothing_bursts():
    assert consider(job(cpu=4 * CPU), [cloud("c", cpu=32 * CPU)], [], waited=HOUR) == \
        "no burst policy covers queue a and class standard"


def test_a_policy_with_no_queues_and_no_classes_covers_every_queue_and_class():
    for queue, cls in (("a", "standard"), ("x/y", "gold")):
        d = consider(job(cpu=4 * CPU), [cloud("c", cpu=32 * CPU)], [rule()], queue=queue, cls=cls, waited=HOUR)
        assert chosen(d) == "c" and d.queue == queue


def test_a_policy_on_an_ancestor_queue_covers_its_descendants_but_not_the_other_way():
    clouds = [cloud("c", cpu=32 * CPU)]
    on_research = [rule(queues=("research",))]
    d = consider(job(cpu=4 * CPU), clouds, on_research, queue="vision", path=["vision", "research"], waited=HOUR)
    assert chosen(d) == "c" and d.policy == "p" and d.queue == "vision"
    on_vision = [rule(queues=("vision",))]
    assert consider(job(cpu=4 * CPU), clouds, on_vision, queue="research", path=["research"], waited=HOUR) == \
        "no burst policy covers queue research and class standard"
    # Queue names are compared whole: "research" does not cover "research-old".
    assert consider(job(cpu=4 * CPU), clouds, on_research, queue="research-old", waited=HOUR) == \
        "no burst policy covers queue research-old and class standard"


def test_the_service_classes_filter_names_the_classes_covered():
    clouds = [cloud("c", cpu=32 * CPU)]
    policy = [rule(classes=("standard", "premium"))]
    assert chosen(consider(job(cpu=4 * CPU), clouds, policy, cls="premium", waited=HOUR)) == "c"
    assert consider(job(cpu=4 * CPU), clouds, policy, cls="gold", waited=HOUR) == \
        "no burst policy covers queue a and class gold"


def test_the_cluster_selector_matches_labels():
    clouds = [cloud("a100s", 0.50, labels={"gpu": "a100"}, cpu=32 * CPU),
              cloud("cheap", 0.01, labels={"gpu": "t4"}, cpu=32 * CPU)]
    d = consider(job(cpu=4 * CPU), clouds, [rule(selector={"gpu": "a100"})], waited=HOUR)
    assert chosen(d) == "a100s"
    assert [c for c, _ in d.alternatives] == ["a100s"]


@pytest.mark.parametrize("selector, expected", [({"tier": "cloud"}, "cheap"), ({"site": "us-east"}, "dear"),
                                                ({"name": "dear"}, "dear"), ({"tier": "edge"}, "paid-edge"),
                                                ({"site": "us-east", "tier": "cloud"}, "dear")])
def test_the_cluster_selector_matches_tier_site_and_name_as_if_they_were_labels(selector, expected):
    clusters = [cloud("cheap", 0.01, site="eu-west", cpu=32 * CPU), cloud("dear", 0.50, site="us-east", cpu=32 * CPU),
                cluster("paid-edge", tier="edge", site="shop", paid=True, price={"cpu": 1.0}, cpu=32 * CPU)]
    assert chosen(consider(job(cpu=4 * CPU), clusters, [rule(selector=selector)], waited=HOUR)) == expected


def test_a_policy_selecting_no_cluster_the_job_may_use_says_so():
    clouds = [cloud("c", site="eu-west", cpu=32 * CPU), cloud("d", site="us-east", cpu=32 * CPU)]
    # The policy selects "d", but the job is pinned to eu-west.
    reason = consider(job(cpu=4 * CPU, sites=("eu-west",)), clouds, [rule(selector={"name": "d"})], waited=HOUR)
    assert reason == "burst policy p selects no cluster the job may use"


# -- trigger: waiting ---------------------------------------------------------------------------------

@pytest.mark.parametrize("policy_after, class_after, threshold", [
    (600.0, None, 600.0),  # the policy's
    (600.0, 1800.0, 1800.0),  # the class's, when longer
    (1800.0, 600.0, 1800.0),  # the policy's, when longer
    (0.0, None, 0.0),
])
def test_a_job_bursts_only_once_it_has_waited_the_longer_of_policy_and_class_after(policy_after, class_after,
                                                                                   threshold):
    clouds = [cloud("c", cpu=32 * CPU)]
    policy = [rule(after=policy_after)]
    if threshold:
        before = consider(job(cpu=4 * CPU), clouds, policy, class_after=class_after, waited=threshold - 1)
        assert isinstance(before, str) and before.startswith("may burst after waiting ")
    for waited in (threshold, threshold + 1, 10 * HOUR):
        d = consider(job(cpu=4 * CPU), clouds, policy, class_after=class_after, waited=waited)
        assert chosen(d) == "c", waited


def test_before_its_time_the_reason_says_how_long_it_must_wait_and_how_long_it_has():
    clouds = [cloud("c", cpu=32 * CPU)]
    assert consider(job(cpu=4 * CPU), clouds, [rule(after=600)], class_after=1200, waited=300) == \
        "may burst after waiting 20m (waited 5m)"
    assert consider(job(cpu=4 * CPU), clouds, [rule(after=90)], waited=45) == \
        "may burst after waiting 90s (waited 45s)"


def test_the_waiting_trigger_is_named_in_the_decision():
    d = consider(job(cpu=4 * CPU), [cloud("c", cpu=32 * CPU)], [rule(after=600)], waited=900)
    assert d.trigger == "waited 15m (policy p bursts after 10m)"


# -- trigger: no unpaid start expected in time --------------------------------------------------------

def test_no_unpaid_start_expected_within_the_wait_triggers_at_once():
    d = consider(job(cpu=4 * CPU), [cloud("c", cpu=32 * CPU)], [rule(after=600)], waited=0, eta=1800)
    assert chosen(d) == "c"
    assert d.trigger == "no on-prem start expected within 10m (expected in 30m)"


@pytest.mark.parametrize("eta", [600.0, 300.0, 0.0, None])
def test_an_unpaid_start_expected_within_the_wait_or_unknown_does_not_trigger(eta):
    reason = consider(job(cpu=4 * CPU), [cloud("c", cpu=32 * CPU)], [rule(after=600)], waited=60, eta=eta)
    assert reason == "may burst after waiting 10m (waited 1m)"


def test_the_early_trigger_counts_the_class_after_too():
    clouds = [cloud("c", cpu=32 * CPU)]
    assert isinstance(consider(job(cpu=4 * CPU), clouds, [rule(after=600)], class_after=3600, eta=1800), str)
    assert chosen(consider(job(cpu=4 * CPU), clouds, [rule(after=600)], class_after=3600, eta=3601)) == "c"


def test_a_job_no_unpaid_cluster_could_ever_hold_bursts_at_once():
    d = consider(job(cpu=4 * CPU), [cloud("c", cpu=32 * CPU)], [rule(after=10 * HOUR)], waited=0, eta=math.inf)
    assert chosen(d) == "c"
    assert d.trigger == "no unpaid cluster could ever run it"


# -- unpaid_start --------------------------------------------------------------------------------------

def busy(name: str, cores: int) -> ClusterState:
    """An unpaid cluster of `cores` with nothing free."""
    return ClusterState(name, "onprem", "dc1", {}, {}, {}, allocatable=res(cpu=cores * CPU))


def test_unpaid_start_is_zero_when_the_job_fits_an_unpaid_cluster_now():
    assert unpaid_start(job(cpu=4 * CPU), [busy("full", 8), cluster("o", cpu=8 * CPU)], {}, NOW) == 0.0


def test_unpaid_start_is_when_enough_running_jobs_with_known_ends_have_ended():
    ends = {"o": [Running(res(cpu=8 * CPU), NOW + 1800), Running(res(cpu=8 * CPU), NOW + 600)]}  # not in order
    assert unpaid_start(job(cpu=8 * CPU), [busy("o", 16)], ends, NOW) == 600.0
    assert unpaid_start(job(cpu=12 * CPU), [busy("o", 16)], ends, NOW) == 1800.0
    assert unpaid_start(job(cpu=16 * CPU), [busy("o", 16)], ends, NOW) == 1800.0


def test_unpaid_start_is_the_soonest_over_the_unpaid_clusters():
    ends = {"o1": [Running(res(cpu=8 * CPU), NOW + 3000)], "o2": [Running(res(cpu=8 * CPU), NOW + 900)]}
    assert unpaid_start(job(cpu=4 * CPU), [busy("o1", 8), busy("o2", 8)], ends, NOW) == 900.0


def test_an_end_already_past_counts_as_now():
    assert unpaid_start(job(cpu=4 * CPU), [busy("o", 8)], {"o": [Running(res(cpu=8 * CPU), NOW - 60)]}, NOW) == 0.0


def test_unpaid_start_is_unknown_when_it_depends_on_jobs_without_a_known_end():
    ends = {"o": [Running(res(cpu=8 * CPU), None), Running(res(cpu=8 * CPU), NOW + 600)]}
    # The known end frees enough for 8 cores; 12 need the job whose end is unknown.
    assert unpaid_start(job(cpu=8 * CPU), [busy("o", 16)], ends, NOW) == 600.0
    assert unpaid_start(job(cpu=12 * CPU), [busy("o", 16)], ends, NOW) is None
    assert unpaid_start(job(cpu=4 * CPU), [busy("o", 16)], {"o": [Running(res(cpu=16 * CPU), None)]}, NOW) is None
    assert unpaid_start(job(cpu=4 * CPU), [busy("o", 16)], {}, NOW) is None  # full, and nothing known runs there


def test_a_known_start_on_one_cluster_is_not_trusted_when_another_could_free_up_any_time():
    ends = {"o1": [Running(res(cpu=8 * CPU), None)], "o2": [Running(res(cpu=8 * CPU), NOW + 7200)]}
    assert unpaid_start(job(cpu=4 * CPU), [busy("o1", 8), busy("o2", 8)], ends, NOW) is None


def test_unpaid_start_is_infinite_when_no_unpaid_cluster_could_ever_hold_the_job():
    big_paid = cloud("c", cpu=64 * CPU)
    ends = {"o": [Running(res(cpu=8 * CPU), NOW + 60)]}
    assert unpaid_start(job(cpu=16 * CPU), [busy("o", 8), big_paid], ends, NOW) == math.inf
    assert unpaid_start(job(cpu=4 * CPU), [big_paid], {}, NOW) == math.inf  # paid clusters never count
    assert unpaid_start(job(cpu=4 * CPU, tiers=("cloud",)), [busy("o", 8)], ends, NOW) == math.inf  # placement
    assert unpaid_start(job(gpu=GPU), [busy("o", 8)], ends, NOW) == math.inf  # a resource it has none of


# -- choice --------------------------------------------------------------------------------------------

def test_the_cheapest_paid_cluster_wins_and_the_cost_is_price_times_request_times_hours():
    clouds = [cloud("cloud-a", 0.10, cpu=32 * CPU), cloud("cloud-b", 0.08, cpu=32 * CPU)]
    d = consider(job(cpu=4 * CPU, runtime=2 * HOUR), clouds, [rule()], waited=HOUR)
    assert chosen(d) == "cloud-b"
    assert d.rate_per_hour == pytest.approx(0.32)
    assert d.expected_hours == 2.0
    assert d.expected_cost == pytest.approx(0.64)
    assert d.starts_in_s == 0.0
    assert d.requests == res(cpu=4 * CPU)
    assert d.alternatives == (("cloud-a", "fits, expected cost 0.80"), ("cloud-b", "fits, expected cost 0.64"))


def test_without_a_max_runtime_a_job_is_expected_to_run_the_default_hours():
    d = consider(job(cpu=4 * CPU), [cloud("c", 0.10, cpu=32 * CPU)], [rule()], waited=HOUR)
    assert d.expected_hours == DEFAULT_EXPECTED_HOURS
    assert d.expected_cost == pytest.approx(0.4 * DEFAULT_EXPECTED_HOURS)


def test_the_cost_counts_every_priced_resource_and_the_class_multiplier():
    gpus = cluster("gpus", tier="cloud", paid=True, price={"cpu": 0.5, "memory": 0.01, G: 2.0},
                   cpu=64 * CPU, memory=256 * GI, gpu=8 * GPU)
    j = job(cpu=4 * CPU, memory=8 * GI, gpu=GPU, runtime=1800)
    d = consider(j, [gpus], [rule()], waited=HOUR, multiplier=1.5)
    assert d.rate_per_hour == pytest.approx((4 * 0.5 + 8 * 0.01 + 2.0) * 1.5)
    assert d.expected_cost == pytest.approx((4 * 0.5 + 8 * 0.01 + 2.0) * 1.5 * 0.5)


def test_the_class_multiplier_scales_the_cost_but_not_the_choice():
    clouds = [cloud("cloud-a", 0.10, cpu=32 * CPU), cloud("cloud-b", 0.08, cpu=32 * CPU)]
    d = consider(job(cpu=4 * CPU), clouds, [rule()], waited=HOUR, multiplier=2.0)
    assert chosen(d) == "cloud-b" and d.expected_cost == pytest.approx(0.64)


def test_a_cheaper_cluster_the_job_does_not_fit_loses_to_a_dearer_one_it_fits():
    clouds = [cloud("cheap", 0.01, cpu=2 * CPU), cloud("dear", 0.50, cpu=32 * CPU),
              cloud("down", 0.001, unavailable="unreachable", cpu=64 * CPU)]
    d = consider(job(cpu=4 * CPU), clouds, [rule()], waited=HOUR)
    assert chosen(d) == "dear"
    assert dict(d.alternatives) == {"cheap": "needs 4 cpu, 2 free", "dear": "fits, expected cost 2.00",
                                    "down": "unreachable"}


def test_on_equal_cost_the_sooner_start_wins_then_the_name():
    # "a-grows" sorts first but must provision; "b-now" starts at once.
    d = consider(job(cpu=4 * CPU), [elastic("a-grows", 0.10), cloud("b-now", 0.10, cpu=32 * CPU)], [rule()],
                 waited=HOUR)
    assert chosen(d) == "b-now"
    d = consider(job(cpu=4 * CPU), [cloud("zz", 0.10, cpu=32 * CPU), cloud("aa", 0.10, cpu=32 * CPU)], [rule()],
                 waited=HOUR)
    assert chosen(d) == "aa"


def test_cost_comes_before_the_start():
    d = consider(job(cpu=4 * CPU), [elastic("grows", 0.05), cloud("now", 0.10, cpu=32 * CPU)], [rule()],
                 waited=HOUR)
    assert chosen(d) == "grows"
    assert d.starts_in_s == 600.0
    assert dict(d.alternatives)["grows"] == "fits, expected cost 0.20, starts in 10m"


def test_an_elastic_cluster_is_not_chosen_when_unpaid_room_is_expected_before_it_could_start():
    clusters = [elastic("grows", 0.05, delay=600), cloud("now", 0.10, cpu=32 * CPU)]
    d = consider(job(cpu=4 * CPU), clusters, [rule()], waited=HOUR, eta=300)
    assert chosen(d) == "now"
    assert dict(d.alternatives)["grows"] == \
        "would start in 10m (provisioning), no sooner than on-prem (expected in 5m)"
    # Exactly as soon is no sooner.
    assert chosen(consider(job(cpu=4 * CPU), clusters, [rule()], waited=HOUR, eta=600)) == "now"
    # Later than the provisioning, or not known at all, or never: the cheaper elastic one wins.
    for eta in (601.0, None, math.inf):
        assert chosen(consider(job(cpu=4 * CPU), clusters, [rule()], waited=HOUR, eta=eta)) == "grows", eta


def test_with_only_an_elastic_cluster_too_slow_the_refusal_says_why():
    reason = consider(job(cpu=4 * CPU), [elastic("grows", delay=600)], [rule()], waited=HOUR, eta=120)
    assert reason == "burst refused: grows: would start in 10m (provisioning), no sooner than on-prem " \
                     "(expected in 2m)"


def test_every_alternative_is_kept_with_its_verdict():
    clouds = [cloud("a", 0.10, cpu=32 * CPU), cloud("b", 0.20, cpu=2 * CPU), elastic("c", 0.30),
              cloud("d", 0.05, unavailable="cordoned", cpu=32 * CPU)]
    d = consider(job(cpu=4 * CPU), clouds, [rule()], waited=HOUR)
    assert chosen(d) == "a"
    assert d.alternatives == (("a", "fits, expected cost 0.40"), ("b", "needs 4 cpu, 2 free"),
                              ("c", "fits, expected cost 1.20, starts in 10m"), ("d", "cordoned"))


def test_the_cheapest_over_several_covering_policies_wins_and_names_its_policy():
    clouds = [cloud("cheap", 0.05, labels={"pool": "spot"}, cpu=32 * CPU),
              cloud("dear", 0.10, labels={"pool": "ondemand"}, cpu=32 * CPU)]
    rules = [rule("ondemand", selector={"pool": "ondemand"}), rule("spot", selector={"pool": "spot"})]
    d = consider(job(cpu=4 * CPU), clouds, rules, waited=HOUR)
    assert (d.policy, d.cluster) == ("spot", "cheap")
    assert d.alternatives == (("cheap", "fits, expected cost 0.20"),)


def test_a_policy_not_yet_triggered_leaves_the_choice_to_one_that_is():
    clouds = [cloud("cheap", 0.05, labels={"pool": "spot"}, cpu=32 * CPU),
              cloud("dear", 0.10, labels={"pool": "ondemand"}, cpu=32 * CPU)]
    rules = [rule("ondemand", selector={"pool": "ondemand"}, after=600),
             rule("spot", selector={"pool": "spot"}, after=3600)]
    d = consider(job(cpu=4 * CPU), clouds, rules, waited=900)
    assert (d.policy, d.cluster) == ("ondemand", "dear")
    assert consider(job(cpu=4 * CPU), clouds, rules, waited=300) == \
        "may burst after waiting 10m (waited 5m); may burst after waiting 1h (waited 5m)"


def test_the_decision_is_recorded_with_trigger_alternatives_and_cost():
    d = consider(job(cpu=4 * CPU, runtime=2 * HOUR), [cloud("cloud-b", 0.08, cpu=32 * CPU)], [rule(after=600)],
                 waited=900)
    rec = d.record()
    assert rec == {"policy": "p", "queue": "a", "cluster": "cloud-b",
                   "trigger": "waited 15m (policy p bursts after 10m)", "ratePerHour": d.rate_per_hour,
                   "expectedHours": 2.0, "expectedCost": d.expected_cost, "startsInSeconds": 0.0,
                   "alternatives": [{"cluster": "cloud-b", "verdict": "fits, expected cost 0.64"}],
                   "requests": {"cpu": 4 * CPU}, "summary": d.summary()}
    assert d.summary() == "burst to cloud-b under policy p: waited 15m (policy p bursts after 10m); " \
                          "expected cost 0.64 (0.32/h)"


# -- budgets -------------------------------------------------------------------------------------------

FOUR = job(cpu=4 * CPU)  # 4 cores for the default hour: 2.50 at 0.625 per core-hour
PRICEY = cloud("c", 0.625, cpu=64 * CPU)


def test_the_hourly_budget_counts_the_running_rate_and_this_jobs():
    policy = [rule(budget=Budget(per_hour=5.0))]
    assert chosen(consider(FOUR, [PRICEY], policy, waited=HOUR, spend={("p", None): Spend(rate=2.5)})) == "c"
    reason = consider(FOUR, [PRICEY], policy, waited=HOUR, spend={("p", None): Spend(rate=2.51)})
    assert reason == "burst refused: c: would break policy p's budget per hour (2.51/h running + 2.50/h > 5.00/h)"


def test_the_daily_budget_admits_exactly_the_cap_and_refuses_a_cent_over():
    policy = [rule(budget=Budget(per_day=10.0))]
    assert chosen(consider(FOUR, [PRICEY], policy, waited=HOUR, spend={("p", None): Spend(today=7.5)})) == "c"
    reason = consider(FOUR, [PRICEY], policy, waited=HOUR, spend={("p", None): Spend(today=7.51)})
    assert reason == "burst refused: c: would break policy p's budget per day (7.51 spent today + 2.50 > 10.00)"


def test_money_is_compared_with_a_tolerance_so_sums_that_round_do_not_refuse():
    # 0.1 + 0.1 + 0.1 is 0.30000000000000004 in floating point.
    tenth = cloud("c", 0.1, cpu=64 * CPU)
    today = 0.1 + 0.1
    assert today + 0.1 > 0.3
    policy = [rule(budget=Budget(per_day=0.3, per_hour=0.3))]
    spend = {("p", None): Spend(rate=today, today=today)}
    assert chosen(consider(job(cpu=CPU), [tenth], policy, waited=HOUR, spend=spend)) == "c"
    over = {("p", None): Spend(rate=today, today=today + 100 * EPSILON)}
    assert isinstance(consider(job(cpu=CPU), [tenth], policy, waited=HOUR, spend=over), str)


def test_the_resource_budget_caps_what_bursts_hold_at_once():
    policy = [rule(budget=Budget(max_resources=res(cpu=10 * CPU, memory=32 * GI, gpu=0)))]
    spend = {("p", None): Spend(resources=res(cpu=6 * CPU, memory=30 * GI, gpu=0))}
    # A resource the job asks none of is never a reason, even at its cap.
    assert chosen(consider(FOUR, [PRICEY], policy, waited=HOUR, spend=spend)) == "c"
    spend = {("p", None): Spend(resources=res(cpu=8 * CPU))}
    assert consider(FOUR, [PRICEY], policy, waited=HOUR, spend=spend) == \
        "burst refused: c: would break policy p's maxResources cpu (8 in use + 4 > 10)"
    big = cluster("big", tier="cloud", paid=True, price={"cpu": 0.1}, cpu=64 * CPU, memory=512 * GI)
    spend = {("p", None): Spend(resources=res(memory=30 * GI))}
    assert consider(job(cpu=CPU, memory=4 * GI), [big], policy, waited=HOUR, spend=spend) == \
        "burst refused: big: would break policy p's maxResources memory (30Gi in use + 4Gi > 32Gi)"


def test_the_per_queue_budget_holds_for_each_queue_under_the_policy():
    policy = [rule(budget=Budget(per_day=100.0), queue_budget=Budget(per_day=5.0))]
    spend = {("p", None): Spend(today=3.0), ("p", "a"): Spend(today=3.0)}
    assert consider(FOUR, [PRICEY], policy, queue="a", waited=HOUR, spend=spend) == \
        "burst refused: c: would break policy p's queue a budget per day (3.00 spent today + 2.50 > 5.00)"
    assert chosen(consider(FOUR, [PRICEY], policy, queue="b", waited=HOUR, spend=spend)) == "c"


def test_the_policys_budget_and_the_queues_each_refuse_and_say_whose():
    policy = [rule(budget=Budget(per_hour=1.0), queue_budget=Budget(per_hour=1.0))]
    assert consider(FOUR, [PRICEY], policy, waited=HOUR) == \
        "burst refused: c: would break policy p's budget per hour (0.00/h running + 2.50/h > 1.00/h)"
    policy = [rule(queue_budget=Budget(max_resources=res(cpu=2 * CPU)))]
    assert consider(FOUR, [PRICEY], policy, waited=HOUR) == \
        "burst refused: c: would break policy p's queue a maxResources cpu (0 in use + 4 > 2)"


def test_a_budget_refusal_quotes_every_cluster():
    clouds = [cloud("x", 0.5, cpu=64 * CPU), cloud("y", 1.0, cpu=64 * CPU)]
    reason = consider(FOUR, clouds, [rule(budget=Budget(per_day=1.0))], waited=HOUR)
    assert reason == ("burst refused: x: would break policy p's budget per day (0.00 spent today + 2.00 > 1.00); "
                      "y: would break policy p's budget per day (0.00 spent today + 4.00 > 1.00)")


# -- committed ----------------------------------------------------------------------------------------

DAY = NOW - 10 * HOUR  # the current UTC day began ten hours ago


def run_(policy="p", queue="a", rate=2.0, expected=4.0, requests=None, active=False, dispatched=DAY + HOUR,
         started=None, finished=None) -> BurstRun:
    return BurstRun(policy, queue, rate, expected, dict(requests if requests is not None else res(cpu=4 * CPU)),
                    active, dispatched, started, finished)


def test_nothing_recorded_commits_nothing():
    assert committed([], DAY, NOW) == {}


def test_a_finished_burst_counts_at_its_actual_cost_and_holds_nothing():
    run = run_(started=NOW - 3 * HOUR, finished=NOW - 1.5 * HOUR)  # ran 1.5h at 2.00/h
    spend = committed([run], DAY, NOW)
    assert spend[("p", None)] == spend[("p", "a")]
    s = spend[("p", None)]
    assert s.today == pytest.approx(3.0) and s.rate == 0.0 and s.resources == {}


def test_a_finished_burst_that_never_started_cost_nothing():
    s = committed([run_(finished=NOW - HOUR)], DAY, NOW)[("p", None)]
    assert s.today == 0.0 and s.rate == 0.0


@pytest.mark.parametrize("started, today", [(None, 4.0), (NOW - HOUR, 4.0), (NOW - 3 * HOUR, 6.0)])
def test_an_active_burst_counts_its_rate_its_resources_and_no_less_than_its_expected_cost(started, today):
    s = committed([run_(active=True, started=started)], DAY, NOW)[("p", None)]
    assert s.today == pytest.approx(today)
    assert s.rate == 2.0
    assert s.resources == res(cpu=4 * CPU)


def test_a_burst_dispatched_before_the_day_began_counts_for_rate_and_resources_only_while_active():
    yesterday = DAY - HOUR
    active = run_(active=True, dispatched=yesterday, started=yesterday)
    done = run_(dispatched=yesterday - HOUR, started=yesterday - HOUR, finished=DAY + HOUR)
    s = committed([active, done], DAY, NOW)[("p", None)]
    assert s.today == 0.0
    assert s.rate == 2.0
    assert s.resources == res(cpu=4 * CPU)
    # One dispatched the instant the day began is today's.
    s = committed([run_(dispatched=DAY, started=DAY, finished=DAY + HOUR)], DAY, NOW)[("p", None)]
    assert s.today == pytest.approx(2.0)


def test_spend_is_kept_per_policy_and_per_policy_and_queue():
    runs = [run_("p", "a", rate=1.0, expected=1.0, active=True, requests=res(cpu=CPU)),
            run_("p", "b", rate=2.0, expected=2.0, active=True, requests=res(cpu=2 * CPU)),
            run_("p", "a", rate=4.0, expected=4.0, started=NOW - 2 * HOUR, finished=NOW - HOUR),
            run_("q", "a", rate=8.0, expected=8.0, active=True, requests=res(gpu=GPU))]
    spend = committed(runs, DAY, NOW)
    assert set(spend) == {("p", None), ("p", "a"), ("p", "b"), ("q", None), ("q", "a")}
    assert spend[("p", None)] == Spend(3.0, 7.0, res(cpu=3 * CPU))
    assert spend[("p", "a")] == Spend(1.0, 5.0, res(cpu=CPU))
    assert spend[("p", "b")] == Spend(2.0, 2.0, res(cpu=2 * CPU))
    assert spend[("q", None)] == spend[("q", "a")] == Spend(8.0, 8.0, res(gpu=GPU))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.builds(
    run_, policy=st.sampled_from(["p", "q"]), queue=st.sampled_from(["a", "b", "c"]),
    rate=st.floats(0, 10), expected=st.floats(0, 50), requests=st.fixed_dictionaries({"cpu": st.integers(0, 8000)}),
    active=st.booleans(), dispatched=st.floats(DAY - 5 * HOUR, NOW),
    started=st.one_of(st.none(), st.floats(DAY - 5 * HOUR, NOW)),
    finished=st.one_of(st.none(), st.just(NOW))), max_size=12))
def test_a_policys_spend_is_the_sum_of_its_queues(runs):
    spend = committed(runs, DAY, NOW)
    for policy in {r.policy for r in runs}:
        queues = [s for (p, q), s in spend.items() if p == policy and q is not None]
        total = spend[(policy, None)]
        assert total.rate == pytest.approx(sum(s.rate for s in queues))
        assert total.today == pytest.approx(sum(s.today for s in queues))
        assert total.resources.get("cpu", 0) == sum(s.resources.get("cpu", 0) for s in queues)
        assert total.rate == pytest.approx(sum(r.rate for r in runs if r.policy == policy and r.active))


# -- one scheduling cycle ------------------------------------------------------------------------------

def head(job_id: int, queue: str = "a", cls: str = "standard", waited: float = 0.0, runtime: float | None = None,
         **per_pod: int) -> Candidate:
    return Candidate(job(job_id, runtime, **per_pod), queue, cls, CLASSES[cls].priority, 0, waited)


def running(job_id: int, cluster_name: str = "onprem", cls: str = "standard", queue: str = "busy",
            ends_at: float | None = None, **requests: int) -> Active:
    return Active(job_id, queue, cls, CLASSES[cls].priority, 0, cluster_name, res(**requests),
                  CLASSES[cls].preemptible, ends_at)


def cycle(candidates, active=(), clusters=(), rules=(), spend=None, queues=None) -> CyclePlan:
    candidates = list(candidates)
    heads: dict[str, list[Candidate]] = {}
    for c in sorted(candidates, key=lambda c: (-c.class_priority, -c.priority, c.job.id)):
        heads.setdefault(c.queue, []).append(c)
    if queues is None:
        queues = [QueueQuota(n) for n in sorted({c.queue for c in candidates} | {a.queue for a in active})]
    return plan_cycle(heads, list(active), list(clusters), list(queues), CLASSES, {}, NOW, list(rules), spend)


def full_onprem(cores: int = 16, cls: str = "standard", ends_at: float | None = None):
    """An on-prem cluster of `cores`, filled by one running job."""
    act = [running(900, cls=cls, ends_at=ends_at, cpu=cores * CPU)]
    return act, cluster("onprem", act, cpu=cores * CPU)


def test_with_onprem_full_a_job_past_its_wait_bursts_to_the_cheaper_cloud():
    act, onprem = full_onprem()
    clouds = [cloud("cloud-a", 0.10, cpu=32 * CPU), cloud("cloud-b", 0.08, cpu=32 * CPU)]
    plan = cycle([head(1, waited=900, cpu=8 * CPU)], act, [onprem] + clouds, [rule(after=600)])
    assert plan.places == [Place(1, "cloud-b")]
    assert plan.waits == {}
    d = plan.bursts[1]
    assert d.cluster == "cloud-b" and d.policy == "p" and d.queue == "a"
    assert d.trigger == "waited 15m (policy p bursts after 10m)"
    assert d.expected_cost == pytest.approx(0.64)


def test_before_its_wait_a_job_stays_queued_and_says_when_it_may_burst():
    act, onprem = full_onprem()
    plan = cycle([head(1, waited=300, cpu=8 * CPU)], act, [onprem, cloud("c", cpu=32 * CPU)], [rule(after=600)])
    assert plan.places == [] and plan.bursts == {}
    assert plan.waits == {1: "no cluster fits: onprem: needs 8 cpu, 0 free; may burst after waiting 10m (waited 5m)"}


def test_free_unpaid_capacity_is_used_before_money():
    plan = cycle([head(1, waited=HOUR, cpu=8 * CPU)], (), [cluster("onprem", cpu=16 * CPU),
                                                            cloud("c", 0.0001, cpu=32 * CPU)], [rule()])
    assert plan.places == [Place(1, "onprem")] and plan.bursts == {}


def test_without_a_policy_a_paid_cluster_is_never_used():
    act, onprem = full_onprem()
    plan = cycle([head(1, waited=HOUR, cpu=8 * CPU)], act, [onprem, cloud("c", cpu=32 * CPU)])
    assert plan.places == []
    assert plan.waits == {1: "no cluster fits: onprem: needs 8 cpu, 0 free; "
                             "no burst policy covers queue a and class standard"}


def test_a_job_whose_onprem_room_is_not_expected_in_time_bursts_at_once():
    act, onprem = full_onprem(ends_at=NOW + 2 * HOUR)
    plan = cycle([head(1, cpu=8 * CPU)], act, [onprem, cloud("c", cpu=32 * CPU)], [rule(after=600)])
    assert plan.places == [Place(1, "c")]
    assert plan.bursts[1].trigger == "no on-prem start expected within 10m (expected in 2h)"


def test_a_job_whose_onprem_room_is_expected_in_time_waits():
    act, onprem = full_onprem(ends_at=NOW + 300)
    plan = cycle([head(1, cpu=8 * CPU)], act, [onprem, cloud("c", cpu=32 * CPU)], [rule(after=600)])
    assert plan.places == []
    assert plan.waits[1].endswith("; may burst after waiting 10m (waited 0s)")


def test_a_job_whose_onprem_room_depends_on_unknown_ends_waits_for_its_time():
    act, onprem = full_onprem(ends_at=None)
    plan = cycle([head(1, cpu=8 * CPU)], act, [onprem, cloud("c", cpu=32 * CPU)], [rule(after=600)])
    assert plan.places == [] and plan.waits[1].endswith("; may burst after waiting 10m (waited 0s)")


def test_a_job_too_big_for_any_unpaid_cluster_bursts_at_once():
    plan = cycle([head(1, cpu=64 * CPU)], (), [cluster("onprem", cpu=16 * CPU), cloud("c", cpu=128 * CPU)],
                 [rule(after=HOUR)])
    assert plan.places == [Place(1, "c")]
    assert plan.bursts[1].trigger == "no unpaid cluster could ever run it"


def test_the_class_after_holds_in_a_cycle_too():
    act, onprem = full_onprem()
    plan = cycle([head(1, cls="patient", waited=900, cpu=8 * CPU), head(2, waited=900, cpu=8 * CPU)], act,
                 [onprem, cloud("c", cpu=32 * CPU)], [rule(after=600)])
    assert plan.places == [Place(2, "c")]
    assert plan.waits[1].endswith("; may burst after waiting 30m (waited 15m)")


def test_the_class_multiplier_prices_the_burst():
    act, onprem = full_onprem()
    plan = cycle([head(1, cls="premium", waited=HOUR, cpu=8 * CPU)], act, [onprem, cloud("c", 0.10, cpu=32 * CPU)],
                 [rule()])
    assert plan.bursts[1].expected_cost == pytest.approx(1.6)


def test_a_batch_job_keeps_waiting_and_its_reason_names_the_class():
    act, onprem = full_onprem()
    plan = cycle([head(1, cls="batch", waited=10 * HOUR, cpu=8 * CPU)], act, [onprem, cloud("c", cpu=32 * CPU)],
                 [rule()])
    assert plan.places == [] and plan.bursts == {}
    assert plan.waits == {1: "no cluster fits: onprem: needs 8 cpu, 0 free; class batch may not burst to paid "
                             "clusters"}


def test_a_job_pinned_off_the_paid_clusters_says_nothing_about_bursting():
    act, onprem = full_onprem()
    c = Candidate(job(1, tiers=("onprem",), cpu=8 * CPU), "a", "standard", 50, 0, HOUR)
    plan = cycle([c], act, [onprem, cloud("c", cpu=32 * CPU)], [rule()])
    assert plan.waits == {1: "no cluster fits: onprem: needs 8 cpu, 0 free"}


@pytest.mark.parametrize("budget, admitted", [
    (Budget(per_day=0.3), 3),  # 0.1 each: 0.1 + 0.1 + 0.1 rounds above 0.3, still three
    (Budget(per_day=0.29), 2),
    (Budget(per_hour=0.5), 5),
    (Budget(max_resources={"cpu": 4 * CPU}), 4),
])
def test_jobs_in_one_cycle_consume_the_budget_so_exactly_as_many_as_it_holds_burst(budget, admitted):
    act, onprem = full_onprem()
    plan = cycle([head(i, waited=HOUR, cpu=CPU) for i in range(1, 9)], act, [onprem, cloud("c", 0.1, cpu=64 * CPU)],
                 [rule(budget=budget)])
    assert sorted(plan.bursts) == list(range(1, admitted + 1))
    assert len(plan.places) == admitted
    for i in range(admitted + 1, 9):
        assert "; burst refused: c: would break policy p's " in plan.waits[i]


def test_spend_already_committed_counts_against_the_cycles_budget():
    act, onprem = full_onprem()
    spend = {("p", None): Spend(rate=0.1, today=0.1, resources=res(cpu=CPU))}
    before = dict(spend)
    plan = cycle([head(i, waited=HOUR, cpu=CPU) for i in range(1, 6)], act, [onprem, cloud("c", 0.1, cpu=64 * CPU)],
                 [rule(budget=Budget(per_day=0.3))], spend)
    assert sorted(plan.bursts) == [1, 2]
    assert plan.waits[3] == ("no cluster fits: onprem: needs 1 cpu, 0 free; burst refused: c: would break "
                             "policy p's budget per day (0.30 spent today + 0.10 > 0.30)")
    assert spend == before  # the caller's spend is left alone


def test_a_queues_own_budget_stops_it_but_not_its_sibling():
    act, onprem = full_onprem()
    policy = [rule(queues=("research",), queue_budget=Budget(per_day=0.2))]
    queues = [QueueQuota("research"), QueueQuota("vision", "research"), QueueQuota("nlp", "research"),
              QueueQuota("busy")]
    jobs = [head(i, "vision", waited=HOUR, cpu=CPU) for i in (1, 2, 3)] + \
        [head(i, "nlp", waited=HOUR, cpu=CPU) for i in (11, 12, 13)]
    plan = cycle(jobs, act, [onprem, cloud("c", 0.1, cpu=64 * CPU)], policy, queues=queues)
    assert sorted(plan.bursts) == [1, 2, 11, 12]
    assert {plan.bursts[i].queue for i in (1, 2)} == {"vision"}
    assert "policy p's queue vision budget per day" in plan.waits[3]
    assert "policy p's queue nlp budget per day" in plan.waits[13]


def test_a_policy_on_a_parent_queue_covers_its_children_in_a_cycle():
    act, onprem = full_onprem()
    queues = [QueueQuota("research"), QueueQuota("vision", "research"), QueueQuota("ops"), QueueQuota("busy")]
    plan = cycle([head(1, "vision", waited=HOUR, cpu=CPU), head(2, "ops", waited=HOUR, cpu=CPU)], act,
                 [onprem, cloud("c", cpu=64 * CPU)], [rule(queues=("research",))], queues=queues)
    assert sorted(plan.bursts) == [1]
    assert plan.waits[2].endswith("; no burst policy covers queue ops and class standard")


def test_a_queue_at_its_max_does_not_burst_past_it():
    act, onprem = full_onprem()
    queues = [QueueQuota("a", max=res(cpu=2 * CPU)), QueueQuota("busy")]
    plan = cycle([head(i, waited=HOUR, cpu=CPU) for i in (1, 2, 3)], act, [onprem, cloud("c", cpu=64 * CPU)],
                 [rule()], queues=queues)
    assert sorted(plan.bursts) == [1, 2]
    assert plan.waits[3].startswith("queue a: cpu 2/2 in use")


def test_preemption_is_preferred_over_bursting():
    act, onprem = full_onprem(cls="batch")
    plan = cycle([head(1, cls="critical", waited=HOUR, cpu=8 * CPU)], act, [onprem, cloud("c", 0.01, cpu=64 * CPU)],
                 [rule()])
    assert plan.bursts == {} and plan.places == []
    assert [p.victim for p in plan.preemptions] == [900]
    assert plan.waits == {1: "preempting jobs 900 on onprem"}


def test_with_nothing_to_preempt_a_job_that_could_preempt_bursts():
    act, onprem = full_onprem(cls="standard")
    plan = cycle([head(1, cls="critical", waited=HOUR, cpu=8 * CPU)], act, [onprem, cloud("c", cpu=64 * CPU)],
                 [rule()])
    assert plan.preemptions == [] and plan.places == [Place(1, "c")] and 1 in plan.bursts


def test_an_elastic_cluster_at_zero_nodes_takes_a_burst_and_the_next_job_sees_less_headroom():
    act, onprem = full_onprem()
    grows = elastic("grows", max_cores=16, node_cores=8, delay=300)
    plan = cycle([head(i, waited=HOUR, cpu=8 * CPU) for i in (1, 2, 3)], act, [onprem, grows], [rule()])
    assert sorted(plan.bursts) == [1, 2]
    assert plan.bursts[1].starts_in_s == 300.0
    assert "burst refused: grows: " in plan.waits[3]


# -- invariants ---------------------------------------------------------------------------------------

@st.composite
def scenes(draw):
    onprem_cores = draw(st.integers(4, 16))
    act = [running(900, cpu=onprem_cores * CPU, ends_at=draw(st.one_of(st.none(), st.floats(NOW, NOW + 4 * HOUR))))]
    clusters = [cluster("onprem", act, cpu=onprem_cores * CPU),
                cloud("cloud-a", draw(st.sampled_from([0.05, 0.1, 0.3])), cpu=draw(st.integers(0, 32)) * CPU),
                cloud("cloud-b", draw(st.sampled_from([0.05, 0.1, 0.3])), cpu=draw(st.integers(0, 32)) * CPU)]
    budget = Budget(draw(st.one_of(st.none(), st.floats(0, 5))), draw(st.one_of(st.none(), st.floats(0, 10))),
                    draw(st.one_of(st.just({}), st.builds(lambda n: {"cpu": n * CPU}, st.integers(0, 40)))))
    spend = Spend(draw(st.floats(0, 2)), draw(st.floats(0, 4)), {"cpu": draw(st.integers(0, 8)) * CPU})
    jobs = [head(i, draw(st.sampled_from(["a", "b"])), draw(st.sampled_from(["standard", "batch", "patient"])),
                 draw(st.sampled_from([0.0, 1200.0, HOUR])), draw(st.sampled_from([None, 1800.0, 3 * HOUR])),
                 cpu=draw(st.integers(1, 20)) * CPU)
            for i in range(1, draw(st.integers(1, 10)) + 1)]
    return jobs, act, clusters, budget, spend


@settings(max_examples=150, deadline=None)
@given(scenes())
def test_a_cycle_never_breaks_a_budget_or_a_paid_clusters_capacity_and_bursts_only_when_allowed(scene):
    jobs, act, clusters, budget, spend = scene
    plan = cycle(jobs, act, clusters, [rule(after=600, budget=budget)], {("p", None): spend})
    by_id = {c.job.id: c for c in jobs}
    paid = {c.name: c for c in clusters if c.paid}
    assert {p.job_id for p in plan.places if p.cluster in paid} == set(plan.bursts)
    rate, today, cores = spend.rate, spend.today, spend.resources.get("cpu", 0)
    used = {name: 0 for name in paid}
    for job_id, d in plan.bursts.items():
        c = by_id[job_id]
        assert CLASSES[c.service_class].burst_allowed
        assert Place(job_id, d.cluster) in plan.places
        after = max(600.0, CLASSES[c.service_class].burst_after_s or 0.0)
        # Early only when on-prem could never hold it or no start there is expected in time.
        assert c.waited_s >= after or d.trigger.startswith(("no unpaid cluster", "no on-prem start expected"))
        rate += d.rate_per_hour
        today += d.expected_cost
        cores += c.job.requests["cpu"]
        used[d.cluster] += c.job.requests["cpu"]
    if budget.per_hour is not None and plan.bursts:
        assert rate <= budget.per_hour + 1e-6
    if budget.per_day is not None and plan.bursts:
        assert today <= budget.per_day + 1e-6
    if "cpu" in budget.max_resources and plan.bursts:
        assert cores <= budget.max_resources["cpu"]
    for name, cores_used in used.items():
        assert cores_used <= paid[name].free.get("cpu", 0)
    assert set(plan.waits) | {p.job_id for p in plan.places} == set(by_id)


# -- found by these tests, fixed -----------------------------------------------------------------------

@pytest.mark.parametrize("onprem_state", ["unreachable", "avoided"])
def test_an_onprem_cluster_out_of_use_for_now_is_not_one_that_could_never_run_the_job(onprem_state):
    onprem = cluster("onprem", unavailable="unreachable" if onprem_state == "unreachable" else "", cpu=16 * CPU)
    j = job(1, cpu=8 * CPU, avoid=("onprem",) if onprem_state == "avoided" else ())
    assert unpaid_start(j, [onprem, cloud("c", cpu=32 * CPU)], {}, NOW) != math.inf
    plan = cycle([Candidate(j, "a", "standard", 50, 0, 0.0)], (), [onprem, cloud("c", cpu=32 * CPU)],
                 [rule(after=600)])
    assert plan.bursts == {}


def test_an_elastic_cluster_whose_nodes_are_too_small_for_the_pod_is_refused_not_a_crash():
    grows = elastic("grows", max_cores=64, node_cores=16)
    reason = consider(job(cpu=32 * CPU), [grows], [rule()], waited=HOUR)
    assert isinstance(reason, str) and reason.startswith("burst refused: grows: ") and "node" in reason
    act, onprem = full_onprem()
    plan = cycle([head(1, waited=HOUR, cpu=32 * CPU)], act, [onprem, grows], [rule()])
    assert plan.bursts == {} and plan.waits[1].startswith("no cluster fits: onprem: ")
