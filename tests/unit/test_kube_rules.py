"""The kubernetes backend's pure parts: manifests (objects), pod policy (policy), what objects mean and
what the cluster can take (status), all in agent/backends/kubernetes/. No I/O."""
from __future__ import annotations

import kubernetes_validate
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent.backends.kubernetes import status as ks
from agent.backends.kubernetes.objects import (
    ADOPT,
    ADOPTED,
    COPY,
    Refused,
    adopted,
    adoption,
    adoption_patch,
    attempt_key,
    job_name,
    origin_of,
    plan_attempt,
    release_patch,
)
from agent.backends.kubernetes.settings import ClusterSettings
from sluice.spec import SpecError, job_from_document
from tests.fakekube.patch import merge_patch

CREATED = "2026-01-01T00:00:00.000000Z"
T0 = ks.parse_time(CREATED)


def job(*pod_sets, queue="vision", **spec):
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"queue": queue, "podSets": list(pod_sets), **spec}}


def pod_set(name="worker", count=2, cpu=8, **pod_spec):
    return {"name": name, "count": count, "template": {
        "metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
        "spec": {"containers": [{"name": "main", "image": "train:1",
                                 "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}],
                 **pod_spec}}}


def test_pods_workload_manifests_are_valid_named_and_labelled():
    plan = plan_attempt(12, 3, job(pod_set(), pod_set("ps", 1, cpu=0.5), maxRuntime="2h"),
                        ClusterSettings(namespaces={"vision": "ml-vision"}), CREATED)
    assert plan.namespace == "ml-vision" and plan.gang_size == 3 and plan.workload == "pods"
    assert [m["metadata"]["name"] for m in plan.manifests] == ["12-3-worker-0", "12-3-worker-1", "12-3-ps-0"]
    first = plan.manifests[0]
    assert first["metadata"]["labels"] == {"team": "a", "sluice.io/job-id": "12", "sluice.io/attempt": "3",
                                           "sluice.io/pod-set": "worker", "app.kubernetes.io/managed-by": "sluice"}
    assert first["metadata"]["annotations"] == {"note": "x", "sluice.io/gang-size": "3",
                                                "sluice.io/pod-set-index": "0",
                                                "sluice.io/created-at": CREATED, "sluice.io/max-runtime": "2h",
                                                "sluice.io/pod-index": "0"}
    assert plan.manifests[2]["metadata"]["annotations"]["sluice.io/pod-set-index"] == "1"
    assert "env" not in first["spec"]["containers"][0]  # no array element: no environment of Sluice's
    assert first["spec"]["restartPolicy"] == "Never" and first["spec"]["activeDeadlineSeconds"] == 7200
    assert first["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "8", "memory": "1Gi"}
    assert plan.manifests[2]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "0.5"
    for manifest in plan.manifests:
        kubernetes_validate.validate(manifest, "1.33", strict=True)
        assert attempt_key(manifest) == (12, 3)


def test_pods_are_kept_off_the_nodes_a_dispatch_names_in_each_of_their_own_node_affinity_terms():
    off = {"key": "metadata.name", "operator": "NotIn", "values": ["node-a", "node-b"]}
    plain = plan_attempt(12, 3, job(pod_set()), ClusterSettings(), CREATED, ("node-a", "node-b"))
    for manifest in plain.manifests:
        assert manifest["spec"]["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [off]}]}}}
        kubernetes_validate.validate(manifest, "1.33", strict=True)
    # The pod's own terms are ORed: each keeps its expressions and gets the nodes to keep off, beside its
    # preferences, which are left alone.
    gpu = {"key": "gpu", "operator": "In", "values": ["a100"]}
    zone = {"key": "zone", "operator": "In", "values": ["z1"]}
    prefer = [{"weight": 1, "preference": {"matchExpressions": [zone]}}]
    own = pod_set(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [gpu]},
                                                                                 {"matchExpressions": [zone]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": prefer}})
    jobs = plan_attempt(12, 3, job(own), ClusterSettings(workload="jobs"), CREATED, ("node-a", "node-b"))
    [manifest] = jobs.manifests
    affinity = manifest["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [gpu], "matchFields": [off]}, {"matchExpressions": [zone], "matchFields": [off]}]
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"] == prefer
    kubernetes_validate.validate(manifest, "1.33", strict=True)
    # No nodes named: the template's spec as it was.
    assert "affinity" not in plan_attempt(12, 3, job(pod_set()), ClusterSettings(), CREATED).manifests[0]["spec"]


def test_jobs_workload_is_one_indexed_job_per_pod_set_that_never_replaces_a_pod():
    plan = plan_attempt(12, 3, job(pod_set(), pod_set("ps", 1, restartPolicy="OnFailure")),
                        ClusterSettings(workload="jobs"), CREATED)
    assert plan.namespace == "vision"
    worker, ps = plan.manifests
    assert worker["kind"] == "Job" and worker["metadata"]["name"] == "12-3-worker"
    assert worker["spec"]["completionMode"] == "Indexed"
    assert (worker["spec"]["parallelism"], worker["spec"]["completions"], worker["spec"]["backoffLimit"]) == (2, 2, 0)
    assert ps["spec"]["backoffLimit"] == 6  # OnFailure restarts in place count against it, as in a plain Job
    assert worker["spec"]["template"]["metadata"]["labels"]["sluice.io/pod-set"] == "worker"
    assert worker["spec"]["template"]["metadata"]["annotations"]["sluice.io/gang-size"] == "3"
    for manifest in plan.manifests:
        kubernetes_validate.validate(manifest, "1.33", strict=True)
    long = job_name(123456, 2, "a" * 63)
    assert len(long) <= 52 and long == job_name(123456, 2, "a" * 63) and long != job_name(123456, 2, "a" * 62 + "b")


@pytest.mark.parametrize("workload", ["pods", "jobs"])
def test_array_elements_get_their_index_in_env_and_labels_and_the_template_s_own_env_wins(workload):
    own = pod_set("main", 1)
    own["template"]["metadata"]["labels"]["sluice.io/array-index"] = "99"  # Sluice's labels win, as for the rest
    own["template"]["spec"]["initContainers"] = [{"name": "fetch", "image": "fetch:1",
                                                  "env": [{"name": "SLUICE_ARRAY_INDEX", "value": "mine"}]}]
    own["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    plan = plan_attempt(40, 1, job(own, pod_set("side", 1), arrayId=37, arrayIndex=3),
                        ClusterSettings(workload=workload), CREATED)
    for manifest in plan.manifests:
        kubernetes_validate.validate(manifest, "1.33", strict=True)
        pod = manifest if workload == "pods" else manifest["spec"]["template"]
        for metadata in {id(m): m for m in (manifest["metadata"], pod["metadata"])}.values():
            assert metadata["labels"]["sluice.io/array-id"] == "37"
            assert metadata["labels"]["sluice.io/array-index"] == "3"
    main = plan.manifests[0] if workload == "pods" else plan.manifests[0]["spec"]["template"]
    assert main["spec"]["initContainers"][0]["env"] == [{"name": "SLUICE_ARRAY_INDEX", "value": "mine"},
                                                        {"name": "SLUICE_ARRAY_ID", "value": "37"}]
    assert main["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"},
                                                    {"name": "SLUICE_ARRAY_ID", "value": "37"},
                                                    {"name": "SLUICE_ARRAY_INDEX", "value": "3"}]
    side = plan.manifests[1] if workload == "pods" else plan.manifests[1]["spec"]["template"]
    assert side["spec"]["containers"][0]["env"] == [{"name": "SLUICE_ARRAY_ID", "value": "37"},
                                                    {"name": "SLUICE_ARRAY_INDEX", "value": "3"}]
    assert own["template"]["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]  # the document's untouched
    plain = plan_attempt(41, 1, job(pod_set("main", 1), arrayId=True, arrayIndex="3"), ClusterSettings(), CREATED)
    assert "env" not in plain.manifests[0]["spec"]["containers"][0]  # not integers: no array element
    assert "sluice.io/array-index" not in plain.manifests[0]["metadata"]["labels"]


@pytest.mark.parametrize("template_spec, cluster, words", [
    ({"containers": [{"name": "m", "image": "x", "securityContext": {"privileged": True}}]}, {},
     "privileged container 'm'"),
    ({"initContainers": [{"name": "i", "image": "x", "securityContext": {"privileged": True}}]}, {},
     "privileged container 'i'"),
    ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, {}, "hostPath volume 'root'"),
    ({"hostNetwork": True}, {}, "hostNetwork"),
    ({"hostPID": True}, {}, "hostPID"),
    ({"hostIPC": True}, {}, "hostIPC"),
    ({"serviceAccountName": "admin"}, {"service_accounts": ("trainer",)}, "service account 'admin'"),
    ({"restartPolicy": "Always"}, {}, "restartPolicy 'Always'"),
])
def test_forbidden_templates_are_refused(template_spec, cluster, words):
    spec = {"containers": [{"name": "m", "image": "x"}], **template_spec}
    with pytest.raises(Refused) as refused:
        plan_attempt(1, 1, job({"name": "w", "count": 1, "template": {"spec": spec}}), ClusterSettings(**cluster),
                     CREATED)
    assert (str(refused.value).startswith("refused by the cluster's pod policy: pod set w: ")
            and words in str(refused.value))


def test_what_the_policy_allows():
    allowed = ClusterSettings(allow_privileged=True, allow_host_path=True, allow_host_network=True, allow_host_pid=True,
                              service_accounts=("trainer",))
    spec = {"containers": [{"name": "m", "image": "x", "securityContext": {"privileged": True}}], "hostNetwork": True,
            "hostPID": True, "volumes": [{"name": "d", "hostPath": {"path": "/data"}}], "serviceAccountName": "trainer"}
    plan_attempt(1, 1, job({"name": "w", "count": 1, "template": {"spec": spec}}), allowed, CREATED)
    plan_attempt(1, 1, job({"name": "w", "count": 1, "template": {"metadata": {"namespace": "vision"}, "spec": {
        "containers": [{"name": "m", "image": "x"}], "serviceAccountName": "default"}}}), ClusterSettings(), CREATED)


def test_namespace_other_than_the_mapped_one_and_unmappable_queues_are_refused():
    other = {"name": "w", "count": 1, "template": {"metadata": {"namespace": "kube-system"},
                                                   "spec": {"containers": [{"name": "m", "image": "x"}]}}}
    with pytest.raises(Refused, match="namespace 'kube-system' .this job's queue runs in namespace 'vision'"):
        plan_attempt(1, 1, job(other), ClusterSettings(), CREATED)
    with pytest.raises(Refused, match="not a Kubernetes namespace name"):
        plan_attempt(1, 1, job(pod_set(), queue="team_a"), ClusterSettings(), CREATED)
    plan_attempt(1, 1, job(pod_set(), queue="team_a"), ClusterSettings(namespaces={"team_a": "team-a"}), CREATED)


def test_cluster_settings_come_from_the_cluster_document():
    document = {"apiVersion": "sluice.io/v1", "kind": "Cluster", "metadata": {"name": "k"}, "spec": {
        "kubernetes": {"namespaces": {"vision": "ml"}, "createNamespaces": True, "gangStartTimeout": "90s",
                       "workload": "jobs"},
        "podPolicy": {"allowHostPath": True, "serviceAccounts": ["trainer"]}}}
    settings = ClusterSettings.from_document(document)
    assert settings == ClusterSettings(name="k", namespaces={"vision": "ml"}, create_namespaces=True,
                                       gang_start_timeout_s=90.0, workload="jobs", allow_host_path=True,
                                       service_accounts=("trainer",))
    assert ClusterSettings.from_document({**document, "spec": {}}) == ClusterSettings(name="k")


# -- adoption ----------------------------------------------------------------------------------------

ORIGIN = {"cluster": "kube-a", "namespace": "team-a", "name": "train", "uid": "u-1"}


def user_job(**spec):
    """A user's Job as the API server holds it, submitted suspended through the kubectl front door."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "team-a", "uid": "u-1", "resourceVersion": "41",
                         "labels": {"sluice.io/queue": "vision"}, "annotations": {"sluice.io/job-id": "7"}},
            "spec": {"suspend": True, "parallelism": 2, "completions": 2, "backoffLimit": 3,
                     "completionMode": "NonIndexed",
                     "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u-1"}},
                     "template": {"metadata": {"labels": {"batch.kubernetes.io/controller-uid": "u-1"}},
                                  "spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "main", "image": "train:1"}]}},
                     **spec},
            "status": {}}


def origin_document(count=2, **spec):
    """The job's document as the dispatcher sends it: one pod set, the Job's, and where it came from."""
    return job(pod_set("job", count), origin=ORIGIN, **spec)


def with_metadata(obj, **metadata):
    return {**obj, "metadata": {**obj["metadata"], **metadata}}


def test_the_origin_is_read_from_the_document_only_when_whole():
    assert origin_of(origin_document()) == ORIGIN
    assert origin_of(job(pod_set())) is None
    assert origin_of(job(pod_set(), origin={**ORIGIN, "uid": ""})) is None
    assert origin_of({"spec": "nonsense"}) is None


@pytest.mark.parametrize("current, document, outcome, words", [
    (user_job(), origin_document(), ADOPT, ""),
    (with_metadata(user_job(), annotations={"sluice.io/adopted": "7-1"}), origin_document(), ADOPTED, ""),
    (None, origin_document(), COPY, "Job team-a/train does not exist"),
    (with_metadata(user_job(), uid="u-2"), origin_document(), COPY, "another Job of the same name (uid u-2)"),
    (with_metadata(user_job(), annotations={"sluice.io/adopted": "7-0"}), origin_document(), COPY,
     "it ran attempt 7-0 (a Job is adopted once)"),
    (with_metadata(user_job(), deletionTimestamp=CREATED), origin_document(), COPY, "it is being deleted"),
    (user_job(suspend=False), origin_document(), COPY, "it is not suspended"),
    ({**user_job(), "status": {"startTime": CREATED}}, origin_document(), COPY, "it ran before"),
    (user_job(managedBy="kueue.x-k8s.io/multikueue"), origin_document(), COPY, "spec.managedBy"),
    (user_job(parallelism=3, completions=3), origin_document(), COPY,
     "it has parallelism 3 and completions 3, the job 2 pods"),
    (user_job(parallelism=2, completions=None), origin_document(), ADOPT, ""),
])
def test_a_job_s_own_job_runs_its_attempt_only_when_it_can(current, document, outcome, words):
    verdict, why = adoption(current, document, 7, 1)
    assert verdict == outcome and words in why


def test_the_adoption_patch_makes_the_job_the_attempt_s_and_its_release_hands_it_back():
    plan = plan_attempt(7, 1, origin_document(maxRuntime="1h"), ClusterSettings(namespaces={"vision": "team-a"}),
                        CREATED)
    patch = adoption_patch(user_job(), *plan.marks[0], "7-1")
    assert patch["metadata"]["resourceVersion"] == "41"  # conditional: 409 if the Job changed since it was read
    running = merge_patch(user_job(), patch)
    kubernetes_validate.validate(running, "1.33", strict=True)
    assert attempt_key(running) == (7, 1) and adopted(running) and running["spec"]["suspend"] is False
    assert running["metadata"]["labels"]["sluice.io/queue"] == "vision"  # the owner's labels stay
    assert running["metadata"]["annotations"]["sluice.io/adopted"] == "7-1"
    template = running["spec"]["template"]["metadata"]
    assert template["labels"] == {"batch.kubernetes.io/controller-uid": "u-1", "sluice.io/job-id": "7",
                                  "sluice.io/attempt": "1", "sluice.io/pod-set": "job",
                                  "app.kubernetes.io/managed-by": "sluice"}
    assert template["annotations"] == {"sluice.io/gang-size": "2", "sluice.io/pod-set-index": "0",
                                       "sluice.io/created-at": CREATED, "sluice.io/max-runtime": "1h"}
    assert running["spec"]["template"]["spec"] == user_job()["spec"]["template"]["spec"]  # immutable: untouched
    released = merge_patch(running, release_patch(running))
    assert released["spec"]["suspend"] is True and attempt_key(released) is None and adopted(released)
    assert release_patch(running)["metadata"]["resourceVersion"] == "41"  # not a Job that finished since


def test_an_adopted_job_is_kept_off_the_nodes_its_dispatch_names_with_its_own_node_affinity_kept():
    own = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]},
                                 {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In",
                                                                     "values": ["z1"]}]}}]
    job = user_job()
    job["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": own,
                         "preferredDuringSchedulingIgnoredDuringExecution": preferred},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    plan = plan_attempt(7, 1, origin_document(), ClusterSettings(namespaces={"vision": "team-a"}), CREATED)
    running = merge_patch(job, adoption_patch(job, *plan.marks[0], "7-1", ("node-b", "node-c")))
    kubernetes_validate.validate(running, "1.33", strict=True)
    off = {"key": "metadata.name", "operator": "NotIn", "values": ["node-b", "node-c"]}
    affinity = running["spec"]["template"]["spec"]["affinity"]
    # Each of the Job's own terms (ORed) also keeps off the nodes; what else it said stays as it was.
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{**term, "matchFields": [off]} for term in own["nodeSelectorTerms"]]}
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert affinity["podAntiAffinity"] == job["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert {k: v for k, v in running["spec"]["template"]["spec"].items() if k != "affinity"} == \
        {k: v for k, v in job["spec"]["template"]["spec"].items() if k != "affinity"}
    # Without nodes to keep off, the pod template's spec is left alone.
    assert "spec" not in adoption_patch(job, *plan.marks[0], "7-1")["spec"]["template"]
    bare = merge_patch(user_job(), adoption_patch(user_job(), *plan.marks[0], "7-1", ("node-b",)))
    assert bare["spec"]["template"]["spec"]["affinity"] == {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]}]}]}}}


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


def _shaped(keys: list[str], inner: st.SearchStrategy) -> st.SearchStrategy:
    """Anything, or an object with some of these keys holding `inner`: a user's affinity, right or wrong at
    every level."""
    return st.fixed_dictionaries({key: inner for key in keys}) \
        | st.fixed_dictionaries({}, optional={key: inner for key in keys}) | _JSON


_TERMS = _JSON | st.lists(_shaped(["matchFields", "matchExpressions"], _JSON), max_size=3)
_NODE_AFFINITY = _shaped(["requiredDuringSchedulingIgnoredDuringExecution",
                          "preferredDuringSchedulingIgnoredDuringExecution"], _shaped(["nodeSelectorTerms"], _TERMS))
_AFFINITY = _shaped(["nodeAffinity", "podAntiAffinity"], _NODE_AFFINITY)


@settings(max_examples=300, deadline=None)
@given(affinity=_AFFINITY)
@example(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchFields": 5}]}}})
def test_adopting_a_job_whatever_its_affinity_says_never_fails_and_keeps_every_required_term_off_the_nodes(
        affinity):
    """A user's Job is what a user wrote: the patch is made whatever its template's affinity holds. Where its
    required node terms are a list of terms, each keeps off the nodes; anything else is left as it was, for the
    API server to judge (it refuses the patch, and the agent makes a copy)."""
    job = user_job()
    job["spec"]["template"]["spec"]["affinity"] = affinity
    plan = plan_attempt(7, 1, origin_document(), ClusterSettings(namespaces={"vision": "team-a"}), CREATED)
    running = merge_patch(job, adoption_patch(job, *plan.marks[0], "7-1", ("node-b",)))
    after = running["spec"]["template"]["spec"].get("affinity")
    node = after.get("nodeAffinity") if isinstance(after, dict) else None
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(node, dict) else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if isinstance(terms, list) and all(isinstance(t, dict) and isinstance(t.get("matchFields") or [], list)
                                       for t in terms):
        off = {"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]}
        assert terms and all(off in (t.get("matchFields") or []) for t in terms)
    if isinstance(affinity, dict):  # the rest of the affinity (pod affinity, anti-affinity) is not touched
        assert {k: v for k, v in after.items() if k != "nodeAffinity"} == \
            {k: v for k, v in affinity.items() if k != "nodeAffinity"}
    else:
        assert after == affinity


def test_plan_marks_are_the_labels_and_annotations_of_each_pod_set_s_objects():
    plan = plan_attempt(12, 3, job(pod_set(), pod_set("ps", 1)), ClusterSettings(workload="jobs"), CREATED)
    for mark, manifest in zip(plan.marks, plan.manifests, strict=True):
        assert mark == (manifest["metadata"]["labels"], manifest["metadata"]["annotations"])


# -- status ------------------------------------------------------------------------------------------

def pod(name, phase="Pending", *, container=None, deleting=False, scheduled=None, gang=2, reason=None):
    obj = {"metadata": {"name": name, "namespace": "vision",
                        "annotations": {"sluice.io/gang-size": str(gang), "sluice.io/created-at": CREATED,
                                        "sluice.io/max-runtime": "2h"}},
           "spec": {}, "status": {"phase": phase}}
    if deleting:
        obj["metadata"]["deletionTimestamp"] = CREATED
    if container is not None:
        obj["status"]["containerStatuses"] = [{"name": "main", **container}]
    if scheduled is not None:
        obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "message": scheduled}]
    if reason is not None:
        obj["status"]["reason"] = reason
    return obj


def evaluate(*pods, now=T0 + 1, **kwargs):
    return ks.evaluate(list(pods), [], now=now, gang_timeout_s=300, pull_grace_s=30, **kwargs)


def test_gang_states():
    assert evaluate(pod("a"), pod("b")).state == "PENDING"
    assert evaluate(pod("a", "Running"), pod("b")).state == "PENDING"
    assert evaluate(pod("a", "Running")).state == "PENDING"  # one of two pods exists
    assert evaluate(pod("a", "Running"), pod("b", "Running")).state == "RUNNING"
    assert evaluate(pod("a", "Succeeded"), pod("b", "Running")).state == "RUNNING"
    assert evaluate(pod("a", "Succeeded"), pod("b", "Succeeded")) == ks.Verdict("SUCCEEDED")


def test_failures_carry_the_container_reason_and_exit_code():
    failed = evaluate(pod("a", "Failed", container={"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}),
                      pod("b", "Running"))
    assert failed == ks.Verdict("FAILED", "pod a failed: container main exited with code 137 (OOMKilled)", 137,
                                ks.CLEANUP_UNFINISHED)
    deadline = evaluate(pod("a", "Failed", reason="DeadlineExceeded"), pod("b", "Running"))
    assert (deadline.state, deadline.reason) == ("FAILED", "exceeded maxRuntime 2h")
    crash = evaluate(pod("a", "Running", container={"restartCount": 7,
                                                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                                    "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}}}),
                     pod("b", "Running"))
    assert (crash.state, crash.exit_code) == ("FAILED", 2) and "restarted 7 times, last exit code 2" in crash.reason


def test_image_errors_fail_after_the_grace_invalid_names_at_once():
    pulling = pod("a", container={"state": {"waiting": {"reason": "ImagePullBackOff",
                                                        "message": "pull access denied"}}})
    key = ks.waiting_key(pulling, "main", "ImagePullBackOff")
    assert evaluate(pulling, pod("b"), waiting_since={key: T0}, now=T0 + 29).state == "PENDING"
    late = evaluate(pulling, pod("b"), waiting_since={key: T0}, now=T0 + 30)
    assert late.state == "FAILED" and late.reason == \
        "pod a failed: container main cannot start: ImagePullBackOff: pull access denied"
    invalid = pod("a", container={"state": {"waiting": {"reason": "InvalidImageName", "message": "bad"}}})
    assert evaluate(invalid, pod("b")).state == "FAILED"


def test_a_failed_pod_of_an_adopted_job_fails_the_attempt_whatever_its_replacements_do():
    failed = pod("train-x1", "Failed", container={"state": {"terminated": {"exitCode": 1, "reason": "Error"}}})
    job = {"metadata": {"name": "train", "annotations": {"sluice.io/gang-size": "2", "sluice.io/adopted": "7-1"}},
           "spec": {"backoffLimit": 3},
           "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    replaced = ks.evaluate([failed, pod("train-x2", "Succeeded"), pod("train-x3", "Succeeded")], [job], now=T0 + 1,
                           gang_timeout_s=300, pull_grace_s=30)
    assert (replaced.state, replaced.exit_code) == ("FAILED", 1) and "pod train-x1 failed" in replaced.reason


def test_an_adopted_job_its_owner_deletes_is_no_loss_its_pods_deleted_are():
    job = {"metadata": {"name": "train", "deletionTimestamp": CREATED,
                        "annotations": {"sluice.io/gang-size": "2", "sluice.io/adopted": "7-1"}}}
    running = [pod("train-x1", "Running"), pod("train-x2", "Running")]
    assert ks.evaluate(running, [job], now=T0 + 1, gang_timeout_s=300, pull_grace_s=30).state == "RUNNING"
    copy = {"metadata": {**job["metadata"], "annotations": {"sluice.io/gang-size": "2"}}}
    assert ks.evaluate(running, [copy], now=T0 + 1, gang_timeout_s=300, pull_grace_s=30).state == "LOST"
    deleted = [running[0], pod("train-x2", "Running", deleting=True)]
    assert ks.evaluate(deleted, [job], now=T0 + 1, gang_timeout_s=300, pull_grace_s=30).state == "LOST"


def test_gang_timeout_and_pods_deleted_outside_sluice():
    late = evaluate(pod("a", "Running"), pod("b", scheduled="0/3 nodes are available: 3 Insufficient cpu."),
                    now=T0 + 300)
    assert late == ks.Verdict("UNSCHEDULABLE", "the gang did not start within 5m: 1 of 2 pods running; pod b: "
                                               "0/3 nodes are available: 3 Insufficient cpu.", 0, ks.CLEANUP_ALL)
    assert evaluate(pod("a", "Running"), pod("b"), now=T0 + 299).state == "PENDING"
    lost = evaluate(pod("a", "Running"), pod("b", "Running", deleting=True))
    assert (lost.state, lost.cleanup) == ("LOST", ks.CLEANUP_ALL) and "b deleted outside Sluice" in lost.reason
    assert evaluate(pod("a", "Running"), was_complete=True).state == "LOST"


def test_capacity_counts_usable_nodes_and_active_pods():
    def node(name, cpu, ready=True, unschedulable=False):
        return {"metadata": {"name": name}, "spec": {"unschedulable": unschedulable},
                "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                           "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    nodes = [node("a", "8"), node("b", "4"), node("cordoned", "64", unschedulable=True),
             node("down", "64", ready=False)]
    pods = [ks.PodUsage("a", {"cpu": 6000}, True), ks.PodUsage("b", {"cpu": 1000}, True),
            ks.PodUsage(None, {"cpu": 500}, True), ks.PodUsage("a", {"cpu": 2000}, False),
            ks.PodUsage("cordoned", {"cpu": 9000}, True)]
    report = ks.capacity(nodes, pods)
    gi8 = 8 * 2**30 * 1000
    assert report.allocatable == {"cpu": 12000, "memory": 2 * gi8}
    assert report.free == {"cpu": 12000 - 6000 - 1000 - 500, "memory": 2 * gi8}
    assert report.largest_free_node == {"cpu": 3000, "memory": gi8}
    # Each usable node's own free capacity (node name order), for placement's packing of gangs (issue 24).
    assert report.node_free == ({"cpu": 2000, "memory": gi8}, {"cpu": 3000, "memory": gi8})
    assert ks.usage_of({"spec": {"nodeName": "a", "containers": [
        {"name": "m", "image": "x", "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}}]},
        "status": {"phase": "Running"}}) == ks.PodUsage("a", {"cpu": 1000, "memory": 2**30 * 1000}, True)


def _container(name: str) -> st.SearchStrategy:
    """A container `sluice submit` takes (a name and an image), anything in the fields it passes through."""
    return st.fixed_dictionaries({"name": st.just(name), "image": st.just("train:1")}, optional={
        "env": st.lists(st.fixed_dictionaries({}, optional={"name": _JSON | st.just("SLUICE_ARRAY_ID"),
                                                            "value": _JSON}) | _JSON, max_size=2) | _JSON,
        "resources": st.just({"requests": {"cpu": "1"}}) | _JSON, "securityContext": _JSON,
        "volumeMounts": _JSON, "ports": _JSON, "envFrom": _JSON})


# Pod sets `sluice submit` takes (a name, a count, a template with containers), anything in what they pass
# through: the template's metadata and the pod spec's other fields.
_POD_SETS = st.lists(st.fixed_dictionaries({
    "count": st.integers(1, 3),
    "template": st.fixed_dictionaries({"spec": st.fixed_dictionaries(
        {"containers": st.lists(st.sampled_from(["main", "side"]), min_size=1, max_size=2, unique=True).flatmap(
            lambda names: st.tuples(*map(_container, names)).map(list))},
        optional={"initContainers": st.lists(_container("init"), max_size=1) | _JSON, "volumes": _JSON,
                  "ephemeralContainers": _JSON, "restartPolicy": st.sampled_from(["Never", "OnFailure"]) | _JSON,
                  "activeDeadlineSeconds": _JSON, "hostNetwork": _JSON, "hostPID": _JSON,
                  "serviceAccountName": _JSON, "securityContext": _JSON, "affinity": _AFFINITY,
                  "tolerations": _JSON, "nodeSelector": _JSON})},
        optional={"metadata": st.fixed_dictionaries({}, optional={"labels": _JSON, "annotations": _JSON,
                                                                  "namespace": _JSON}) | _JSON})}),
    min_size=1, max_size=2).map(lambda sets: [{"name": f"set{i}", **s} for i, s in enumerate(sets)])


@settings(max_examples=200, deadline=None)
@given(pod_sets=_POD_SETS, max_runtime=st.none() | st.just("1h") | _JSON, element=st.booleans(),
       workload=st.sampled_from(["pods", "jobs"]), avoid=st.sampled_from([(), ("node-b",)]))
@example(pod_sets=[pod_set(volumes=5)], max_runtime=None, element=False, workload="pods", avoid=())
@example(pod_sets=[pod_set(ephemeralContainers=5)], max_runtime=None, element=False, workload="jobs", avoid=())
@example(pod_sets=[{"name": "worker", "count": 1, "template": {"metadata": {"labels": []}, "spec": {
    "containers": [{"name": "main", "image": "train:1"}]}}}], max_runtime=None, element=False, workload="pods",
    avoid=())
@example(pod_sets=[pod_set(containers=[{"name": "main", "image": "train:1", "env": [{"name": []}]}])],
         max_runtime=None, element=True, workload="pods", avoid=())
def test_any_job_document_submit_takes_is_planned_or_refused_never_an_error(pod_sets, max_runtime, element,
                                                                             workload, avoid):
    """What a dispatch carries is a job document `sluice submit` took, which checks what Sluice needs of a pod
    template and passes the rest through (sluice/spec.py): planning it makes manifests or refuses it (FAILED,
    with why), and never raises anything else, which would fail the command each time it came again."""
    try:
        taken = job_from_document(job(*pod_sets, **({} if max_runtime is None else {"maxRuntime": max_runtime})))
    except SpecError:
        return  # refused at submit: it never reaches an agent
    document = taken.to_document()
    if element:  # the dispatcher's document of an array's element
        document["spec"].update(arrayId=4, arrayIndex=1)
    try:
        plan_attempt(12, 3, document, ClusterSettings(workload=workload), CREATED, avoid)
    except Refused:
        pass
