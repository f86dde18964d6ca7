"""Job files: both job kinds, every validation rule with its exact path and message, and round trips."""
import copy
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice import spec as spec_module
from sluice.documents import parse_documents, parse_numbered_documents
from sluice.spec import (
    JobSpec,
    Placement,
    PodSet,
    SpecError,
    job_from_document,
    load_jobs,
    pod_requests,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GI = 2**30 * 1000  # one Gi in milli-units


def container(name="main", **resources):
    out = {"name": name, "image": "busybox:1.36"}
    if resources:
        out["resources"] = resources
    return out


def sluice_doc(**spec):
    """A minimal valid Sluice Job document; spec fields given replace (None removes) the defaults."""
    base = {"queue": "vision",
            "podSets": [{"name": "worker", "count": 2,
                         "template": {"spec": {"containers": [container(requests={"cpu": "1"})]}}}]}
    base.update(spec)
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": "train"},
            "spec": {k: v for k, v in base.items() if v is not None}}


def k8s_doc(annotations=None, **spec):
    base = {"parallelism": 3, "template": {"spec": {"containers": [container(requests={"cpu": "500m"})]}}}
    base.update(spec)
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "k", "annotations": {"sluice.io/queue": "vision", **(annotations or {})}},
            "spec": {k: v for k, v in base.items() if v is not None}}


def error(doc, **kwargs) -> SpecError:
    with pytest.raises(SpecError) as info:
        job_from_document(doc, **kwargs)
    return info.value


def pod_set_with(**template_spec):
    return [{"name": "worker", "count": 1, "template": {"spec": template_spec}}]


# -- the Sluice Job ----------------------------------------------------------------------------------

def test_full_sluice_job():
    doc = yaml.safe_load("""
apiVersion: sluice.io/v1
kind: Job
metadata:
  name: train-resnet
  labels: {project: imagenet, example.com/team: vision}
spec:
  queue: vision
  serviceClass: standard
  priority: -5
  podSets:
  - name: worker
    count: 4
    template:
      metadata: {annotations: {sluice.io/sim-duration: 3s}}
      spec:
        containers:
        - name: main
          image: registry.example/train:1.2
          resources: {requests: {cpu: "8", memory: 32Gi, nvidia.com/gpu: "1"}}
  - name: ps
    count: 1
    template:
      spec:
        containers: [{name: ps, image: ps:1, resources: {requests: {cpu: 16, memory: 8Gi}}}]
  placement:
    clusterSelector: {region: eu}
    tiers: [onprem, cloud]
    sites: [edge-1]
  maxRetries: 0
  maxRuntime: 2h
""")
    job = job_from_document(doc)
    assert job.name == "train-resnet"
    assert job.labels == {"project": "imagenet", "example.com/team": "vision"}
    assert (job.queue, job.service_class, job.priority) == ("vision", "standard", -5)
    assert [(p.name, p.count) for p in job.pod_sets] == [("worker", 4), ("ps", 1)]
    assert job.pod_sets[0].requests == {"cpu": 8000, "memory": 32 * GI, "nvidia.com/gpu": 1000}
    assert job.pod_sets[0].template == doc["spec"]["podSets"][0]["template"]
    assert job.placement == Placement({"region": "eu"}, ("onprem", "cloud"), ("edge-1",))
    assert (job.max_retries, job.max_runtime_s) == (0, 7200.0)
    assert job.pod_count() == 5
    assert job.total_requests() == {"cpu": 48000, "memory": 136 * GI, "nvidia.com/gpu": 4000}
    assert job.largest_pod() == {"cpu": 16000, "memory": 32 * GI, "nvidia.com/gpu": 1000}


def test_defaults():
    doc = sluice_doc()
    del doc["metadata"]
    job = job_from_document(doc)
    assert job.name is None and job.labels == {}
    assert job.service_class is None and job.priority == 0
    assert job.placement == Placement() == Placement({}, (), ())
    assert (job.max_retries, job.max_runtime_s) == (2, None)


def test_explicit_nulls_read_as_absent():
    doc = sluice_doc()
    doc["metadata"] = {"name": None, "labels": None}
    doc["spec"].update(serviceClass=None, priority=None, placement=None, maxRetries=None, maxRuntime=None)
    bare = sluice_doc()
    bare["metadata"] = {}
    assert job_from_document(doc) == job_from_document(bare)


