"""Many streams on one dispatcher (issue 26): agent links, watches and submit streams hold no thread, so
unary calls keep answering whatever they do; watches are limited per user and in all; agents redialling at
once are admitted at a bounded rate; a watch far behind, or resumed from an old event, misses nothing.

Real dispatcher, real gRPC over loopback, real Postgres. No figure here is a timed assertion: deadlines only
say when a call that would hang counts as failed.
"""
from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import text

from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store import clusters as cluster_store
from dispatcher.store import tokens
from dispatcher.store.database import DatabaseSettings
from sluice.client import Client
from sluice.config import ClientConfig
from sluice.objects import load_objects
from sluice.v1 import agents_pb2, agents_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from tests.integration.test_agent_link import OBJECTS, ScriptedAgent, wait_for
from tests.integration.test_cli import REPO, base_env, free_port, run_sluice
from tests.integration.test_dispatcher_metrics import samples, scrape
from tests.integration.test_spine import job_doc

CLUSTERS = [f"site-{n:02d}" for n in range(30)]


def _serve(db_url: str, **settings) -> Dispatcher:
    d = Dispatcher(ServerSettings(**{"listen": "127.0.0.1:0", "metrics_listen": None, "schedule": False,
                                     "database": DatabaseSettings(url=db_url), **settings})).start()
    clusters = "".join(f"---\napiVersion: sluice.io/v1\nkind: Cluster\nmetadata: {{name: {c}}}\nspec: {{tier: edge}}\n"
                       for c in CLUSTERS)
    with d.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(OBJECTS + clusters))
        d.admin = tokens.create(session, "admin", "admin")
        d.users = [tokens.create(session, "user", f"user-{n}") for n in range(3)]
        d.agent_tokens = {c: tokens.create(session, "agent", f"agent-{c}", c) for c in CLUSTERS}
    d.channel = grpc.insecure_channel(d.address)
    d.jobs = jobs_pb2_grpc.JobsStub(d.channel)
    return d


@pytest.fixture
def serve(db_url):
    started = []

    def start(**settings) -> Dispatcher:
        started.append(_serve(db_url, **settings))
        return started[-1]
    yield start
    for d in started:
        d.channel.close()
        d.stop(0)


def _bearer(token: str):
    return [("authorization", f"Bearer {token}")]


def _watch(d: Dispatcher, token: str, after: int = 0):
    return d.jobs.WatchBatches(jobs_pb2.WatchRequest(after_event_id=after), metadata=_bearer(token))


def _refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


