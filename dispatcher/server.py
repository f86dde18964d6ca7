"""The dispatcher process: database, notification listener, gRPC services and the scheduler.

`Dispatcher` is used by `sluice dispatcher serve`, by `sluice up` (with in-process sim agents) and by
the tests: one object to start and stop, owning everything it started.

Any number of them may serve one database (docs/scaling.md). Every replica serves the whole API, agent
streams included, and listens for notifications; only the one holding the leader lock schedules and
reads Prometheus (its refresher runs while it leads). A replica started with `schedule=False` never
leads. The scheduler runs on a thread of this process, or (`scheduler_process`, `sluice dispatcher serve`'s
default) in a child process of its own whose cycles then never wait for this one's GIL, nor it for
theirs (scheduler/process.py). The /metrics gauges read from Postgres are served by every replica, each
scrape being one short read-only transaction.
"""
from __future__ import annotations

import asyncio
import logging
import pathlib
import shutil
import tempfile
import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dispatcher.api.admin import AdminService
from dispatcher.api.admission import AdmissionRate, AgentsFirst, StreamLimits
from dispatcher.api.agents import AgentsService
from dispatcher.api.auth import Authenticator
from dispatcher.api.jobs import JobsService
from dispatcher.api.logs import LogRelay
from dispatcher.api.oidc import IdentityProvider, OidcSettings
from dispatcher.api.schedules import SchedulesService
from dispatcher.api.wakeups import drain_wakeups
from dispatcher.console.app import Console
from dispatcher.console.gateway import Gateway
from dispatcher.metrics import DispatcherMetrics, StoreCollector, StreamCollector
from dispatcher.scheduler.process import SchedulerProcess, Scheduling
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.store import channels, database
from dispatcher.store.database import DatabaseSettings
from dispatcher.store.listening import Notifier, libpq_url
from dispatcher.tls import grpc_credentials
from sluice.process import tune_interpreter
from sluice.serving import MetricsServer, ServerTls, refuse_plaintext_off_loopback, refuse_port_in_use
from sluice.v1 import admin_pb2_grpc, agents_pb2_grpc, schedules_pb2_grpc

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 << 20  # one Submit call; each job document is limited separately
# Health: service "" answers SERVING only while the store can be reached (readiness); LIVENESS answers SERVING
# for as long as the process serves, Postgres or not (a liveness probe: restarting would not bring it back).
LIVENESS = "liveness"


