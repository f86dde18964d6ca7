"""Placement: tier order, bin-packing, no head-of-line blocking, whole-job and per-pod fit, unavailable
clusters, placement filters, the reasons a job waits, `impossible`, and invariants over random inputs."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.policy.placing import ClusterState, Place, QueuedJob, Wait, impossible, plan

CPU = 1000  # milli-units per core
GPU = 1000
GI = 2**30 * 1000  # one Gi of memory in milli-units


def _resource(keyword: str) -> str:
    return "nvidia.com/gpu" if keyword == "gpu" else keyword


def cluster(name: str, tier: str = "onprem", site: str = "dc1", labels: dict | None = None,
            unavailable: str = "", largest: dict | None = None, **free: int) -> ClusterState:
    """A cluster with `free` given in milli-units (use CPU/GI/GPU; gpu= is nvidia.com/gpu); the largest
    node holds all of it unless `largest` says otherwise."""
    free = {_resource(k): v for k, v in free.items()}
    return ClusterState(name, tier, site, dict(labels or {}), free, dict(largest if largest is not None else free),
                        unavailable)


def job(job_id: int, pods: int = 1, selector: dict | None = None, tiers: tuple = (), sites: tuple = (),
        **per_pod: int) -> QueuedJob:
    """A job of `pods` identical pods, each asking for `per_pod` milli-units."""
    per_pod = {_resource(k): v for k, v in per_pod.items()}
    return QueuedJob(job_id, {r: v * pods for r, v in per_pod.items()}, dict(per_pod), dict(selector or {}),
                     tuple(tiers), tuple(sites))


def placed(decisions) -> dict[int, str]:
    return {d.job_id: d.cluster for d in decisions if isinstance(d, Place)}


def reasons(decisions) -> dict[int, str]:
    return {d.job_id: d.reason for d in decisions if isinstance(d, Wait)}


# -- tiers and bin-packing ---------------------------------------------------------------------------

def test_onprem_is_chosen_before_cloud_before_edge():
    # The cloud and edge clusters would be the tighter fit: the tier still wins.
    onprem = cluster("zz-onprem", "onprem", cpu=100 * CPU)
    cloud = cluster("aa-cloud", "cloud", cpu=8 * CPU)
    edge = cluster("aa-edge", "edge", cpu=8 * CPU)
    one = [job(1, cpu=8 * CPU)]
    assert plan(one, [edge, cloud, onprem]) == [Place(1, "zz-onprem")]
    assert plan(one, [edge, cloud]) == [Place(1, "aa-cloud")]
    assert plan(one, [edge]) == [Place(1, "aa-edge")]


def test_an_unknown_tier_comes_after_edge():
    clusters = [cluster("a-odd", "lab", cpu=8 * CPU), cluster("z-edge", "edge", cpu=100 * CPU)]
    assert plan([job(1, cpu=8 * CPU)], clusters) == [Place(1, "z-edge")]


def test_the_tightest_fit_wins_within_a_tier():
    clusters = [cluster("big", cpu=64 * CPU), cluster("snug", cpu=10 * CPU), cluster("mid", cpu=32 * CPU)]
    assert plan([job(1, cpu=8 * CPU)], clusters) == [Place(1, "snug")]


def test_tightness_is_judged_on_the_scarcest_resource_the_job_asks_for():
    # On "cpu-tight" the job would leave 20% of the cpu; on "mem-tight" 10% of the memory: tighter.
    clusters = [cluster("cpu-tight", cpu=10 * CPU, memory=1000 * GI),
                cluster("mem-tight", cpu=1000 * CPU, memory=10 * GI)]
    assert plan([job(1, cpu=8 * CPU, memory=9 * GI)], clusters) == [Place(1, "mem-tight")]


def test_equally_tight_clusters_are_chosen_by_name():
    clusters = [cluster("b", cpu=16 * CPU), cluster("a", cpu=16 * CPU)]
    assert plan([job(1, cpu=4 * CPU)], clusters) == [Place(1, "a")]


def test_a_job_that_asks_for_nothing_is_still_placed_by_tier():
    clusters = [cluster("c", "cloud", cpu=CPU), cluster("o", "onprem")]
    assert plan([QueuedJob(1, {}, {})], clusters) == [Place(1, "o")]


def test_capacity_taken_earlier_in_the_cycle_is_not_offered_again():
    clusters = [cluster("onprem", cpu=12 * CPU), cluster("cloud", "cloud", cpu=100 * CPU)]
    decisions = plan([job(1, cpu=8 * CPU), job(2, cpu=8 * CPU), job(3, cpu=4 * CPU)], clusters)
    assert decisions == [Place(1, "onprem"), Place(2, "cloud"), Place(3, "onprem")]


def test_placements_fill_the_tighter_cluster_first():
    clusters = [cluster("a", cpu=16 * CPU), cluster("b", cpu=8 * CPU)]
    decisions = plan([job(n, cpu=4 * CPU) for n in range(1, 7)], clusters)
    assert [getattr(d, "cluster", None) for d in decisions] == ["b", "b", "a", "a", "a", "a"]


# -- no head-of-line blocking ------------------------------------------------------------------------

def test_a_job_that_does_not_fit_never_blocks_later_smaller_jobs():
    decisions = plan([job(1, cpu=32 * CPU), job(2, cpu=4 * CPU), job(3, cpu=4 * CPU), job(4, cpu=4 * CPU)],
                     [cluster("onprem", cpu=10 * CPU)])
    assert [type(d) for d in decisions] == [Wait, Place, Place, Wait]
    assert decisions[0].reason == "no cluster fits: onprem: needs 32 cpu, 10 free"
    assert decisions[3].reason == "no cluster fits: onprem: needs 4 cpu, 2 free"


def test_a_waiting_job_takes_no_capacity():
    decisions = plan([job(1, pods=3, cpu=4 * CPU), job(2, pods=2, cpu=4 * CPU)], [cluster("onprem", cpu=8 * CPU)])
    assert decisions == [Wait(1, "no cluster fits: onprem: needs 12 cpu, 8 free"), Place(2, "onprem")]


# -- whole-job fit and per-pod fit -------------------------------------------------------------------

def test_the_whole_job_must_fit_the_free_capacity():
    # Four pods of 4 cpu: every pod fits a node, the gang does not fit the cluster.
    decisions = plan([job(1, pods=4, cpu=4 * CPU)], [cluster("onprem", cpu=8 * CPU)])
    assert decisions == [Wait(1, "no cluster fits: onprem: needs 16 cpu, 8 free")]


def test_the_largest_pod_must_fit_the_largest_free_node():
    # 12 cpu in total fits the 16 free, but no node has 6 cpu free.
    c = cluster("onprem", cpu=16 * CPU, largest={"cpu": 4 * CPU})
    decisions = plan([job(1, pods=2, cpu=6 * CPU)], [c])
    assert decisions == [Wait(1, "no cluster fits: onprem: needs 6 cpu on one node, 4 free on its largest node")]
    assert "on one node" in decisions[0].reason
    assert plan([job(2, pods=3, cpu=4 * CPU)], [c]) == [Place(2, "onprem")]


def test_per_pod_fit_sends_the_job_where_a_node_can_hold_its_pod():
    fragmented = cluster("a-fragmented", cpu=64 * CPU, largest={"cpu": 2 * CPU})
    roomy = cluster("b-roomy", cpu=64 * CPU, largest={"cpu": 32 * CPU})
    assert plan([job(1, cpu=8 * CPU)], [fragmented, roomy]) == [Place(1, "b-roomy")]


def test_a_resource_the_largest_node_does_not_list_has_none():
    c = cluster("onprem", cpu=8 * CPU, gpu=4 * GPU, largest={"cpu": 8 * CPU})
    decisions = plan([job(1, cpu=CPU, gpu=GPU)], [c])
    assert decisions == [Wait(1, "no cluster fits: onprem: needs 1 nvidia.com/gpu on one node, "
                                 "0 free on its largest node")]


def test_the_largest_free_node_shrinks_with_what_was_placed():
    c = cluster("onprem", cpu=16 * CPU, memory=64 * GI, largest={"cpu": 8 * CPU, "memory": 64 * GI})
    # The first job leaves 6 cpu in all, so no node can still have 8 free.
    decisions = plan([QueuedJob(1, {"cpu": 10 * CPU}, {"cpu": CPU}),
                      QueuedJob(2, {"cpu": 6 * CPU, "memory": GI}, {"cpu": 6 * CPU, "memory": GI}),
                      QueuedJob(3, {"cpu": 0, "memory": GI}, {"memory": GI})], [c])
    assert decisions == [Place(1, "onprem"), Place(2, "onprem"), Place(3, "onprem")]


# -- the reasons a job waits -------------------------------------------------------------------------

def test_the_reason_names_every_eligible_cluster_in_tier_order_with_its_shortfall():
    clusters = [cluster("edge-1", "edge", site="shop", cpu=2 * CPU),
                cluster("cloud-1", "cloud", cpu=4 * CPU, largest={"cpu": CPU}),
                cluster("onprem-b", cpu=8 * CPU, memory=64 * GI),
                cluster("onprem-a", cpu=32 * CPU, memory=16 * GI)]
    decisions = plan([job(1, cpu=16 * CPU, memory=32 * GI)], clusters)
    assert decisions == [Wait(1, "no cluster fits: onprem-a: needs 32Gi memory, 16Gi free; "
                                 "onprem-b: needs 16 cpu, 8 free; cloud-1: needs 16 cpu, 4 free; "
                                 "edge-1: needs 16 cpu, 2 free")]


def test_the_reason_names_only_clusters_the_placement_allows():
    clusters = [cluster("onprem", cpu=2 * CPU), cluster("cloud", "cloud", cpu=2 * CPU)]
    decisions = plan([job(1, tiers=("cloud",), cpu=4 * CPU)], clusters)
    assert decisions == [Wait(1, "no cluster fits: cloud: needs 4 cpu, 2 free")]


def test_reasons_spell_quantities_as_kubernetes_does():
    decisions = plan([job(1, cpu=1500), job(2, memory=512 * 2**20 * 1000), job(3, gpu=2 * GPU)],
                     [cluster("onprem", cpu=CPU, memory=256 * 2**20 * 1000)])
    assert reasons(decisions) == {1: "no cluster fits: onprem: needs 1500m cpu, 1 free",
                                  2: "no cluster fits: onprem: needs 512Mi memory, 256Mi free",
                                  3: "no cluster fits: onprem: needs 2 nvidia.com/gpu, 0 free"}


def test_an_overcommitted_cluster_shows_nothing_free_rather_than_a_negative_amount():
    decisions = plan([job(1, cpu=CPU)], [cluster("onprem", cpu=-3 * CPU)])
    assert decisions == [Wait(1, "no cluster fits: onprem: needs 1 cpu, 0 free")]


def test_a_resource_the_job_asks_none_of_never_holds_it_back():
    # cpu: "0" in a pod template gives a 0 entry; free cpu is below zero while dispatches are in flight.
    overcommitted = cluster("onprem", cpu=-3 * CPU, memory=8 * GI)
    decisions = plan([QueuedJob(1, {"cpu": 0, "memory": 2 * GI}, {"cpu": 0, "memory": GI})], [overcommitted])
    assert decisions == [Place(1, "onprem")]


# -- unavailable clusters ----------------------------------------------------------------------------

def test_an_unavailable_cluster_gets_nothing_and_its_state_is_the_reason():
    clusters = [cluster("edge-a", "edge", unavailable="unreachable (no heartbeat from its agent)", cpu=100 * CPU),
                cluster("onprem", unavailable="cordoned", cpu=100 * CPU),
                cluster("cloud", "cloud", cpu=2 * CPU)]
    decisions = plan([job(1, cpu=4 * CPU), job(2, cpu=CPU)], clusters)
    assert decisions == [
        Wait(1, "no cluster fits: onprem: cordoned; cloud: needs 4 cpu, 2 free; "
                "edge-a: unreachable (no heartbeat from its agent)"),
        Place(2, "cloud")]


def test_a_job_pinned_to_an_unreachable_site_waits_for_it():
    clusters = [cluster("edge-a", "edge", site="shop-7", unavailable="unreachable", cpu=8 * CPU),
                cluster("onprem", cpu=100 * CPU)]
    assert plan([job(1, sites=("shop-7",), cpu=CPU)], clusters) == [Wait(1, "no cluster fits: edge-a: unreachable")]


# -- placement filters -------------------------------------------------------------------------------

def test_tiers_restrict_where_a_job_may_go():
    clusters = [cluster("onprem", cpu=100 * CPU), cluster("cloud", "cloud", cpu=100 * CPU),
                cluster("edge", "edge", cpu=100 * CPU)]
    assert placed(plan([job(1, tiers=("cloud",), cpu=CPU), job(2, tiers=("edge", "cloud"), cpu=CPU),
                        job(3, tiers=("edge",), cpu=CPU)], clusters)) == {1: "cloud", 2: "cloud", 3: "edge"}


def test_sites_pin_a_job_to_its_data():
    clusters = [cluster("onprem", site="dc1", cpu=100 * CPU), cluster("edge-7", "edge", site="shop-7", cpu=8 * CPU),
                cluster("edge-8", "edge", site="shop-8", cpu=8 * CPU)]
    assert placed(plan([job(1, sites=("shop-8",), cpu=CPU), job(2, sites=("shop-7", "shop-8"), cpu=CPU),
                        job(3, cpu=CPU)], clusters)) == {1: "edge-8", 2: "edge-8", 3: "onprem"}


def test_a_cluster_selector_needs_every_label_to_match():
    clusters = [cluster("a", labels={"gpu": "a100"}, cpu=100 * CPU),
                cluster("b", labels={"gpu": "h100", "zone": "north"}, cpu=100 * CPU),
                cluster("c", labels={"gpu": "h100", "zone": "south"}, cpu=100 * CPU)]
    decisions = plan([job(1, selector={"gpu": "h100", "zone": "south"}, cpu=CPU),
                      job(2, selector={"gpu": "a100"}, cpu=CPU),
                      job(3, selector={"gpu": "h100"}, cpu=CPU)], clusters)
    # Job 3 may use b or c; job 1 already made c the tighter fit.
    assert placed(decisions) == {1: "c", 2: "a", 3: "c"}


def test_no_cluster_matching_the_placement_is_its_own_reason():
    clusters = [cluster("onprem", site="dc1", cpu=100 * CPU), cluster("edge", "edge", site="shop-7", cpu=100 * CPU)]
    decisions = plan([job(1, sites=("shop-9",), cpu=CPU),
                      job(2, sites=("shop-9", "shop-10"), tiers=("edge",), selector={"zone": "x", "gpu": "a100"},
                          cpu=CPU),
                      job(3, tiers=("cloud",), cpu=CPU),
                      job(4, selector={"gpu": "a100"}, cpu=CPU)], clusters)
    assert reasons(decisions) == {
        1: "no cluster matches its placement (sites shop-9)",
        2: "no cluster matches its placement (sites shop-9,shop-10; tiers edge; selector gpu=a100,zone=x)",
        3: "no cluster matches its placement (tiers cloud)",
        4: "no cluster matches its placement (selector gpu=a100)"}


def test_with_no_clusters_at_all_every_job_waits():
    assert plan([job(1, cpu=CPU)], []) == [Wait(1, "no cluster matches its placement")]
    assert plan([], [cluster("onprem", cpu=CPU)]) == []


def test_plan_leaves_its_inputs_alone():
    clusters = [cluster("onprem", cpu=8 * CPU, largest={"cpu": 4 * CPU})]
    jobs = [job(1, pods=2, cpu=2 * CPU)]
    before = (repr(clusters), repr(jobs))
    assert plan(jobs, clusters) == [Place(1, "onprem")]
    assert (repr(clusters), repr(jobs)) == before
    assert plan(jobs, clusters) == [Place(1, "onprem")]


# -- impossible --------------------------------------------------------------------------------------

def allocatable(name: str, tier: str = "onprem", site: str = "dc1", labels: dict | None = None,
                **amounts: int) -> ClusterState:
    """What submit judges against: each cluster's allocatable as its free capacity."""
    return cluster(name, tier, site, labels, **amounts)


