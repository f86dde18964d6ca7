"""Connecting to Postgres: the embedded server (pgserver) or a given URL, and schema migration.

With no database URL the dispatcher starts a real PostgreSQL from the `pgserver` package under its data
directory; with a URL it uses that server and never starts its own. Only Alembic changes the schema.
"""
from __future__ import annotations

import contextlib
import logging
import pathlib
import subprocess
import threading
import time
import warnings
from dataclasses import dataclass

import psutil
import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from psycopg.rows import namedtuple_row
from sqlalchemy import Engine, create_engine, event, exc, text
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.errors import SchemaBehind, StoreUnavailable

log = logging.getLogger(__name__)
# What a caller is told while the server cannot be reached; the cause goes to the log, never to a user.
UNREACHABLE = "the database is unreachable; try again shortly"
MIGRATIONS = pathlib.Path(__file__).resolve().parent.parent.parent / "migrations"
DATABASE_NAME = "sluice"


@dataclass(frozen=True)
class DatabaseSettings:
    url: str | None = None  # SQLAlchemy/libpq URL; None: embedded pgserver under data_dir/postgres
    data_dir: pathlib.Path = pathlib.Path("~/.local/share/sluice").expanduser()
    pool_size: int = 10  # connections kept open per dispatcher process
    pool_overflow: int = 50  # more, opened under load (RPC threads, agent streams, the scheduler)
    # A pooled connection idle this long is pinged (one round trip) before it is handed out, and replaced
    # if the server dropped it; one in use more recently is handed out as it is (see _ping_when_idle).
    ping_after_idle_s: float = 2.0
    # What happens to the embedded server when this process exits cleanly: "stop" it, or "delete" its
    # data too (throw-away demo runs). A killed process leaves it running; the next start reuses it.
    embedded_cleanup: str = "stop"
    connect_timeout_s: int = 5  # a new connection that takes longer fails (libpq's connect_timeout)


