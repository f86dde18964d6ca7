"""LISTEN/NOTIFY fan-out: one Postgres connection per process, many in-process subscribers.

Writers call store.channels.notify inside their transaction; Postgres delivers on commit to every replica.
Subscribers register a callback per channel; callbacks run on the listener thread and must only set
events or put to queues.
"""
from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable

import psycopg
from sqlalchemy import Engine

log = logging.getLogger(__name__)
STOP_CHECK_S = 0.05  # how often the listening thread checks for stop(): stop() waits up to as long


def libpq_url(engine: Engine) -> str:
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


class Notifier:
    def __init__(self, engine: Engine, channels: tuple[str, ...]):
        self._url = libpq_url(engine)
        self._channels = channels
        self._subscribers: dict[str, list[Callable[[str], None]]] = defaultdict(list)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notifier", daemon=True)

    def subscribe(self, channel: str, callback: Callable[[str], None]) -> Callable[[], None]:
        with self._lock:
            self._subscribers[channel].append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers[channel]:
                    self._subscribers[channel].remove(callback)
        return unsubscribe

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        backoff = 0.1
        lost = False  # said once per outage, not at every try
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True, connect_timeout=10) as conn:
                    for channel in self._channels:
                        conn.execute(f'LISTEN "{channel}"')
                    self._ready.set()
                    if lost:
                        log.warning("notification listener reconnected")
                    backoff, lost = 0.1, False
                    # Anything may have happened while we were not listening: wake everyone once.
                    self._deliver_all()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=STOP_CHECK_S):
                            self._deliver(note.channel, note.payload)
            except psycopg.Error as exc:
                if self._stop.is_set():
                    return
                if not lost:
                    log.warning("notification listener lost its connection; reconnecting", extra={"error": str(exc)})
                lost = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def _deliver(self, channel: str, payload: str) -> None:
        with self._lock:
            callbacks = list(self._subscribers.get(channel, ()))
        for callback in callbacks:
            try:
                callback(payload)
            except Exception:  # a subscriber's bug must not stop delivery to the others
                log.exception("notification subscriber failed", extra={"channel": channel})

    def _deliver_all(self) -> None:
        for channel in self._channels:
            self._deliver(channel, "")