@dataclass(frozen=True)
class ServerSettings:
    listen: str = "127.0.0.1:7070"  # host:port; port 0 picks a free one
    # TLS on every port (gRPC and /metrics). None: plaintext, which only a loopback address may serve
    # (`sluice dispatcher serve --insecure`); tokens would otherwise cross the network in clear.
    tls: ServerTls | None = None
    # host:port where agents authenticate with client certificates signed by tls.client_ca (mTLS) instead
    # of tokens; gRPC asks for client certificates on a whole port or not at all. None: no such port.
    agent_listen: str | None = None
    # host:port serving the gRPC health service alone, in plaintext on any address: the kubelet's gRPC probes
    # cannot speak TLS, and nothing secret crosses this port (no token, no job). None: no such port.
    health_listen: str | None = None
    # Threads for unary RPCs (each holds one while it runs). The streams (agent links, watches, submit streams)
    # hold none: they wait on the event loop, and their database work runs on `stream_workers` threads.
    workers: int = 64
    stream_workers: int = 32
    # gRPC servers sharing each port on the one event loop (SO_REUSEPORT: the kernel spreads the connections over
    # them). A grpc.aio server takes up one new call at a time, a turn or two of a loop that a thousand streams keep
    # busy; N servers take up N at once, so a storm of calls (every agent redialling a restarted dispatcher) is
    # not queued behind one (ADR 0004). They share every service, so which one a connection lands on is invisible.
    listeners: int = 4
    # Submit streams (Jobs.SubmitStream) open at once; a client keeps one only while it submits again and
    # again (sluice.client). One more is refused, and its client submits by unary calls. 0: none.
    submit_streams: int = 256
    # Watch streams (Jobs.Watch, WatchBatches) open at once, in all and for one user; one more is refused with
    # RESOURCE_EXHAUSTED. 0: no limit.
    watch_streams: int = 10_000
    watch_streams_per_user: int = 100
    # Recent job events kept in memory for the watches (api/event_feed.py); a watch further behind reads the store.
    watch_feed_rows: int = 20_000
    # Agent links admitted (hellos reconciled) a second after a burst of as many, so that every agent redialling
    # a restarted dispatcher at once is taken in turn; a hello waiting longer than agent_admission_wait_s is
    # refused with RESOURCE_EXHAUSTED and its agent redials after its backoff. 0: no limit.
    agent_admissions_per_s: float = 200.0
    agent_admission_wait_s: float = 20.0
    # While agents are connecting (every one of them, after a restart), a watch that opens waits up to this long
    # before it reads: the agents run the jobs, the watches only report them (api/admission.AgentsFirst). 0: no wait.
    watches_wait_for_agents_s: float = 30.0
    heartbeat_s: float = 1.0  # how often agents report capacity
    database: DatabaseSettings = field(default_factory=DatabaseSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    prometheus_interval_s: float = 1.0  # how often each cluster's Prometheus is read, when it has one
    migrate: bool = False  # bring the schema to head at start (the embedded default always does)
    # Whether this replica may lead (run the scheduling loop). False: it serves the API and agents only,
    # and the scheduling replicas (started with True, the default) need take no client or agent traffic:
    # their cycles then have a process, and its GIL, to themselves.
    schedule: bool = True
    # Whether the scheduler runs in a child process of its own (scheduler/process.py) rather than on a thread
    # of this one, whose GIL its cycles would hold while calls and agents wait. `sluice dispatcher serve`
    # runs it apart by default; False here keeps a whole dispatcher in one process, as `sluice up`'s dev
    # stack and the tests (which start many) run it.
    scheduler_process: bool = False
    # host:port for /metrics (Prometheus text); port 0 picks a free one; None or "" serves none.
    # Loopback by default: the series name queues and clusters.
    metrics_listen: str | None = "127.0.0.1:0"
    # The web console and its JSON API on the metrics port's other paths (dispatcher/console); it calls this
    # dispatcher's own gRPC API over a Unix socket in a private directory, made and removed with the server.
    console: bool = True
    # How long a busy Python thread keeps the GIL before another may take it (Python's default is 5 ms).
    # The dispatcher's threads mostly wait on Postgres and the network; each wait ends by taking the GIL
    # back, so with the default every round trip of a request can queue behind 5 ms of a busy thread
    # (a scheduling cycle, a batch of agent reports). None keeps the interpreter's setting.
    gil_switch_interval_s: float | None = 0.0005
    # The cyclic garbage collector's thresholds (gc.set_threshold), set for the whole process at start.
    # Python's default runs a collection every 700 net container allocations, each full one walking every
    # object under the GIL, and they free almost nothing: reference counting frees what requests make.
    # These run them far less often (at most a few MB behind). None keeps the interpreter's setting.
    gc_thresholds: tuple[int, int, int] | None = (100_000, 50, 1000)
    # How often health is checked against the store (a new connection and one statement); while Postgres
    # cannot be reached the health check answers NOT_SERVING, and an embedded one that died is started again.
    store_check_s: float = 1.0
    # An OpenID Connect / JWT identity provider whose tokens are accepted beside Sluice's own (api/oidc.py).
    identity: OidcSettings = field(default_factory=OidcSettings)


class Dispatcher:
    def __init__(self, settings: ServerSettings, db: database.Database | None = None):
        self.settings = settings
        self.db = db or database.connect(settings.database)
        self.engine = self.db.engine
        try:
            if settings.migrate or settings.database.url is None:
                database.migrate(self.engine)
            database.check_schema(self.engine)
        except Exception:
            self.db.close()
            raise
        self.sessions = self.db.sessions()
        # Wake-ups are for a scheduler on a thread of this process; a scheduler process listens for its own.
        wakes = (channels.WAKE_CHANNEL,) if settings.schedule and not settings.scheduler_process else ()
        self.notifier = Notifier(self.engine, (*wakes, channels.EVENTS_CHANNEL, channels.OUTBOX_CHANNEL,
                                               channels.TOKENS_CHANNEL))
        try:
            identity = IdentityProvider(settings.identity) if settings.identity.enabled else None
        except ValueError:
            self.db.close()
            raise
        auth = Authenticator(self.sessions, self.notifier, identity)
        unreachable = settings.scheduler.unreachable_after_s
        self.metrics = DispatcherMetrics()
        self.metrics.registry.register(StoreCollector(
            self.sessions, unreachable_after_s=unreachable, staleness_s=settings.scheduler.prometheus_staleness_s))
        self.scheduler: Scheduling | SchedulerProcess | None = None  # None: this replica never leads
        if settings.schedule and settings.scheduler_process:
            self.scheduler = SchedulerProcess(
                self.engine, settings.database, settings.scheduler,
                prometheus_interval_s=settings.prometheus_interval_s, metrics=self.metrics,
                gil_switch_interval_s=settings.gil_switch_interval_s, gc_thresholds=settings.gc_thresholds)
        elif settings.schedule:
            self.scheduler = Scheduling(self.engine, self.sessions, self.notifier, settings.scheduler,
                                        prometheus_interval_s=settings.prometheus_interval_s, metrics=self.metrics)
        # The gRPC server runs on an event loop of its own thread (ADR 0004): unary handlers on `workers`
        # threads, streams as coroutines whose blocking work runs on the loop's executor.
        self._loop = asyncio.new_event_loop()
        self._stream_pool = futures.ThreadPoolExecutor(settings.stream_workers, thread_name_prefix="stream")
        self._loop.set_default_executor(self._stream_pool)
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="rpc-loop", daemon=True)
        self._loop_thread.start()
        self._unary_pool = futures.ThreadPoolExecutor(settings.workers, thread_name_prefix="rpc")
        self.servers = [self._on_loop(_aio_server(self._unary_pool)) for _ in range(max(1, settings.listeners))]
        self.wakeups_drained = self._on_loop(_drain_wakeups())  # gRPC's poller then never waits on the loop
        self.watch_streams = StreamLimits("watch streams", per_user=settings.watch_streams_per_user,
                                          total=settings.watch_streams)
        logs = LogRelay()  # Logs calls ask the agents connected here
        agents_first = AgentsFirst(max_wait_s=settings.watches_wait_for_agents_s)
        jobs = JobsService(self.sessions, auth, self.notifier, unreachable_after_s=unreachable,
                           submit_streams=settings.submit_streams, watches=self.watch_streams,
                           feed_rows=settings.watch_feed_rows, metrics=self.metrics, logs=logs,
                           agents_first=agents_first)
        admission = AdmissionRate("agent links", per_s=settings.agent_admissions_per_s,
                                  burst=max(1, int(settings.agent_admissions_per_s)),
                                  max_wait_s=settings.agent_admission_wait_s)
        agents = AgentsService(self.sessions, auth, self.notifier, heartbeat_s=settings.heartbeat_s,
                               metrics=self.metrics, admission=admission, agents_first=agents_first, logs=logs)
        self.metrics.registry.register(StreamCollector(
            {"watch": jobs.watches, "submit": jobs.submit_streams}, agent_links=lambda: agents.links_open,
            agents_refused=lambda: admission.refused, agents_first=agents_first,
            watch_reads=jobs.feed_reads))
        admin, schedules = AdminService(self.sessions, auth), SchedulesService(self.sessions, auth)
        self.health = _Health(self._loop)
        for server in self.servers:
            jobs.add_to(server)
            agents_pb2_grpc.add_AgentsServicer_to_server(agents, server)
            admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
            schedules_pb2_grpc.add_SchedulesServicer_to_server(schedules, server)
            health_pb2_grpc.add_HealthServicer_to_server(self.health.on_loop, server)
        self.health_server: grpc.Server | None = None
        self._console_dir: pathlib.Path | None = None
        self._gateway: Gateway | None = None
        try:
            self.port = self._listen(settings.listen)
            self.address = f"{settings.listen.rsplit(':', 1)[0]}:{self.port}"
            self.agent_port = self._listen(settings.agent_listen, agents=True) if settings.agent_listen else 0
            self.health_port = self._serve_health(settings.health_listen) if settings.health_listen else 0
            self.metrics_server: MetricsServer | None = None
            if settings.metrics_listen:
                console = Console(self._serve_gateway()) if settings.console else None
                self.metrics_server = MetricsServer(settings.metrics_listen, self.metrics.registry, settings.tls,
                                                    app=console)
        except OSError:
            self._on_loop(self._stop_servers(None))
            self._close_loop()
            if self.health_server is not None:
                self.health_server.stop(None)
            self._close_gateway()
            self.db.close()
            raise
        self.metrics_port = self.metrics_server.port if self.metrics_server else 0  # 0: no /metrics
        self._watch_stop = threading.Event()
        self._store_up = True
        self._watch = threading.Thread(target=self._watch_store, name="store-watch", daemon=True)

    def _listen(self, listen: str, *, agents: bool = False) -> int:
        """Add a gRPC port to every server: TLS when the settings have it (agents: the mTLS agent port), else
        plaintext, on loopback only. The first server binds it (port 0: a free one), the others the same port."""
        tls = self.settings.tls
        if tls is None:
            if agents:
                raise OSError(f"refusing plaintext on {listen}: the agent port needs TLS with a client CA")
            refuse_plaintext_off_loopback(listen)
        refuse_port_in_use(listen)

        def add(server: grpc.aio.Server, address: str) -> int:  # credentials of its own: gRPC takes them over
            return (server.add_secure_port(address, grpc_credentials(tls, agents=agents)) if tls
                    else server.add_insecure_port(address))

        port = _bound(listen, lambda: add(self.servers[0], listen))
        same = f"{listen.rsplit(':', 1)[0]}:{port}"
        for server in self.servers[1:]:
            _bound(same, lambda server=server: add(server, same))
        return port

    def _serve_gateway(self) -> Gateway:
        """The console's way in: plaintext gRPC on a Unix socket that only this user can reach (mkdtemp makes
        its directory 0700), so a token sent on it never leaves the process's host or user."""
        self._console_dir = pathlib.Path(tempfile.mkdtemp(prefix="sluice-console-"))
        target = f"unix:{self._console_dir / 'grpc.sock'}"
        _bound(target, lambda: self.servers[0].add_insecure_port(target))
        self._gateway = Gateway(target)
        return self._gateway

    def _close_gateway(self) -> None:
        if self._gateway is not None:
            self._gateway.close()
        if self._console_dir is not None:
            shutil.rmtree(self._console_dir, ignore_errors=True)

    def _serve_health(self, listen: str) -> int:
        self.health_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health"))
        health_pb2_grpc.add_HealthServicer_to_server(self.health.threaded, self.health_server)
        refuse_port_in_use(listen)
        return _bound(listen, lambda: self.health_server.add_insecure_port(listen))

    def start(self) -> Dispatcher:
        tune_interpreter(self.settings.gil_switch_interval_s, self.settings.gc_thresholds)
        self.notifier.start()
        for server in self.servers:
            self._on_loop(server.start())
        if self.health_server is not None:
            self.health_server.start()
        if self.scheduler is not None:
            self.scheduler.start()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        self._watch.start()
        log.info("dispatcher serving", extra={"address": self.address})
        return self

    def _watch_store(self) -> None:
        """Health follows the store: NOT_SERVING while Postgres cannot be reached, SERVING again once it
        can. An embedded server found dead is started again. Everything else reconnects by itself."""
        url = libpq_url(self.engine)
        timeout_s = self.settings.database.connect_timeout_s
        while not self._watch_stop.wait(self.settings.store_check_s):
            if database.reachable(url, timeout_s):
                self._serving(True)
                continue
            self._serving(False)
            if self.db.restart_embedded():
                self._serving(database.reachable(url, timeout_s))

    def _serving(self, up: bool) -> None:
        if up == self._store_up:
            return
        self._store_up = up
        status = health_pb2.HealthCheckResponse
        self.health.set("", status.SERVING if up else status.NOT_SERVING)
        if up:
            log.warning("the database is reachable again; serving")
        else:
            log.warning("the database is unreachable; health is NOT_SERVING until it returns")

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving and release everything; a second call does nothing."""
        if self._loop.is_closed():
            return
        self.health.enter_graceful_shutdown()
        self._watch_stop.set()
        if self._watch.is_alive():
            self._watch.join(2 * self.settings.database.connect_timeout_s + 5)
        if self.scheduler is not None:
            self.scheduler.stop()
        self._on_loop(self._stop_servers(grace))
        self._close_loop()
        if self.health_server is not None:
            self.health_server.stop(None)
        self.notifier.stop()
        if self.metrics_server:
            self.metrics_server.stop()
        self._close_gateway()
        self.db.close()

    async def _stop_servers(self, grace: float | None) -> None:
        await asyncio.gather(*(server.stop(grace) for server in self.servers))

    def _on_loop(self, coroutine, timeout_s: float | None = 60.0):
        """Run a coroutine on the server's event loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    def _close_loop(self) -> None:
        try:
            self._on_loop(_cancel_tasks(), timeout_s=10)
        except TimeoutError:
            log.warning("tasks on the gRPC loop did not end in 10 s")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(10)
        self._loop.close()
        self._stream_pool.shutdown(wait=False, cancel_futures=True)
        self._unary_pool.shutdown(wait=False, cancel_futures=True)