def test_unary_calls_and_new_agents_are_served_while_hundreds_of_streams_are_open(serve):
    """Far more streams than the server has threads (64 unary workers, 32 for streams' database work):
    List, Submit, the health check and a new agent's hello are all answered, the watches see a new job's
    event, and every stream cancelled ends on the server too (a cancelled WatchBatches used to hang)."""
    d = serve(watch_streams_per_user=0)
    watches = [_watch(d, d.admin) for _ in range(300)]
    links = [ScriptedAgent(d.address, d.agent_tokens[c], c) for c in CLUSTERS]
    for link in links:
        link.next("welcome")
    wait_for(lambda: d.watch_streams.open() == 300)
    client = Client(ClientConfig(d.address, d.admin, timeout_s=10, insecure=True))
    try:
        [job_id] = client.submit([job_doc(name="while-watched")])
        assert [j["id"] for j in client.list()] == [job_id]
        health = health_pb2_grpc.HealthStub(d.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        for call in (watches[0], watches[150], watches[-1]):
            assert next(call).events[0].job_id == job_id
        for call in watches:
            call.cancel()
        wait_for(lambda: d.watch_streams.open() == 0)
        assert [j["id"] for j in client.list()] == [job_id]
    finally:
        client.close()
        for link in links:
            link.close()


def test_connections_spread_over_the_listeners_share_every_stream_and_call(serve):
    """ServerSettings.listeners: gRPC servers sharing one port, the kernel spreading connections over them. Twelve
    watches and twelve agents, each on a connection of its own (so they land on different listeners): every watch
    sees the job submitted on yet another connection, every agent is welcomed, a health check is answered on each
    connection, and the counts of open streams are the dispatcher's, not a listener's."""
    d = serve(listeners=4, watch_streams_per_user=0)
    channels = [grpc.insecure_channel(d.address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(12)]
    watches = [jobs_pb2_grpc.JobsStub(c).WatchBatches(jobs_pb2.WatchRequest(), metadata=_bearer(d.admin))
               for c in channels]
    links = [ScriptedAgent(d.address, d.agent_tokens[c], c, own_connection=True) for c in CLUSTERS[:12]]
    client = Client(ClientConfig(d.address, d.users[0], timeout_s=10, insecure=True))
    try:
        for link in links:
            link.next("welcome")
        wait_for(lambda: d.watch_streams.open() == 12)
        [job_id] = client.submit([job_doc(name="over-listeners")])
        for call in watches:
            assert next(call).events[0].job_id == job_id
        for channel in channels:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        for call in watches:
            call.cancel()
        wait_for(lambda: d.watch_streams.open() == 0)
    finally:
        client.close()
        for link in links:
            link.close()
        for channel in channels:
            channel.close()


def test_a_second_server_on_a_port_a_dispatcher_serves_is_refused_in_words(serve, db_url, tmp_path):
    """gRPC binds with SO_REUSEPORT (so the listeners share a port), which would let a second dispatcher bind a port
    that one serves and take part of its connections; it is refused instead, on the health port too."""
    d = serve(health_listen="127.0.0.1:0")
    for settings in ({"listen": d.address}, {"listen": "127.0.0.1:0", "health_listen": f"127.0.0.1:{d.health_port}"}):
        with pytest.raises(OSError, match="cannot listen on 127.0.0.1:[0-9]+: address in use"):
            Dispatcher(ServerSettings(metrics_listen=None, schedule=False, database=DatabaseSettings(url=db_url),
                                      **settings))
    url = db_url.replace("postgresql+psycopg://", "postgresql://")
    refused = run_sluice(base_env(tmp_path), "dispatcher", "serve", "--database-url", url, "--insecure",
                         "--listen", d.address, "--metrics-listen", "")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"cannot listen on {d.address}: address in use (another server listens there)" in refused.stderr
    assert health_pb2_grpc.HealthStub(d.channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status == (
        health_pb2.HealthCheckResponse.SERVING)


def test_dispatcher_serve_tells_agents_its_heartbeat_and_a_silent_cluster_goes_unreachable_when_told(
        serve, db_url, tmp_path):
    """`--heartbeat-s` reaches every agent in its welcome (a thousand clusters beat every 5 s: docs/admin-guide.md), and
    `--unreachable-after-s` is when a silent cluster takes no more jobs; fewer than two heartbeats is refused."""
    d = serve()
    url, env = db_url.replace("postgresql+psycopg://", "postgresql://"), base_env(tmp_path)
    flags = ["dispatcher", "serve", "--database-url", url, "--insecure", "--metrics-listen", ""]
    short = run_sluice(env, *flags, "--listen", "127.0.0.1:0", "--heartbeat-s", "5", "--unreachable-after-s", "9")
    assert short.returncode == 2 and "--unreachable-after-s 9 is less than two heartbeats (--heartbeat-s 5)" in (
        " ".join(short.stderr.split())), short.stderr
    port = free_port()
    served = subprocess.Popen([sys.executable, "-m", "sluice", *flags, "--listen", f"127.0.0.1:{port}", "--no-schedule",
                               "--heartbeat-s", "2", "--unreachable-after-s", "4"],
                              env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    agent = None
    try:
        assert served.stderr.readline().startswith(f"serving on 127.0.0.1:{port}")
        agent = ScriptedAgent(f"127.0.0.1:{port}", d.agent_tokens["site-00"], "site-00")
        assert agent.next("welcome").heartbeat_seconds == 2
        client = Client(ClientConfig(f"127.0.0.1:{port}", d.admin, timeout_s=10, insecure=True))

        def state() -> str:
            return next(c["state"] for c in client.clusters() if c["name"] == "site-00")
        assert state() == "active"  # the hello was heard; then nothing for 4 s
        wait_for(lambda: state() == "unreachable", timeout=15)
        client.close()
    finally:
        if agent is not None:
            agent.close()
        served.send_signal(signal.SIGINT)
        assert served.wait(15) == 0


def _streams(d: Dispatcher) -> tuple[dict, dict]:
    """/metrics: sluice_streams_open by kind, sluice_streams_refused_total by (kind, limit)."""
    shown = scrape(d.metrics_port)
    return ({k[0][1]: v for k, v in samples(shown, "sluice_streams_open").items()},
            {(dict(k)["kind"], dict(k)["limit"]): v for k, v in samples(shown, "sluice_streams_refused_total").items()})


def test_watches_past_a_users_limit_or_the_total_are_refused_in_words_until_one_closes(serve, tmp_path):
    d = serve(watch_streams_per_user=3, watch_streams=5, metrics_listen="127.0.0.1:0")
    first = [_watch(d, d.users[0]) for _ in range(3)]
    wait_for(lambda: d.watch_streams.open() == 3)
    err = _refused(lambda: next(_watch(d, d.users[0])))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.details() == "watch streams: user-0 has 3 open, the most one user may have; close one first"
    # `sluice watch` says it in one line, as any refused call
    env = {**base_env(tmp_path), "SLUICE_ADDRESS": d.address, "SLUICE_TOKEN": d.users[0], "SLUICE_INSECURE": "1"}
    shown = run_sluice(env, "watch")
    assert shown.returncode == 1 and shown.stderr == (
        "error: watch: watch streams: user-0 has 3 open, the most one user may have; close one first\n"), shown.stderr
    second = [_watch(d, d.users[1]) for _ in range(2)]
    wait_for(lambda: d.watch_streams.open() == 5)
    err = _refused(lambda: next(_watch(d, d.users[2])))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.details() == "watch streams: all 5 this dispatcher allows are open; try again later"
    opened, refused = _streams(d)
    assert opened == {"watch": 5, "submit": 0, "agent": 0}
    assert refused == {("watch", "total"): 1, ("watch", "per_user"): 2, ("submit", "total"): 0,
                       ("submit", "per_user"): 0, ("agent", "rate"): 0}  # per_user: the call above and the CLI's
    first[0].cancel()
    wait_for(lambda: d.watch_streams.open() == 4)
    again = _watch(d, d.users[2])
    wait_for(lambda: d.watch_streams.open() == 5)
    for call in [*first, *second, again]:
        call.cancel()
    wait_for(lambda: d.watch_streams.open() == 0)


def test_agents_dialling_at_once_are_admitted_at_the_bounded_rate_and_the_rest_told_to_come_back(serve):
    rate, wait_s = 3, 1.0  # a burst of 3, then 3 a second, each waiting up to 1 s for its turn
    d = serve(agent_admissions_per_s=rate, agent_admission_wait_s=wait_s, metrics_listen="127.0.0.1:0")
    began = time.monotonic()
    links = {c: ScriptedAgent(d.address, d.agent_tokens[c], c) for c in CLUSTERS}
    welcomed, refused = [], []
    for cluster, link in links.items():
        try:
            link.next("welcome", timeout=15)
            welcomed.append(cluster)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            assert f"agent links: the dispatcher admits {rate} a second and is" in exc.details(), exc.details()
            refused.append(cluster)
    # The hellos arrived within `span` (the dials take time, longer on a loaded machine): the burst, then one per
    # 1/rate over the span and the wait at most. About 9 of 30 when the dials take a second; none is refused
    # only if they take 8 s.
    span = time.monotonic() - began
    assert rate <= len(welcomed) <= rate + rate * (span + wait_s) and refused, (welcomed, refused, span)
    opened, refused_shown = _streams(d)
    assert opened["agent"] == len(welcomed) and refused_shown[("agent", "rate")] == len(refused)
    for cluster in refused:  # back one after another: each waits at most 1/rate for its turn, and is admitted
        links[cluster].close()
        links[cluster] = ScriptedAgent(d.address, d.agent_tokens[cluster], cluster)
        links[cluster].next("welcome", timeout=15)
    assert _streams(d)[0]["agent"] == len(CLUSTERS)
    for link in links.values():
        link.close()
    wait_for(lambda: _streams(d)[0]["agent"] == 0)


def _held_agent(d: Dispatcher, cluster: str) -> tuple[queue.Queue, grpc.Channel, object]:
    """An agent link that has called and sends its hello only when the test puts it on the queue."""
    channel = grpc.insecure_channel(d.address, options=[("grpc.use_local_subchannel_pool", 1)])
    outgoing: queue.Queue = queue.Queue()
    call = agents_pb2_grpc.AgentsStub(channel).Connect(iter(outgoing.get, None),
                                                       metadata=_bearer(d.agent_tokens[cluster]))
    return outgoing, channel, call


def _first_events(call, into: queue.Queue) -> threading.Thread:
    """Read a watch on a thread: (seconds since the start, event ids) for its first message with events."""
    began = time.monotonic()

    def read():
        for message in call:
            if message.events:
                into.put((time.monotonic() - began, [e.id for e in message.events]))
                return
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def _metric(d: Dispatcher, name: str) -> float:
    return samples(scrape(d.metrics_port), name)[()]


def test_a_watch_opened_while_an_agent_connects_waits_for_its_welcome_and_a_quiet_second_or_its_bound(serve):
    """After a restart every agent and every watch redial at once; the agents go first (api.admission.AgentsFirst).
    A watch opened while an agent has called but not yet said hello reads nothing until that agent is welcomed and
    no other has called for a second; with a bound of 2 s and an agent that never says hello, the watch reads after
    2 s. A watch opened with no agent connecting reads at once."""
    d = serve(watches_wait_for_agents_s=60, metrics_listen="127.0.0.1:0")
    client = Client(ClientConfig(d.address, d.admin, timeout_s=30, insecure=True))
    try:
        client.submit([job_doc(name="seen")])
        at_once: queue.Queue = queue.Queue()
        _first_events(_watch(d, d.admin), at_once)
        assert at_once.get(timeout=10)[0] < 5
        hello, channel, link = _held_agent(d, "site-00")
        wait_for(lambda: _metric(d, "sluice_agent_links_connecting") == 1)
        held: queue.Queue = queue.Queue()
        watch = _watch(d, d.admin)
        _first_events(watch, held)
        wait_for(lambda: _metric(d, "sluice_watches_waited_for_agents_total") == 1)
        with pytest.raises(queue.Empty):
            held.get(timeout=2)  # nothing while the agent connects
        hello.put(agents_pb2.AgentMessage(hello=agents_pb2.Hello(
            cluster="site-00", capacity=ScriptedAgent.capacity({"cpu": 8000}))))
        welcomed_at = time.monotonic()
        assert next(link).WhichOneof("kind") == "welcome"
        at, ids = held.get(timeout=15)
        assert ids and time.monotonic() - welcomed_at >= 0.9  # a quiet second after the welcome
        assert _metric(d, "sluice_agent_links_connecting") == 0
        watch.cancel()
        hello.put(None)
        channel.close()
    finally:
        client.close()
    bounded = serve(watches_wait_for_agents_s=2, metrics_listen="127.0.0.1:0")
    bounded_client = Client(ClientConfig(bounded.address, bounded.admin, timeout_s=30, insecure=True))
    try:
        bounded_client.submit([job_doc(name="seen")])
        hello, channel, link = _held_agent(bounded, "site-01")
        wait_for(lambda: _metric(bounded, "sluice_agent_links_connecting") == 1)
        held = queue.Queue()
        watch = _watch(bounded, bounded.admin)
        _first_events(watch, held)
        at, ids = held.get(timeout=15)
        assert ids and 1.9 <= at < 10 and _metric(bounded, "sluice_agent_links_connecting") == 1
        watch.cancel()
        hello.put(None)
        channel.close()
    finally:
        bounded_client.close()


def test_agents_saying_hello_together_are_each_welcomed_and_one_of_an_unknown_cluster_alone_refused(serve):
    """Thirty agents dial at once, one more naming a cluster the dispatcher does not have (an admin's token may
    name any), and two with a revoked token and a made-up one: their tokens are looked up together and their
    hellos reconciled together; each agent is welcomed with its own cluster's watermark, the stranger alone is
    told NOT_FOUND and the impostors alone UNAUTHENTICATED."""
    d = serve()
    with d.sessions.begin() as session:  # site-07 acked command 5 before: its agent resumes after it
        session.execute(text("INSERT INTO outbox (id, cluster, kind, job_id, attempt, payload, acked_at) "
                             "VALUES (5, 'site-07', 'cancel', 1, 1, '{}', now())"))
    with d.sessions.begin() as session:
        revoked = tokens.create(session, "agent", "agent-site-09-before", "site-09")
        tokens.revoke(session, session.execute(text("SELECT max(id) FROM api_tokens")).scalar())
    links = {c: ScriptedAgent(d.address, d.agent_tokens[c], c, own_connection=True) for c in CLUSTERS}
    stranger = ScriptedAgent(d.address, d.admin, "nowhere")
    impostors = [ScriptedAgent(d.address, token, "site-09", own_connection=True)
                 for token in (revoked, "sl_not-a-token-at-all")]
    with pytest.raises(grpc.RpcError) as refused:
        stranger.next("welcome", timeout=30)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert "cluster 'nowhere' not found" in refused.value.details()
    for impostor in impostors:  # their tokens looked up with the others' (api/auth.py), refused alone
        with pytest.raises(grpc.RpcError) as refused:
            impostor.next("welcome", timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.details() == "invalid, expired or revoked token"
    for cluster, link in links.items():
        assert link.next("welcome", timeout=30).cluster == cluster
    with d.sessions() as session:
        seen = dict(session.execute(text("SELECT name, applied_through FROM clusters WHERE capacity IS NOT NULL"))
                    .all())
    assert sorted(seen) == CLUSTERS and seen["site-07"] == 5 and seen["site-08"] == 0
    for link in [*links.values(), stranger, *impostors]:
        link.close()


def test_hellos_reconciled_in_one_batch_take_two_of_one_cluster_in_turn_and_fail_a_bad_one_alone(serve):
    """The batch itself (AgentsService._reconcile), as the coalescer hands it over: a cluster the dispatcher does
    not have and a capacity Postgres cannot store fail their own hello only; two hellos of one cluster are taken
    one after the other (the second no longer its cluster's first report)."""
    from dispatcher.api.agents import AgentsService
    from dispatcher.api.auth import Authenticator
    from dispatcher.errors import InvalidRequest, NotFound
    d = serve()
    service = AgentsService(d.sessions, Authenticator(d.sessions), d.notifier, heartbeat_s=1)

    def hello(cluster: str, cpu: str = "cpu") -> agents_pb2.Hello:
        return agents_pb2.Hello(cluster=cluster, capacity=ScriptedAgent.capacity({cpu: 8000}))
    results = service._reconcile([hello("site-00"), hello("nowhere"), hello("site-01", "c\x00pu"), hello("site-00"),
                                  hello("site-02")])
    assert [r[2] if isinstance(r, tuple) else type(r) for r in results] == [
        True, NotFound, InvalidRequest, False, True]  # site-00's first report, then its second
    assert "NUL character" in str(results[2])
    with d.sessions() as session:
        assert session.execute(text("SELECT name FROM clusters WHERE capacity IS NOT NULL ORDER BY name")
                               ).scalars().all() == ["site-00", "site-02"]


def test_a_watch_that_fell_far_behind_or_resumed_from_an_old_event_gets_every_event_once_in_order(serve):
    """The watch is not read while 25,000 events are written (far more than the feed keeps, and than gRPC's
    flow control lets the server send ahead), then read: every event comes, once, in id order. A watch opened
    after them, from event 0, gets the same."""
    d = serve(watch_feed_rows=1000)
    behind = _watch(d, d.admin)
    wait_for(lambda: d.watch_streams.open() == 1)
    client = Client(ClientConfig(d.address, d.admin, timeout_s=60, insecure=True))
    try:
        ids = []
        for batch in range(5):
            ids += client.submit([job_doc(name=f"j{batch}-{n}") for n in range(5000)])
        resumed = _watch(d, d.admin, after=0)
        for call in (behind, resumed):
            seen: list[int] = []
            for message in call:
                seen += [e.job_id for e in message.events]
                if len(seen) >= len(ids):
                    break
            assert seen == ids  # one QUEUED event a job, in id order, none twice
            call.cancel()
        late = client.submit([job_doc(name="late")])
        fresh = _watch(d, d.admin, after=0)
        tail: queue.Queue = queue.Queue()
        for message in fresh:
            for e in message.events:
                tail.put(e.job_id)
            if e.job_id == late[0]:
                break
        fresh.cancel()
        assert tail.qsize() == len(ids) + 1
    finally:
        client.close()


def test_watches_resuming_together_on_a_restarted_dispatcher_each_get_every_later_event_once_in_order(serve):
    """Some forty watches resume at once on another dispatcher (as every `sluice watch` does after a restart),
    from event ids spread over 6,000 stored events, while more are written: each gets every event after its
    own id, once, in id order. They read the stored events together (api.event_feed: blocks read once for
    all, partly kept), and the new events from the feed."""
    first = serve()
    client = Client(ClientConfig(first.address, first.admin, timeout_s=60, insecure=True))
    try:
        for batch in range(6):
            client.submit([job_doc(name=f"old{batch}-{n}") for n in range(1000)])
        restarted = serve(watch_feed_rows=1500)
        afters = [0, 1, 999, 1000, 1001, 2500, 5999, 6000, *range(7, 6000, 187)]
        watches = [_watch(restarted, restarted.admin, after=after) for after in afters]
        for batch in range(5):  # while the watches catch up
            client.submit([job_doc(name=f"new{batch}-{n}") for n in range(300)])
        with restarted.sessions() as session:
            stored = [tuple(r) for r in session.execute(text("SELECT id, job_id FROM job_events ORDER BY id"))]
        assert len(stored) == 7500
        for after, call in zip(afters, watches, strict=True):
            seen: list[tuple[int, int]] = []
            for message in call:
                seen += [(e.id, e.job_id) for e in message.events]
                if seen[-1][0] >= stored[-1][0]:
                    break
            assert seen == [event for event in stored if event[0] > after], after
            call.cancel()
    finally:
        client.close()


def test_watches_resuming_together_read_each_block_of_stored_events_once_for_all(serve):
    """Forty watches resume in four waves on a restarted dispatcher, from event ids spread over 1,500 stored
    events: a whole block of them and a shorter last one, as after every restart. Each gets every later event
    once, in order, and the store is read for each block once for all of them, not once a watch or a wave
    (sluice_watch_event_reads_total). Each watch reading and converting the last block alone kept a restarted
    dispatcher's loop busy while its agents dialled in."""
    first = serve()
    client = Client(ClientConfig(first.address, first.admin, timeout_s=60, insecure=True))
    try:
        client.submit([job_doc(name=f"old-{n}") for n in range(1500)])
        with first.sessions() as session:
            stored = [tuple(r) for r in session.execute(text("SELECT id, job_id FROM job_events ORDER BY id"))]
        last = stored[-1][0]
        restarted = serve(metrics_listen="127.0.0.1:0")
        afters = list(range(1, last - 1, (last - 1) // 40))[:40]
        for wave in range(4):
            watches = {after: _watch(restarted, restarted.admin, after=after) for after in afters[wave::4]}
            for after, call in watches.items():
                seen: list[tuple[int, int]] = []
                for message in call:
                    seen += [(e.id, e.job_id) for e in message.events]
                    if seen[-1][0] >= last:
                        break
                assert seen == [e for e in stored if e[0] > after], after
                call.cancel()
        reads = {dict(k)["read"]: v for k, v in samples(scrape(restarted.metrics_port),
                                                        "sluice_watch_event_reads_total").items()}
        blocks = len(range(afters[0] - afters[0] % 1000, last, 1000))  # api.event_feed.READ rows a block
        assert (reads["shared"], reads["alone"]) == (blocks, 0), reads
    finally:
        client.close()


def test_an_event_committed_late_below_where_a_new_feed_began_still_reaches_its_watch(serve):
    """An event id taken by a transaction still open when a dispatcher's first watch starts its feed, below the
    newest event then, comes when that transaction commits: the feed waits for the ids missing below where it
    began as for any skipped over later."""
    d = serve()
    client = Client(ClientConfig(d.address, d.admin, timeout_s=60, insecure=True))
    try:
        [first] = client.submit([job_doc(name="first")])
        insert = text("INSERT INTO job_events (job_id, attempt, to_state, reason) VALUES (:job, 0, 'QUEUED', :why) "
                      "RETURNING id")
        with d.sessions() as session:
            after = session.scalar(text("SELECT max(id) FROM job_events"))
        with d.sessions.begin() as slow:  # takes its event id now, commits after the watch began
            late = slow.scalar(insert, {"job": first, "why": "late"})
            with d.sessions.begin() as quick:
                early = quick.scalar(insert, {"job": first, "why": "early"})
            watch = d.jobs.WatchBatches(jobs_pb2.WatchRequest(after_event_id=after), metadata=_bearer(d.admin),
                                        timeout=30)  # ends the test rather than hang if the late event never comes
            assert [e.id for e in next(watch).events] == [early]
        assert [(e.id, e.reason) for e in next(watch).events] == [(late, "late")]
        watch.cancel()
    finally:
        client.close()
