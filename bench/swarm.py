"""The swarm: many clusters and many watchers on one dispatcher (issue 26's targets).

N simulated agents speak the real agent protocol over real gRPC and TLS: a hello with capacity, a heartbeat
every `heartbeat_s`, an ack for every command, RUNNING then SUCCEEDED reports for every dispatch. They run
as asyncio tasks, `agents_per_process` to a process, each on a connection of its own as a deployed agent
has. Beside them, M Watch streams (WatchBatches, as `sluice watch` opens) in a process of their own.

With all of them connected, single-job submits and `list` calls are timed, and the age of every
cluster's last heartbeat is read from the database; then `jobs` one-pod jobs are submitted and each must
reach SUCCEEDED, none dispatched twice. Everything binds loopback and stops by itself: a call that
finds no answer counts as failed after its timeout, and an agent that cannot connect tries again with
jittered backoff until the run ends.
"""
from __future__ import annotations

import asyncio
import collections
import pathlib
import random
import time
from dataclasses import asdict, dataclass

import psutil
import psycopg

from bench import systems, workload
from bench.figures import Figure, Run, Target
from bench.postgres import Postgres
from dispatcher.scheduler.settings import SchedulerSettings
from sluice import process as tuning
from sluice.quantity import parse_resources

NODE = parse_resources({"cpu": "64", "memory": "256Gi"})  # what each swarm cluster offers, milli-units
JOB = parse_resources({"cpu": "1", "memory": "2Gi"})  # what each job takes (workload.SHAPES[0])


@dataclass(frozen=True)
class SwarmConfig:
    clusters: int = 1000
    watchers: int = 1000
    agents_per_process: int = 250
    heartbeat_s: float = 5.0
    connect_s: float = 120.0  # how long every agent and watcher gets to connect
    probe_s: float = 30.0  # submit and list timed for this long, everything connected
    probe_interval_s: float = 0.1  # a probe submit and a probe list every this often
    call_timeout_s: float = 10.0  # a probe call unanswered this long counts as failed
    jobs: int = 20_000
    job_s: float = 1.0  # each job's simulated run time
    settle_s: float = 600.0  # how long the jobs get to finish
    tls: bool = True
    apart: bool = False  # two replicas: one schedules; another (--no-schedule) serves agents, watches and calls
    kill: bool = False  # kill -9 of the serving dispatcher once a quarter of the jobs ended, then a restart
    back_s: float = 60.0  # how long every agent gets to be back after the restart

    @classmethod
    def quick(cls) -> SwarmConfig:
        return cls(clusters=40, watchers=20, agents_per_process=20, probe_s=5.0, jobs=1000, settle_s=120.0)


# -- the agents' processes -------------------------------------------------------------------------------

def _agents(pipe, address: str, ca: str | None, tokens: dict[str, str], config: SwarmConfig) -> None:
    """Run one process's swarm agents until told to stop; answer each message with their counts."""
    tuning.apply()  # a process entry point: before it imports grpc
    asyncio.run(_Agents(address, ca, tokens, config).run(pipe))


