"""The kubectl front door, the dispatcher's side: Jobs a cluster's agent saw in its API server, over the real
agent link (a scripted agent, real gRPC, real Postgres). Each (cluster, uid) is submitted once and for ever;
refusals say why and write nothing; a Job being deleted cancels its job."""
from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store import clusters as cluster_store
from dispatcher.store import tokens
from dispatcher.store.database import DatabaseSettings
from sluice.client import Client
from sluice.config import ClientConfig
from sluice.objects import load_objects
from sluice.v1 import agents_pb2
from tests.integration.test_agent_link import ScriptedAgent
from tests.integration.test_fuzz import FUZZ, INTERNALS, mutated

OBJECTS = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: research}
spec: {serviceClasses: [standard], members: [someone-else]}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: other}
spec: {serviceClasses: [standard]}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: alpha}
spec:
  tier: onprem
  kubernetes:
    intake:
      team-a: {user: alice, queues: [research]}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: beta}
spec: {tier: onprem}
"""


def kube_job(name: str, uid: str, *, queue: str = "research", suspend: bool = True, cpu: str = "1", **spec) -> dict:
    """A batch/v1 Job as the API server holds it (with what it generated: selector, controller-uid labels)."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "team-a", "uid": uid, "labels": {"sluice.io/queue": queue},
                         "annotations": {"sluice.io/priority": "5"}},
            "spec": {"suspend": suspend, "parallelism": 1, "backoffLimit": 1,
                     "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}},
                     "template": {"metadata": {"labels": {"batch.kubernetes.io/controller-uid": uid}},
                                  "spec": {"restartPolicy": "Never", "containers": [
                                      {"name": "main", "image": "busybox",
                                       "resources": {"requests": {"cpu": cpu}}}]}},
                     **spec}}


def mention(job: dict, *, deleting: bool = False, namespace: str | None = None) -> agents_pb2.IntakeJob:
    metadata = job["metadata"]
    return agents_pb2.IntakeJob(uid=metadata["uid"], namespace=namespace or metadata["namespace"],
                                name=metadata["name"], document_json=json.dumps(job), deleting=deleting)


def ask(agent: ScriptedAgent, *jobs: agents_pb2.IntakeJob) -> list[agents_pb2.IntakeAnswer]:
    agent.send(intake=agents_pb2.Intake(jobs=list(jobs)))
    return list(agent.next("intake_answers").answers)


def start(db_url) -> Dispatcher:
    return Dispatcher(ServerSettings(listen="127.0.0.1:0", database=DatabaseSettings(url=db_url))).start()


@pytest.fixture
def dispatcher(db_url):
    d = start(db_url)
    with d.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(OBJECTS))
        d.admin = tokens.create(session, "admin", "admin")
        d.agent_tokens = {c: tokens.create(session, "agent", f"agent-{c}", c) for c in ("alpha", "beta")}
    d.client = Client(ClientConfig(d.address, d.admin, timeout_s=10, insecure=True))
    yield d
    d.client.close()
    d.stop()


def jobs_count(dispatcher) -> int:
    with dispatcher.sessions() as session:
        return session.execute(text("SELECT count(*) FROM jobs")).scalar()


def test_a_job_is_submitted_once_as_the_namespace_user_and_dispatched_with_its_origin(dispatcher, db_url):
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    assert agent.next("welcome").takes_intake
    job = kube_job("train", "uid-1")
    [answer] = ask(agent, mention(job))
    assert answer.uid == "uid-1" and answer.job_id > 0 and not answer.error
    described = dispatcher.client.describe(answer.job_id)
    assert described["submittedBy"] == "alice" and described["queue"] == "research"
    spec = described["spec"]["spec"]
    assert spec["origin"] == {"cluster": "alpha", "namespace": "team-a", "name": "train", "uid": "uid-1"}
    assert spec["priority"] == 5 and spec["maxRetries"] == 1
    # The generated labels naming this cluster's Job are not the job's: a copy elsewhere gets its own.
    assert spec["podSets"][0]["template"]["metadata"].get("labels", {}) == {}
    command = agent.next("command")  # the only cluster with room: dispatched here, the document says from where
    assert command.dispatch.job_id == answer.job_id
    assert json.loads(command.dispatch.spec_json)["spec"]["origin"]["uid"] == "uid-1"
    agent.send(ack=agents_pb2.CommandAck(command_ids=[command.id]))
    again = ask(agent, mention(job), mention(job))  # a re-list, twice in one message
    assert [a.job_id for a in again] == [answer.job_id] * 2
    assert {a.state for a in again} == {"DISPATCHED"} and again[0].cluster == "alpha" and again[0].attempt == 1
    agent.close()
    dispatcher.stop()
    restarted = start(db_url)  # a dispatcher restart and a new link: the same Job is still the same job
    try:
        agent = ScriptedAgent(restarted.address, dispatcher.agent_tokens["alpha"], "alpha",
                              inventory=[agents_pb2.AttemptStatus(job_id=answer.job_id, attempt=1, state="PENDING")])
        agent.next("welcome")
        [after] = ask(agent, mention(job))
        assert after.job_id == answer.job_id
        with restarted.sessions() as session:
            assert session.execute(text("SELECT count(*) FROM jobs")).scalar() == 1
        agent.close()
    finally:
        restarted.stop()


