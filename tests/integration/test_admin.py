"""The Admin service through a real dispatcher: real Postgres, real gRPC, the Python admin client.

Covers every RPC and every refusal: apply (create, update, unchanged, dry run and its diff), the
cross-object checks that refuse a whole apply, deletes refused while in use, quota and membership
shortcuts, tokens, cluster states, role checks and the audit log.
"""
from __future__ import annotations

import difflib
import queue
from functools import partial

import pytest
import yaml

from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store import clusters as cluster_store
from dispatcher.store import tokens
from dispatcher.store.database import DatabaseSettings
from sluice.admin_client import AdminClient
from sluice.client import Client, ClientError
from sluice.config import ClientConfig
from sluice.objects import load_objects
from sluice.v1 import agents_pb2
from tests.integration.test_agent_link import OBJECTS, ScriptedAgent, wait_for
from tests.integration.test_spine import job_doc

TREE = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: gold}
spec: {priority: 800}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: research}
spec:
  guaranteed: {cpu: "64", nvidia.com/gpu: "8"}
  serviceClasses: [gold, standard]
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: cv}
spec:
  parent: research
  guaranteed: {cpu: "32", nvidia.com/gpu: "4"}
"""


def queue_doc(name: str, **spec) -> dict:
    return {"apiVersion": "sluice.io/v1", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def dispatcher(db_url):
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", database=DatabaseSettings(url=db_url))).start()
    with d.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(OBJECTS))
        d.admin_token = tokens.create(session, "admin", "root")
        d.agent_tokens = {c: tokens.create(session, "agent", f"agent-{c}", c) for c in ("alpha", "beta")}
    d.admin = AdminClient(ClientConfig(d.address, d.admin_token, timeout_s=10, insecure=True))
    yield d
    d.admin.close()
    d.stop()


def everything(admin: AdminClient) -> list[dict]:
    """Every stored object (an empty kind reads them all)."""
    return admin.get_objects("")


def refused(call, code: str) -> str:
    with pytest.raises(ClientError) as err:
        call()
    assert err.value.code == code, err.value.message
    return err.value.message


def test_apply_creates_updates_and_reports_unchanged(dispatcher):
    admin = dispatcher.admin
    objects = load_objects(TREE)
    results = admin.apply(objects)
    assert [(r["kind"], r["name"], r["action"]) for r in results] == [
        ("ServiceClass", "gold", "create"), ("Queue", "research", "create"), ("Queue", "cv", "create")]
    assert admin.get_objects("queue", "cv") == [objects[2].to_document()]
    stored = admin.get_objects("Queues")
    assert [d["metadata"]["name"] for d in stored] == ["cv", "default", "research"]
    assert [stored[0], stored[2]] == [objects[2].to_document(), objects[1].to_document()]
    assert {r["action"] for r in admin.apply(objects)} == {"unchanged"}
    assert all(r["diff"] == "" for r in admin.apply(objects))

    changed = yaml.safe_load_all(TREE.replace('cpu: "32"', 'cpu: "48"'))
    results = admin.apply(list(changed))
    assert [r["action"] for r in results] == ["unchanged", "unchanged", "update"]
    assert admin.get_objects("queue", "cv")[0]["spec"]["guaranteed"] == {"cpu": "48", "nvidia.com/gpu": "4"}
    # Stored rows follow the document: the queue's parent column, the class's priority column.
    with dispatcher.sessions() as session:
        assert cluster_store.get_queue(session, "cv").parent == "research"
        assert cluster_store.service_classes(session)["gold"].priority == 800


def test_dry_run_shows_a_correct_diff_and_changes_nothing(dispatcher):
    admin = dispatcher.admin
    admin.apply(load_objects(TREE))
    before, audit_before = everything(admin), admin.audit()
    edited = load_objects(TREE.replace('nvidia.com/gpu: "8"', 'nvidia.com/gpu: "12"')
                          + "---\napiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: nlp}\n"
                            "spec: {parent: research, weight: 2}\n")
    results = {r["name"]: r for r in admin.apply(edited, dry_run=True)}
    assert {n: r["action"] for n, r in results.items()} == {"gold": "unchanged", "research": "update",
                                                            "cv": "unchanged", "nlp": "create"}
    old, new = (yaml.safe_dump(o.to_document(), sort_keys=False).splitlines(keepends=True)
                for o in (load_objects(TREE)[1], edited[1]))
    assert results["research"]["diff"] == "".join(difflib.unified_diff(old, new, "Queue/research", "Queue/research"))
    assert "-    nvidia.com/gpu: '8'\n+    nvidia.com/gpu: '12'\n" in results["research"]["diff"]
    created = results["nlp"]["diff"].splitlines()
    assert created[:2] == ["--- /dev/null", "+++ Queue/nlp"]
    assert "+  parent: research" in created and "+  weight: 2.0" in created
    assert all(line.startswith(("+", "@@")) for line in created[2:])
    assert results["gold"]["diff"] == ""
    assert everything(admin) == before and admin.audit() == audit_before
    refused(lambda: admin.get_objects("queue", "nlp"), "NOT_FOUND")


INVALID = [
    ("child guaranteed above its parent's",
     [queue_doc("cv2", parent="research", guaranteed={"nvidia.com/gpu": "16"})],
     "document 1: queue cv2: spec.guaranteed.nvidia.com/gpu 16 exceeds its parent research's guaranteed 8"),
    ("children's guarantees together above the parent's",
     [queue_doc("nlp", parent="research", guaranteed={"nvidia.com/gpu": "3"}),
      queue_doc("audio", parent="research", guaranteed={"nvidia.com/gpu": "2"})],
     ("queue research: its children's spec.guaranteed.nvidia.com/gpu sum to 9 (audio 2, cv 4, nlp 3), "
      "above its own guaranteed 8")),
    ("a parent lowered below its child",
     [queue_doc("research", guaranteed={"cpu": "16"})],
     "document 1: queue cv: spec.guaranteed.cpu 32 exceeds its parent research's guaranteed 16"),
    ("unknown service class",
     [queue_doc("x", serviceClasses=["standard", "platinum"])],
     "document 1: queue x: spec.serviceClasses[1]: service class 'platinum' not found"),
    ("unknown parent",
     [queue_doc("x", parent="nowhere")],
     "document 1: queue x: spec.parent: queue 'nowhere' not found"),
    ("a cycle",
     [queue_doc("a", parent="b"), queue_doc("b", parent="a")],
     "document 1: queue a: spec.parent: the queues form a cycle: a -> b -> a"),
    ("a cycle through a stored queue",
     [queue_doc("research", parent="cv")],
     "the queues form a cycle"),
    ("negative quantity",
     [queue_doc("x", guaranteed={"cpu": "-1"})],
     "document 1: spec.guaranteed.cpu: '-1' is not a quantity"),
    ("unknown kind",
     [{"apiVersion": "sluice.io/v1", "kind": "Tenant", "metadata": {"name": "x"}}],
     "document 1: kind: unknown kind string 'Tenant'"),
    ("unknown field",
     [queue_doc("x", wieght=2)],
     "document 1: spec.wieght: unknown field (did you mean weight?)"),
    ("burst policy naming an unknown queue",
     [{"apiVersion": "sluice.io/v1", "kind": "BurstPolicy", "metadata": {"name": "b"},
       "spec": {"queues": ["research", "ghost"], "serviceClasses": ["gold"]}}],
     "document 1: burst policy b: spec.queues[1]: queue 'ghost' not found"),
    ("the same object twice",
     [queue_doc("x"), queue_doc("x", weight=2)],
     "document 2: queue x is also document 1"),
    ("a valid object does not go in with an invalid one",
     [queue_doc("fine"), queue_doc("x", guaranteed={"memory": "lots"})],
     "document 2: spec.guaranteed.memory: 'lots' is not a quantity"),
]


def test_invalid_objects_are_refused_and_change_nothing(dispatcher):
    admin = dispatcher.admin
    admin.apply(load_objects(TREE))
    before, audit_before = everything(admin), admin.audit()
    for label, docs, expected in INVALID:
        for dry_run in (False, True):
            message = refused(partial(admin.apply, docs, dry_run=dry_run), "INVALID_ARGUMENT")
            assert expected in message, (label, message)
    assert everything(admin) == before
    assert admin.audit() == audit_before


def test_kinds_are_read_in_any_case_and_plural(dispatcher):
    admin = dispatcher.admin
    for word in ("queue", "queues", "Queue", "QUEUES"):
        assert [d["metadata"]["name"] for d in admin.get_objects(word)] == ["default"]
    for word in ("class", "classes", "serviceclass", "ServiceClasses", "service-class"):
        assert [d["metadata"]["name"] for d in admin.get_objects(word)] == ["standard"]
    assert [d["metadata"]["name"] for d in admin.get_objects("clusters")] == ["alpha", "beta"]
    assert admin.get_objects("burstpolicies") == []
    assert [(d["kind"], d["metadata"]["name"]) for d in admin.get_objects("")] == [
        ("Queue", "default"), ("ServiceClass", "standard"), ("Cluster", "alpha"), ("Cluster", "beta")]
    assert "unknown kind 'tenant'" in refused(lambda: admin.get_objects("tenant"), "INVALID_ARGUMENT")
    assert refused(lambda: admin.get_objects("queue", "nope"), "NOT_FOUND") == "queue 'nope' not found"
    assert refused(lambda: admin.delete("queue", "nope"), "NOT_FOUND") == "queue 'nope' not found"


def test_delete_is_refused_while_in_use_and_allowed_after(dispatcher):
    admin = dispatcher.admin
    admin.apply(load_objects(TREE) + load_objects(
        "apiVersion: sluice.io/v1\nkind: BurstPolicy\nmetadata: {name: spill}\n"
        "spec: {queues: [cv], serviceClasses: [gold], clusterSelector: {tier: cloud}}\n"))
    with Client(ClientConfig(dispatcher.address, dispatcher.admin_token, insecure=True)) as client:
        ids = client.submit([job_doc(queue="research", serviceClass="standard")] * 3)
        assert refused(lambda: admin.delete("queue", "research"), "FAILED_PRECONDITION") == \
            "queue research is in use: 3 jobs not finished, child queue cv"
        assert refused(lambda: admin.delete("class", "gold"), "FAILED_PRECONDITION") == \
            "service class gold is in use: named by queue research, named by burst policy spill"
        assert refused(lambda: admin.delete("queue", "cv"), "FAILED_PRECONDITION") == \
            "queue cv is in use: named by burst policy spill"
        client.cancel(ids)
    admin.delete("BurstPolicy", "spill")
    admin.delete("queues", "cv")
    # Finished jobs still refer to the queue: their history is kept, so it stays.
    assert refused(lambda: admin.delete("queue", "research"), "FAILED_PRECONDITION") == \
        "queue research cannot be deleted: still referred to by 3 jobs"
    admin.apply([queue_doc("research", serviceClasses=["standard"])])
    assert admin.delete("classes", "gold")["metadata"]["name"] == "gold"
    assert [d["metadata"]["name"] for d in admin.get_objects("queues")] == ["default", "research"]
    assert admin.get_objects("classes") == [admin.get_objects("class", "standard")[0]]
    deletes = [(r["kind"], r["name"]) for r in admin.audit() if r["action"] == "delete"]
    assert deletes == [("BurstPolicy", "spill"), ("Queue", "cv"), ("ServiceClass", "gold")]


def test_a_cluster_is_deletable_only_without_active_jobs_or_history(dispatcher):
    admin = dispatcher.admin
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    with Client(ClientConfig(dispatcher.address, dispatcher.admin_token, insecure=True)) as client:
        [job_id] = client.submit([job_doc(cpu="1")])
        command = agent.next("command")
        assert refused(lambda: admin.delete("cluster", "alpha"), "FAILED_PRECONDITION") == \
            "cluster alpha is in use: 1 job active"
        agent.status(1, job_id, command.dispatch.attempt, "SUCCEEDED")
        assert client.get(job_id)["state"] == "SUCCEEDED"
    assert refused(lambda: admin.delete("cluster", "alpha"), "FAILED_PRECONDITION") == (
        "cluster alpha cannot be deleted: still referred to by 1 token, 1 attempt, 1 job, 1 outbox command; "
        "cordon it instead")
    agent.close()
    # beta only has its agent token; a cluster nothing refers to goes.
    assert "still referred to by 1 token" in refused(lambda: admin.delete("cluster", "beta"), "FAILED_PRECONDITION")
    admin.apply(load_objects("apiVersion: sluice.io/v1\nkind: Cluster\nmetadata: {name: gamma}\nspec: {}\n"))
    assert admin.delete("cluster", "gamma")["metadata"]["name"] == "gamma"
    assert [d["metadata"]["name"] for d in admin.get_objects("clusters")] == ["alpha", "beta"]


def test_quota_set_merges_removes_and_is_checked(dispatcher):
    admin = dispatcher.admin
    admin.apply(load_objects(TREE))
    result = admin.set_quota("cv", {"memory": "64Gi", "nvidia.com/gpu": "2"}, {"cpu": "40"})
    assert result["action"] == "update"
    spec = admin.get_objects("queue", "cv")[0]["spec"]
    assert spec["guaranteed"] == {"cpu": "32", "memory": "64Gi", "nvidia.com/gpu": "2"}
    assert spec["max"] == {"cpu": "40"} and spec["parent"] == "research"
    assert result["object"] == admin.get_objects("queue", "cv")[0]
    assert admin.set_quota("cv", {"memory": ""}, {"cpu": ""})["action"] == "update"
    spec = admin.get_objects("queue", "cv")[0]["spec"]
    assert spec["guaranteed"] == {"cpu": "32", "nvidia.com/gpu": "2"} and spec["max"] == {}
    assert admin.set_quota("cv", {"cpu": "32"})["action"] == "unchanged"

    before, audit_before = everything(admin), admin.audit()
    for guaranteed, maximum, expected in [
            ({"nvidia.com/gpu": "9"}, {}, ("queue cv: spec.guaranteed.nvidia.com/gpu 9 exceeds its parent "
                                           "research's guaranteed 8")),
            ({"cpu": "-4"}, {}, "queue cv: spec.guaranteed.cpu: '-4' is not a quantity"),
            ({"cpu": "32"}, {"cpu": "16"}, "queue cv: spec.guaranteed.cpu: must not exceed spec.max.cpu (16)"),
            ({}, {}, "quota: no resources given")]:
        assert expected in refused(partial(admin.set_quota, "cv", guaranteed, maximum), "INVALID_ARGUMENT")
    # Lowering a parent below its child is refused too, naming the child.
    assert refused(lambda: admin.set_quota("research", {"cpu": "8"}), "INVALID_ARGUMENT") == \
        "queue cv: spec.guaranteed.cpu 32 exceeds its parent research's guaranteed 8"
    assert refused(lambda: admin.set_quota("nope", {"cpu": "1"}), "NOT_FOUND") == "queue 'nope' not found"
    assert everything(admin) == before and admin.audit() == audit_before
    quota_sets = [r for r in admin.audit() if r["action"] == "quota-set"]
    assert len(quota_sets) == 2 and quota_sets[0]["details"]["before"]["spec"]["max"] == {}
    assert quota_sets[0]["details"]["after"]["spec"]["max"] == {"cpu": "40"}


def test_add_member_lets_a_user_submit_to_a_members_only_queue(dispatcher):
    admin = dispatcher.admin
    admin.apply([queue_doc("vision", members=["alice"])])
    alice, bob = (admin.create_token("user", u)["secret"] for u in ("alice", "bob"))
    doc = job_doc(cpu="1", queue="vision")
    with Client(ClientConfig(dispatcher.address, bob, insecure=True)) as client:
        assert "bob may not submit to queue 'vision'" in refused(lambda: client.submit([doc]), "PERMISSION_DENIED")
        result = admin.add_member("vision", "bob")
        assert result["action"] == "update" and result["object"]["spec"]["members"] == ["alice", "bob"]
        assert client.submit([doc])
    with Client(ClientConfig(dispatcher.address, alice, insecure=True)) as client:
        assert client.submit([doc])
    assert admin.add_member("vision", "bob")["action"] == "unchanged"
    assert refused(lambda: admin.add_member("nope", "bob"), "NOT_FOUND") == "queue 'nope' not found"
    [record] = [r for r in admin.audit() if r["action"] == "add-member"]
    assert (record["actor"], record["kind"], record["name"]) == ("root", "Queue", "vision")


def test_tokens_are_created_listed_and_revoked(dispatcher):
    admin = dispatcher.admin
    made = admin.create_token("user", "carol", expires_s=3600)
    assert made["secret"].startswith("sl_") and made["id"] > 0
    agent = admin.create_token("agent", "agent-beta-2", cluster="beta")
    listed = {t["id"]: t for t in admin.tokens()}
    carol = listed[made["id"]]
    assert (carol["role"], carol["subject"], carol["cluster"], carol["revokedAt"]) == ("user", "carol", None, None)
    assert carol["createdAt"] and carol["expiresAt"] > carol["createdAt"]
    assert listed[agent["id"]]["cluster"] == "beta" and listed[agent["id"]]["expiresAt"] is None
    assert set(carol) == {"id", "role", "subject", "cluster", "createdAt", "expiresAt", "revokedAt"}
    assert all("sl_" not in str(t) for t in admin.tokens())  # never a secret

    with Client(ClientConfig(dispatcher.address, made["secret"], insecure=True)) as client:
        assert client.list() == []
        revoked = admin.revoke_token(made["id"])
        assert revoked["revokedAt"] and not revoked["alreadyRevoked"]
        assert refused(client.list, "UNAUTHENTICATED") == "invalid, expired or revoked token"
    assert admin.revoke_token(made["id"])["alreadyRevoked"]
    assert admin.tokens()[-2]["revokedAt"] == revoked["revokedAt"]
    # A dispatcher that never cached it (another replica) refuses it too.
    other = Dispatcher(ServerSettings(listen="127.0.0.1:0", database=dispatcher.settings.database)).start()
    try:
        with Client(ClientConfig(other.address, made["secret"], insecure=True)) as client:
            refused(client.list, "UNAUTHENTICATED")
    finally:
        other.stop()

    for args, code, expected in [
            (("root", "x"), "INVALID_ARGUMENT", "role: must be one of admin, user, agent"),
            (("user", ""), "INVALID_ARGUMENT", "subject: required"),
            (("agent", "a"), "INVALID_ARGUMENT", "cluster: required for agent tokens and only for them"),
            (("user", "u", "alpha"), "INVALID_ARGUMENT", "cluster: required for agent tokens and only for them"),
            (("agent", "a", "nowhere"), "NOT_FOUND", "cluster 'nowhere' not found")]:
        assert expected in refused(partial(admin.create_token, *args), code)
    assert refused(lambda: admin.revoke_token(9999), "NOT_FOUND") == "token 9999 not found"
    actions = [(r["action"], r["kind"], r["name"]) for r in admin.audit() if r["kind"] == "Token"]
    assert actions == [("create", "Token", str(made["id"])), ("create", "Token", str(agent["id"])),
                       ("revoke", "Token", str(made["id"]))]
    details = admin.audit()[0]["details"]
    assert (details["role"], details["subject"], details["cluster"]) == ("user", "carol", None)
    assert details["expiresAt"][:19] == carol["expiresAt"][:19]


def test_only_admins_may_administer(dispatcher):
    user = dispatcher.admin.create_token("user", "dave")["secret"]
    for secret, who in ((user, "dave (user)"), (dispatcher.agent_tokens["alpha"], "agent-alpha (agent)")):
        with AdminClient(ClientConfig(dispatcher.address, secret, insecure=True)) as client:
            calls = [lambda: client.apply([queue_doc("x")]), lambda: client.get_objects("queues"),
                     lambda: client.delete("queue", "default"), lambda: client.set_quota("default", {"cpu": "1"}),
                     lambda: client.add_member("default", "dave"), lambda: client.create_token("admin", "dave"),
                     client.tokens, lambda: client.revoke_token(1),
                     lambda: client.set_cluster_state("alpha", "cordoned"), client.audit]
            for call in calls:
                assert refused(call, "PERMISSION_DENIED") == f"{who} may not call this; needs admin"
    with AdminClient(ClientConfig(dispatcher.address, "sl_wrong", insecure=True)) as client:
        refused(client.tokens, "UNAUTHENTICATED")
    assert [d["metadata"]["name"] for d in dispatcher.admin.get_objects("queues")] == ["default"]
    assert [r["name"] for r in dispatcher.admin.audit()] == [str(dispatcher.admin.tokens()[-1]["id"])]


def test_cordon_drain_and_uncordon(dispatcher):
    admin = dispatcher.admin
    agent = ScriptedAgent(dispatcher.address, dispatcher.agent_tokens["alpha"], "alpha")
    agent.next("welcome")
    with Client(ClientConfig(dispatcher.address, dispatcher.admin_token, insecure=True)) as client:
        def states():
            return {c["name"]: c["state"] for c in client.clusters()}
        assert states()["alpha"] == "active"
        assert admin.set_cluster_state("alpha", "cordoned") == "active"
        assert states()["alpha"] == "cordoned"
        [job_id] = client.submit([job_doc(cpu="1")])
        agent.send(heartbeat=agents_pb2.Heartbeat(capacity=agent.capacity({"cpu": 8000})))
        with pytest.raises(queue.Empty):
            agent.next("command", timeout=1.5)  # a cordoned cluster gets no new jobs
        assert client.get(job_id)["state"] == "QUEUED"
        assert admin.set_cluster_state("alpha", "draining") == "cordoned"
        assert states()["alpha"] == "draining"
        assert admin.set_cluster_state("alpha", "active") == "draining"
        agent.send(heartbeat=agents_pb2.Heartbeat(capacity=agent.capacity({"cpu": 8000})))
        assert agent.next("command").dispatch.job_id == job_id
        wait_for(lambda: states()["alpha"] == "active")
    assert admin.set_cluster_state("alpha", "active") == "active"  # no change, no record
    assert refused(lambda: admin.set_cluster_state("alpha", "paused"), "INVALID_ARGUMENT") == \
        "state: must be one of active, cordoned, draining, got 'paused'"
    assert refused(lambda: admin.set_cluster_state("nowhere", "cordoned"), "NOT_FOUND") == \
        "cluster 'nowhere' not found"
    assert [(r["action"], r["details"]) for r in admin.audit()] == [
        ("cordon", {"state": "cordoned", "previousState": "active"}),
        ("drain", {"state": "draining", "previousState": "cordoned"}),
        ("uncordon", {"state": "active", "previousState": "draining"})]
    agent.close()


def test_audit_says_who_did_what_and_when(dispatcher):
    admin = dispatcher.admin
    admin.apply(load_objects(TREE))
    second_admin = admin.create_token("admin", "erin")
    with AdminClient(ClientConfig(dispatcher.address, second_admin["secret"], insecure=True)) as erin:
        erin.set_quota("cv", {"cpu": "16"})
        erin.set_cluster_state("beta", "cordoned")
        erin.delete("queue", "cv")
    records = admin.audit()
    assert [(r["actor"], r["action"], r["kind"], r["name"]) for r in records] == [
        ("root", "create", "ServiceClass", "gold"), ("root", "create", "Queue", "research"),
        ("root", "create", "Queue", "cv"), ("root", "create", "Token", str(second_admin["id"])),
        ("erin", "quota-set", "Queue", "cv"), ("erin", "cordon", "Cluster", "beta"),
        ("erin", "delete", "Queue", "cv")]
    assert all(r["at"].endswith("Z") for r in records)
    assert [r["id"] for r in records] == sorted(r["id"] for r in records)
    assert records[2]["details"] == {"before": None, "after": load_objects(TREE)[2].to_document()}
    assert records[-1]["details"]["after"] is None and records[-1]["details"]["before"]["metadata"]["name"] == "cv"
    assert "sl_" not in str(records)
    # The newest N, oldest first; or everything after a known id.
    assert admin.audit(limit=2) == records[-2:]
    assert admin.audit(after_id=records[4]["id"]) == records[5:]
    assert admin.audit(after_id=records[0]["id"], limit=1) == records[1:2]