class _Agents:
    def __init__(self, address: str, ca: str | None, tokens: dict[str, str], config: SwarmConfig):
        self.address, self.tokens, self.config = address, tokens, config
        self.ca = pathlib.Path(ca).read_bytes() if ca else None
        self.welcomed: set[str] = set()
        self.dialling: set[str] = set()  # a call open and no welcome yet: waiting for the dispatcher, not backing off
        self.created: collections.Counter = collections.Counter()  # job id -> dispatches applied (attempts)
        self.errors: collections.Counter = collections.Counter()  # status code (details) -> links that ended with it
        self.heartbeats = 0
        self.stop = asyncio.Event()

    async def run(self, pipe) -> None:
        tasks = [asyncio.create_task(self._agent(name, token)) for name, token in self.tokens.items()]
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, pipe.recv) != "stop":
            pipe.send(self._counts())
        self.stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        pipe.send(self._counts())

    def _counts(self) -> dict:
        return {"welcomed": len(self.welcomed), "dialling": len(self.dialling), "created": dict(self.created),
                "errors": dict(self.errors),
                "heartbeats": self.heartbeats}

    async def _agent(self, name: str, token: str) -> None:
        import grpc

        from agent.connection import AgentSettings, reconnect_delay
        from sluice.v1 import agents_pb2, agents_pb2_grpc, jobs_pb2

        running: set[tuple[int, int]] = set()
        applied: set[tuple[int, int]] = set()  # every dispatch this agent applied (a cluster knows what it made)
        link: list[asyncio.Queue] = [asyncio.Queue()]  # the current connection's outgoing messages
        seq = 0
        unacked: dict[int, tuple[int, int, str]] = {}  # reports the dispatcher has not acked: sent again on redial
        backoff_initial_s, backoff_max_s = AgentSettings.backoff_initial_s, AgentSettings.backoff_max_s
        backoff = backoff_initial_s

        def capacity() -> agents_pb2.Capacity:
            free = {name: amount - JOB.get(name, 0) * len(running) for name, amount in NODE.items()}
            return agents_pb2.Capacity(allocatable=jobs_pb2.Resources(milli=NODE),
                                       free=jobs_pb2.Resources(milli=free),
                                       largest_free_node=jobs_pb2.Resources(milli=free))

        def send(**kind) -> None:
            link[0].put_nowait(agents_pb2.AgentMessage(**kind))

        async def report(job_id: int, attempt: int) -> None:
            """RUNNING, then SUCCEEDED job_s later, on whichever connection is up then (as a real agent's
            reports outlive a reconnect: the dispatcher acks them by seq and ignores a repeat)."""
            nonlocal seq
            for state in ("RUNNING", "SUCCEEDED"):
                if state == "SUCCEEDED":
                    await asyncio.sleep(self.config.job_s)
                    running.discard((job_id, attempt))
                seq += 1
                unacked[seq] = (job_id, attempt, state)
                send(status=status(seq))

        def status(n: int) -> agents_pb2.StatusReport:
            job_id, attempt, state = unacked[n]
            return agents_pb2.StatusReport(seq=n, status=agents_pb2.AttemptStatus(job_id=job_id, attempt=attempt,
                                                                                   state=state))

        async def heartbeats() -> None:
            while True:
                await asyncio.sleep(self.config.heartbeat_s * random.uniform(0.9, 1.0))
                send(heartbeat=agents_pb2.Heartbeat(capacity=capacity()))
                self.heartbeats += 1

        reports: set[asyncio.Task] = set()
        while not self.stop.is_set():
            queue = link[0] = asyncio.Queue()
            # As a real agent's hello: what runs, and for an attempt with unacked reports the earliest of them.
            held = {key: "RUNNING" for key in running}
            earliest: dict[tuple[int, int], str] = {}
            for n in sorted(unacked):
                earliest.setdefault(unacked[n][:2], unacked[n][2])
            inventory = [agents_pb2.AttemptStatus(job_id=j, attempt=a, state=state)
                         for (j, a), state in {**held, **earliest}.items()]
            send(hello=agents_pb2.Hello(cluster=name, capacity=capacity(), inventory=inventory, reads_batches=True))
            for n in sorted(unacked):
                send(status=status(n))

            async def requests(queue=queue):
                while (message := await queue.get()) is not None:
                    yield message

            credentials = grpc.ssl_channel_credentials(self.ca) if self.ca else None
            own = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own, as a real agent's
            channel = (grpc.aio.secure_channel(self.address, credentials, own) if credentials
                       else grpc.aio.insecure_channel(self.address, own))
            beating: asyncio.Task | None = None
            try:
                self.dialling.add(name)
                call = agents_pb2_grpc.AgentsStub(channel).Connect(
                    requests(), metadata=[("authorization", f"Bearer {token}")])
                async for message in call:
                    for one in (message.batch.messages if message.WhichOneof("kind") == "batch" else (message,)):
                        kind = one.WhichOneof("kind")
                        if kind == "welcome":
                            self.welcomed.add(name)
                            self.dialling.discard(name)
                            backoff = backoff_initial_s
                            beating = asyncio.create_task(heartbeats())
                        elif kind == "status_ack":
                            for n in [n for n in unacked if n <= one.status_ack.seq]:
                                del unacked[n]
                        elif kind == "command":
                            command = one.command
                            send(ack=agents_pb2.CommandAck(command_ids=[command.id]))
                            if command.WhichOneof("kind") == "dispatch":
                                key = (command.dispatch.job_id, command.dispatch.attempt)
                                if key not in applied:  # a command sent again after a reconnect: applied once
                                    applied.add(key)
                                    running.add(key)
                                    self.created[key[0]] += 1
                                    task = asyncio.create_task(report(*key))
                                    reports.add(task)
                                    task.add_done_callback(reports.discard)
            except grpc.aio.AioRpcError as exc:  # a dispatcher going away: UNAVAILABLE; anything else says what
                unusual = exc.code() != grpc.StatusCode.UNAVAILABLE
                self.errors[f"{exc.code().name} ({exc.details()[:60]})" if unusual else exc.code().name] += 1
            except asyncio.CancelledError:
                for task in reports:
                    task.cancel()
                raise
            finally:
                self.welcomed.discard(name)
                self.dialling.discard(name)
                if beating is not None:
                    beating.cancel()
                queue.put_nowait(None)
                await channel.close()
            if not self.stop.is_set():  # jittered, as a real agent waits before it dials again
                await asyncio.sleep(reconnect_delay(backoff))
                backoff = min(backoff * 2, backoff_max_s)