def test_the_document_is_not_shared_with_the_job():
    doc = sluice_doc()
    job = job_from_document(doc)
    doc["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["image"] = "changed"
    assert job.pod_sets[0].template["spec"]["containers"][0]["image"] == "busybox:1.36"
    job.to_document()["spec"]["podSets"][0]["template"]["spec"]["containers"].clear()
    assert job.pod_sets[0].template["spec"]["containers"]


def test_to_document_is_canonical():
    job = job_from_document(sluice_doc(maxRuntime="90m"))
    assert job.to_document() == {
        "apiVersion": "sluice.io/v1", "kind": "Job",
        "metadata": {"name": "train", "labels": {}},
        "spec": {"queue": "vision", "priority": 0,
                 "podSets": [{"name": "worker", "count": 2,
                              "template": sluice_doc()["spec"]["podSets"][0]["template"]}],
                 "placement": {"clusterSelector": {}, "tiers": [], "sites": []},
                 "maxRetries": 2, "maxRuntime": "90m"}}


@pytest.mark.parametrize("doc, path, message", [
    ({"kind": "Job", "spec": {}}, "apiVersion", "required: sluice.io/v1 (or batch/v1 for a Kubernetes Job)"),
    ({"apiVersion": "v1", "kind": "Job"}, "apiVersion",
     "must be sluice.io/v1 (or batch/v1 for a Kubernetes Job), got string 'v1'"),
    ({"apiVersion": "sluice.io/v1", "kind": "Pod"}, "kind", "must be Job, got string 'Pod'"),
    ({"apiVersion": "sluice.io/v1"}, "kind", "must be Job, got null"),
    ({"apiVersion": "sluice.io/v1", "kind": "Queue"}, "kind",
     "must be Job, got string 'Queue' (admin objects are applied with `sluice admin apply`)"),
    ({"apiVersion": "batch/v1", "kind": "CronJob"}, "kind", "must be Job, got string 'CronJob'"),
])
def test_api_version_and_kind(doc, path, message):
    err = error(doc)
    assert (err.path, err.message) == (path, message)


def test_document_must_be_a_mapping():
    err = error(["not", "a", "job"])
    assert (err.path, err.message) == ("", "must be a mapping, got list")


def edit(doc, dotted, value):
    """Set doc at a dotted path (list indexes as numbers); value None deletes."""
    *parents, last = dotted.split(".")
    target = doc
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    elif value is None:
        del target[last]
    else:
        target[last] = value
    return doc


CONTAINER = "spec.podSets.0.template.spec.containers.0"


@pytest.mark.parametrize("where, value, path, message", [
    # the envelope
    ("status", {}, "status", "unknown field (known: apiVersion, kind, metadata, spec)"),
    ("metadata", "train", "metadata", "must be a mapping, got string 'train'"),
    ("metadata.annotations", {}, "metadata.annotations", "unknown field (known: name, labels)"),
    ("metadata.label", {}, "metadata.label", "unknown field (did you mean labels?)"),
    ("metadata.name", 7, "metadata.name", 'must be a string, got integer 7 (quote it: "7")'),
    ("metadata.name", "", "metadata.name", "must not be empty"),
    ("metadata.name", "x" * 254, "metadata.name", "is 254 characters long, at most 253 allowed"),
    ("spec", None, "spec", "required"),
    ("spec", [], "spec", "must be a mapping, got list"),
    ("spec.podSet", [], "spec.podSet", "unknown field (did you mean podSets?)"),
    ("spec.retries", 3, "spec.retries", "unknown field (did you mean maxRetries?)"),
    ("spec.zzz", 3, "spec.zzz", "unknown field (known: queue, serviceClass, priority, podSets, placement, "
                                "maxRetries, maxRuntime, startAfter, dependsOn, array, interactive, idleTimeout)"),
    # labels
    ("metadata.labels", ["a"], "metadata.labels", "must be a mapping, got list"),
    ("metadata.labels", {"team": 5}, "metadata.labels.team", 'must be a string, got integer 5 (quote it: "5")'),
    ("metadata.labels", {"team": True}, "metadata.labels.team", "must be a string, got boolean True"),
    ("metadata.labels", {"team": "x" * 64}, "metadata.labels.team", "is 64 characters long, at most 63 allowed"),
    ("metadata.labels", {5: "x"}, "metadata.labels", "label keys must be non-empty strings, got integer 5"),
    ("metadata.labels", {"k" * 64: "x"}, "metadata.labels." + "k" * 64,
     "key must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit "
     "(optionally after a prefix such as 'a.b/')"),
    ("metadata.labels", {"a b": "x"}, "metadata.labels.a b",
     "key must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit "
     "(optionally after a prefix such as 'a.b/')"),
    ("metadata.labels", {"Bad_Prefix/x": "x"}, "metadata.labels.Bad_Prefix/x",
     "key prefix 'Bad_Prefix' must be a DNS subdomain of at most 253 characters"),
    ("metadata.labels", {"/x": "x"}, "metadata.labels./x",
     "key prefix '' must be a DNS subdomain of at most 253 characters"),
    # queue, class, priority
    ("spec.queue", "Vision", "spec.queue", "'Vision' is not a valid name (lowercase letters, digits, '-', '_' "
                                           "and '.', starting and ending with a letter or digit)"),
    ("spec.queue", "-x", "spec.queue", "'-x' is not a valid name (lowercase letters, digits, '-', '_' "
                                       "and '.', starting and ending with a letter or digit)"),
    ("spec.queue", "q" * 64, "spec.queue", "is 64 characters long, at most 63 allowed"),
    ("spec.queue", 3, "spec.queue", 'must be a string, got integer 3 (quote it: "3")'),
    ("spec.serviceClass", "gold!", "spec.serviceClass",
     "'gold!' is not a valid name (lowercase letters, digits, '-', '_' and '.', starting and ending with a "
     "letter or digit)"),
    ("spec.priority", 1001, "spec.priority", "must be at most 1000"),
    ("spec.priority", -1001, "spec.priority", "must be at least -1000"),
    ("spec.priority", True, "spec.priority", "must be an integer, got boolean True"),
    ("spec.priority", "5", "spec.priority", "must be an integer, got string '5'"),
    ("spec.priority", 1.5, "spec.priority", "must be an integer, got number 1.5"),
    # pod sets
    ("spec.podSets", None, "spec.podSets", "required"),
    ("spec.podSets", [], "spec.podSets", "must not be empty"),
    ("spec.podSets", {"name": "x"}, "spec.podSets", "must be a list, got mapping"),
    ("spec.podSets.0", "worker", "spec.podSets[0]", "must be a mapping, got string 'worker'"),
    ("spec.podSets.0.replicas", 2, "spec.podSets[0].replicas", "unknown field (known: name, count, template)"),
    ("spec.podSets.0.cont", 2, "spec.podSets[0].cont", "unknown field (did you mean count?)"),
    ("spec.podSets.0.name", None, "spec.podSets[0].name", "required"),
    ("spec.podSets.0.name", "Worker", "spec.podSets[0].name",
     "'Worker' is not a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit)"),
    ("spec.podSets.0.name", "a_b", "spec.podSets[0].name",
     "'a_b' is not a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit)"),
    ("spec.podSets.0.name", "w" * 64, "spec.podSets[0].name", "is 64 characters long, at most 63 allowed"),
    ("spec.podSets.0.count", None, "spec.podSets[0].count", "required"),
    ("spec.podSets.0.count", "four", "spec.podSets[0].count", "must be an integer, got string 'four'"),
    ("spec.podSets.0.count", "4", "spec.podSets[0].count", "must be an integer, got string '4'"),
    ("spec.podSets.0.count", True, "spec.podSets[0].count", "must be an integer, got boolean True"),
    ("spec.podSets.0.count", 4.0, "spec.podSets[0].count", "must be an integer, got number 4.0"),
    ("spec.podSets.0.count", 0, "spec.podSets[0].count", "must be at least 1"),
    ("spec.podSets.0.count", 10001, "spec.podSets[0].count", "must be at most 10000"),
    ("spec.podSets.0.template", None, "spec.podSets[0].template", "required"),
    ("spec.podSets.0.template", [], "spec.podSets[0].template", "must be a mapping, got list"),
    ("spec.podSets.0.template.spec", None, "spec.podSets[0].template.spec", "required"),
    # Every agent puts Sluice's labels and annotations beside the template's own.
    ("spec.podSets.0.template.metadata", [], "spec.podSets[0].template.metadata", "must be a mapping, got list"),
    ("spec.podSets.0.template.metadata", {"labels": ["a"]}, "spec.podSets[0].template.metadata.labels",
     "must be a mapping, got list"),
    ("spec.podSets.0.template.metadata", {"annotations": "x"}, "spec.podSets[0].template.metadata.annotations",
     "must be a mapping, got string 'x'"),
    ("spec.podSets.0.template.spec.containers", None, "spec.podSets[0].template.spec.containers", "required"),
    ("spec.podSets.0.template.spec.containers", [], "spec.podSets[0].template.spec.containers",
     "must not be empty"),
    ("spec.podSets.0.template.spec.containers", {"name": "x"}, "spec.podSets[0].template.spec.containers",
     "must be a list, got mapping"),
    (CONTAINER, "busybox", "spec.podSets[0].template.spec.containers[0]", "must be a mapping, got string 'busybox'"),
    (CONTAINER + ".name", None, "spec.podSets[0].template.spec.containers[0].name", "required"),
    (CONTAINER + ".image", None, "spec.podSets[0].template.spec.containers[0].image", "required"),
    (CONTAINER + ".image", ["x"], "spec.podSets[0].template.spec.containers[0].image",
     "must be a string, got list"),
    (CONTAINER + ".resources", "lots", "spec.podSets[0].template.spec.containers[0].resources",
     "must be a mapping, got string 'lots'"),
    (CONTAINER + ".resources", {"requests": {"memory": "1GB"}},
     "spec.podSets[0].template.spec.containers[0].resources.requests.memory",
     "'1GB' is not a quantity (examples: '500m', '2', '32Gi', '1.5')"),
    (CONTAINER + ".resources", {"requests": {"cpu": -1}},
     "spec.podSets[0].template.spec.containers[0].resources.requests.cpu",
     "-1 is not a quantity (examples: '500m', '2', '32Gi', '1.5')"),
    (CONTAINER + ".resources", {"requests": {"cpu": True}},
     "spec.podSets[0].template.spec.containers[0].resources.requests.cpu",
     "expected a quantity such as '500m', '32Gi' or 8, got True"),
    (CONTAINER + ".resources", {"limits": {"cpu": "lots"}},
     "spec.podSets[0].template.spec.containers[0].resources.limits.cpu",
     "'lots' is not a quantity (examples: '500m', '2', '32Gi', '1.5')"),
    (CONTAINER + ".resources", {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}},
     "spec.podSets[0].template.spec.containers[0].resources.requests.cpu", "must not exceed the limit (1500m)"),
    (CONTAINER + ".resources", {"requests": ["cpu"]},
     "spec.podSets[0].template.spec.containers[0].resources.requests", "must be a mapping, got list"),
    # placement
    ("spec.placement", ["onprem"], "spec.placement", "must be a mapping, got list"),
    ("spec.placement", {"tier": ["onprem"]}, "spec.placement.tier", "unknown field (did you mean tiers?)"),
    ("spec.placement", {"tiers": ["moon"]}, "spec.placement.tiers[0]",
     "must be one of onprem, cloud, edge, got string 'moon'"),
    ("spec.placement", {"tiers": "cloud"}, "spec.placement.tiers", "must be a list, got string 'cloud'"),
    ("spec.placement", {"clusterSelector": {"region": 1}}, "spec.placement.clusterSelector.region",
     'must be a string, got integer 1 (quote it: "1")'),
    ("spec.placement", {"clusterSelector": ["eu"]}, "spec.placement.clusterSelector", "must be a mapping, got list"),
    ("spec.placement", {"sites": ["dc-1", ""]}, "spec.placement.sites[1]", "must not be empty"),
    ("spec.placement", {"sites": [1]}, "spec.placement.sites[0]", 'must be a string, got integer 1 (quote it: "1")'),
    # retries and runtime
    ("spec.maxRetries", -1, "spec.maxRetries", "must be at least 0"),
    ("spec.maxRetries", 101, "spec.maxRetries", "must be at most 100"),
    ("spec.maxRetries", "2", "spec.maxRetries", "must be an integer, got string '2'"),
    ("spec.maxRetries", False, "spec.maxRetries", "must be an integer, got boolean False"),
    ("spec.maxRuntime", "0s", "spec.maxRuntime", "must be longer than 0s"),
    ("spec.maxRuntime", 0, "spec.maxRuntime", "must be longer than 0s"),
    ("spec.maxRuntime", "2 hours", "spec.maxRuntime",
     "'2 hours' is not a duration (examples: '90s', '10m', '2h', '1d')"),
    ("spec.maxRuntime", -5, "spec.maxRuntime", "duration -5 is negative"),
    ("spec.maxRuntime", True, "spec.maxRuntime", "expected a duration such as '90s', '10m', '2h', got True"),
    ("spec.maxRuntime", float("inf"), "spec.maxRuntime", "must be a finite duration"),
])
def test_sluice_job_validation(where, value, path, message):
    doc = edit(sluice_doc(), where, value)
    err = error(copy.deepcopy(doc))
    assert (err.path, err.message) == (path, message)
    assert spec_module._plain_job(doc, False) is None  # and the full checks word the error
    assert str(err) == f"{path}: {message}" if path else message


