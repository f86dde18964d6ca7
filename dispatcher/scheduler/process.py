"""Where the scheduler runs: on a thread of the serving process (`Scheduling`), or in a child process of
its own (`SchedulerProcess`, `sluice dispatcher serve`'s default).

Either way it is the same work: the scheduling loop (loop.Scheduler) and, while this replica leads, the
Prometheus refresher. A cycle is pure Python for most of its length, so on a thread it holds the serving
process's GIL while the event loop waits to answer calls and agents; in a process of its own the two use
two cores (docs/scaling.md, "One dispatcher, two processes"). The child shares nothing with its parent
but a pipe: it connects to the same database, listens for wake-ups itself, and sends back what the parent
shows for it: its log records, its cycles and leadership for /metrics. It ends when the pipe does, so a
parent killed with SIGKILL takes its scheduler with it (and the leader lock is free for the next one); a
child that dies is started again by its parent. The parent stops it with SIGTERM: once it schedules, that
ends its cycle and leadership cleanly; while it still starts (imports, connects: seconds on a busy machine)
it holds nothing yet, and SIGTERM ends it at once, so a stop never waits for a start.
"""
from __future__ import annotations

import logging
import multiprocessing
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dispatcher.capacity.prometheus import Refresher
from dispatcher.errors import StoreUnavailable
from dispatcher.metrics import DispatcherMetrics
from dispatcher.scheduler.loop import Scheduler
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.store import channels, database
from dispatcher.store.database import DatabaseSettings
from dispatcher.store.listening import Notifier, libpq_url

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from dispatcher.store.database import Engine, Sessions

log = logging.getLogger(__name__)

RESTART_S = (1.0, 30.0)  # a dead scheduler process is started again after 1 s, doubling up to 30 s
HEALTHY_S = 60.0  # a child that ran this long before it died is started again after the first pause


class Scheduling:
    """The scheduler on a thread of this process, and the Prometheus refresher while it leads."""

    def __init__(self, engine: Engine, sessions: Sessions, notifier: Notifier, settings: SchedulerSettings, *,
                 prometheus_interval_s: float, metrics: DispatcherMetrics | _CycleRelay | None = None):
        self._sessions, self._interval_s = sessions, prometheus_interval_s
        self._refresher: Refresher | None = None
        self._lock = threading.Lock()
        self._stopping = False
        self._scheduler = Scheduler(engine, sessions, notifier, settings, metrics=metrics,
                                    on_leadership=self._leadership)
        self.is_leader = self._scheduler.is_leader

    def start(self) -> None:
        self._scheduler.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        self._scheduler.stop()  # ends leading, which stops the refresher
        self._leadership(False)  # in case the scheduler thread did not end in time

    def _leadership(self, leading: bool) -> None:
        """Only the leader reads Prometheus: every replica doing it would multiply the queries by the
        replicas and let an older reading overwrite a newer one."""
        with self._lock:
            if leading:
                if self._refresher is None and not self._stopping:
                    self._refresher = Refresher(self._sessions, interval_s=self._interval_s)
                    self._refresher.start()
                return
            refresher, self._refresher = self._refresher, None
        if refresher is not None:
            refresher.stop()


@dataclass(frozen=True)
class ChildSettings:
    """What the scheduler process is started with (pickled to it)."""

    database: DatabaseSettings  # with the url of the parent's server, embedded or not
    scheduler: SchedulerSettings
    prometheus_interval_s: float
    log_level: int
    gil_switch_interval_s: float | None
    gc_thresholds: tuple[int, int, int] | None