# -- the watchers' process -------------------------------------------------------------------------------

def _watchers(pipe, address: str, ca: str | None, token: str, count: int) -> None:
    tuning.apply()  # a process entry point: before it imports grpc
    asyncio.run(_watch_all(pipe, address, ca, token, count))


async def _watch_all(pipe, address: str, ca: str | None, token: str, count: int) -> None:
    import grpc

    from sluice.v1 import jobs_pb2, jobs_pb2_grpc

    root = pathlib.Path(ca).read_bytes() if ca else None
    # Each watcher's connection of its own, as a thousand users' `sluice watch` would have: gRPC otherwise shares
    # one among a process's channels to the same address.
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(root), options) if root
                else grpc.aio.insecure_channel(address, options) for _ in range(count)]
    counts = {"open": 0, "events": 0, "errors": collections.Counter()}

    async def watch(channel) -> None:
        """One `sluice watch` user: after the stream ends (a dispatcher restart), it watches again from the last
        event it saw, after a jittered wait, as a user's script would."""
        stub = jobs_pb2_grpc.JobsStub(channel)
        after, backoff = 0, 0.5
        while True:
            call = stub.WatchBatches(jobs_pb2.WatchRequest(after_event_id=after),
                                     metadata=[("authorization", f"Bearer {token}")])
            counts["open"] += 1
            try:
                async for batch in call:
                    counts["events"] += len(batch.events)
                    if batch.events:
                        after, backoff = batch.events[-1].id, 0.5
            except grpc.aio.AioRpcError as exc:
                counts["errors"][f"{exc.code().name}: {exc.details()}"[:100]] += 1
            finally:
                counts["open"] -= 1
            await asyncio.sleep(random.uniform(0, backoff))
            backoff = min(backoff * 2, 10.0)

    tasks = [asyncio.create_task(watch(channel)) for channel in channels]
    loop = asyncio.get_running_loop()
    while await loop.run_in_executor(None, pipe.recv) != "stop":
        pipe.send({**counts, "errors": dict(counts["errors"])})
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(channel.close() for channel in channels))
    pipe.send({**counts, "errors": dict(counts["errors"])})


# -- the run ---------------------------------------------------------------------------------------------

def _ask(pipes: list) -> list[dict]:
    for pipe in pipes:
        pipe.send("counts?")
    return [pipe.recv() for pipe in pipes]


def _probe(system: systems.System, config: SwarmConfig) -> tuple[list[float], list[float], int]:
    """Single-job submit and list latencies (s) over probe_s, and how many calls failed."""
    from sluice.client import Client, ClientError

    doc = workload.job_document("default", workload.SHAPES[0], "standard", 0, duration="1s")
    submits, lists, failed = [], [], 0
    with Client(system.config(config.call_timeout_s)) as client:
        until = time.monotonic() + config.probe_s
        while time.monotonic() < until:
            for call, into in ((lambda: client.submit([doc]), submits), (lambda: client.list(limit=100), lists)):
                began = time.monotonic()
                try:
                    call()
                    into.append(time.monotonic() - began)
                except ClientError:
                    failed += 1
            time.sleep(config.probe_interval_s)
    return submits, lists, failed


