"""`explain`'s quota verdict counts what runs from the per-queue sum, a running job as if asking again."""
from __future__ import annotations

import json
from datetime import UTC, datetime

from sqlalchemy.orm import sessionmaker

from dispatcher.scheduler.explaining import explain
from dispatcher.services import administering, submitting
from dispatcher.store import database, lifecycle
from dispatcher.store.tokens import Principal
from sluice.objects import default_objects, load_objects
from tests.integration.test_spine import job_doc


def test_the_quota_verdict_counts_the_queues_running_jobs(db_url):
    db = database.connect(database.DatabaseSettings(url=db_url))
    sessions = sessionmaker(db.engine, expire_on_commit=False)
    try:
        with sessions.begin() as session:
            administering.apply(session, "root", [*default_objects(), *load_objects(
                "apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: org}\nspec: {max: {cpu: '4'}}\n---\n"
                "apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: team}\nspec: {parent: org}\n")])

        def submit(cpu: str, n: int) -> list[int]:
            doc = job_doc(cpu=cpu)
            doc["spec"]["queue"] = "team"
            with sessions.begin() as session:
                return submitting.submit(session, Principal("root", "admin"),
                                         submitting.parse([json.dumps(doc)] * n))

        running = submit("1", 3)
        with sessions.begin() as session:
            lifecycle.dispatch(session, [(i, "onprem") for i in running])
        [small], [big] = submit("1", 1), submit("2", 1)
        now = datetime.now(UTC)
        with sessions() as session:
            def quota(job_id: int) -> str:
                return explain(session, job_id, now, unreachable_after_s=5).quota
            assert quota(small) == "within the quotas of queue team and its parents"
            assert "org" in quota(big) and "max" in quota(big)  # 3 running + 2 > 4
            assert quota(running[0]) == "within the quotas of queue team and its parents"  # 2 others + itself
    finally:
        db.close()
