"""Shared fixtures: one real PostgreSQL (pgserver) per test session, a migrated template database,
and a fresh copy of it per test (fast and isolated), dropped after it. Dispatchers and agents run for real on
loopback.
"""
from __future__ import annotations

import itertools
import os
import pathlib
import shutil
import tempfile
from dataclasses import dataclass

import psycopg
import pytest

from sluice import process

process.apply()  # the test session's entry point: before anything imports grpc, as Sluice's processes do

from dispatcher.store import database  # noqa: E402

_counter = itertools.count()


def _scratch_root() -> str:
    """Where tests keep PostgreSQL data directories they throw away: /dev/shm when it is a tmpfs with room.

    Each copy of the template (and each initdb) creates some four hundred files; on the ext4 of /tmp, after a
    few hundred were created and deleted, finding a free inode for each costs the backend about 0.25 s of
    CPU per copy, against 0.04 s on tmpfs. Nothing there need outlive the test session. The path stays short:
    a server's unix socket lives in its data directory.
    """
    try:
        shm = os.statvfs("/dev/shm")
    except OSError:
        return "/tmp"
    return "/dev/shm" if shm.f_bavail * shm.f_frsize >= 4 << 30 and os.access("/dev/shm", os.W_OK) else "/tmp"


SCRATCH = _scratch_root()


@dataclass(frozen=True)
class PgServer:
    server: object  # pgserver's PostgresServer
    host: pathlib.Path  # its data directory, where its unix socket is
    admin: psycopg.Connection  # autocommit, on the postgres database: creates and drops the tests' databases


@pytest.fixture(scope="session")
def pg_server():
    root = pathlib.Path(tempfile.mkdtemp(prefix="sl-pg-", dir=SCRATCH))
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
    admin = psycopg.connect(host=str(host), user="postgres", dbname="postgres", autocommit=True)
    yield PgServer(server, host, admin)
    admin.close()
    server.cleanup()
    shutil.rmtree(root, ignore_errors=True)


def _new_database(pg_server: PgServer, template: str | None) -> str:
    name = f"t_{os.getpid()}_{next(_counter)}"
    pg_server.admin.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    return f"postgresql+psycopg://postgres@/{name}?host={pg_server.host}"


def _drop_database(pg_server: PgServer, url: str) -> None:
    """Drop a test's database once it is over (tmpfs is memory); anything the test left connected is cut off."""
    name = url.split("@/", 1)[1].split("?", 1)[0]
    try:
        pg_server.admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    except psycopg.Error:  # kept until the session's server is deleted: a leak of memory, not a failure
        pass


@pytest.fixture
def db_url(pg_server):
    """A fresh database at the schema head, private to this test."""
    url = _new_database(pg_server, "sluice_template")
    yield url
    _drop_database(pg_server, url)


@pytest.fixture
def empty_db_url(pg_server):
    """A fresh database with no schema at all."""
    url = _new_database(pg_server, None)
    yield url
    _drop_database(pg_server, url)


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