def run(pg: Postgres, config: SwarmConfig, run_: Run) -> None:
    run_.configs["swarm"] = {**asdict(config), "agents": "asyncio tasks on grpc.aio, a connection each",
                             "watchers": "WatchBatches streams of the admin, a connection each, one process"}
    objs = [*workload.CLASSES, *systems.objects(config.clusters, 1)[len(workload.CLASSES):]]
    # The watchers are one admin's: no limit per user. Agents are told to heartbeat as the swarm's do, and a
    # cluster is unreachable after three heartbeats missed, as a deployment with this interval would set it.
    server = {"heartbeat_s": config.heartbeat_s, "watch_streams_per_user": 0,
              "scheduler": SchedulerSettings(unreachable_after_s=3 * config.heartbeat_s)}
    with systems.System(pg, "swarm", objs, split=True, agents=False, tls=config.tls, server=server,
                        apart=config.apart) as system:
        names = sorted(system.agent_tokens)
        chunks = [names[i:i + config.agents_per_process] for i in range(0, len(names), config.agents_per_process)]
        began = time.monotonic()
        children, pipes = [], []
        for chunk in chunks:
            parent, child = systems.SPAWN.Pipe()
            tokens = {n: system.agent_tokens[n] for n in chunk}
            children.append(systems.SPAWN.Process(target=_agents, args=(child, system.address, system.ca, tokens,
                                                                         config), name="bench-swarm"))
            children[-1].start()
            pipes.append(parent)
        parent, child = systems.SPAWN.Pipe()
        watcher = systems.SPAWN.Process(target=_watchers, args=(child, system.address, system.ca, system.token,
                                                                config.watchers), name="bench-watchers")
        watcher.start()
        try:
            _measure(system, config, run_, pipes, parent, began)
        finally:
            for pipe in [*pipes, parent]:
                try:
                    pipe.send("stop")
                except OSError:
                    pass
            for p in [*children, watcher]:
                p.join(30)
                if p.is_alive():
                    p.terminate()


def _measure(system: systems.System, config: SwarmConfig, run_: Run, pipes: list, watch_pipe, began: float) -> None:
    deadline = began + config.connect_s
    while True:
        welcomed = sum(c["welcomed"] for c in _ask(pipes))
        watch_pipe.send("counts?")
        watched = watch_pipe.recv()
        watching = watched["open"]
        if welcomed >= config.clusters and watching >= config.watchers or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    connected_s = time.monotonic() - began
    run_.add(Figure("swarm", "clusters connected", welcomed, "clusters", Target(">=", config.clusters),
                    note=f"of {config.clusters} in {connected_s:.0f}s; {watching} watch streams open, "
                         f"ended: {watched['errors'] or 'none'}"))
    time.sleep(config.heartbeat_s * 2)  # every agent heartbeats at least once more
    submits, lists, failed = _probe(system, config)
    with psycopg.connect(system.libpq) as conn:
        age = conn.execute("SELECT extract(epoch FROM max(now() - capacity_at)), count(*) FILTER "
                           "(WHERE capacity_at IS NULL) FROM clusters").fetchone()
    serving = psutil.Process(system.serving_pid)  # with its children: the scheduler process
    rss = sum(p.memory_info().rss for p in (serving, *serving.children(recursive=True))) / 2**30
    (submit50, submit99), (list50, list99) = systems.percentiles(submits), systems.percentiles(lists)
    run_.add(Figure("swarm", "single-job submit p99, swarm connected", submit99 * 1000, "ms", Target("<=", 100),
                    note=f"{len(submits)} calls, p50 {submit50 * 1000:.0f} ms, {failed} calls failed in all"))
    run_.add(Figure("swarm", "list p99, swarm connected", list99 * 1000, "ms", Target("<=", 200),
                    note=f"{len(lists)} calls, p50 {list50 * 1000:.0f} ms"))
    oldest = float("inf") if age[1] or age[0] is None else float(age[0])  # a cluster never heard from: no bound
    run_.add(Figure("swarm", "oldest cluster heartbeat, swarm connected", oldest, "s",
                    Target("<=", 2 * config.heartbeat_s), note=f"{age[1]} clusters never reported"))
    run_.add(Figure("swarm", "dispatcher RSS, swarm connected", rss, "GiB", Target("<=", 1.0),
                    note="the serving process and its children"))
    _dispatch(system, config, run_, pipes, watch_pipe)


