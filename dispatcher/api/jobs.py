"""The Jobs service: submit, read, cancel and watch jobs; read views of clusters and queues; usage."""
from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from functools import reduce

import grpc

from dispatcher.api import convert
from dispatcher.api.admission import AgentsFirst, StreamLimits
from dispatcher.api.asynchronous import Coalescer, blocking
from dispatcher.api.auth import RECHECK_S, Authenticator
from dispatcher.api.errors import check_request, outcome_of, translated
from dispatcher.api.event_feed import EventFeed
from dispatcher.api.logs import LogRelay
from dispatcher.capacity import snapshot
from dispatcher.errors import InvalidRequest, NotFound, ResourceExhausted
from dispatcher.metrics import DispatcherMetrics
from dispatcher.policy import accounting, states
from dispatcher.policy.quotas import rolled_up
from dispatcher.scheduler.explaining import explain, fair_shares
from dispatcher.scheduler.stored_policy import queue_quotas
from dispatcher.services import budgets, group_commit, scoping, sessions
from dispatcher.services import reporting as reports
from dispatcher.services.submitting import Whole
from dispatcher.store import clusters as cluster_store
from dispatcher.store import database, holds, job_reads, lifecycle
from dispatcher.store import usage as usage_totals
from dispatcher.store.database import Sessions
from dispatcher.store.listening import Notifier
from sluice.objects import object_from_document
from sluice.quantity import add
from sluice.v1 import jobs_pb2, jobs_pb2_grpc
from sluice.wire import STREAM_MARK

READERS = ("admin", "user")
SERVICE = jobs_pb2.DESCRIPTOR.services_by_name["Jobs"].full_name
MAX_LIST = 1000
MAX_FILTER_CHARS = 253  # a List filter's text: no queue, user, cluster or job name is longer
MAX_SINCE_S = 100 * 365 * 86400.0  # the longest usage window a call may ask for (0 asks for all time)
# A submit stream's request of at most this many bytes of documents is parsed on the event loop, sparing it a
# hop to a thread; a larger one on a thread, where its parse holds no other stream up.
PARSE_ON_LOOP_BYTES = 16 << 10