def test_queue_is_required():
    err = error(sluice_doc(queue=None))
    assert (err.path, err.message) == ("spec.queue", "required (or give --queue)")


def test_duplicate_pod_set_names():
    pod_set = sluice_doc()["spec"]["podSets"][0]
    err = error(sluice_doc(podSets=[pod_set, copy.deepcopy(pod_set)]))
    assert (err.path, err.message) == ("spec.podSets[1].name", "pod set 'worker' is defined twice")


def test_at_most_16_pod_sets():
    template = sluice_doc()["spec"]["podSets"][0]["template"]
    pod_sets = [{"name": f"p{i}", "count": 1, "template": template} for i in range(17)]
    err = error(sluice_doc(podSets=pod_sets))
    assert (err.path, err.message) == ("spec.podSets", "has 17 entries, at most 16 allowed")
    assert job_from_document(sluice_doc(podSets=pod_sets[:16])).pod_count() == 16


def test_at_most_100000_pods_in_total():
    template = sluice_doc()["spec"]["podSets"][0]["template"]
    pod_sets = [{"name": f"p{i}", "count": 10000, "template": template} for i in range(11)]
    err = error(sluice_doc(podSets=pod_sets))
    assert (err.path, err.message) == ("spec.podSets", "110000 pods in total, at most 100000 allowed")
    assert job_from_document(sluice_doc(podSets=pod_sets[:10])).pod_count() == 100000


