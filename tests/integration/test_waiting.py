"""Jobs that wait and job arrays, through the whole path: submit -> Postgres -> the leader's release pass ->
scheduler -> sim agent. startAfter, dependsOn (a chain and a diamond in one file, a failed dependency, a
cycle, bad references), arrays with and without parallelism, cancel by array."""
from __future__ import annotations

import time

import pytest

from sluice.client import ClientError
from tests.integration.scenarios import FINAL, wait_final
from tests.integration.test_spine import job_doc


def states_of(client, ids):
    return [client.get(i)["state"] for i in ids]


def test_a_chain_and_a_diamond_in_one_file_run_in_order(system):
    docs = [job_doc("prep", duration="0.3s"),
            job_doc("left", duration="0.3s", dependsOn=[{"job": "prep"}]),
            job_doc("right", duration="0.3s", dependsOn=[{"job": "prep"}]),
            job_doc("join", duration="0.2s", dependsOn=[{"job": "left"}, {"job": "right"}]),
            job_doc("after", duration="0.2s", dependsOn=[{"job": "join", "condition": "finished"}])]
    ids = system.client.submit(docs)
    first = [system.client.get(i) for i in ids]
    assert [j["state"] for j in first[1:]] == ["WAITING"] * 4
    assert first[1]["reason"] == f"waiting for job {ids[0]} to succeed"
    assert first[3]["reason"] == f"waiting for job {ids[1]} to succeed (and 1 more)"
    jobs = wait_final(system.client, ids, timeout=60)
    assert all(j["state"] == "SUCCEEDED" for j in jobs)
    started = {j["name"]: j["startedAt"] for j in jobs}
    finished = {j["name"]: j["finishedAt"] for j in jobs}
    assert finished["prep"] <= started["left"] and finished["prep"] <= started["right"]
    assert max(finished["left"], finished["right"]) <= started["join"] <= finished["join"] <= started["after"]


def test_a_failed_dependency_fails_its_dependants_with_a_reason(system):
    docs = [job_doc("bad", exit_code="2", maxRetries=0),
            job_doc("next", dependsOn=[{"job": "bad"}]),
            job_doc("then", dependsOn=[{"job": "next"}]),
            job_doc("cleanup", dependsOn=[{"job": "bad", "condition": "failed"}])]
    ids = system.client.submit(docs)
    jobs = wait_final(system.client, ids, timeout=60)
    assert [j["state"] for j in jobs] == ["FAILED", "FAILED", "FAILED", "SUCCEEDED"]
    assert jobs[1]["reason"] == f"dependency job {ids[0]} ended FAILED; this job needed it to succeed"
    assert jobs[2]["reason"] == f"dependency job {ids[1]} ended FAILED; this job needed it to succeed"
    assert jobs[1]["attempt"] == 0  # never ran


def test_a_dependency_on_an_earlier_job_by_id_and_by_name(system):
    [first] = system.client.submit([job_doc("earlier", duration="0.5s")])
    ids = system.client.submit([job_doc("by-id", dependsOn=[{"job": first}]),
                                job_doc("by-name", dependsOn=[{"job": "earlier", "condition": "finished"}])])
    jobs = wait_final(system.client, [first, *ids], timeout=60)
    assert all(j["state"] == "SUCCEEDED" for j in jobs)
    assert jobs[0]["finishedAt"] <= min(jobs[1]["startedAt"], jobs[2]["startedAt"])


@pytest.mark.parametrize("docs, message", [
    ([job_doc("a", dependsOn=[{"job": "b"}]), job_doc("b", dependsOn=[{"job": "a"}])],
     "submit: the dependencies form a cycle: document 1 (a) -> document 2 (b) -> document 1 (a)"),
    ([job_doc("a", dependsOn=[{"job": "a"}])],
     "submit: the dependencies form a cycle: document 1 (a) -> document 1 (a)"),
    ([job_doc("a", dependsOn=[{"job": "nobody"}])],
     "job: spec.dependsOn[0].job: no job named 'nobody' in this submit or submitted by admin"),
    ([job_doc("a", dependsOn=[{"job": 99999}])], "job: spec.dependsOn[0].job: job 99999 not found"),
    ([job_doc("x"), job_doc("x"), job_doc("a", dependsOn=[{"job": "x"}])],
     "document 3: spec.dependsOn[0].job: 2 documents of this submit are named 'x'; name each once"),
])
def test_bad_dependencies_are_refused_with_one_line_and_change_nothing(system, docs, message):
    before = len(system.client.list())
    with pytest.raises(ClientError) as caught:
        system.client.submit(docs)
    assert caught.value.message == message
    assert len(system.client.list()) == before


def test_a_dependency_on_a_job_the_user_may_not_see_is_not_found(system):
    [hidden] = system.client.submit([job_doc("admins", duration="0.1s")])
    from sluice.admin_client import AdminClient
    from sluice.client import Client
    secret = AdminClient(system.client_settings()).create_token("user", "alice")["secret"]
    with Client(system.client_settings(secret, timeout_s=10)) as user, pytest.raises(ClientError) as caught:
        user.submit([job_doc("mine", dependsOn=[{"job": hidden}])])
    assert caught.value.message == f"job: spec.dependsOn[0].job: job {hidden} not found"


