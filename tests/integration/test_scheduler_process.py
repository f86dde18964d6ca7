"""The scheduler in a child process of its own (dispatcher/scheduler/process.py, `sluice dispatcher serve`'s
default): it leads and dispatches, its cycles and leadership show on the parent's /metrics and its log
lines in the parent's log; it stops with the parent, ends when the parent is killed, and is started
again when it dies. Real processes, a real Postgres."""
from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time

import psutil
from sqlalchemy import create_engine

from dispatcher.scheduler.process import SchedulerProcess
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store.database import DatabaseSettings
from tests.integration.test_cli import free_port
from tests.integration.test_dispatcher_metrics import scrape, value
from tests.integration.test_scheduler_loop import NODE, _heard, _submit, _until_dispatched, _world

SPAWNED_S = 60.0  # a child process imports the dispatcher's modules first: slow on a busy machine


def _apart(db_url: str) -> Dispatcher:
    return Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", scheduler_process=True,
                                     database=DatabaseSettings(url=db_url))).start()


def _wait(condition, what: str, limit_s: float = SPAWNED_S) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_scheduler_process_leads_dispatches_and_reports_to_its_parent(db_url, caplog):
    caplog.set_level(logging.INFO)
    d = _apart(db_url)
    try:
        assert d.scheduler.is_leader.wait(SPAWNED_S)
        child = d.scheduler.pid
        assert child is not None and child != os.getpid()
        assert psutil.Process(child).ppid() == os.getpid()
        _world(d.sessions)
        _submit(d.sessions, 3)
        _until_dispatched(d.sessions, 3, limit_s=30)
        _wait(lambda: value(scrape(d.metrics_port), "sluice_scheduling_cycles_total") >= 1, "cycles on /metrics")
        metrics = scrape(d.metrics_port)
        assert value(metrics, "sluice_scheduler_leader") == 1
        assert value(metrics, "sluice_scheduling_decisions_total", decision="dispatched") == 3
        # The child's log lines go through the parent's logging (its format, its destination).
        assert any(r.name == "dispatcher.scheduler.loop" and r.getMessage() == "became the scheduling leader"
                   for r in caplog.records)
    finally:
        d.stop()
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert not d.scheduler.is_leader.is_set()
    assert d.scheduler.exitcode == 0  # stopped cleanly: its cycle and its leadership ended


def test_a_dispatcher_stopped_while_its_scheduler_process_starts_does_not_wait_for_that_start(db_url):
    """Ctrl-C right after `sluice dispatcher serve` starts: the child, still importing, holds nothing and is
    ended at once (on a busy machine its start alone takes seconds)."""
    d = _apart(db_url)
    d.stop()
    assert d.scheduler.exitcode == -signal.SIGTERM
    assert d.scheduler.pid is None and not d.scheduler.is_leader.is_set()
    _the_lead_is_free(db_url)


def _the_lead_is_free(db_url: str) -> None:
    """Another dispatcher takes the leader lock."""
    follower = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None,
                                         database=DatabaseSettings(url=db_url))).start()
    try:
        assert follower.scheduler.is_leader.wait(15), "the lock is not free"
    finally:
        follower.stop()


def test_a_scheduler_process_that_dies_is_started_again(db_url, caplog):
    d = _apart(db_url)
    try:
        assert d.scheduler.is_leader.wait(SPAWNED_S)
        _world(d.sessions)
        first = d.scheduler.pid
        os.kill(first, signal.SIGKILL)
        _wait(lambda: not d.scheduler.is_leader.is_set(), "leadership seen to end", 10)
        assert value(scrape(d.metrics_port), "sluice_scheduler_leader") == 0
        _wait(lambda: d.scheduler.is_leader.is_set(), "a new scheduler process leads")
        assert d.scheduler.starts == 2 and d.scheduler.pid not in (None, first)
        # The new leader waits for the clusters heard from before it took over (scheduler/takeover.py): the
        # cluster's agent goes on heartbeating.
        _heard(d.sessions, NODE)
        _submit(d.sessions, 2)
        _until_dispatched(d.sessions, 2, limit_s=30)
        assert any(r.getMessage() == "the scheduler process ended; starting it again" and r.exitcode == -9
                   for r in caplog.records)
    finally:
        d.stop()


