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


class Postgres:
    def __init__(self) -> None:
        # A short path: the server's Unix socket lives in its data directory (limit ~107 bytes).
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="sl-bench-", dir="/tmp"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, self._server = database.start_embedded(self.root, cleanup="delete")
        self.host = (self.root / "postgres").resolve()

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

    def __enter__(self) -> "Postgres":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
