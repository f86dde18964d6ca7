"""The one membership rule (Principal.belongs) and who sees which job (services.scoping.sees), whichever
way the caller authenticated: Sluice's own token (listed in a queue's members) or an identity provider's
(granted the queue by a group)."""
from __future__ import annotations

from dispatcher.services.scoping import sees
from dispatcher.store.tokens import Principal

ALICE = Principal("alice", "user")
BOB_BY_GROUP = Principal("bob", "user", queues=frozenset({"vision"}))


def test_a_user_belongs_to_a_queue_listing_them_or_granted_by_a_group():
    assert ALICE.belongs("vision", ["alice", "carol"])
    assert not ALICE.belongs("vision", ["carol"])
    assert not ALICE.belongs("vision", [])  # a queue open to every submitter has no members to see its jobs
    assert BOB_BY_GROUP.belongs("vision", [])
    assert not BOB_BY_GROUP.belongs("nlp", ["carol"])


def test_users_see_their_own_jobs_and_their_queues_jobs_and_admins_every_job():
    assert sees(ALICE, frozenset(), "nlp", "alice")
    assert not sees(ALICE, frozenset(), "nlp", "carol")
    assert sees(ALICE, frozenset({"nlp"}), "nlp", "carol")
    assert sees(Principal("root", "admin"), None, "nlp", "carol")