def test_start_after_waits_for_its_time(system):
    [job_id] = system.client.submit([job_doc("later", startAfter="2s")])
    job = system.client.get(job_id)
    assert job["state"] == "WAITING" and job["reason"].startswith("waiting until ")
    [job] = wait_final(system.client, [job_id], timeout=30)
    assert job["state"] == "SUCCEEDED"
    assert (_seconds(job["startedAt"]) - _seconds(job["createdAt"])) >= 2.0


def test_an_array_runs_every_element_at_most_parallelism_at_once(system):
    ids = system.client.submit([job_doc("sweep", duration="0.3s", array={"count": 12, "parallelism": 3})])
    assert len(ids) == 12
    jobs = [system.client.get(i) for i in ids]
    assert [j["state"] for j in jobs].count("WAITING") == 9
    assert jobs[5]["reason"] == f"waiting for a slot of array {ids[0]} (3 at once)"
    peak = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = states_of(system.client, ids)
        peak = max(peak, sum(s in ("QUEUED", "DISPATCHED", "RUNNING") for s in now))
        if all(s in FINAL for s in now):
            break
        time.sleep(0.05)
    assert peak <= 3
    jobs = wait_final(system.client, ids)
    assert all(j["state"] == "SUCCEEDED" for j in jobs)
    assert [j["arrayIndex"] for j in jobs] == list(range(12)) and {j["arrayId"] for j in jobs} == {ids[0]}
    assert [j["id"] for j in system.client.list(array=ids[0])] == sorted(ids)
    groups = {g["group"]: g for g in system.client.usage(by="array")["groups"]}
    assert groups[str(ids[0])]["attempts"] == 12
    lines = [entry["line"] for entry in system.client.logs(ids[7])]
    assert lines[0].endswith(f" environment: SLUICE_ARRAY_ID={ids[0]} SLUICE_ARRAY_INDEX=7")


def test_cancel_an_array_cancels_every_element_left(system):
    ids = system.client.submit([job_doc("long", duration="60s", array={"count": 20, "parallelism": 2})])
    cancelled = [j["id"] for j in system.client.cancel(arrays=[ids[0]])]
    assert sorted(cancelled) == sorted(ids)
    jobs = wait_final(system.client, ids)
    assert {j["state"] for j in jobs} == {"CANCELLED"}
    time.sleep(1.5)  # a release pass later, nothing was queued again
    assert set(states_of(system.client, ids)) == {"CANCELLED"}


def test_a_dependency_on_an_array_waits_for_every_element(system):
    docs = [job_doc("sweep", duration="0.2s", array={"count": 5, "parallelism": 2}),
            job_doc("reduce", dependsOn=[{"job": "sweep"}])]
    ids = system.client.submit(docs)
    assert len(ids) == 6
    jobs = wait_final(system.client, ids, timeout=60)
    assert all(j["state"] == "SUCCEEDED" for j in jobs)
    assert max(j["finishedAt"] for j in jobs[:5]) <= jobs[5]["startedAt"]


@pytest.mark.parametrize("spec, message", [
    ({"array": {"count": 0}}, "spec.array.count: must be at least 1"),
    ({"array": {"count": 100_001}}, "spec.array.count: must be at most 100000"),
    ({"startAfter": "tomorrow"}, "spec.startAfter: 'tomorrow' is not a duration"),
    ({"idleTimeout": "1h"}, "spec.idleTimeout: only an interactive job (spec.interactive: true) has an idle timeout"),
])
def test_bad_arrays_and_times_are_refused(system, spec, message):
    with pytest.raises(ClientError) as caught:
        system.client.submit([job_doc("bad", **spec)])
    assert caught.value.message.startswith(message)


def _seconds(text: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"


def _example(name: str):
    from sluice.spec import load_jobs
    return load_jobs((EXAMPLES / name).read_text(), source=f"examples/{name}")


def test_the_user_guides_examples_run_as_it_says(system):
    client = system.client
    pipeline = client.submit(_example("pipeline.yaml"))
    sweep = client.submit(_example("sweep.yaml"))
    [later] = client.submit(_example("later.yaml"))
    [notebook] = client.submit(_example("notebook.yaml"))
    assert len(sweep) == 21 and client.get(later)["state"] == "WAITING"
    jobs = {j["name"]: j for j in wait_final(client, pipeline, timeout=120)}
    assert [jobs[n]["state"] for n in ("preprocess", "train-small", "train-large", "evaluate")] == ["SUCCEEDED"] * 4
    assert jobs["cleanup"]["state"] == "FAILED"
    assert jobs["cleanup"]["reason"] == (f"dependency job {pipeline[0]} ended SUCCEEDED; this job needed it to fail")
    assert max(jobs["train-small"]["finishedAt"], jobs["train-large"]["finishedAt"]) <= jobs["evaluate"]["startedAt"]
    swept = wait_final(client, sweep, timeout=120)
    assert all(j["state"] == "SUCCEEDED" for j in swept)
    assert max(j["finishedAt"] for j in swept[:20]) <= swept[20]["startedAt"]
    deadline = time.monotonic() + 30
    while client.get(notebook)["state"] != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.1)
    attached = client.attach(notebook)
    assert attached["job"]["interactive"] and attached["address"].endswith(":8888")
    assert attached["idleTimeoutSeconds"] == 1800
    client.cancel([notebook, later])
