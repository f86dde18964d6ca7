"""python -m bench [NAME ...] [--quick] [--jobs N] [--no-record] [--plaintext] [--profile FILE]
                  [--doc FILE]

Runs the named benchmarks (all without names), prints each figure with its configuration, and records
them in docs/performance.md (each figure's row replaced). Every run starts its own PostgreSQL (pgserver,
Unix socket only) in a temp dir and deletes it at the end; dispatchers and agents bind 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import logging
import os
import pathlib
import shlex
import sys
import time
from dataclasses import replace

from bench import arrays, dispatching, figures, latency, simulating, swarm, systems
from bench.postgres import Postgres
from sluice import process

BENCHMARKS = {
    "submit": ("jobs/s accepted through gRPC Jobs.Submit: 1,000-job calls and single-job calls, 8 clients; "
               "empty calls as the floor"),
    "dispatch": "jobs/s decided and committed by run_cycle from a deep backlog (with the floor, same run)",
    "cycle": "cycle time at 1k, 100k and 1M queued, nothing able to start",
    "floor": "plain-SQL claim-and-record rate of Postgres over the same backlog, batches of 1,000",
    "memory": "RSS of the process running the cycles, 1M queued",
    "latency": "submit->dispatched and submit->running p50/p99, a job every 10 ms (sluice up, sim agents)",
    "e2e": "jobs/s completing through gRPC agents with sim backends (sluice up)",
    "simulate": "seconds to replay whole public traces through the production cycle (sluice simulate)",
    "arrays": ("a 100,000-element job array submitted in one call against 100,000 plain jobs: submit seconds, "
               "cycle p50/p99 and dispatch rate; an array with parallelism 1,000 and the release pass"),
    "swarm": ("1,000 simulated agents and 1,000 watch streams on one dispatcher: submit and list p99, heartbeats, "
              "20,000 jobs dispatched across them (only when named)"),
}
ON_REQUEST = {"swarm"}  # not part of a run without names
BACKLOG = {"dispatch", "cycle", "floor", "memory"}


def main(argv: list[str] | None = None) -> int:
    process.apply()  # first: the processes it spawns (the dispatcher, the clients) inherit it
    parser = argparse.ArgumentParser(prog="python -m bench", description="Sluice benchmarks.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(f"  {k:<9} {v}" for k, v in BENCHMARKS.items()))
    parser.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="everything scaled down: a smoke run of a minute or two")
    parser.add_argument("--jobs", type=int, help="backlog size for dispatch/cycle/floor/memory (default 1,000,000)")
    parser.add_argument("--no-record", action="store_true", help="print only; leave docs/performance.md alone")
    parser.add_argument("--plaintext", action="store_true",
                        help="submit, latency and e2e without TLS (loopback): what the code costs, apart from "
                             "what encryption costs; never recorded")
    parser.add_argument("--apart", action="store_true",
                        help="latency and swarm with two replicas: one that schedules and no client or agent "
                             "calls, and one that serves them (`sluice dispatcher serve --no-schedule`); never "
                             "recorded")
    parser.add_argument("--kill", action="store_true",
                        help="swarm: kill -9 of the dispatcher once a quarter of the jobs ended, then a restart on "
                             "its address; every agent must be back within 60 s; never recorded")
    parser.add_argument("--profile", metavar="FILE",
                        help="pyinstrument profiles: the dispatch drain's cycles to FILE, the waiting cycles "
                             "at the largest size to FILE.wait")
    parser.add_argument("--doc", metavar="FILE", default=str(figures.DOC),
                        help="where to record (default: this checkout's docs/performance.md)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    wanted = set(args.names or set(BENCHMARKS) - ON_REQUEST)
    if (args.plaintext or args.apart or args.kill) and not args.no_record:
        parser.error("--plaintext, --apart and --kill figures are for comparing, not the ones to record: add "
                     "--no-record")

    def over(config):
        """The system benchmarks' configuration, in plaintext and apart when asked."""
        config = replace(config, tls=False) if args.plaintext else config
        return replace(config, apart=True) if args.apart and hasattr(config, "apart") else config
    logging.basicConfig(level=logging.WARNING)
    given = list(argv if argv is not None else sys.argv[1:])
    if "--doc" in given:  # where it is recorded changes nothing measured
        del given[given.index("--doc"):given.index("--doc") + 2]
    given = [a for a in given if not a.startswith("--doc=")]
    command = "python -m bench " + shlex.join(given)
    run = figures.Run(command.strip())
    began = time.monotonic()
    def section(names: set[str], title: str) -> None:
        pg.checkpoint()  # each benchmark starts on a server with no write-back of the last one's left
        run.part(title)
        load = os.getloadavg()[0]
        print(f"== {title} == (load average {load:.1f} on {os.cpu_count()} cpus)", flush=True)
        run.load[title] = f"{load:.1f}"

    with Postgres() as pg:
        postgres = pg.settings()
        print(f"postgres: {postgres}", flush=True)
        if "submit" in wanted:
            section({"submit"}, "submit")
            systems.submit(pg, over(systems.SubmitConfig.quick() if args.quick else systems.SubmitConfig()), run)
        if wanted & BACKLOG:
            section(wanted & BACKLOG, ", ".join(sorted(wanted & BACKLOG)))
            config = dispatching.BacklogConfig.quick() if args.quick else dispatching.BacklogConfig()
            if args.jobs:
                config = replace(config, jobs=args.jobs)
            dispatching.run(pg, config, run, wanted, profile_path=args.profile)
        if "latency" in wanted:
            section({"latency"}, "latency")
            latency.latency(pg, over(latency.LatencyConfig.quick() if args.quick else latency.LatencyConfig()), run)
        if "e2e" in wanted:
            section({"e2e"}, "e2e")
            systems.end_to_end(pg, over(systems.EndToEndConfig.quick() if args.quick else systems.EndToEndConfig()),
                               run)
        if "arrays" in wanted:
            section({"arrays"}, "arrays")
            arrays.run(pg, arrays.ArraysConfig.quick() if args.quick else arrays.ArraysConfig(), run)
        if "swarm" in wanted:
            section({"swarm"}, "swarm")
            config = over(swarm.SwarmConfig.quick() if args.quick else swarm.SwarmConfig())
            swarm.run(pg, replace(config, kill=True) if args.kill else config, run)
        if "simulate" in wanted:
            section({"simulate"}, "simulate")
            simulating.run(simulating.SimulateConfig.quick() if args.quick else simulating.SimulateConfig(), run)
    run.part(None)
    run.load["end"] = f"{os.getloadavg()[0]:.1f}"
    print(f"done in {time.monotonic() - began:.0f}s", flush=True)
    for name, config in run.configs.items():
        print(f"config {name}: {config}")
    if not args.no_record:
        figures.record(run, postgres=postgres, doc=pathlib.Path(args.doc))
        print(f"recorded in {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