def test_a_job_that_fits_an_empty_cluster_is_possible_even_when_it_must_wait_now():
    unreachable = ClusterState("onprem", "onprem", "dc1", {}, {"cpu": 64 * CPU}, {"cpu": 64 * CPU}, "unreachable")
    assert plan([job(1, pods=4, cpu=8 * CPU)], [unreachable]) == [Wait(1, "no cluster fits: onprem: unreachable")]
    assert impossible(job(1, pods=4, cpu=8 * CPU), [unreachable]) is None


def test_a_job_bigger_than_every_cluster_is_impossible_and_says_why():
    clusters = [allocatable("onprem", cpu=16 * CPU, memory=64 * GI), allocatable("cloud", "cloud", cpu=8 * CPU)]
    why = impossible(job(1, pods=4, cpu=16 * CPU), clusters)
    assert why == "no cluster could ever run it: onprem: needs 64 cpu, 16 in all; cloud: needs 64 cpu, 8 in all"


def test_a_job_asking_for_a_resource_no_cluster_has_is_impossible():
    why = impossible(job(1, gpu=GPU), [allocatable("onprem", cpu=16 * CPU)])
    assert why == "no cluster could ever run it: onprem: needs 1 nvidia.com/gpu, 0 in all"


def test_a_job_no_cluster_matches_is_impossible():
    clusters = [allocatable("onprem", cpu=16 * CPU)]
    assert impossible(job(1, sites=("shop-9",), cpu=CPU), clusters) == "no cluster matches its placement (sites shop-9)"
    assert impossible(job(1, cpu=CPU), []) == "no cluster matches its placement"