def test_container_names_are_unique_across_init_and_main_containers():
    err = error(sluice_doc(podSets=pod_set_with(initContainers=[container("main")], containers=[container("main")])))
    assert (err.path, err.message) == ("spec.podSets[0].template.spec.containers[0].name",
                                       "container 'main' is defined twice")


def test_init_containers_are_checked_like_containers():
    err = error(sluice_doc(podSets=pod_set_with(initContainers=[{"name": "init"}], containers=[container()])))
    assert (err.path, err.message) == ("spec.podSets[0].template.spec.initContainers[0].image", "required")


def test_pod_templates_pass_through_untouched():
    template = {"metadata": {"labels": {"app": "x"}, "annotations": {"sluice.io/sim-exit-code": "3"}},
                "spec": {"containers": [container(env=[{"name": "A", "value": "1"}], ports=[{"containerPort": 80}])],
                         "nodeSelector": {"disk": "ssd"}, "tolerations": [{"key": "gpu"}], "someFutureField": 1}}
    job = job_from_document(sluice_doc(podSets=[{"name": "w", "count": 1, "template": template}]))
    assert job.pod_sets[0].template == template


# -- effective requests ------------------------------------------------------------------------------

def requests_of(**template_spec):
    return job_from_document(sluice_doc(podSets=pod_set_with(**template_spec))).pod_sets[0].requests


def test_requests_sum_over_containers():
    assert requests_of(containers=[container("a", requests={"cpu": "1", "memory": "1Gi"}),
                                   container("b", requests={"cpu": "250m", "nvidia.com/gpu": 1})]) == {
        "cpu": 1250, "memory": GI, "nvidia.com/gpu": 1000}


def test_containers_without_resources_request_nothing():
    assert requests_of(containers=[container("a"), container("b", requests={})]) == {}


def test_init_containers_count_as_their_maximum():
    assert requests_of(
        initContainers=[container("init1", requests={"cpu": "4", "memory": "1Gi"}),
                        container("init2", requests={"cpu": "1", "memory": "8Gi"})],
        containers=[container("a", requests={"cpu": "2", "memory": "2Gi"}),
                    container("b", requests={"cpu": "1", "memory": "1Gi"})]) == {"cpu": 4000, "memory": 8 * GI}


def test_limits_without_requests_become_requests():
    assert requests_of(containers=[
        container("a", limits={"cpu": "2", "memory": "1Gi"}),
        container("b", requests={"cpu": "500m"}, limits={"cpu": "1", "memory": "2Gi"})]) == {
        "cpu": 2500, "memory": 3 * GI}


def test_limits_only_init_container():
    assert requests_of(initContainers=[container("init", limits={"memory": "4Gi"})],
                       containers=[container("a", requests={"memory": "1Gi", "cpu": "1"})]) == {
        "cpu": 1000, "memory": 4 * GI}


def test_sidecars_run_next_to_the_containers_and_later_init_containers():
    assert requests_of(
        initContainers=[container("sidecar", requests={"cpu": "1"}) | {"restartPolicy": "Always"},
                        container("init", requests={"cpu": "3"})],
        containers=[container("a", requests={"cpu": "1"})]) == {"cpu": 4000}
    assert requests_of(
        initContainers=[container("sidecar", requests={"cpu": "1"}) | {"restartPolicy": "Always"}],
        containers=[container("a", requests={"cpu": "1"})]) == {"cpu": 2000}


def test_pod_overhead_is_added():
    assert requests_of(containers=[container(requests={"cpu": "1"})], overhead={"cpu": "100m", "memory": "64Mi"}) == {
        "cpu": 1100, "memory": 64 * 2**20 * 1000}


def test_fractional_requests_round_up_to_milli_units():
    assert requests_of(containers=[container(requests={"cpu": "0.0001", "memory": "1.5"})]) == {
        "cpu": 1, "memory": 1500}


def test_pod_requests_directly():
    assert pod_requests({"spec": {"containers": [container(requests={"cpu": 2})]}}) == {"cpu": 2000}
    with pytest.raises(SpecError) as info:
        pod_requests({"spec": {"containers": []}})
    assert info.value.path == "template.spec.containers"


# -- Kubernetes batch/v1 Jobs ------------------------------------------------------------------------

def test_kubernetes_job():
    doc = k8s_doc(annotations={"sluice.io/service-class": "batch", "sluice.io/priority": " -7 "},
                  activeDeadlineSeconds=600, backoffLimit=6, completions=3)
    doc["metadata"]["labels"] = {"app": "x"}
    job = job_from_document(doc)
    assert (job.name, job.labels) == ("k", {"app": "x"})
    assert (job.queue, job.service_class, job.priority) == ("vision", "batch", -7)
    assert len(job.pod_sets) == 1
    pod_set = job.pod_sets[0]
    assert (pod_set.name, pod_set.count, pod_set.requests) == ("job", 3, {"cpu": 500})
    assert pod_set.template == doc["spec"]["template"]
    assert (job.max_retries, job.max_runtime_s, job.placement) == (6, 600.0, Placement())


def test_kubernetes_job_defaults():
    doc = k8s_doc(parallelism=None)
    del doc["metadata"]["name"]
    job = job_from_document(doc)
    assert (job.name, job.service_class, job.priority, job.pod_count(), job.max_runtime_s) == (
        None, None, 0, 1, None)


def test_kubernetes_job_ignores_fields_sluice_does_not_read():
    doc = k8s_doc(ttlSecondsAfterFinished=100, suspend=False, completionMode="NonIndexed",
                  podReplacementPolicy="Failed", manualSelector=False, selector={"matchLabels": {"a": "b"}})
    doc["status"] = {"active": 1}
    doc["metadata"]["annotations"]["other.io/x"] = "y"
    assert job_from_document(doc).pod_count() == 3