def test_the_scheduler_process_ends_when_its_parent_is_killed_and_frees_the_lead(db_url, tmp_path):
    """`sluice dispatcher serve` killed with SIGKILL: its scheduler process sees its pipe end and exits, so
    the leader lock it held is free for the next dispatcher."""
    log = tmp_path / "serve.log"
    serve = subprocess.Popen([sys.executable, "-m", "sluice", "dispatcher", "serve", "--database-url", db_url,
                              "--listen", "127.0.0.1:0", "--metrics-listen", "", "--insecure", "-v"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    try:
        _wait(lambda: "became the scheduling leader" in log.read_text(errors="replace"),
              "the child leads (its log line, in the parent's log)")
        assert re.search(r"INFO dispatcher\.scheduler\.loop: became the scheduling leader", log.read_text())
        children = psutil.Process(serve.pid).children()
        assert children, "no scheduler process"
        serve.kill()
        serve.wait(10)
        _wait(lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children),
              "the scheduler process ended with its parent", 20)
    finally:
        if serve.poll() is None:
            serve.kill()
    _the_lead_is_free(db_url)


def test_ctrl_c_while_the_scheduler_process_still_imports_prints_no_traceback(db_url):
    """Ctrl-C reaches the whole process group: the child, a second or more into its imports, ignores it, and
    serve stops cleanly."""
    serve = subprocess.Popen([sys.executable, "-m", "sluice", "dispatcher", "serve", "--database-url", db_url,
                              "--listen", "127.0.0.1:0", "--metrics-listen", "", "--insecure"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        assert serve.stderr.readline().startswith("serving on ")
        time.sleep(0.3)  # the child was started with the server: it is importing now
        os.killpg(serve.pid, signal.SIGINT)
        _, stderr = serve.communicate(timeout=30)
        assert serve.returncode == 0 and "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)


def test_dispatcher_serve_can_keep_the_scheduler_on_a_thread(db_url, tmp_path):
    log = tmp_path / "serve.log"
    serve = subprocess.Popen([sys.executable, "-m", "sluice", "dispatcher", "serve", "--database-url", db_url,
                              "--listen", "127.0.0.1:0", "--metrics-listen", "", "--insecure", "-v",
                              "--scheduler-thread"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    try:
        _wait(lambda: "became the scheduling leader" in log.read_text(errors="replace"), "it leads")
        assert psutil.Process(serve.pid).children() == []
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(20) == 0
    finally:
        if serve.poll() is None:
            serve.kill()


def test_a_scheduler_process_that_cannot_reach_the_database_says_so_and_is_tried_again(caplog):
    """Its failure is logged through the parent's logging (no traceback on a terminal) and it is started
    again after a pause."""
    nowhere = create_engine(f"postgresql+psycopg://sluice@127.0.0.1:{free_port()}/sluice")  # nothing listens
    child = SchedulerProcess(nowhere, DatabaseSettings(connect_timeout_s=2), SchedulerSettings(),
                             prometheus_interval_s=1.0)
    child.start()
    try:
        _wait(lambda: child.starts >= 2, "started again")
        said = [r for r in caplog.records if r.name == "dispatcher.scheduler.process"]
        unreachable = [r for r in said if r.getMessage() == "scheduler process: the database is unreachable"]
        assert unreachable and "127.0.0.1" in unreachable[0].error and unreachable[0].exc_text is None
        assert any(r.getMessage() == "the scheduler process ended; starting it again" and r.exitcode == 1
                   for r in said)
        assert not child.is_leader.is_set()
    finally:
        child.stop()
    assert child.pid is None
