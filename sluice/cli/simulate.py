"""`sluice simulate`: replay a workload trace in virtual time through Sluice's scheduling cycle and the
baselines, and print the figures side by side (docs/simulate.md)."""
from __future__ import annotations

import pathlib
import sys
import time

import typer
import yaml

from sluice.cli.common import Failed

app = typer.Typer()

OUTPUTS = ("table", "json")
MAPPING_END = "# (end of the mapping)"
PROGRESS_EVERY_S = 0.2


def _window(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    start, sep, count = text.partition(":")
    try:
        window = int(start), int(count)
    except ValueError:
        window = None
    if not sep or window is None or window[0] < 0 or window[1] < 1:
        raise Failed("simulate --window", f"{text!r} is not START:COUNT (a job index from 0, and how many jobs, "
                                          "at least 1), e.g. 0:10000")
    return window


def _checkpoint_interval(text: str | None) -> float | None:
    from sluice.quantity import QuantityError, parse_duration
    if text is None:
        return None
    try:
        seconds = parse_duration(text)
    except QuantityError as exc:
        raise Failed("simulate --checkpoint-interval", str(exc)) from None
    if seconds <= 0:
        raise Failed("simulate --checkpoint-interval", f"{text!r} must be longer than 0 (e.g. 30m)")
    return seconds


class _Progress:
    """A one-line progress bar on the terminal (stderr), redrawn at most every PROGRESS_EVERY_S, with the time a
    policy's replay has taken and, once it is ETA_AFTER_S in, about how long the rest will take at its pace."""

    def __init__(self) -> None:
        self.shown = 0.0
        self.on = sys.stderr.isatty()
        self.began: dict[str, float] = {}
        self.ended: set[str] = set()  # the policies whose bar is drawn full (the end may be told twice)

    def __call__(self, policy: str, done: int, total: int) -> None:
        now = time.monotonic()
        began = self.began.setdefault(policy, now)
        if not self.on or policy in self.ended or (now - self.shown < PROGRESS_EVERY_S and done < total):
            return
        sys.stderr.write(progress_line(policy, done, total, now - began))
        if done >= total:
            sys.stderr.write("\n")
            self.ended.add(policy)
        sys.stderr.flush()
        self.shown = now


ETA_AFTER_S = 5.0  # a pace read off the first seconds (the trace's first jobs end first) would say little


def progress_line(policy: str, done: int, total: int, elapsed_s: float) -> str:
    """The bar redrawn over the line before (\\r, then erased to its end: a shorter line leaves nothing behind)."""
    from simulation.report import format_seconds
    width = 30
    filled = width * done // max(total, 1)
    bar = "#" * filled + "." * (width - filled)
    line = f"\r{policy:>14} [{bar}] {done:,}/{total:,} jobs, {format_seconds(elapsed_s)}"
    if 0 < done < total and elapsed_s >= ETA_AFTER_S:
        line += f", about {format_seconds(elapsed_s * (total - done) / done)} left"
    return line + "\x1b[K"


@app.command()
def simulate(trace: pathlib.Path = typer.Option(..., "--trace", help="The trace file (.swf, .swf.gz, Philly .csv, "
                                                                    "or Sluice job YAML with submitAt/runFor)"),
             fmt: str | None = typer.Option(None, "--format", help="swf | philly | sluice (default: from the name)"),
             config: pathlib.Path | None = typer.Option(None, "--config",
                                                        help="Cluster (with simulated nodes), Queue, ServiceClass and "
                                                             "BurstPolicy objects, as `sluice up --config` reads; "
                                                             "default: a mapping built from the trace, printed"),
             policy: list[str] = typer.Option(["sluice", "fifo", "easy-backfill"], "--policy",
                                              help="sluice | fifo | easy-backfill; repeat for a column each"),
             window: str | None = typer.Option(None, "--window", help="START:COUNT: replay only these jobs"),
             output: str = typer.Option("table", "--output", "-o", help="table | json"),
             plot: pathlib.Path | None = typer.Option(None, "--plot", help="Write PNG figures into this directory "
                                                                          "(needs matplotlib: the plot extra)"),
             skip_bad_lines: bool = typer.Option(False, "--skip-bad-lines",
                                                 help="Skip (and count) trace lines that cannot be read"),
             checkpoint_interval: str | None = typer.Option(
                 None, "--checkpoint-interval",
                 help="The trace's jobs save their progress this often (e.g. 30m): an evicted job resumes from its "
                      "last checkpoint; default: it starts again from scratch"),
             exact_runtimes: bool = typer.Option(
                 False, "--exact-runtimes",
                 help="Tell every policy each job's run time as its requested time (Sluice's maxRuntime, EASY's "
                      "estimate), as if users knew it; default: what the trace requested, nothing where it says "
                      "nothing"),
             dependencies: bool = typer.Option(
                 True, "--dependencies/--no-dependencies",
                 help="Replay the trace's dependencies (SWF's preceding job and think time, a job file's dependsOn); "
                      "--no-dependencies: none (startAfter and arrays still hold)")) -> None:
    """Replay a trace in virtual time through Sluice's scheduling and baselines; print figures per policy."""
    from simulation import POLICIES
    from simulation.plots import PlotError, ready, write_plots
    from simulation.report import render_table, to_json
    from simulation.traces import TraceError, read_trace
    from sluice.objects import load_objects
    from sluice.spec import SpecError

    if output not in OUTPUTS:
        raise Failed("simulate --output", f"{output!r} is not one of {', '.join(OUTPUTS)}")
    for name in policy:
        if name not in POLICIES:
            raise Failed("simulate --policy", f"{name!r} is not one of {', '.join(POLICIES)}")
    span = _window(window)
    checkpoint_s = _checkpoint_interval(checkpoint_interval)
    objects = None
    if config is not None:
        try:
            objects = load_objects(config.read_text(), source=str(config))
        except OSError as exc:
            raise Failed(f"simulate --config {config}", exc.strerror or str(exc)) from None
        except SpecError as exc:
            raise Failed(f"simulate --config {config}", str(exc)) from None
        except UnicodeDecodeError:
            raise Failed(f"simulate --config {config}", "not UTF-8 text") from None
    if plot is not None:
        try:
            ready(plot)
        except PlotError as exc:
            raise Failed(f"simulate --plot {plot}", str(exc)) from None
    try:
        read = read_trace(trace, fmt, skip_bad_lines=skip_bad_lines, window=span, dependencies=dependencies)
    except OSError as exc:
        raise Failed(f"simulate --trace {trace}", exc.strerror or str(exc)) from None
    except (TraceError, ValueError) as exc:
        raise Failed(f"simulate --trace {trace}", str(exc)) from None
    if not read.jobs:
        why = "the trace has no job to replay"
        if read.skipped:
            unit = "document" if read.format == "sluice" else "line"
            why += f" ({read.skipped:,} unreadable {unit}{'s' if read.skipped != 1 else ''} skipped)"
        raise Failed(f"simulate --trace {trace}", why)
    # The replay's modules (the scheduling cycle, and the dispatcher's store it imports) load only now: a bad
    # option or trace is said without waiting for them.
    from simulation.run import simulate as run_simulation
    from simulation.scenario import ScenarioError
    try:
        result = run_simulation(read, objects, policy, progress=_Progress(), checkpoint_s=checkpoint_s,
                                exact_runtimes=exact_runtimes)
    except (ScenarioError, SpecError) as exc:
        raise Failed("simulate", str(exc)) from None
    mapping = [o.to_document() for o in result.scenario.objects]
    if output == "json":
        if result.scenario.built:
            result.trace["config"] = mapping
        print(to_json(result.trace, result.figures))
    else:
        if result.scenario.built:
            print(f"# The mapping built from the trace: save it, edit it and pass it with --config\n"
                  f"{yaml.safe_dump_all(mapping, sort_keys=False)}{MAPPING_END}")
        print(render_table(result.trace, result.figures), end="")
        if hint := _run_times_hint(result.trace, policy, exact_runtimes):
            print(hint, file=sys.stderr)
    if plot is not None:
        try:
            written = write_plots(plot, result.outcomes, {p: r.busy for p, r in result.replays.items()},
                                  result.scenario.capacity)
        except (PlotError, OSError) as exc:
            raise Failed(f"simulate --plot {plot}", str(exc)) from None
        print("plots: " + ", ".join(str(p) for p in written), file=sys.stderr)


def _run_times_hint(trace: dict, policies: list[str], exact_runtimes: bool) -> str | None:
    """For a table reader: why reservations and backfill did little, when the trace says no run time for some
    jobs (the JSON's `requestedTimes` says it to a program)."""
    unknown = trace["jobs"] - trace["requestedTimes"]
    if exact_runtimes or not unknown or not {"sluice", "easy-backfill"} & set(policies):
        return None
    return (f"note: {unknown:,} of {trace['jobs']:,} jobs give no requested run time, so no policy knows when they "
            "end: Sluice's reservations keep their room from every other job, and EASY cannot date a reservation and "
            "starts whatever fits. --exact-runtimes tells every policy each job's run time.")