@pytest.mark.parametrize("annotations, spec, path, message", [
    ({"sluice.io/priority": "high"}, {}, "metadata.annotations[sluice.io/priority]", "must be an integer, got 'high'"),
    ({"sluice.io/priority": "2000"}, {}, "metadata.annotations[sluice.io/priority]", "must be at most 1000"),
    ({"sluice.io/priority": 5}, {}, "metadata.annotations[sluice.io/priority]",
     'must be a string, got integer 5 (quote it: "5")'),
    ({"sluice.io/queue": "Vision"}, {}, "metadata.annotations[sluice.io/queue]",
     "'Vision' is not a valid name (lowercase letters, digits, '-', '_' and '.', starting and ending with a "
     "letter or digit)"),
    ({"sluice.io/service-class": ""}, {}, "metadata.annotations[sluice.io/service-class]", "must not be empty"),
    ({}, {"parallelism": 0}, "spec.parallelism", "must be at least 1"),
    ({}, {"parallelism": "2"}, "spec.parallelism", "must be an integer, got string '2'"),
    ({}, {"parallelism": 10001}, "spec.parallelism", "must be at most 10000"),
    ({}, {"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds", "must be at least 1"),
    ({}, {"activeDeadlineSeconds": "1h"}, "spec.activeDeadlineSeconds", "must be an integer, got string '1h'"),
    ({}, {"template": None}, "spec.template", "required"),
    ({}, {"template": {"spec": {"containers": [{"name": "main"}]}}}, "spec.template.spec.containers[0].image",
     "required"),
    ({}, {"template": {"spec": {"containers": [container(requests={"memory": "1 Gi"})]}}},
     "spec.template.spec.containers[0].resources.requests.memory",
     "'1 Gi' is not a quantity (examples: '500m', '2', '32Gi', '1.5')"),
])
def test_kubernetes_job_validation(annotations, spec, path, message):
    err = error(k8s_doc(annotations, **spec))
    assert (err.path, err.message) == (path, message)


def test_kubernetes_job_completions_are_the_gang_or_refused():
    # Sluice runs a Job's pods once, all together: completions can only be the pod count.
    assert job_from_document(k8s_doc(parallelism=2, completions=2)).pod_count() == 2
    assert job_from_document(k8s_doc(parallelism=2)).pod_count() == 2
    err = error(k8s_doc(parallelism=2, completions=6))
    assert (err.path, err.message) == ("spec.completions", (
        "6 is not supported: Sluice runs a Job's pods once, all at the same time (a gang); set completions to "
        "parallelism (2) or leave it out"))
    err = error(k8s_doc(parallelism=None, completions=4))  # Kubernetes would run them one at a time
    assert (err.path, err.message[:43]) == ("spec.completions", "4 is not supported: Sluice runs a Job's pod")
    assert "parallelism (1)" in err.message
    err = error(k8s_doc(completions="3"))
    assert (err.path, err.message) == ("spec.completions", "must be an integer, got string '3'")


def test_kubernetes_job_backoff_limit_is_its_retries():
    assert job_from_document(k8s_doc(backoffLimit=3)).max_retries == 3
    assert job_from_document(k8s_doc(backoffLimit=0)).max_retries == 0
    assert job_from_document(k8s_doc()).max_retries == 2  # not given: Sluice's default, not Kubernetes' 6
    assert job_from_document(k8s_doc(backoffLimit=3)).to_document()["spec"]["maxRetries"] == 3
    err = error(k8s_doc(backoffLimit=101))
    assert (err.path, err.message) == ("spec.backoffLimit", (
        "101 is not supported: it becomes the job's maxRetries (attempts after the first), at most 100"))
    err = error(k8s_doc(backoffLimit=-1))
    assert (err.path, err.message) == ("spec.backoffLimit", "must be at least 0")


@pytest.mark.parametrize("field, value, message", [
    ("completionMode", "Indexed", "'Indexed' is not supported: Sluice does not give every pod a completion index "
                                  "(JOB_COMPLETION_INDEX); leave it out or set NonIndexed"),
    ("completionMode", "indexed", "must be one of NonIndexed, Indexed, got string 'indexed'"),
    ("backoffLimitPerIndex", 1, "not supported: Sluice retries a Job's pods together, as a new attempt "
                                "(use backoffLimit)"),
    ("maxFailedIndexes", 1, "not supported: Sluice retries a Job's pods together, as a new attempt "
                            "(use backoffLimit)"),
    ("podFailurePolicy", {"rules": []}, "not supported: any failed pod fails the attempt, which Sluice retries "
                                        "as a whole up to backoffLimit times"),
    ("successPolicy", {"rules": []}, "not supported: the attempt succeeds when every pod succeeded"),
    ("suspend", True, "true is not supported: Sluice queues the job and starts it when it may run; submit it "
                      "when it should"),
])
def test_kubernetes_job_fields_sluice_cannot_honour_are_refused(field, value, message):
    err = error(k8s_doc(**{field: value}))
    assert (err.path, err.message) == (f"spec.{field}", message)


def test_kubernetes_jobs_read_alike_sent_as_they_are_or_as_the_cli_sends_them():
    """The CLI reads a Kubernetes Job and sends its canonical Sluice form, which the server reads by the
    plain path; sent as it is, the server reads it by the full checks: both read the same job."""
    for doc in (k8s_doc(), k8s_doc(backoffLimit=3, completions=3), k8s_doc(activeDeadlineSeconds=60, backoffLimit=0)):
        job = job_from_document(copy.deepcopy(doc))
        assert spec_module._plain_job(job.to_document(), False) == job
        assert job_from_document(json.loads(json.dumps(job.to_document()))) == job


def test_the_server_refuses_a_kubernetes_job_sent_as_it_is_as_the_cli_does():
    from dispatcher.errors import InvalidRequest
    from dispatcher.services import submitting
    with pytest.raises(InvalidRequest) as refused:
        submitting.parse([json.dumps(k8s_doc(parallelism=2, completions=6))])
    assert str(refused.value).startswith("spec.completions: 6 is not supported: Sluice runs a Job's pods once")
    [job] = submitting.parse([json.dumps(k8s_doc(backoffLimit=3))])
    assert job.max_retries == 3


def test_kubernetes_job_needs_a_spec_and_a_queue():
    err = error({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "k"}})
    assert (err.path, err.message) == ("spec", "required")
    doc = k8s_doc()
    del doc["metadata"]["annotations"]
    err = error(doc)
    assert (err.path, err.message) == ("metadata.annotations[sluice.io/queue]", "required (or give --queue)")