def test_one_cluster_that_could_run_it_is_enough():
    clusters = [allocatable("onprem", cpu=4 * CPU), allocatable("cloud", "cloud", cpu=64 * CPU)]
    assert impossible(job(1, pods=4, cpu=8 * CPU), clusters) is None
    assert impossible(job(1, pods=4, cpu=8 * CPU, tiers=("onprem",)), clusters) is not None


# -- invariants over random clusters and jobs --------------------------------------------------------

RESOURCES = ("cpu", "memory", "nvidia.com/gpu")
TIERS = ("onprem", "cloud", "edge")
SITES = ("dc1", "dc2", "shop")
# Strategies are built once here: building them inside @composite dominates the run time.
labels = st.dictionaries(st.sampled_from(("gpu", "zone")), st.sampled_from(("a", "b")), max_size=2)
# Most jobs name no placement filter, so that most of them can be placed somewhere.
nothing = st.just(())
selectors = st.one_of(st.just({}), st.just({}), st.just({}), st.dictionaries(st.sampled_from(("gpu", "zone")),
                                                                 st.sampled_from(("a", "b")), min_size=1, max_size=1))
# Per resource: free whole units (below zero when in-flight dispatches overcommit it), and what share
# (in fifths; 0 lists no amount) the largest node has.
capacity = st.tuples(st.integers(-4, 32), st.integers(0, 5))
capacities = st.fixed_dictionaries({"cpu": capacity, "memory": capacity}, optional={"nvidia.com/gpu": capacity})
amount = st.integers(0, 6).map(lambda n: n * 500)
pods = st.fixed_dictionaries({"cpu": amount}, optional={"memory": amount, "nvidia.com/gpu": amount})
pod_sets = st.lists(st.tuples(st.integers(1, 3), pods), min_size=1, max_size=2)
tier_filters = st.one_of(nothing, nothing, nothing,
                         st.lists(st.sampled_from(TIERS), min_size=1, max_size=2, unique=True).map(tuple))
