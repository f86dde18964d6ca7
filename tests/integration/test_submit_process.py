"""Process-level settings the dispatcher applies at start for the submit path (dispatcher/server.py):
the cyclic garbage collector's thresholds, in `sluice dispatcher serve` (Dispatcher) and `sluice up`
(Embedded, which starts a Dispatcher)."""
from __future__ import annotations

import gc

import pytest

from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store.database import DatabaseSettings


@pytest.fixture
def thresholds():
    """Restores the test process's thresholds, whatever the dispatcher under test set."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def _serve(db_url: str, **settings) -> Dispatcher:
    return Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, schedule=False,
                                     database=DatabaseSettings(url=db_url), **settings)).start()


def test_serve_sets_the_gc_thresholds_at_start(db_url, thresholds):
    d = _serve(db_url)
    try:
        assert gc.get_threshold() == ServerSettings.gc_thresholds == (100_000, 50, 1000)
        assert gc.isenabled()
    finally:
        d.stop()


def test_none_leaves_the_interpreters_thresholds(db_url, thresholds):
    d = _serve(db_url, gc_thresholds=None)
    try:
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        d.stop()


def test_sluice_up_sets_them_too(thresholds, system):
    """`system` is `sluice up` (Embedded), started after `thresholds` put the interpreter's back."""
    assert system.dispatcher.settings.gc_thresholds == ServerSettings.gc_thresholds
    assert gc.get_threshold() == (100_000, 50, 1000)