class SchedulerProcess:
    """Scheduling in a child process, as seen from the serving process: `is_leader` and the metrics follow
    what the child reports; start() and stop() as Scheduling's."""

    def __init__(self, engine: Engine, database_settings: DatabaseSettings, settings: SchedulerSettings, *,
                 prometheus_interval_s: float, metrics: DispatcherMetrics | None = None,
                 gil_switch_interval_s: float | None = None, gc_thresholds: tuple[int, int, int] | None = None):
        self._child_settings = ChildSettings(
            replace(database_settings, url=libpq_url(engine)), settings, prometheus_interval_s,
            logging.getLogger().getEffectiveLevel(), gil_switch_interval_s, gc_thresholds)
        self._metrics = metrics
        self.is_leader = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # no child is started once stop() has begun
        self._conn: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._watch = threading.Thread(target=self._run, name="scheduler-process", daemon=True)
        self.starts = 0  # child processes started so far (a restart after a death counts)
        self._started_at = 0.0

    @property
    def pid(self) -> int | None:
        """The running child's process id (None between a death and its restart)."""
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    @property
    def exitcode(self) -> int | None:
        """How the last child ended: 0 stopped cleanly, -15 ended by SIGTERM while it still started; None while
        it runs."""
        process = self._process
        return None if process is None else process.exitcode

    def start(self) -> None:
        self._spawn()
        self._watch.start()

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            process = self._process
        if process is not None:
            if process.is_alive():
                process.terminate()  # SIGTERM: see the module's docstring
            process.join(15)  # the scheduler joins its cycle for up to 10 s
            if process.is_alive():
                log.warning("the scheduler process did not stop in 15 s; killing it", extra={"pid": process.pid})
                process.kill()
                process.join(5)
        if self._watch.is_alive():
            self._watch.join(5)
        self._left()

    def _spawn(self) -> bool:
        """Start a child, unless stopping; whether it did."""
        context = multiprocessing.get_context("spawn")  # no fork of a process with gRPC and its threads
        with self._lock:
            if self._stop.is_set():
                return False
            ours, theirs = context.Pipe()
            process = context.Process(target=_child, args=(theirs, self._child_settings), name="sluice-scheduler",
                                      daemon=True)
            _start_deaf_to_ctrl_c(process)
            theirs.close()  # only the child holds that end now: its death is our EOF
            self._conn, self._process = ours, process
            self._started_at = time.monotonic()
            self.starts += 1
            return True

    def _run(self) -> None:
        """Take the child's reports until it ends; start it again, after a pause, unless stopping."""
        pause = RESTART_S[0]
        while True:
            self._relay(self._conn)
            self._left()
            if self._stop.is_set():
                return
            process = self._process
            process.join(5)
            if time.monotonic() - self._started_at >= HEALTHY_S:
                pause = RESTART_S[0]
            log.error("the scheduler process ended; starting it again", extra={"exitcode": process.exitcode,
                                                                              "in_s": pause})
            if self._stop.wait(pause):
                return
            pause = min(RESTART_S[1], pause * 2)
            try:
                if not self._spawn():
                    return
            except OSError:
                log.exception("the scheduler process could not be started")

    def _relay(self, conn: Connection) -> None:
        """The child's reports, applied here, until its end of the pipe closes."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                conn.close()
                return
            kind = message[0]
            if kind == "log":
                record = message[1]
                logging.getLogger(record.name).handle(record)
            elif kind == "leader":
                (self.is_leader.set if message[1] else self.is_leader.clear)()
                if self._metrics is not None:
                    self._metrics.leader.set(1 if message[1] else 0)
            elif kind == "cycle" and self._metrics is not None:
                self._metrics.observe_cycle(*message[1])

    def _left(self) -> None:
        """The child is gone (or going): it leads no more, as far as anything here shows."""
        self.is_leader.clear()
        if self._metrics is not None:
            self._metrics.leader.set(0)


class _CycleRelay:
    """What loop.Scheduler records in DispatcherMetrics, sent to the parent instead (the child serves none)."""

    def __init__(self, send):
        self._send = send
        self.leader = self  # loop.Scheduler sets metrics.leader

    def set(self, value: float) -> None:
        self._send(("leader", bool(value)))

    def observe_cycle(self, *args) -> None:
        self._send(("cycle", args))


class _LogRelay(logging.Handler):
    """Every record the child logs, sent to the parent, whose handlers (format, destination) print it."""

    def __init__(self, send):
        super().__init__()
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.exc_info:  # a traceback is sent as text: the exception itself may not pickle
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.msg, record.args, record.exc_info = record.getMessage(), None, None
            self._send(("log", record))
        except Exception:  # noqa: BLE001 - a record that will not pickle
            self.handleError(record)


def _start_deaf_to_ctrl_c(process: multiprocessing.process.BaseProcess) -> None:
    """Start the child ignoring SIGINT from its first instruction: Ctrl-C reaches the whole process group,
    and a child still importing would print a KeyboardInterrupt's traceback (the parent stops it itself).
    Python keeps ignoring a signal it was started ignoring, so SIGINT is ignored here while the child is
    made; only the main thread may do that (a restart, from the watch thread, starts the child as it is),
    and only where SIGINT's handler is one Python can put back (None: one set outside Python)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        process.start()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process.start()
    finally:
        signal.signal(signal.SIGINT, previous)


class _Stop(Exception):
    """SIGTERM came while the scheduler process schedules: the parent stops it."""


def _stop(signum, frame) -> None:
    raise _Stop


def _child(conn: Connection, settings: ChildSettings) -> None:
    """The scheduler process: schedule until the parent stops it (SIGTERM) or goes away (its end of the pipe
    closes)."""
    from sluice import process as tuning
    tuning.apply()  # a process entry point (nothing here serves gRPC, but what it imports may load it)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        with send_lock:
            try:
                conn.send(message)
            except (OSError, ValueError):
                pass  # the parent is gone: the loop below ends on it

    root = logging.getLogger()
    root.handlers[:] = [_LogRelay(send)]
    root.setLevel(settings.log_level)
    logging.raiseExceptions = False  # a failed relay (parent gone) must not print to a terminal
    tuning.tune_interpreter(settings.gil_switch_interval_s, settings.gc_thresholds)
    try:  # what fails here is logged through the parent (no traceback on its terminal); it starts us again
        db = database.connect(settings.database)
    except StoreUnavailable as error:
        log.error("scheduler process: the database is unreachable", extra={"error": str(error)})
        sys.exit(1)
    notifier = Notifier(db.engine, (channels.WAKE_CHANNEL,))
    scheduling = Scheduling(db.engine, db.sessions(), notifier, settings.scheduler,
                            prometheus_interval_s=settings.prometheus_interval_s, metrics=_CycleRelay(send))
    # From here on a SIGTERM stops us cleanly (until here it ended us at once). It is blocked while the threads
    # start, which keep it blocked: only this thread takes it, between its polls of the pipe.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGTERM, _stop)
    notifier.start()
    scheduling.start()
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        while not conn.poll(0.2):
            pass
        conn.recv()  # the parent sends nothing: this is its end of the pipe closing (EOFError)
    except (EOFError, OSError, _Stop):
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopping already
        scheduling.stop()
        notifier.stop()
        db.close()