site_filters = st.one_of(nothing, nothing, nothing,
                         st.lists(st.sampled_from(SITES), min_size=1, max_size=2, unique=True).map(tuple))
cluster_tiers = st.sampled_from(TIERS + ("lab",))
cluster_sites = st.sampled_from(SITES)
unavailability = st.sampled_from(("", "", "", "unreachable"))


@st.composite
def clusters_strategy(draw) -> list[ClusterState]:
    out = []
    for n in range(draw(st.integers(1, 5))):
        capacity = draw(capacities)
        free = {r: units * 1000 for r, (units, _) in capacity.items()}
        # The largest free node never holds more than the whole cluster has free; now and then it
        # lists no amount at all for a resource (then it has none of it).
        largest = {r: units * 1000 * fifths // 5 for r, (units, fifths) in capacity.items() if fifths}
        out.append(ClusterState(
            name=f"c{n}", tier=draw(cluster_tiers), site=draw(cluster_sites),
            labels=draw(labels), free=free, largest_free_node=largest,
            unavailable=draw(unavailability)))
    return out


@st.composite
def jobs_strategy(draw) -> list[QueuedJob]:
    out = []
    for n in range(draw(st.integers(0, 8))):
        requests: dict[str, int] = {}
        largest: dict[str, int] = {}
        for count, pod in draw(pod_sets):
            for r, v in pod.items():
                requests[r] = requests.get(r, 0) + v * count
                largest[r] = max(largest.get(r, 0), v)
        out.append(QueuedJob(
            id=100 + n, requests=requests, largest_pod=largest, cluster_selector=draw(selectors),
            tiers=draw(tier_filters), sites=draw(site_filters)))
    return out


def allowed_on(j: QueuedJob, c: ClusterState) -> bool:
    return ((not j.tiers or c.tier in j.tiers) and (not j.sites or c.site in j.sites)
            and all(c.labels.get(k) == v for k, v in j.cluster_selector.items()))


def _fits(request: dict[str, int], free: dict[str, int]) -> bool:
    return all(v <= free.get(r, 0) for r, v in request.items() if v > 0)


def _replay(jobs, clusters, decisions):
    """Walk the decisions in order, yielding (job, decision, free before, largest node before) while
    charging each placement to its cluster; free and largest are what each cluster had at that moment."""
    free = {c.name: dict(c.free) for c in clusters}
    by_name = {c.name: c for c in clusters}
    for j, d in zip(jobs, decisions):
        largest = {name: {r: min(v, free[name].get(r, 0)) for r, v in c.largest_free_node.items()}
                   for name, c in by_name.items()}
        yield j, d, {k: dict(v) for k, v in free.items()}, largest
        if isinstance(d, Place):
            for r, v in j.requests.items():
                free[d.cluster][r] = free[d.cluster].get(r, 0) - v


def check_one_decision_per_job_in_input_order(jobs, clusters, decisions):
    assert [d.job_id for d in decisions] == [j.id for j in jobs]
    assert all(isinstance(d, (Place, Wait)) for d in decisions)
    assert all(d.reason for d in decisions if isinstance(d, Wait))


def check_placements_never_exceed_any_clusters_free_capacity(jobs, clusters, decisions):
    by_name = {c.name: c for c in clusters}
    used: dict[str, dict[str, int]] = {c.name: {} for c in clusters}
    for j, d in zip(jobs, decisions):
        if isinstance(d, Place):
            for r, v in j.requests.items():
                used[d.cluster][r] = used[d.cluster].get(r, 0) + v
    for name, resources in used.items():
        for r, total in resources.items():
            if total > 0:
                assert total <= by_name[name].free.get(r, 0), (name, r)


def check_each_placed_job_goes_whole_to_one_available_cluster_it_allows_and_fits(jobs, clusters, decisions):
    by_name = {c.name: c for c in clusters}
    for j, d, free, largest in _replay(jobs, clusters, decisions):
        if not isinstance(d, Place):
            continue
        c = by_name[d.cluster]
        assert not c.unavailable
        assert allowed_on(j, c)
        assert _fits(j.requests, free[c.name])  # the whole gang, at that moment
        assert _fits(j.largest_pod, largest[c.name])  # its largest pod, on the largest free node then


def check_a_job_waits_only_when_nothing_it_allows_fits_and_never_skips_a_better_tier(jobs, clusters, decisions):
    rank = {"onprem": 0, "cloud": 1, "edge": 2}
    for j, d, free, largest in _replay(jobs, clusters, decisions):
        fitting = [c for c in clusters if not c.unavailable and allowed_on(j, c)
                   and _fits(j.requests, free[c.name]) and _fits(j.largest_pod, largest[c.name])]
        if isinstance(d, Wait):
            assert not fitting, d.reason
            eligible = [c.name for c in clusters if allowed_on(j, c)]
            if eligible:
                assert d.reason.startswith("no cluster fits: ")
                assert all(f"{name}: " in d.reason for name in eligible)
            else:
                assert d.reason.startswith("no cluster matches its placement")
        else:
            chosen = next(c for c in clusters if c.name == d.cluster)
            assert min(rank.get(c.tier, 9) for c in fitting) == rank.get(chosen.tier, 9)


def check_a_job_called_impossible_is_never_placed(jobs, clusters, decisions):
    for j in jobs:
        if impossible(j, clusters) is not None:
            assert isinstance(plan([j], clusters)[0], Wait)


# One generated input checked against every invariant: generating the inputs is the slow part.
@settings(max_examples=200, deadline=None)
@given(clusters=clusters_strategy(), jobs=jobs_strategy())
def test_plan_invariants_over_random_clusters_and_jobs(clusters, jobs):
    before = repr(clusters)
    decisions = plan(jobs, clusters)
    assert repr(clusters) == before
    check_one_decision_per_job_in_input_order(jobs, clusters, decisions)
    check_placements_never_exceed_any_clusters_free_capacity(jobs, clusters, decisions)
    check_each_placed_job_goes_whole_to_one_available_cluster_it_allows_and_fits(jobs, clusters, decisions)
    check_a_job_waits_only_when_nothing_it_allows_fits_and_never_skips_a_better_tier(jobs, clusters, decisions)
    check_a_job_called_impossible_is_never_placed(jobs, clusters, decisions)


def test_a_wait_reason_names_at_most_five_clusters_and_counts_the_rest():
    from dispatcher.policy.placing import decide
    full = {f"c{i}": ClusterState(f"c{i}", "onprem", "dc", {}, {"cpu": 0}, {"cpu": 0}, "", {"cpu": 8000})
            for i in range(8)}
    reason = decide(QueuedJob(1, {"cpu": 1000}, {"cpu": 1000}), full)
    assert isinstance(reason, Wait)
    assert reason.reason == ("no cluster fits: " + "; ".join(f"c{i}: needs 1 cpu, 0 free" for i in range(5))
                             + "; and 3 more clusters (sluice explain lists them)")
