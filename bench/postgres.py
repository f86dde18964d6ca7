"""One throw-away PostgreSQL per benchmark run: pgserver in a fresh temp dir, deleted at the end.

The server listens on its Unix socket only (pgserver starts it with `-h ""`), never on TCP. Each
benchmark takes databases of its own from it, migrated by the project's own migration code.
"""
from __future__ import annotations

import itertools
import pathlib
import shutil
import tempfile
import warnings

import psycopg

from dispatcher.store import database

_names = itertools.count()
SHARED_BUFFERS = "2GB"


class Postgres:
    def __init__(self) -> None:
        # A short path: the server's Unix socket lives in its data directory (limit ~107 bytes).
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="sl-bench-", dir="/tmp"))
        self.host = (self.root / "postgres").resolve()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, server = database.start_embedded(self.root, cleanup="stop")
            # Sized as a production server would be (about a quarter of RAM is the usual advice; 2 GB of
            # this machine's 24): a 1M-job table and its indexes then stay in Postgres' own cache. Read
            # at start, so the server is started again with it.
            with psycopg.connect(self.libpq("postgres"), autocommit=True) as conn:
                conn.execute(f"ALTER SYSTEM SET shared_buffers = '{SHARED_BUFFERS}'")
            server.cleanup()
            _, self._server = database.start_embedded(self.root, cleanup="delete")

    def url(self, name: str) -> str:
        """SQLAlchemy URL of a database on this server."""
        return f"postgresql+psycopg://postgres@/{name}?host={self.host}"

    def libpq(self, name: str) -> str:
        """libpq URL (plain psycopg) of a database on this server."""
        return f"postgresql://postgres@/{name}?host={self.host}"

    def create(self, prefix: str, *, template: str | None = None, migrate: bool = True) -> str:
        """A new database (a copy of `template`, or migrated to the schema head); returns its name."""
        name = f"{prefix}_{next(_names)}"
        with psycopg.connect(self.libpq("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
        if migrate and template is None:
            db = database.connect(database.DatabaseSettings(url=self.url(name)))
            try:
                database.migrate(db.engine)
            finally:
                db.close()
        return name

    def drop(self, name: str) -> None:
        with psycopg.connect(self.libpq("postgres"), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def checkpoint(self) -> None:
        """Write out what earlier benchmarks left dirty in the buffers, so that the next one does not
        share the disk and a core with that write-back (a 1M-job drain leaves gigabytes of it)."""
        with psycopg.connect(self.libpq("postgres"), autocommit=True) as conn:
            conn.execute("CHECKPOINT")

    def settings(self) -> dict[str, str]:
        """The server settings that bear on the figures."""
        names = ("server_version", "shared_buffers", "work_mem", "synchronous_commit", "fsync", "max_wal_size",
                 "wal_level", "max_connections")
        with psycopg.connect(self.libpq("postgres"), autocommit=True) as conn:
            return {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in names}

    def close(self) -> None:
        try:
            self._server.cleanup()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Postgres:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