def sqlalchemy_url(url: str) -> str:
    """Any postgres URL, as SQLAlchemy's psycopg 3 dialect wants it."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise StoreUnavailable(f"unsupported database URL {url!r}: expected postgresql://...")


def unreachable(error: BaseException) -> bool:
    """Whether an error (psycopg's, or SQLAlchemy's around it) says the server cannot be reached: no
    connection could be made, it broke, or the server is shutting down or starting. Not a statement's own
    failure (a constraint, a deadlock, a timeout), which the server answered."""
    if isinstance(error, exc.DBAPIError):
        if error.connection_invalidated:
            return True
        error = error.orig
    if isinstance(error, psycopg.OperationalError):
        # No SQLSTATE: the client library's own failure (refused, broken). 08: connection exceptions;
        # 57P0x: the server ended the session (shut down, crashed, starting up, database dropped).
        return error.sqlstate is None or error.sqlstate.startswith(("08", "57P0"))
    return False


@contextlib.contextmanager
def reaching():
    """A block whose connection failures (`unreachable`) raise StoreUnavailable, the cause chained; other
    errors pass as they are. For the connections outside a session (the leader lock's)."""
    try:
        yield
    except (psycopg.Error, exc.DBAPIError) as error:
        if unreachable(error):
            raise StoreUnavailable(UNREACHABLE) from error
        raise


def _pgserver():
    with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR on import; not ours to fix
        warnings.simplefilter("ignore")
        import pgserver
    return pgserver


def start_embedded(data_dir: pathlib.Path, cleanup: str = "stop"):
    """Start (or reuse, after a crash) the pgserver PostgreSQL under data_dir; return (url, server).

    A killed dispatcher leaves the server running; restarted on the same data dir it finds it running
    (or starts it again), and nothing committed is lost either way. The last process using it stops it
    when it exits cleanly (per `cleanup`), even when an earlier one was killed.
    """
    pgserver = _pgserver()
    pgdata = (data_dir / "postgres").resolve()
    pgdata.mkdir(parents=True, exist_ok=True)
    if len(str(pgdata)) > 90:  # the unix socket lives in pgdata; its path is limited to ~107 bytes
        raise StoreUnavailable(f"data directory path too long for the embedded server's socket: {pgdata}")
    _forget_dead_users(pgserver, pgdata)
    try:
        server = pgserver.get_server(pgdata, cleanup_mode=cleanup)
    except (subprocess.SubprocessError, OSError) as error:
        raise StoreUnavailable(f"the embedded PostgreSQL did not start (its log: {pgdata / 'log'})") from error
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")
    if "(1 row)" not in exists:
        server.psql(f"CREATE DATABASE {DATABASE_NAME};")
    return f"postgresql+psycopg://postgres@/{DATABASE_NAME}?host={pgdata}", server


def _forget_dead_users(pgserver, pgdata: pathlib.Path) -> None:
    """Drop the processes that no longer exist from pgserver's list of the server's users.

    pgserver stops the server when the last process on its list exits cleanly; a process killed with
    kill -9 never takes itself off, and the server would then be left running by every clean stop after it.
    """
    users = pgserver.utils.DiskList(pgdata / ".handle_pids.json")
    with pgserver.PostgresServer._lock:  # pgserver's own inter-process lock over that list
        pids = users.get()
        alive = [pid for pid in pids if _exists(pid)]
        if alive != pids:
            users.put(alive)


def _exists(pid: int) -> bool:
    """Whether a process runs (one dead but not reaped yet, a zombie, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _embedded_running(server) -> bool:
    info = _pgserver().utils.PostmasterInfo.read_from_pgdata(server.pgdata)
    return info is not None and info.is_running()


@dataclass
class Database:
    """An engine, and the embedded server behind it when there is one (closed with it)."""

    engine: Engine
    embedded: object | None = None
    _restarting: bool = False  # restart_embedded has failed since the server was last found dead

    def sessions(self) -> sessionmaker:
        """A session factory on the engine: one transaction per unit of work, rows kept after commit."""
        return sessionmaker(self.engine, class_=StoreSession, expire_on_commit=False)

    def restart_embedded(self) -> bool:
        """Start the embedded server again if its postmaster is gone (killed, crashed); whether it did.

        Committed work survives (PostgreSQL recovers from its WAL at start). The first tries may fail
        while the dead server's backends still hold its shared memory; the caller tries again later.
        """
        server = self.embedded
        if server is None or _embedded_running(server):
            return False
        if not self._restarting:  # said once per outage, however many tries it takes
            log.warning("the embedded PostgreSQL is not running; restarting it", extra={"pgdata": str(server.pgdata)})
        try:
            with type(server)._lock:  # pgserver's inter-process lock, as its own start takes it
                server.ensure_postgres_running()
        except (subprocess.SubprocessError, OSError, AssertionError) as error:
            if not self._restarting:
                log.warning("the embedded PostgreSQL did not start yet; trying again",
                            extra={"error": str(error), "log": str(server.pgdata / "log")})
            self._restarting = True
            return False
        self._restarting = False
        log.warning("the embedded PostgreSQL restarted", extra={"pid": server.get_pid()})
        return True

    def close(self) -> None:
        self.engine.dispose()
        if self.embedded is not None:
            self.embedded.cleanup()  # stops (or deletes) per DatabaseSettings.embedded_cleanup
            self.embedded = None


def connect(settings: DatabaseSettings) -> Database:
    server = None
    if settings.url:
        url = sqlalchemy_url(settings.url)
    else:
        url, server = start_embedded(settings.data_dir, settings.embedded_cleanup)
    engine = create_engine(url, pool_size=settings.pool_size, max_overflow=settings.pool_overflow,
                           connect_args={"connect_timeout": settings.connect_timeout_s})
    _ping_when_idle(engine, settings.ping_after_idle_s)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        raise StoreUnavailable(f"cannot connect to {engine.url.render_as_string(hide_password=True)}: {exc}") from exc
    return Database(engine, server)


class StoreSession(Session):
    """A session whose `with` block (`with sessions() as s`, `with sessions.begin() as s`) ends in
    StoreUnavailable, the cause chained, when the server could not be reached: whether the failure came
    through SQLAlchemy or from the psycopg connection under it (`driver`)."""

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None and unreachable(error):
            self.invalidate()  # its connections are broken: dropped, not rolled back and pooled again
            raise StoreUnavailable(UNREACHABLE) from error
        super().__exit__(kind, error, traceback)


def reachable(url: str, timeout_s: int) -> bool:
    """Whether a new connection to the server at `url` (libpq form) can be made and answer now."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=timeout_s) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def driver(session: Session) -> psycopg.Connection:
    """The psycopg connection under the session's transaction (begun if it was not yet). The hot paths
    (a job's agent reports, the Watch polls, the cycle's statements) run their plain SQL on it, with
    psycopg's %(name)s parameters, without SQLAlchemy's statement and result handling (a job's life takes
    dozens of statements).
    Errors are psycopg's; a dropped connection still renews the pool, through the session's rollback."""
    return session.connection().connection.driver_connection


def autocommit(sessions: sessionmaker) -> sessionmaker:
    """Sessions like `sessions`' whose statements each commit by themselves, for work that is one statement
    (a Watch poll, the agent link's read of its commands, a batch of acks alone): no BEGIN before it and
    no COMMIT or ROLLBACK after, one round trip instead of three."""
    return sessionmaker(sessions.kw["bind"].execution_options(isolation_level="AUTOCOMMIT"), class_=sessions.class_,
                        expire_on_commit=False)


def at_once(session: Session, *reads: tuple[str, dict | None]) -> list[list]:
    """Several plain SQL reads (sql, params) on `driver(session)`, sent together in one round trip
    (psycopg's pipeline mode) and run in their order in the session's transaction: each one's rows, as
    named tuples."""
    conn = driver(session)
    with conn.pipeline():
        cursors = [conn.cursor(row_factory=namedtuple_row).execute(sql, params) for sql, params in reads]
    out = []
    for cursor in cursors:
        with cursor:
            out.append(cursor.fetchall())
    return out


def named(session: Session, sql: str, params: dict | None = None) -> list:
    """The rows of a plain SQL query run on `driver(session)`, as named tuples (row.column)."""
    with driver(session).cursor(row_factory=namedtuple_row) as cursor:
        return cursor.execute(sql, params).fetchall()


def _ping_when_idle(engine: Engine, idle_s: float) -> None:
    """Check a pooled connection before handing it out only when it has been idle idle_s or longer.

    SQLAlchemy's pool_pre_ping costs a round trip on every checkout; the dispatcher checks connections
    out for every cycle, report batch, Watch poll and API call, hundreds of times a second under load, a
    connection back in the pool a few milliseconds earlier each time. One idle for longer (where a
    restarted or failed-over server, or a dropped network, shows) is pinged, and replaced by a new one
    if the ping finds it gone. One used within idle_s that the server dropped fails its statement; that
    error invalidates the whole pool (SQLAlchemy does so on any disconnect), so the next checkouts get
    new connections: one call or cycle fails, and the scheduler retries by itself.
    """
    @event.listens_for(engine, "checkin")
    def _checked_in(dbapi_connection, record) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection, record, proxy) -> None:
        since = record.info.pop("idle_since", None)
        if since is None or time.monotonic() - since < idle_s:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as error:
            if engine.dialect.is_disconnect(error, dbapi_connection, None):
                raise exc.DisconnectionError() from error  # the pool replaces it and checks out again
            raise


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def migrate(engine: Engine, revision: str = "head") -> None:
    cfg = _alembic_config()
    with engine.begin() as conn:
        # Serialise concurrent migrators (several replicas starting at once).
        conn.execute(text("SELECT pg_advisory_xact_lock(7301)"))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def check_schema(engine: Engine) -> None:
    """Refuse to run on a schema that is not at head, saying which command fixes it."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaBehind(
            f"database schema is at {current or 'nothing'}, this Sluice needs {head}: "
            "run `sluice dispatcher migrate` (with the same --database-url)")


def statement_timeout(session, seconds: float) -> None:
    """Bound every statement of the caller's transaction (a local setting: it ends with the transaction)."""
    session.execute(text("SELECT set_config('statement_timeout', :ms, true)"), {"ms": str(max(1, int(seconds * 1000)))})