@pytest.mark.parametrize(("job", "namespace", "error"), [
    (kube_job("x", "u-ns"), "team-b", "namespace 'team-b' is not one that cluster 'alpha' takes Jobs from"),
    (kube_job("x", "u-q", queue="other"), None, "'other' is not a queue namespace 'team-a' may submit to (research)"),
    (kube_job("x", "u-run", suspend=False), None, "spec.suspend: must be true"),
    (kube_job("x", "u-gang", completions=3), None, "spec.completions: 3 is not supported"),
    (kube_job("x", "u-cpu", cpu="lots"), None, "spec.template.spec.containers[0].resources.requests.cpu"),
])
def test_a_job_that_cannot_be_submitted_is_answered_why_and_nothing_is_written(dispatcher, job, namespace, error):
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    agent.next("welcome")
    good = kube_job("fine", "u-good")
    refused, submitted = ask(agent, mention(job, namespace=namespace), mention(good))
    assert refused.job_id == 0 and error in refused.error, refused.error
    assert submitted.job_id > 0 and not submitted.error  # one bad Job does not hold up the others
    assert jobs_count(dispatcher) == 1
    agent.close()


def test_unreadable_mentions_are_answered_and_the_link_goes_on(dispatcher):
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    agent.next("welcome")
    answers = ask(agent, agents_pb2.IntakeJob(uid="u1", namespace="team-a", name="a", document_json="{not json"),
                  agents_pb2.IntakeJob(uid="u2", namespace="team-a", name="b", document_json="[]"),
                  agents_pb2.IntakeJob(uid="", namespace="team-a", name="c", document_json="{}"),
                  mention(kube_job("d", "u4")),
                  agents_pb2.IntakeJob(uid="\x00", namespace="team-a", name="e", document_json="{}"),
                  agents_pb2.IntakeJob(uid="u6", namespace="team-a", name="f\x00", document_json="{}"))
    assert [bool(a.error) for a in answers] == [True, True, True, False, True, True]
    assert "not JSON" in answers[0].error and "expected a JSON object" in answers[1].error
    assert "no metadata.uid" in answers[2].error
    assert answers[4].error == "the Job's metadata.uid contains a NUL character (\\u0000)"  # Postgres stores none
    assert answers[5].error == "the Job's metadata.name contains a NUL character (\\u0000)"
    assert jobs_count(dispatcher) == 1
    agent.close()


def test_a_job_being_deleted_cancels_its_job_everywhere(dispatcher):
    beta = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["beta"], "beta")
    beta.next("welcome")
    alpha = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha", capacity={"cpu": 0})
    alpha.next("welcome")
    job = kube_job("train", "uid-del")
    [answer] = ask(alpha, mention(job))
    command = beta.next("command")  # alpha has no room: it runs on beta
    assert command.dispatch.job_id == answer.job_id
    beta.send(ack=agents_pb2.CommandAck(command_ids=[command.id]))
    [running] = ask(alpha, mention(job))
    assert running.cluster == "beta"
    [gone] = ask(alpha, mention(job, deleting=True))
    assert gone.state == "CANCELLED" and "its Job team-a/train was deleted" in gone.reason
    cancel = beta.next("command")
    assert cancel.cancel.job_id == answer.job_id
    # A Job never submitted and deleted: nothing to cancel, nothing written.
    [never] = ask(alpha, mention(kube_job("other", "uid-never"), deleting=True))
    assert never.job_id == 0 and not never.error
    assert jobs_count(dispatcher) == 1
    alpha.close()
    beta.close()


def test_intake_settings_are_validated_by_admin_apply():
    from sluice._validate import SpecError
    bad = OBJECTS.replace("queues: [research]", "queues: []")
    with pytest.raises(SpecError, match=r"spec.kubernetes.intake.team-a.queues: must name at least one queue"):
        load_objects(bad)
    with pytest.raises(SpecError, match=r"spec.kubernetes.intake.*not a Kubernetes namespace name"):
        load_objects(OBJECTS.replace("team-a: {user", "Team_A: {user"))
    with pytest.raises(SpecError, match=r"spec.kubernetes.intake.team-a.*user"):
        load_objects(OBJECTS.replace("{user: alice, queues: [research]}", "{queues: [research]}"))
    [cluster] = [o for o in load_objects(OBJECTS) if o.kind == "Cluster" and o.name == "alpha"]
    document = cluster.to_document()
    assert document["spec"]["kubernetes"]["intake"] == {"team-a": {"user": "alice", "queues": ["research"]}}
    assert load_objects(json.dumps(document))[0] == cluster


@FUZZ
@given(documents=st.lists(mutated(kube_job("fuzz", "u")), min_size=1, max_size=4), deleting=st.booleans())
def test_fuzzed_jobs_are_each_answered_in_words_and_only_accepted_ones_are_written(dispatcher, documents, deleting):
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    try:
        agent.next("welcome")
        before = jobs_count(dispatcher)
        mentions = [agents_pb2.IntakeJob(uid=f"fuzz-{uuid.uuid4()}", namespace="team-a", name="fuzz",
                                         document_json=json.dumps(doc), deleting=deleting) for doc in documents]
        answers = ask(agent, *mentions)
        assert [a.uid for a in answers] == [m.uid for m in mentions]
        for answer in answers:
            assert (answer.job_id > 0) != bool(answer.error) or (deleting and not answer.job_id), answer
            assert not INTERNALS.search(answer.error), answer.error
        assert jobs_count(dispatcher) == before + sum(a.job_id > 0 for a in answers)
    finally:
        agent.close()


def test_the_user_guides_example_job_is_taken(dispatcher):
    import pathlib

    import yaml
    example = yaml.safe_load((pathlib.Path(__file__).parents[2] / "examples" / "kubectl-job.yaml").read_text())
    example["metadata"]["uid"] = "uid-example"
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    agent.next("welcome")
    [answer] = ask(agent, mention(example))
    assert answer.job_id > 0 and not answer.error
    job = dispatcher.client.describe(answer.job_id)
    assert job["spec"]["spec"]["podSets"][0]["count"] == 2 and job["spec"]["spec"]["priority"] == 10
    agent.close()