def test_kubernetes_job_round_trips_as_a_sluice_job():
    job = job_from_document(k8s_doc(activeDeadlineSeconds=90))
    assert job.to_document()["apiVersion"] == "sluice.io/v1"
    assert job.to_document()["spec"]["maxRuntime"] == "90s"
    assert job_from_document(job.to_document()) == job


# -- overrides ---------------------------------------------------------------------------------------

def test_overrides_replace_the_document():
    job = job_from_document(sluice_doc(serviceClass="batch"), queue="other", service_class="critical")
    assert (job.queue, job.service_class) == ("other", "critical")
    job = job_from_document(k8s_doc({"sluice.io/service-class": "batch"}), queue="other", service_class="critical")
    assert (job.queue, job.service_class) == ("other", "critical")


def test_queue_override_supplies_a_missing_queue():
    assert job_from_document(sluice_doc(queue=None), queue="q1").queue == "q1"
    doc = k8s_doc()
    del doc["metadata"]["annotations"]["sluice.io/queue"]
    assert job_from_document(doc, queue="q1").queue == "q1"


def test_bad_overrides_name_the_flag():
    err = error(sluice_doc(), queue="Bad Queue")
    assert err.path == "--queue" and "not a valid name" in err.message
    err = error(sluice_doc(), service_class="")
    assert (err.path, err.message) == ("--class", "must not be empty")


def test_the_document_is_checked_even_when_overridden():
    assert error(sluice_doc(queue="BAD"), queue="good").path == "spec.queue"


# -- files -------------------------------------------------------------------------------------------

def test_multi_document_yaml_skips_empty_documents_and_keeps_their_numbers():
    text = "---\n# nothing here\n---\na: 1\n---\n---\nb: 2\n---\n"
    assert parse_documents(text) == [{"a": 1}, {"b": 2}]
    assert parse_numbered_documents(text) == [(2, {"a": 1}), (4, {"b": 2})]


def test_empty_input_has_no_documents():
    assert parse_documents("") == []
    assert parse_documents("# only a comment\n") == []
    assert load_jobs("  \n") == []


def test_json_object_and_array():
    doc = sluice_doc()
    assert parse_documents(json.dumps(doc)) == [doc]
    assert parse_documents("  \n" + json.dumps([doc, None, k8s_doc()])) == [doc, k8s_doc()]
    assert [j.pod_count() for j in load_jobs(json.dumps([doc, k8s_doc()]))] == [2, 3]


def test_yaml_flow_mapping_is_not_mistaken_for_json():
    assert parse_documents("{a: 1, b: [x]}") == [{"a": 1, "b": ["x"]}]


@pytest.mark.parametrize("text, document, message", [
    ("a: 1\n---\n- 1\n- 2\n", 2, "must be a mapping with apiVersion, kind, metadata and spec, got list"),
    ("just a string\n", 1, "must be a mapping with apiVersion, kind, metadata and spec, got string 'just a string'"),
    ('[{"a": 1}, 5]', 2, "must be a mapping with apiVersion, kind, metadata and spec, got integer 5"),
    ("7", 1, "must be a mapping with apiVersion, kind, metadata and spec, got integer 7"),
])
def test_documents_must_be_mappings(text, document, message):
    with pytest.raises(SpecError) as info:
        parse_documents(text, source="jobs.yaml")
    err = info.value
    assert (err.path, err.document, err.source, err.message) == ("", document, "jobs.yaml", message)
    assert str(err) == f"jobs.yaml document {document}: {message}"


def test_yaml_syntax_errors_give_the_line():
    with pytest.raises(SpecError) as info:
        parse_documents("apiVersion: sluice.io/v1\nkind: Job\nspec:\n  queue: a: b\n", source="bad.yaml")
    assert str(info.value) == "bad.yaml: invalid YAML: line 4, column 11: mapping values are not allowed here"
    with pytest.raises(SpecError, match=r"invalid YAML: line 2, column 1"):
        parse_documents('{"a": 1,\n')


def test_load_jobs_names_the_source_and_document():
    text = yaml.safe_dump_all([sluice_doc(), k8s_doc(), sluice_doc(priority=5000)])
    with pytest.raises(SpecError) as info:
        load_jobs(text, source="jobs.yaml")
    err = info.value
    assert (err.source, err.document, err.path) == ("jobs.yaml", 3, "spec.priority")
    assert str(err) == "jobs.yaml document 3: spec.priority: must be at most 1000"


def test_load_jobs_applies_overrides_to_every_document():
    text = yaml.safe_dump_all([sluice_doc(queue=None), k8s_doc()])
    assert [j.queue for j in load_jobs(text, queue="q2", service_class="c")] == ["q2", "q2"]
    assert [j.service_class for j in load_jobs(text, queue="q2", service_class="c")] == ["c", "c"]


@pytest.mark.parametrize("kwargs, text", [
    ({}, "spec.queue: required"),
    ({"document": 2}, "document 2: spec.queue: required"),
    ({"source": "a.yaml"}, "a.yaml: spec.queue: required"),
    ({"document": 2, "source": "a.yaml"}, "a.yaml document 2: spec.queue: required"),
])
def test_spec_error_text(kwargs, text):
    err = SpecError("spec.queue", "required", **kwargs)
    assert str(err) == text
    assert isinstance(err, ValueError)


def test_job_from_document_locates_its_errors():
    err = error(sluice_doc(priority=True), document=4, source="x.json")
    assert str(err) == "x.json document 4: spec.priority: must be an integer, got boolean True"


# -- examples ----------------------------------------------------------------------------------------

def test_example_kubernetes_job():
    [job] = load_jobs((EXAMPLES / "k8s-job.yaml").read_text())
    assert (job.queue, job.service_class, job.pod_count(), job.max_retries) == ("default", "standard", 2, 0)
    assert job.pod_sets[0].requests == {"cpu": 1000, "memory": GI}
    assert job.pod_sets[0].template["metadata"]["annotations"]["sluice.io/sim-duration"] == "20s"