class JobsService(jobs_pb2_grpc.JobsServicer):
    def __init__(self, sessions: Sessions, auth: Authenticator, notifier: Notifier, *, unreachable_after_s: float,
                 submit_streams: int = 16, watches: StreamLimits | None = None, feed_rows: int = 20_000,
                 metrics: DispatcherMetrics | None = None, logs: LogRelay | None = None,
                 agents_first: AgentsFirst | None = None):
        self._sessions = sessions
        self._metrics = metrics
        self._agents_first = agents_first or AgentsFirst(max_wait_s=0)
        self._logs = logs or LogRelay()
        self._one_statement = database.autocommit(sessions)
        self._auth = auth
        self._unreachable_after_s = unreachable_after_s
        self._submitter = group_commit.Submitter(sessions)
        self._submits = Coalescer(self._submitter.submit_wholes, name="submit-streams")
        self.submit_streams = StreamLimits("submit streams", per_user=0, total=submit_streams, advice="use Submit") \
            if submit_streams > 0 else None
        self.watches = watches or StreamLimits("watch streams", per_user=0, total=0)
        self._feed = EventFeed(sessions, notifier, keep=feed_rows)
        auth.on_revocation(self._feed.wake_soon)  # every watch checks its token
        self.feed_reads = self._feed.reads  # for /metrics

    @translated
    def Submit(self, request, context):
        try:
            who = self._auth.require(context, *READERS)
            if request.more:
                raise InvalidRequest("more: a Submit call is a whole submit; send its parts on SubmitStream")
            whole = self._submitter.whole(request.idempotency_key)
            whole.add(list(request.specs_json), more=False)
            done = self._submitter.submit_whole(who, whole)
        except Exception as exc:
            self._count_submit(exc=exc)
            raise
        self._count_submit(done)
        return jobs_pb2.SubmitResponse(ids=done.ids, replayed=done.replayed)  # only after the commit wrote them

    def _count_submit(self, done=None, exc: Exception | None = None) -> None:
        """A submit answered (done) or refused (exc), in sluice_submit_requests and sluice_submitted_jobs."""
        outcome = outcome_of(exc) if exc is not None else "accepted"
        if self._metrics is not None and outcome is not None:
            self._metrics.observe_submit(outcome, 0 if done is None or done.replayed else len(done.ids))

    @translated
    async def SubmitStream(self, request_iterator, context):
        """Submit, one request after another on one stream. Each request is authenticated as a Submit call
        is (a revoked token is refused within the same few seconds) and answered as Submit answers it; a
        refused one ends the stream with its error. A submit may come in several requests (`more`): each but
        the last is answered, with no ids, once parsed, and the last commits them all. A message costs the
        server less than a call. At most `submit_streams` are open at once; one more is refused at once,
        before its headers and before reading anything, so that its client sends the request by Submit.

        A small request is parsed on the loop, and the small submits of every stream ready at once are
        written by one thread in one group (`_submits`): a message crosses to a thread once a group, not
        once each."""
        try:
            async for response in self._submit_stream(request_iterator, context):
                yield response
        except Exception as exc:
            self._count_submit(exc=exc)
            raise

    async def _submit_stream(self, request_iterator, context):
        if self.submit_streams is None:
            raise ResourceExhausted("submit streams: this dispatcher allows none; use Submit")
        with self.submit_streams.admitted(""):
            await self._auth.require_on_loop(context, *READERS)
            await context.send_initial_metadata((STREAM_MARK,))  # taken: the client may send
            whole = None  # the submit under way
            async for request in request_iterator:
                check_request(request)
                who = await self._auth.require_on_loop(context, *READERS)
                if whole is None:
                    whole = Whole(request.idempotency_key)
                elif request.idempotency_key != whole.key:
                    raise InvalidRequest("idempotency_key: every request of a submit carries the same key")
                if sum(map(len, request.specs_json)) <= PARSE_ON_LOOP_BYTES:
                    whole.add(list(request.specs_json), more=request.more)
                else:
                    await blocking(self._add_part, whole, request)
                if request.more:
                    yield jobs_pb2.SubmitResponse()
                    continue
                if whole.count < group_commit.HAND_ON_EARLY_FROM:
                    done = await self._submits((who, whole))
                else:  # on a thread of its own, whose insert the next group's validating overlaps (group_commit)
                    done = await blocking(self._submitter.submit_whole, who, whole)
                whole = None
                self._count_submit(done)
                yield jobs_pb2.SubmitResponse(ids=done.ids, replayed=done.replayed)

    def _add_part(self, whole: Whole, request) -> None:
        """A large request's documents parsed on a thread, one parse at a time as Submit's are."""
        with self._submitter.parsing:
            whole.add(list(request.specs_json), more=request.more)

    @translated
    async def Logs(self, request, context):
        """The pod logs of a job's attempt, read by the agent of the cluster that ran it (api/logs.py)."""
        who = await self._auth.require_on_loop(context, *READERS)
        if request.tail_lines < 0 or request.attempt < 0:
            raise InvalidRequest("tail_lines and attempt: must not be negative")
        cluster, attempt = await blocking(self._attempt_of, who, request.id, request.attempt)
        async for lines in self._logs.read(cluster, request.id, attempt, pod=request.pod, pod_set=request.pod_set,
                                           tail_lines=request.tail_lines, follow=request.follow):
            yield jobs_pb2.LogLines(lines=lines, attempt=attempt, cluster=cluster)

    def _attempt_of(self, who, job_id: int, attempt: int) -> tuple[str, int]:
        """(cluster, attempt) whose logs a Logs call reads: the job's latest attempt unless it names one."""
        with self._sessions() as session:
            job = scoping.visible_job(session, who, job_id)
            if job.attempt == 0:
                raise NotFound(f"job {job_id} has not been dispatched yet: it has no logs")
            attempt = attempt or job.attempt
            cluster = job_reads.attempt_cluster(session, job_id, attempt)
            if cluster is None:
                raise NotFound(f"job {job_id} has no attempt {attempt} (its attempts: 1 to {job.attempt})")
            return cluster, attempt

    @translated
    def Get(self, request, context):
        who = self._auth.require(context, *READERS)
        with self._sessions() as session:
            return _job_with_reason(session, scoping.visible_job(session, who, request.id))[0]

    @translated
    def Describe(self, request, context):
        who = self._auth.require(context, *READERS)
        with self._sessions() as session:
            message, position = _job_with_reason(session, scoping.visible_job(session, who, request.id))
            return jobs_pb2.DescribeJobResponse(
                job=message, events=[convert.event(e) for e in job_reads.events(session, job_id=request.id)],
                queue_position=position, attempts=[convert.attempt(a) for a in job_reads.attempts(session, request.id)],
                depends_on=[convert.dependency(*d) for d in holds.dependencies(session, request.id)],
                dependants=[convert.dependency(*d) for d in holds.dependants(session, request.id)])

    @translated
    def Attach(self, request, context):
        who = self._auth.require(context, *READERS)
        with self._sessions.begin() as session:
            found = sessions.attach(session, who, request.id, datetime.now(UTC))
            return jobs_pb2.AttachResponse(job=convert.job(found.job, with_spec=False), address=found.address,
                                           idle_timeout_seconds=found.idle_timeout_s)

    @translated
    def Explain(self, request, context):
        who = self._auth.require(context, *READERS)
        with self._sessions() as session:
            scoping.visible_job(session, who, request.id)
            found = explain(session, request.id, datetime.now(UTC),
                            unreachable_after_s=self._unreachable_after_s)
            return jobs_pb2.ExplainResponse(
                job=convert.job(found.job, with_spec=False), queue_position=found.queue_position, quota=found.quota,
                clusters=[jobs_pb2.ClusterVerdict(cluster=name, verdict=v) for name, v in found.clusters],
                bursts=[convert.burst_decision(attempt, b) for attempt, b in found.bursts])

    @translated
    def List(self, request, context):
        who = self._auth.require(context, *READERS)
        if request.state and request.state not in states.STATES:
            raise InvalidRequest(f"state: {request.state!r} is not one of {', '.join(states.STATES)}")
        if request.limit < 0:
            raise InvalidRequest("limit: must not be negative")
        for field in ("queue", "user", "cluster", "name"):
            if len(getattr(request, field)) > MAX_FILTER_CHARS:
                raise InvalidRequest(f"{field}: at most {MAX_FILTER_CHARS} characters")
        limit = min(request.limit or 100, MAX_LIST)
        try:
            after = int(request.page_token or 0)
        except ValueError:
            after = -1
        if not 0 <= after < 1 << 63:  # a job id, as a previous List wrote it
            raise InvalidRequest("page_token: not a token from a previous List")
        with self._sessions() as session:
            readable = scoping.readable_queues(session, who)
            rows = job_reads.list_jobs(session, queue=request.queue or None, state=request.state or None,
                                       user=request.user or None, cluster=request.cluster or None,
                                       name=request.name or None, array_id=request.array_id or None,
                                       after_id=after, limit=limit + 1,
                                       visible_to=None if readable is None else (who.subject, readable))
            more = len(rows) > limit
            rows = rows[:limit]
            return jobs_pb2.ListJobsResponse(jobs=[convert.job(r, with_spec=False) for r in rows],
                                             next_page_token=str(rows[-1].id) if more else "")

    @translated
    def Cancel(self, request, context):
        who = self._auth.require(context, *READERS)
        if not request.ids and not request.array_ids:
            raise InvalidRequest("cancel: no job ids given")
        with self._sessions.begin() as session:
            ids = list(request.ids) + job_reads.array_elements(session, list(request.array_ids))
            jobs = reports.cancel(session, ids, who)
            return jobs_pb2.CancelResponse(jobs=[convert.job(j, with_spec=False) for j in jobs])

    def add_to(self, server) -> None:
        """This service on a gRPC server, its WatchBatches sending as they are the runs that the event feed
        serialized once for every watch (Chunk.wire), and serializing a watch's own selection as usual."""
        handlers: dict = {}

        class Registered:  # what the generated code registers, taken before it reaches the server
            def add_generic_rpc_handlers(self, _generic):
                pass

            def add_registered_method_handlers(self, _service, methods):
                handlers.update(methods)

        jobs_pb2_grpc.add_JobsServicer_to_server(self, Registered())
        handlers["WatchBatches"] = handlers["WatchBatches"]._replace(response_serializer=_serialized)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_registered_method_handlers(SERVICE, handlers)

    @translated
    async def Watch(self, request, context):
        async for batches in self._watched(request, context):
            for batch in batches:
                for event in batch.events:
                    yield event

    @translated
    async def WatchBatches(self, request, context):
        async for batches in self._watched(request, context, wire=True):
            for batch in batches:
                yield batch

    async def _watched(self, request, context, *, wire: bool = False):
        """The events after request.after_event_id (of request.job_id, or every job the caller may see), as
        JobEvents messages (in runs of up to streams.RUN_BYTES), each time the feed (api.event_feed) brings
        some, for as long as the stream is open. Watch sends them one message an event; WatchBatches one a run.
        wire: a run of every row of a feed's chunk comes as the bytes serialized once for every watch.
        At most `watch_streams` are open at once, and `watch_streams_per_user` for one subject."""
        who = await self._auth.require_on_loop(context, *READERS)
        if request.job_id:
            await blocking(self._visible, who, request.job_id)
        with self.watches.admitted(who.subject):
            await self._agents_first.wait()
            place = await self._feed.join(request.after_event_id)
            try:
                async for batches in self._following(request, context, who, place, wire):
                    yield batches
            finally:
                self._feed.leave()

    async def _following(self, request, context, who, place, wire: bool):
        job_id, floor = request.job_id, request.after_event_id  # the client has every event up to floor
        # A user watching every job gets the events of the jobs they may see (services.scoping); the queues
        # they belong to are read again at most every RECHECK_S while events come (a member added sees soon).
        scoped = who.role != "admin" and not job_id
        readable, readable_at = None, -math.inf
        check_at, revocations = time.monotonic() + self._auth.check_within(who), self._auth.revocations
        seq, behind = place.seq, place
        sent_through = floor  # the highest event id sent
        skip: set[int] = set()  # read from the store while catching up, and still to come through the feed

        async def seen(rows: list) -> list:
            """The rows (each with its owner) this watch may see."""
            nonlocal readable, readable_at
            if not scoped or not rows:
                return rows
            if time.monotonic() - readable_at > RECHECK_S:
                readable, readable_at = await blocking(self._readable, who), time.monotonic()
            return [r for r in rows if scoping.sees(who, readable, r.queue, r.submitted_by)]

        while True:
            if behind is not None:  # read from the store what the feed no longer (or never) had for this watch
                cursor, head, gaps = sent_through, behind.head, behind.gaps
                behind = None
                while cursor < head and (chunk := await self._feed.stored(cursor, head, job_id)) is not None:
                    cursor = sent_through = max(sent_through, chunk.highest_id)
                    if gaps:
                        skip.update(gaps.intersection(chunk.ids))
                    if not scoped:
                        yield chunk.wire() if wire else chunk.batches()
                    elif rows := await seen([row for row, _ in chunk.rows]):
                        allowed = {id(row) for row in rows}
                        yield chunk.of([i for i, (row, _) in enumerate(chunk.rows) if id(row) in allowed], wire=wire)
            chunks, seq, lost = self._feed.since(seq)
            if lost:
                behind = self._feed.place()
                seq = behind.seq
                continue
            batches = []
            for chunk in chunks:
                sent_through = max(sent_through, chunk.highest_id)
                if not (job_id or scoped or skip) and chunk.lowest_id > floor:
                    batches += chunk.wire() if wire else chunk.batches()  # every row, as every such watch sends
                    continue
                keep = []  # the indices of the rows this watch sends
                for i, (row, _) in enumerate(chunk.rows):
                    if row.id in skip:
                        skip.discard(row.id)
                    elif row.id > floor and (not job_id or row.job_id == job_id):
                        keep.append(i)
                if scoped and keep:
                    allowed = {id(r) for r in await seen([chunk.rows[i][0] for i in keep])}
                    keep = [i for i in keep if id(chunk.rows[i][0]) in allowed]
                if keep:
                    batches += chunk.of(keep, wire=wire)
            if batches:
                yield batches
            elif self._auth.revocations == revocations:  # else a revocation came while this watch read the store
                await self._feed.wait(max(0.0, check_at - time.monotonic()))
            if self._auth.revocations != revocations or time.monotonic() >= check_at:
                # A token revoked (the feed wakes every watch) or expired since ends the stream: `translated` says so.
                revocations = self._auth.revocations
                who = await self._auth.require_on_loop(context, *READERS)
                check_at = time.monotonic() + self._auth.check_within(who)

    def _visible(self, who, job_id: int) -> None:
        with self._one_statement() as session:
            scoping.visible_job(session, who, job_id)

    def _readable(self, who):
        with self._one_statement() as session:
            return scoping.readable_queues(session, who)

    @translated
    def ListClusters(self, request, context):
        self._auth.require(context, *READERS)
        now = datetime.now(UTC)
        with self._sessions() as session:
            running = cluster_store.running_per_cluster(session)
            prices = {c.name: object_from_document(c.spec).price for c in cluster_store.list_clusters(session)}
            views = []
            for cap in snapshot.read(session, now, unreachable_after_s=self._unreachable_after_s):
                s = cap.state
                views.append(jobs_pb2.ClusterView(
                    name=s.name, tier=s.tier, site=s.site, labels=s.labels, state=cap.status,
                    capacity_source=cap.source, capacity_age_seconds=cap.age_seconds,
                    allocatable=convert.resources(cap.allocatable), free=convert.resources(s.free),
                    largest_free_node=convert.resources(s.largest_free_node), running_jobs=running.get(s.name, 0),
                    connected=cap.status != "unreachable", price=prices.get(s.name, {})))
        return jobs_pb2.ListClustersResponse(clusters=views)

    @translated
    def ListQueues(self, request, context):
        self._auth.require(context, *READERS)
        with self._sessions() as session:
            usage = cluster_store.queue_usage(session)
            quotas = queue_quotas(session)
            shares = fair_shares(session, datetime.now(UTC), quotas, unreachable_after_s=self._unreachable_after_s)
        siblings: dict[str | None, list[str]] = {}
        for q in sorted(quotas, key=lambda q: (shares[q.name], q.name)):
            siblings.setdefault(q.parent, []).append(q.name)
        rank = {name: n for names in siblings.values() for n, name in enumerate(names, 1)}
        # A parent queue shows its whole subtree: its descendants' jobs count against it, as the scheduler counts them.
        used = rolled_up(quotas, {(queue, ""): reduce(add, requests, {}) for queue, (_, _, requests) in usage.items()})
        jobs = rolled_up(quotas, {(queue, ""): {"queued": queued, "running": active}
                                  for queue, (queued, active, _) in usage.items()})
        views = [jobs_pb2.QueueView(
            name=q.name, parent=q.parent or "", guaranteed=convert.resources(q.guaranteed),
            max=convert.resources(q.max), used=convert.resources(used.get((q.name, ""), {})),
            queued_jobs=jobs.get((q.name, ""), {}).get("queued", 0),
            running_jobs=jobs.get((q.name, ""), {}).get("running", 0), fair_share=shares[q.name],
            fair_share_rank=rank[q.name]) for q in quotas]
        return jobs_pb2.ListQueuesResponse(queues=views)

    @translated
    def Usage(self, request, context):
        who = self._auth.require(context, *READERS)
        by = request.by or "queue"
        if by not in accounting.GROUPINGS:
            raise InvalidRequest(f"by: {by!r} is not one of {', '.join(accounting.GROUPINGS)}")
        if not math.isfinite(request.since_seconds) or not 0 <= request.since_seconds <= MAX_SINCE_S:
            raise InvalidRequest(f"since_seconds: must be a number of seconds from 0 (all time) to {MAX_SINCE_S:.0f}"
                                 " (100 years)")
        win = accounting.window(datetime.now(UTC), request.since_seconds or None)
        with self._sessions() as session:
            readable = scoping.readable_queues(session, who)  # a user's usage is that of the jobs they may see
            runs = [accounting.AttemptRun(queue=r.queue, service_class=r.service_class, cluster=r.cluster,
                                          user=r.submitted_by, requests=r.requests, started_at=r.started_at,
                                          finished_at=r.finished_at, array=r.array_id)
                    for r in usage_totals.attempt_runs(session, ended_after=win.start)
                    if scoping.sees(who, readable, r.queue, r.submitted_by)]
            # Today's prices and multipliers apply to the whole window.
            prices = {c.name: object_from_document(c.spec).price for c in cluster_store.list_clusters(session)}
            multipliers = {name: object_from_document(c.spec).price_multiplier
                           for name, c in cluster_store.service_classes(session).items()}
            burst = budgets.report(session, win.end, win)
        rows = accounting.usage(runs, by=by, win=win, prices=prices, multipliers=multipliers)
        return jobs_pb2.UsageResponse(
            rows=[jobs_pb2.UsageRow(group=u.group, resource_hours=u.resource_hours, cost=u.cost, attempts=u.attempts)
                  for u in rows],
            currency=accounting.CURRENCY, window_start=convert.timestamp(win.start),
            window_end=convert.timestamp(win.end), by=by, burst=[convert.burst_budget(b) for b in burst])


def _job_with_reason(session, job) -> tuple[jobs_pb2.Job, int]:
    """The job, and its place in its queue. A job deeper in its queue than the scheduler reads each cycle
    has no reason of its own yet: it is told how many jobs are ahead of it."""
    message = convert.job(job)
    position = job_reads.queue_position(session, job)
    if job.state == states.QUEUED and job.reason == lifecycle.SUBMITTED:
        message.reason = f"waiting behind {position - 1} jobs in queue {job.queue}"
    return message, position


def _serialized(message: jobs_pb2.JobEvents | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()