def _dispatch(system: systems.System, config: SwarmConfig, run_: Run, pipes: list, watch_pipe) -> None:
    from sluice.client import Client, ClientError

    doc = workload.job_document("default", workload.SHAPES[0], "standard", 0, duration=f"{config.job_s}s")
    before = system.count("true")
    began = time.monotonic()
    ids: set[int] = set()
    try:
        with Client(system.config(60)) as client:
            for start in range(0, config.jobs, 1000):
                ids.update(client.submit([doc] * min(1000, config.jobs - start)))
    except ClientError as exc:  # the dispatcher did not take them: every job not submitted counts as lost
        run_.notes.append(f"swarm: submitting the jobs failed after {len(ids):,}: {exc}")
        run_.add(Figure("swarm", "jobs lost or run twice", config.jobs - len(ids), "jobs", Target("<=", 0),
                        note=f"submit failed: {exc.code}"))
        return
    deadline = began + config.settle_s
    if config.kill:
        _kill_and_restart(system, config, run_, pipes, watch_pipe, before + len(ids) // 4, deadline)
    while system.count("state = 'SUCCEEDED'") < len(ids) + before and time.monotonic() < deadline:
        time.sleep(1.0)
    elapsed = time.monotonic() - began
    with psycopg.connect(system.libpq) as conn:
        done = conn.execute("SELECT count(*) FROM jobs WHERE id = ANY(%s) AND state = 'SUCCEEDED'",
                            (list(ids),)).fetchone()[0]
    created: collections.Counter = collections.Counter()
    for counts in _ask(pipes):
        created.update({int(k): v for k, v in counts["created"].items()})
    twice = sum(1 for job in ids if created[job] > 1)
    run_.add(Figure("swarm", "one-pod jobs dispatched across the swarm", done / elapsed, "jobs/s",
                    note=f"{done:,} of {len(ids):,} SUCCEEDED in {elapsed:.0f}s; {len(ids) - done} not, "
                         f"{twice} dispatched twice"))
    run_.add(Figure("swarm", "jobs lost or run twice", (len(ids) - done) + twice, "jobs", Target("<=", 0)))


def _kill_and_restart(system: systems.System, config: SwarmConfig, run_: Run, pipes: list, watch_pipe, ended: int,
                      deadline: float) -> None:
    """Once `ended` jobs SUCCEEDED: kill -9 of the dispatcher the agents call, a restart on its address, and
    how long until every agent is welcomed again (each redials on its own jittered backoff), and how many
    watches are open again by then."""
    while system.count("state = 'SUCCEEDED'") < ended and time.monotonic() < deadline:
        time.sleep(0.2)
    killed_with = system.count("state = 'SUCCEEDED'")
    failed_before = _links_failed(pipes)
    killed = time.monotonic()
    system.kill_and_restart_serving()
    serving_s = time.monotonic() - killed
    every_10s: list[str] = []  # agents welcomed again (and dialling) at 10 s, 20 s, ... after the kill
    while True:
        counts = _ask(pipes)
        if (welcomed := sum(c["welcomed"] for c in counts)) >= config.clusters:
            break
        since = time.monotonic() - killed
        if since > config.back_s * 2:
            break
        if since >= 10 * (len(every_10s) + 1):
            every_10s.append(f"{welcomed} ({sum(c['dialling'] for c in counts)})")
        time.sleep(0.5)
    back_s = time.monotonic() - killed
    failed = _links_failed(pipes) - failed_before
    watch_pipe.send("counts?")
    watching = watch_pipe.recv()["open"]
    run_.add(Figure("swarm", "every agent back after kill -9 and a restart", back_s, "s",
                    Target("<=", config.back_s),
                    note=f"from the kill; {welcomed:,} of {config.clusters:,} welcomed again; the restarted "
                         f"process served after {serving_s:.1f}s; killed with {killed_with:,} jobs SUCCEEDED; "
                         f"{watching:,} of {config.watchers:,} watches open again; welcomed every 10 s (and "
                         "dialling, a call open but not yet welcomed): "
                         f"{', '.join(map(str, every_10s)) or '-'}; links failed meanwhile: "
                         f"{', '.join(f'{n:,} {code}' for code, n in failed.most_common()) or 'none'}"))


def _links_failed(pipes: list) -> collections.Counter:
    """How many agent links have ended with each status code, in every agents' process."""
    failed: collections.Counter = collections.Counter()
    for counts in _ask(pipes):
        failed.update(counts["errors"])
    return failed