def test_example_train():
    jobs = load_jobs((EXAMPLES / "train.yaml").read_text())
    assert len(jobs) == 2
    for job in jobs:
        assert job.queue == "default"
        assert job.largest_pod() == {"cpu": 2000, "memory": 4 * GI}
        assert all(p.template["metadata"]["annotations"]["sluice.io/sim-duration"] == "3s" for p in job.pod_sets)


def test_example_invalid():
    with pytest.raises(SpecError) as info:
        load_jobs((EXAMPLES / "invalid.yaml").read_text(), source="examples/invalid.yaml")
    assert info.value.path == "spec.podSets[0].count"
    assert str(info.value) == ("examples/invalid.yaml document 1: spec.podSets[0].count: "
                               "must be an integer, got string 'four'")


# -- round trip --------------------------------------------------------------------------------------

def regex(pattern, max_size):
    return st.from_regex(pattern, fullmatch=True).filter(lambda s: len(s) <= max_size)


names = regex(r"[a-z0-9]([-a-z0-9_.]{0,8}[a-z0-9])?", 63)
dns_labels = regex(r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?", 63)
label_keys = regex(r"([a-z0-9]{1,4}(\.[a-z0-9]{1,4})?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,8}[A-Za-z0-9])?", 63)
label_values = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=63)
label_maps = st.dictionaries(label_keys, label_values, max_size=3)
quantities = st.one_of(st.integers(0, 10**6), regex(r"[0-9]{1,4}(\.[0-9]{1,3})?(m|k|Ki|Mi|Gi)?", 20))
resource_maps = st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "example.com/fpga"]),
                                quantities, max_size=3)


@st.composite
def templates(draw):
    def containers(prefix, n_min):
        n = draw(st.integers(n_min, 3))
        out = []
        for i in range(n):
            c = {"name": f"{prefix}{i}", "image": draw(st.sampled_from(["busybox", "registry.example/x:1"]))}
            resources = {k: draw(resource_maps) for k in draw(st.sets(st.sampled_from(["requests", "limits"])))}
            if "requests" in resources and "limits" in resources:  # keep requests within limits
                resources["limits"] = {**resources["limits"], **resources["requests"]}
            if resources:
                c["resources"] = resources
            out.append(c)
        return out

    spec = {"containers": containers("c", 1)}
    init = containers("i", 0)
    if init:
        spec["initContainers"] = init
    template = {"spec": spec}
    if draw(st.booleans()):
        template["metadata"] = {"annotations": {"sluice.io/sim-duration": draw(st.sampled_from(["1s", "20s"]))}}
    return template


@st.composite
def job_documents(draw):
    pod_set_names = draw(st.lists(dns_labels, min_size=1, max_size=3, unique=True))
    spec = {"queue": draw(names),
            "podSets": [{"name": n, "count": draw(st.integers(1, 10000)), "template": draw(templates())}
                        for n in pod_set_names]}
    optional = {
        "serviceClass": names,
        "priority": st.integers(-1000, 1000),
        "placement": st.fixed_dictionaries({}, optional={
            "clusterSelector": label_maps,
            "tiers": st.lists(st.sampled_from(["onprem", "cloud", "edge"]), max_size=3),
            "sites": st.lists(names, max_size=2)}),
        "maxRetries": st.integers(0, 100),
        "maxRuntime": st.one_of(st.floats(min_value=0.001, max_value=1e9), st.integers(1, 10**6),
                                st.sampled_from(["90s", "10m", "2h", "1d", "1.5h", "250ms"])),
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            spec[key] = draw(strategy)
    metadata = draw(st.fixed_dictionaries({}, optional={"name": st.text(min_size=1, max_size=20),
                                                        "labels": label_maps}))
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": metadata, "spec": spec}


@settings(max_examples=80, deadline=None)
@given(job_documents())
def test_to_document_round_trips(doc):
    job = job_from_document(doc)
    document = job.to_document()
    assert job_from_document(document) == job
    assert job_from_document(json.loads(json.dumps(document))) == job
    assert job_from_document(yaml.safe_load(yaml.safe_dump(document))) == job
    assert job.to_document() == document


@settings(max_examples=30, deadline=None)
@given(job_documents())
def test_totals_agree_with_pod_sets(doc):
    job = job_from_document(doc)
    assert job.pod_count() == sum(p["count"] for p in doc["spec"]["podSets"])
    for resource, largest in job.largest_pod().items():
        assert largest == max(p.requests.get(resource, 0) for p in job.pod_sets)
        assert job.total_requests()[resource] >= largest


def test_dataclasses_are_frozen():
    job = job_from_document(sluice_doc())
    with pytest.raises(AttributeError):
        job.queue = "other"  # type: ignore[misc]
    assert isinstance(job, JobSpec) and isinstance(job.pod_sets[0], PodSet)


# -- the plain path ----------------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2, 20_000), st.floats(allow_nan=False), st.text(max_size=5),
              st.sampled_from(["", "worker", "onprem", "moon", "Bad", "1", "2Gi", "1GB", "10m", "x" * 64])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6)


