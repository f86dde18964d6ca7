"""Plots: two non-empty PNG files per run, and a clear refusal without matplotlib."""
from __future__ import annotations

import sys

import pytest

from simulation.plots import UTILIZATION, WAIT_CDF, PlotError, write_plots
from simulation.report import JobOutcome

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def runs(shift: float) -> list[JobOutcome]:
    return [JobOutcome(n, "a" if n % 2 else "b", 60.0 * n, 60.0 * n + shift * n, 60.0 * n + shift * n + 300, 300.0,
                       {"cpu": 1000 * (1 + n % 4)}) for n in range(40)]


def test_writes_wait_cdf_and_utilization(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'sluice[plot]')")
    fifo, backfill = runs(30.0), runs(5.0)
    busy = [(0.0, {"cpu": 2000}), (1200.0, {"cpu": 8000}), (3000.0, {})]
    written = write_plots(tmp_path / "plots", {"fifo": fifo, "backfill": backfill}, {"fifo": busy},
                          {"cpu": 8000, "memory": 64 * 2**30 * 1000})
    assert [path.name for path in written] == [WAIT_CDF, UTILIZATION]
    for path in written:
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000


def test_no_jobs_still_writes_both(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'sluice[plot]')")
    written = write_plots(tmp_path, {"fifo": []}, None, {"cpu": 1000})
    assert all(path.stat().st_size > 0 for path in written)


def test_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # None in sys.modules makes the import fail
    with pytest.raises(PlotError, match=r"pip install 'sluice\[plot\]'"):
        write_plots(tmp_path, {"fifo": runs(1.0)}, None, {"cpu": 8000})
    assert not list(tmp_path.iterdir())


def test_unwritable_directory_is_a_plot_error(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'sluice[plot]')")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(PlotError, match="cannot create the plot directory"):
        write_plots(blocker / "plots", {"fifo": runs(1.0)}, None, {"cpu": 8000})
