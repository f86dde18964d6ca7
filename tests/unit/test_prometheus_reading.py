"""Capacity from kube-state-metrics series: the pure arithmetic of dispatcher/capacity/prometheus.py."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dispatcher.capacity.prometheus import PrometheusSettings, compute, resource_name

NOW = datetime(2026, 11, 22, tzinfo=UTC)


def series(value, **labels):
    return {"metric": labels, "value": [0, str(value)]}


def alloc(node, cpu, mem_gib, gpu=0):
    out = [series(cpu, node=node, resource="cpu", unit="core"),
           series(mem_gib * 2**30, node=node, resource="memory", unit="byte")]
    if gpu:
        out.append(series(gpu, node=node, resource="nvidia_com_gpu", unit="integer"))
    return out


def test_free_and_largest_node_from_series():
    allocatable = alloc("n1", 8, 32, gpu=4) + alloc("n2", 8, 32, gpu=4)
    requests = [series(6, node="n1", pod="a", resource="cpu"), series(2, node="n1", pod="a", resource="nvidia_com_gpu"),
                series(1.5, node="n2", pod="b", resource="cpu"),
                series(2, node="", pod="pending", resource="cpu")]  # pending: counts against the total only
    r = compute(allocatable, [], [], requests, [series(1, label_sluice_io_job_id="7", label_sluice_io_attempt="2")],
                NOW)
    assert r.allocatable == {"cpu": 16000, "memory": 64 * 2**30 * 1000, "nvidia.com/gpu": 8000}
    assert r.free == {"cpu": 6500, "memory": 64 * 2**30 * 1000, "nvidia.com/gpu": 6000}
    assert r.largest_free_node == {"cpu": 6500, "memory": 32 * 2**30 * 1000, "nvidia.com/gpu": 4000}
    assert r.attempts == {(7, 2)}


def test_cordoned_and_not_ready_nodes_are_left_out():
    allocatable = alloc("n1", 8, 32) + alloc("n2", 8, 32) + alloc("n3", 8, 32)
    requests = [series(4, node="n2", resource="cpu"), series(1, node="n1", resource="cpu")]
    r = compute(allocatable, [series(1, node="n2")], [series(0, node="n3", condition="Ready", status="true")],
                requests, [], NOW)
    assert r.allocatable["cpu"] == 8000 and r.free["cpu"] == 7000 and r.largest_free_node["cpu"] == 7000


def test_bad_pod_labels_are_skipped():
    r = compute(alloc("n1", 1, 1), [], [], [], [series(1, label_sluice_io_job_id="x", label_sluice_io_attempt="1"),
                                                   series(1, pod="no-labels")], NOW)
    assert r.attempts == frozenset()


@pytest.mark.parametrize("ksm, name", [("cpu", "cpu"), ("memory", "memory"), ("nvidia_com_gpu", "nvidia.com/gpu"),
                                       ("ephemeral_storage", "ephemeral-storage"),
                                       ("example_io_fpga", "example.io/fpga"), ("hugepages_2Mi", "hugepages_2Mi")])
def test_resource_names(ksm, name):
    assert resource_name(ksm) == name


def test_selector_goes_into_every_query_and_queries_can_be_overridden():
    s = PrometheusSettings(url="http://127.0.0.1:1", selector='{cluster="onprem-a"}',
                           queries={"pods": 'my_pods{{{sel}}}'})
    assert s.query("allocatable") == 'kube_node_status_allocatable{cluster="onprem-a"}'
    assert ('kube_node_status_condition{cluster="onprem-a", condition="Ready", status="true"} == 0'
            == s.query("not_ready"))
    assert s.query("pods") == 'my_pods{cluster="onprem-a"}'
    assert PrometheusSettings(url="x").query("allocatable") == 'kube_node_status_allocatable{__name__!=""}'


def test_settings_from_a_cluster_document():
    s = PrometheusSettings.from_document({"url": "http://p:9090", "selector": '{c="a"}', "timeout": "2",
                                          "headers": {"Authorization": "Bearer t"}})
    assert (s.url, s.selector, s.timeout_s, s.headers) == ("http://p:9090", '{c="a"}', 2.0,
                                                           {"Authorization": "Bearer t"})


@pytest.mark.parametrize("timeout, seconds", [("2.5s", 2.5), ("1m", 60.0), (7.5, 7.5), (5, 5.0)])
def test_the_timeout_of_a_stored_cluster_is_read_as_written_now_and_before(timeout, seconds):
    """ClusterObject.to_document() writes the timeout as a duration ('2.5s'); clusters stored before hold seconds."""
    from sluice.objects import ClusterObject
    written = ClusterObject("c", prometheus={"url": "http://p", "timeout": 2.5}).to_document()["spec"]["prometheus"]
    assert written["timeout"] == "2.5s"
    assert PrometheusSettings.from_document({"url": "http://p", "timeout": timeout}).timeout_s == seconds


def test_an_unreachable_prometheus_is_a_prometheus_error():
    from devstack.prometheus import free_port
    from dispatcher.capacity.prometheus import PrometheusError, read
    with pytest.raises(PrometheusError):
        read(PrometheusSettings(url=f"http://127.0.0.1:{free_port()}", timeout_s=1, retries=0))
