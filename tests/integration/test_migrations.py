"""The schema: one Alembic head, upgrades from nothing, models that match the migrations, and a
dispatcher that refuses a schema it does not know, saying which command fixes it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from dispatcher.errors import SchemaBehind, StoreUnavailable
from dispatcher.store import database
from dispatcher.store.database import DatabaseSettings
from dispatcher.store.models import Base

TABLES = {"alembic_version", "api_tokens", "attempts", "clusters", "job_events", "jobs", "outbox", "queues",
          "service_classes", "burst_policies", "admin_audit", "submit_config", "submit_keys",
          "revoked_certificates", "job_arrays", "job_dependencies", "schedules", "intake_jobs"}


def plain_url(url: str) -> str:
    """The fixtures' postgresql+psycopg:// URL in the form users type: postgresql://..."""
    assert url.startswith("postgresql+psycopg://")
    return "postgresql://" + url[len("postgresql+psycopg://"):]


def cli_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}


@pytest.fixture
def empty_db(empty_db_url):
    db = database.connect(DatabaseSettings(url=empty_db_url))
    yield db
    db.close()


def test_exactly_one_head():
    script = ScriptDirectory.from_config(database._alembic_config())
    heads = script.get_heads()
    assert len(heads) == 1, f"several migration heads, merge them: {heads}"
    assert heads[0] == database.head_revision()
    # Every revision chains back to the one base.
    assert len(script.get_bases()) == 1


def test_upgrade_from_empty_reaches_head_and_is_idempotent(empty_db):
    engine = empty_db.engine
    assert database.current_revision(engine) is None
    assert inspect(engine).get_table_names() == []
    database.migrate(engine)
    assert database.current_revision(engine) == database.head_revision()
    assert set(inspect(engine).get_table_names()) == TABLES
    database.check_schema(engine)  # at head: no complaint
    database.migrate(engine)  # again: nothing to do, nothing breaks
    assert database.current_revision(engine) == database.head_revision()
    assert set(inspect(engine).get_table_names()) == TABLES


def test_models_match_migrations(empty_db):
    database.migrate(empty_db.engine)
    with empty_db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], f"models and migrations differ (write a migration): {diff}"
    # The comparison is not vacuous: a schema that drifted from the models is noticed.
    with empty_db.engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_jobs_state_id"))
        conn.execute(text("ALTER TABLE jobs ADD COLUMN stray text"))
    with empty_db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    kinds = sorted(d[0] if isinstance(d, tuple) else d[0][0] for d in diff)
    assert kinds == ["add_index", "remove_column"], diff


def test_dispatcher_refuses_a_schema_that_is_behind(empty_db_url):
    from dispatcher.server import Dispatcher, ServerSettings
    with pytest.raises(SchemaBehind) as err:
        Dispatcher(ServerSettings(listen="127.0.0.1:0", database=DatabaseSettings(url=empty_db_url)))
    assert "sluice dispatcher migrate" in str(err.value)
    assert "nothing" in str(err.value) and database.head_revision() in str(err.value)
    with pytest.raises(SchemaBehind):
        db = database.connect(DatabaseSettings(url=empty_db_url))
        try:
            database.check_schema(db.engine)
        finally:
            db.close()


def test_cli_serve_refuses_then_migrate_fixes_it(empty_db_url):
    url = plain_url(empty_db_url)
    sluice = [sys.executable, "-m", "sluice"]
    refused = subprocess.run(sluice + ["dispatcher", "serve", "--database-url", url, "--listen", "127.0.0.1:0",
                                       "--metrics-listen", "127.0.0.1:0", "--insecure"],
                             capture_output=True, text=True, timeout=60, env=cli_env())
    assert refused.returncode == 1, refused
    lines = refused.stderr.splitlines()
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith("error: dispatcher serve: ") and "sluice dispatcher migrate" in lines[0]

    migrated = subprocess.run(sluice + ["dispatcher", "migrate", "--database-url", url],
                              capture_output=True, text=True, timeout=60, env=cli_env())
    assert migrated.returncode == 0, migrated
    assert migrated.stdout.strip() == f"schema empty -> {database.head_revision()}"
    again = subprocess.run(sluice + ["dispatcher", "migrate", "--database-url", url],
                           capture_output=True, text=True, timeout=60, env=cli_env())
    assert again.returncode == 0, again
    head = database.head_revision()
    assert again.stdout.strip() == f"schema {head} -> {head}"

    # Now it serves, and stops cleanly on Ctrl-C.
    serve = subprocess.Popen(sluice + ["dispatcher", "serve", "--database-url", url, "--listen", "127.0.0.1:0",
                                       "--metrics-listen", "127.0.0.1:0", "--insecure"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    watchdog = threading.Timer(30, serve.kill)  # never hang the suite on a server that says nothing
    watchdog.start()
    try:
        line = serve.stderr.readline()
        assert line.startswith("serving on 127.0.0.1:"), line + serve.stderr.read()
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=15) == 0
    finally:
        watchdog.cancel()
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        serve.stdout.close()
        serve.stderr.close()


@pytest.mark.parametrize("given", ["postgres://u:p@db.example:5432/sluice", "postgresql://u:p@db.example:5432/sluice",
                                   "postgresql+psycopg://u:p@db.example:5432/sluice"])
def test_postgres_url_forms_are_accepted(given):
    assert database.sqlalchemy_url(given) == "postgresql+psycopg://u:p@db.example:5432/sluice"


@pytest.mark.parametrize("given", ["mysql://u:p@db.example/sluice", "sqlite:///sluice.db", "db.example:5432"])
def test_other_urls_are_refused(given):
    with pytest.raises(StoreUnavailable) as err:
        database.sqlalchemy_url(given)
    assert "postgresql://" in str(err.value)


def test_each_url_form_connects(db_url):
    rest = db_url[len("postgresql+psycopg://"):]
    for scheme in ("postgres://", "postgresql://", "postgresql+psycopg://"):
        db = database.connect(DatabaseSettings(url=scheme + rest))
        try:
            assert database.current_revision(db.engine) == database.head_revision()
        finally:
            db.close()
    with pytest.raises(StoreUnavailable):
        database.connect(DatabaseSettings(url="mysql://" + rest))
