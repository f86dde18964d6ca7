"""The connection pool's liveness check (store.database._ping_when_idle), against a real Postgres whose
backends are ended under the pool (pg_terminate_backend: what a server restart does to each of them)."""
from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import exc, text
from sqlalchemy.orm import sessionmaker

from dispatcher.store import database


def _pid(db) -> int:
    with db.engine.connect() as conn:
        return conn.execute(text("SELECT pg_backend_pid()")).scalar_one()


def _end(db_url: str, pid: int) -> None:
    with psycopg.connect(database.sqlalchemy_url(db_url).replace("postgresql+psycopg", "postgresql"),
                         autocommit=True) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
    time.sleep(0.2)  # the backend is gone once its socket is closed


def test_a_connection_idle_past_the_limit_is_checked_and_replaced_when_the_server_dropped_it(db_url):
    db = database.connect(database.DatabaseSettings(url=db_url, pool_size=1, pool_overflow=0, ping_after_idle_s=0.3))
    try:
        first = _pid(db)
        _end(db_url, first)
        time.sleep(0.3)
        assert _pid(db) != first  # the ping found it gone: a new connection, and no error
    finally:
        db.close()


def test_a_connection_used_just_now_is_not_pinged_and_one_failure_renews_the_whole_pool(db_url):
    db = database.connect(database.DatabaseSettings(url=db_url, pool_size=2, pool_overflow=0, ping_after_idle_s=60))
    try:
        with db.engine.connect() as a, db.engine.connect() as b:  # two pooled connections
            pids = {a.execute(text("SELECT pg_backend_pid()")).scalar_one(),
                    b.execute(text("SELECT pg_backend_pid()")).scalar_one()}
        for pid in pids:
            _end(db_url, pid)
        with pytest.raises(exc.OperationalError) as failed:
            _pid(db)
        assert failed.value.connection_invalidated
        assert _pid(db) not in pids and _pid(db) not in pids  # every pooled connection was replaced
    finally:
        db.close()


def test_a_failure_on_the_driver_connection_renews_the_pool_too(db_url):
    """The hot paths run psycopg statements under a session (database.driver), past SQLAlchemy's error
    handling; the session's rollback on the dead connection still tells the pool (and is the error raised)."""
    db = database.connect(database.DatabaseSettings(url=db_url, pool_size=2, pool_overflow=0, ping_after_idle_s=60))
    sessions = sessionmaker(db.engine)
    try:
        with db.engine.connect() as a, db.engine.connect() as b:
            pids = {a.execute(text("SELECT pg_backend_pid()")).scalar_one(),
                    b.execute(text("SELECT pg_backend_pid()")).scalar_one()}
        for pid in pids:
            _end(db_url, pid)
        with pytest.raises((psycopg.OperationalError, exc.OperationalError)):  # the rollback's, or the statement's
            with sessions.begin() as session:
                database.driver(session).execute("SELECT 1")
        assert _pid(db) not in pids and _pid(db) not in pids  # every pooled connection was replaced
    finally:
        db.close()