async def _cancel_tasks() -> None:
    """Cancel what still runs on the loop (an event feed's reader, a batch being flushed) and wait for it."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _aio_server(unary_pool: futures.ThreadPoolExecutor) -> grpc.aio.Server:
    """A gRPC server, made on the loop that will run it; its unary handlers run on `unary_pool`."""
    return grpc.aio.server(migration_thread_pool=unary_pool,
                           options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                    # A call waits this long (s) for the server to take it up before gRPC
                                    # cancels it (30 by default): a storm of streams dialling at once must
                                    # all be taken up (ADR 0004).
                                    ("grpc.server_max_unrequested_time_in_server", 300),
                                    # Every listener binds the same port (gRPC's default on Linux, stated here
                                    # because ServerSettings.listeners depends on it).
                                    ("grpc.so_reuseport", 1)])


async def _drain_wakeups() -> bool:
    return drain_wakeups(asyncio.get_running_loop())


class _Health:
    """The health statuses, served alike by the server on the loop and by the plaintext health port's server."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self.threaded = health.HealthServicer()
        self.on_loop = health.aio.HealthServicer()

    def set(self, service: str, status) -> None:
        self.threaded.set(service, status)
        asyncio.run_coroutine_threadsafe(self.on_loop.set(service, status), self._loop).result(10)

    def enter_graceful_shutdown(self) -> None:
        self.threaded.enter_graceful_shutdown()
        asyncio.run_coroutine_threadsafe(self.on_loop.enter_graceful_shutdown(), self._loop).result(10)


def _bound(listen: str, add) -> int:
    """The port add() bound (a gRPC server's add_*_port for `listen`); OSError if it bound none."""
    try:
        port = add()
    except RuntimeError:
        port = 0
    if not port:
        raise OSError(f"cannot listen on {listen}: address in use or not valid")
    return port