class KeptConnection:
    """An autocommit connection kept from one small write to the next while writes keep coming, so that a
    write does not pay a pool checkout (and its isolation-level changes) each time; a write gets its psycopg
    connection (lifecycle.submit_if_unchanged). It goes back to the pool once no call is queued after a write
    (`release_if_idle`), after any error, and if unused for KEEP_S; the next write then takes one afresh.
    One write at a time uses it (a lock; small writes hand on only after their statement anyway)."""

    KEEP_S = 1.0

    def __init__(self, sessions: sessionmaker):
        self._engine = sessions.kw["bind"]
        self._lock = threading.Lock()
        self._connection = None
        self._used = 0.0

    def __enter__(self):
        self._lock.acquire()
        try:
            if self._connection is not None and time.monotonic() - self._used > self.KEEP_S:
                self._drop()
            if self._connection is None:
                self._connection = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            return self._connection.connection.driver_connection
        except BaseException as error:
            self._lock.release()
            if unreachable(error):
                raise StoreUnavailable(UNREACHABLE) from error
            raise

    def __exit__(self, kind, error, traceback) -> None:
        try:
            if kind is not None:
                self._drop()
            self._used = time.monotonic()
        finally:
            self._lock.release()
        if error is not None and unreachable(error):
            raise StoreUnavailable(UNREACHABLE) from error

    def release_if_idle(self) -> None:
        """Back to the pool, unless a write is using it."""
        if self._connection is not None and self._lock.acquire(blocking=False):
            try:
                self._drop()
            finally:
                self._lock.release()

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.close()
            except Exception:  # noqa: BLE001 - a broken connection: the pool replaces it
                pass


Sessions = sessionmaker  # what callers outside the store name a session factory by


def owns_transaction(session: Session) -> bool:
    """Whether `session` began its own transaction on the engine (not joined to a caller's connection)."""
    return isinstance(session.get_bind(), Engine)
