"""The leader lock: a Postgres session advisory lock held on a connection of its own.

When the leader dies its connection closes, the lock is released and another replica takes it.
"""
from __future__ import annotations

import psycopg
from sqlalchemy import Engine

from dispatcher.store.database import reaching
from dispatcher.store.listening import libpq_url


class LeaderLock:
    """An autocommit connection for the leader lock, with keepalives on both ends of TCP.

    The server-side settings let Postgres drop a silent leader (its machine or network gone) within about
    keepalive_s + 2 s, releasing the lock for a follower; the client-side ones let the leader notice a
    silent Postgres. Over a Unix socket none apply: the kernel closes the socket when the process dies.
    A connection that cannot be made, or is lost, raises StoreUnavailable (and the lock is gone with it).
    """

    def __init__(self, engine: Engine, key: int, keepalive_s: int):
        k = int(keepalive_s)
        self.key = key
        with reaching():
            self._conn = psycopg.connect(libpq_url(engine), autocommit=True, connect_timeout=10, keepalives=1,
                                         keepalives_idle=k, keepalives_interval=1, keepalives_count=2,
                                         tcp_user_timeout=(k + 2) * 1000)
        try:
            with reaching():
                self._conn.execute(f"SET tcp_keepalives_idle = {k}; SET tcp_keepalives_interval = 1; "
                                   f"SET tcp_keepalives_count = 2; SET tcp_user_timeout = {(k + 2) * 1000}")
        except Exception:
            self._conn.close()
            raise

    @property
    def backend_pid(self) -> int:
        """The backend holding (or trying for) the lock: cycles fence on it."""
        return self._conn.info.backend_pid

    def try_take(self) -> bool:
        with reaching():
            return bool(self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()[0])

    def ping(self) -> None:
        """Raises when the connection (and so the lock) is gone."""
        with reaching():
            self._conn.execute("SELECT 1")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> LeaderLock:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