def paths(value, here=()):
    """Every place in a JSON document: mapping keys and list positions, at any depth."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield here + (key,)
        yield from paths(item, here + (key,))


@st.composite
def edited_documents(draw):
    """A valid job document with one place changed: a value replaced, a key removed, or a key added."""
    doc = draw(job_documents())
    *parents, last = draw(st.sampled_from(list(paths(doc))))
    target = doc
    for key in parents:
        target = target[key]
    how = draw(st.sampled_from(["replace", "remove", "add"] if isinstance(target, dict) else ["replace"]))
    if how == "remove":
        del target[last]
    elif how == "add":
        target[draw(st.sampled_from(["extra", "initContainers", "overhead", "limits", "placement", "tiers",
                                     "completions", "backoffLimit", "parallelism"]))] = (
            draw(json_values))
    else:
        target[last] = draw(json_values)
    return doc


def full_checks(doc):
    try:
        return spec_module._sluice_job(copy.deepcopy(doc))
    except SpecError:
        return None


@settings(max_examples=300, deadline=None)
@given(st.one_of(job_documents(), edited_documents()))
def test_plain_documents_read_as_the_full_checks_read_them(doc):
    """Whatever the plain path takes (it passes the rest to the full checks), the full checks take to the
    same JobSpec."""
    expected = full_checks(doc)
    got = spec_module._plain_job(copy.deepcopy(doc), False)
    assert got is None or got == expected


def test_the_plain_path_takes_the_usual_documents():
    plain = sluice_doc(serviceClass="gold", priority=3, maxRetries=1, maxRuntime="2h",
                       placement={"tiers": ["onprem"], "clusterSelector": {"zone": "a"}, "sites": ["dc-1"]})
    plain["metadata"]["labels"] = {"team": "ml"}
    plain["spec"]["podSets"][0]["template"]["spec"]["containers"].append(
        container("side", requests={"cpu": "1"}, limits={"cpu": "2", "memory": "2Gi"}))
    assert spec_module._plain_job(copy.deepcopy(plain), False) == spec_module._sluice_job(copy.deepcopy(plain))
    job = job_from_document(plain)
    assert job.pod_sets[0].requests == {"cpu": 2000, "memory": 2 * GI}


# -- what makes a small file large or deep ----------------------------------------------------------

def _laughs(levels: int) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_aliases_standing_for_too_many_values_are_refused():
    with pytest.raises(SpecError, match=r"invalid YAML: line 6, column \d+: aliases stand for more than 100000 values"):
        parse_documents(_laughs(9))
    assert len(parse_documents(_laughs(4))[0]) == 4  # 9^3 values through aliases: fine


def test_an_alias_inside_the_node_it_names_is_refused():
    with pytest.raises(SpecError, match="an alias inside the node it names"):
        parse_documents("a: &a [1, *a]\n")


def test_aliases_sharing_a_template_read_as_written_out():
    shared = ("apiVersion: sluice.io/v1\nkind: Job\nspec:\n  queue: q\n  podSets:\n"
              "  - {name: a, count: 1, template: &t {spec: {containers: [{name: m, image: x}]}}}\n"
              "  - {name: b, count: 2, template: *t}\n")
    [job] = load_jobs(shared)
    assert [p.template for p in job.pod_sets] == [{"spec": {"containers": [{"name": "m", "image": "x"}]}}] * 2


@pytest.mark.parametrize("text", ["a: " + "[" * 101 + "]" * 101, "a:\n" + "".join(f"{'  ' * i}k{i}:\n" for i in
                                                                                   range(1, 102)) + "  " * 102 + "x",
                                  '{"a": ' + "[" * 101 + "]" * 101 + "}", "[" * 5000 + "]" * 5000])
def test_nesting_deeper_than_a_hundred_levels_is_refused(text):
    with pytest.raises(SpecError, match="nested deeper than 100 levels"):
        parse_documents(text)


def test_a_hundred_levels_are_fine():
    assert parse_documents('{"a": ' + "[" * 99 + "]" * 99 + "}")
    assert parse_documents("a: " + "[" * 99 + "]" * 99)


_YAML_PIECES = st.sampled_from([
    "apiVersion: sluice.io/v1\n", "apiVersion: batch/v1\n", "kind: Job\n", "kind: Queue\n", "metadata: {name: a}\n",
    "spec:\n", "  queue: q\n", "  podSets:\n", "  - name: w\n", "    count: 2\n", "    count: 1e400\n",
    "    template: {spec: {containers: [{name: m, image: x}]}}\n", "  priority: .nan\n", "  maxRuntime: 1h\n",
    "---\n", "&a [1, 2]\n", "*a\n", "!!python/object:os.system {}\n", "x: 2001-12-14\n", "? [a, b]\n: 1\n",
    "!!binary aGk=\n", "- [[[[[[]]]]]]\n", "<<: *a\n", "'\\ud800'\n", '"\\ud800"\n', "\t\n", "{", "]", ":",
    "%YAML 1.1\n",
    "spec: {guaranteed: {cpu: '-1'}, max: {cpu: 1e999}}\n", "metadata: {name: a, labels: {1: 2}}\n"])


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.one_of(_YAML_PIECES, st.text(max_size=12)), max_size=12))
def test_any_text_is_read_or_refused_with_a_spec_error(pieces):
    from sluice.objects import load_objects
    text = "".join(pieces)
    for load in (load_jobs, load_objects):
        try:
            load(text)
        except SpecError:
            pass


SIM_ANNOTATIONS = "spec.podSets[0].template.metadata.annotations"


@pytest.mark.parametrize(("annotations", "error"), [
    ({"sluice.io/sim-exit-code": "4294967297"},
     f"{SIM_ANNOTATIONS}[sluice.io/sim-exit-code]: must be an integer from 0 to 255, got '4294967297'"),
    ({"sluice.io/sim-exit-code": "-1"},
     f"{SIM_ANNOTATIONS}[sluice.io/sim-exit-code]: must be an integer from 0 to 255, got '-1'"),
    ({"sluice.io/sim-exit-code": "three"},
     f"{SIM_ANNOTATIONS}[sluice.io/sim-exit-code]: must be an integer from 0 to 255, got 'three'"),
    ({"sluice.io/sim-duration": "soon"},
     f"{SIM_ANNOTATIONS}[sluice.io/sim-duration]: 'soon' is not a duration (examples: '90s', '10m', '2h', '1d')"),
])
def test_annotations_the_sim_agent_reads_as_numbers_are_checked_at_submit(annotations, error):
    """Both ways of reading a document (the server's plain fast path and the full checks) refuse them."""
    doc = {"apiVersion": "sluice.io/v1", "kind": "Job", "spec": {"queue": "q", "podSets": [{
        "name": "w", "count": 1, "template": {"metadata": {"annotations": annotations}, "spec": {
            "containers": [{"name": "m", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}}]}}
    for owned in (False, True):
        with pytest.raises(SpecError) as err:
            job_from_document(copy.deepcopy(doc), owned=owned)
        assert str(err.value) == error
    doc["spec"]["podSets"][0]["template"]["metadata"]["annotations"] = {"sluice.io/sim-exit-code": " 255 ",
                                                                         "sluice.io/sim-duration": "2m"}
    assert job_from_document(doc).pod_sets[0].count == 1
    assert spec_module.sim_exit_code(" 255 ") == 255 and spec_module.sim_exit_code(3) == 3
