"""Shared fixtures: one real PostgreSQL (pgserver) per test session, a migrated template database,
and a fresh copy of it per test (fast and isolated). Dispatchers and agents run for real on loopback.
"""
from __future__ import annotations

import itertools
import os
import pathlib
import shutil
import tempfile

import pytest

from sluice import process

process.apply()  # the test session's entry point: before anything imports grpc, as Sluice's processes do

from dispatcher.store import database  # noqa: E402

_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_server():
    # A short path: the server's unix socket lives in its data directory.
    root = pathlib.Path(tempfile.mkdtemp(prefix="sl-pg-", dir="/tmp"))
    url, server = database.start_embedded(root, cleanup="delete")
    host = root.resolve() / "postgres"
    # A throw-away server: nothing in it need outlive a crash of the machine, so no commit waits for a disk flush
    # (a killed postgres process loses nothing either way); each test's CREATE DATABASE would flush the template.
    server.psql("ALTER SYSTEM SET fsync = off; ALTER SYSTEM SET synchronous_commit = off; "
                "ALTER SYSTEM SET full_page_writes = off; SELECT pg_reload_conf();")
    server.psql("CREATE DATABASE sluice_template;")
    template = f"postgresql+psycopg://postgres@/sluice_template?host={host}"
    db = database.connect(database.DatabaseSettings(url=template))
    database.migrate(db.engine)
    db.close()
    yield server, host
    server.cleanup()
    shutil.rmtree(root, ignore_errors=True)


def _new_database(pg_server, template: str | None) -> str:
    server, host = pg_server
    name = f"t_{os.getpid()}_{next(_counter)}"
    server.psql(f"CREATE DATABASE {name}" + (f" TEMPLATE {template};" if template else ";"))
    return f"postgresql+psycopg://postgres@/{name}?host={host}"


@pytest.fixture
def db_url(pg_server) -> str:
    """A fresh database at the schema head, private to this test."""
    return _new_database(pg_server, "sluice_template")


@pytest.fixture
def empty_db_url(pg_server) -> str:
    """A fresh database with no schema at all."""
    return _new_database(pg_server, None)


@pytest.fixture
def system(db_url, tmp_path):
    """Dispatcher plus in-process sim agents for the default clusters, over real gRPC on loopback."""
    from devstack.embedded import Embedded, UpSettings
    from sluice.client import Client
    from sluice.objects import default_objects

    embedded = Embedded(UpSettings(data_dir=tmp_path / "data", listen="127.0.0.1:0", make_default=False,
                                   database_url=db_url, sim_time_scale=0.2), default_objects()).start()
    embedded.wait_connected()
    embedded.client = Client(embedded.client_settings(timeout_s=10))
    yield embedded
    embedded.client.close()
    embedded.stop()
