"""The policy's inputs as the store holds them: the queue tree's quotas, the service classes, the burst rules
(PolicyConfig, read again only when their documents changed) and the decayed usage fair share remembers."""
from __future__ import annotations

from datetime import datetime

from dispatcher.policy.plans import ClassPolicy
from dispatcher.policy.quotas import QueueQuota, QuotaTree
from dispatcher.scheduler.mapping import PolicyConfig
from dispatcher.services import budgets
from dispatcher.services.admin_objects import class_policy_of, quota_of
from dispatcher.store import clusters as cluster_store
from dispatcher.store import cycle_reads
from sluice.objects import object_from_document


def refresh(config: PolicyConfig, session, digest: str | None = None) -> PolicyConfig:
    """`config`, read again if its documents changed since. `digest`: the documents' digest, when the caller
    read it already in this transaction."""
    digest = digest if digest is not None else cycle_reads.policy_digest(session)
    if digest != config.digest:
        config.classes, config.quotas = class_policies(session), queue_quotas(session)
        config.rules = budgets.rules(session)
        config.digest = digest
    return config


def queue_quotas(session) -> list[QueueQuota]:
    """The queue tree's quotas, from the Queue objects."""
    return [quota_of(object_from_document(row.spec)) for row in cluster_store.list_queues(session)]


def decayed_history(session, now: datetime, quotas: list[QueueQuota]) -> dict[str, dict[str, float]]:
    """Per queue, the decayed resource-seconds its fair share remembers (policy/decay.py): only in trees whose root
    has a usage half-life; none read when no root has one."""
    if not any(q.usage_half_life_s for q in quotas):
        return {}
    tree = QuotaTree(quotas, {})
    half_lives = {q.name: h for q in quotas if (h := tree.half_life(q.name))}
    return cycle_reads.decayed_history(session, now, half_lives)


def class_policies(session) -> dict[str, ClassPolicy]:
    """Each service class as the policy reads it, by name."""
    return {name: class_policy_of(object_from_document(row.spec))
            for name, row in cluster_store.service_classes(session).items()}
