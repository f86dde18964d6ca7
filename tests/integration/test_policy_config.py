"""The leader's cache of policy objects (scheduler.PolicyConfig): reused while the documents are the
same, read again as soon as any class, queue or burst policy changes, whoever changed it."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from dispatcher.scheduler.mapping import PolicyConfig
from dispatcher.scheduler.stored_policy import refresh
from dispatcher.services import administering
from dispatcher.store import database
from sluice.objects import default_objects, load_objects


def test_policy_objects_are_read_again_only_when_their_documents_change(db_url):
    db = database.connect(database.DatabaseSettings(url=db_url))
    sessions = sessionmaker(db.engine, expire_on_commit=False)
    try:
        with sessions.begin() as session:
            administering.apply(session, "root", default_objects())
        config = PolicyConfig()
        with sessions.begin() as session:
            refresh(config, session)
        first = config.classes
        assert set(first) == {"critical", "standard", "batch"} and [q.name for q in config.quotas] == ["default"]
        assert [r.name for r in config.rules] == ["cloud-burst"]
        with sessions.begin() as session:
            assert refresh(config, session).classes is first  # nothing changed: nothing read again
        changes = [
            "apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: team}\nspec: {guaranteed: {cpu: '4'}}\n",
            ("apiVersion: sluice.io/v1\nkind: ServiceClass\nmetadata: {name: batch}\n"
             "spec: {priority: 50, preemptible: false}\n"),
        ]
        for change in changes:
            with sessions.begin() as session:
                administering.apply(session, "root", load_objects(change))
            with sessions.begin() as session:
                refresh(config, session)
        assert [q.name for q in config.quotas] == ["default", "team"]
        assert config.quotas[1].guaranteed == {"cpu": 4000}
        assert not config.classes["batch"].preemptible and config.classes["batch"].priority == 50
        with sessions.begin() as session:  # a change written by hand, not through the admin API, is seen too
            session.execute(text("DELETE FROM burst_policies"))
        with sessions.begin() as session:
            assert refresh(config, session).rules == []
    finally:
        db.close()
