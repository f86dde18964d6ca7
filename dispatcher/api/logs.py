"""Pod logs, relayed from the agents connected to this dispatcher process to the Logs calls that ask for them.

A Logs call names a cluster; the relay puts a LogRequest on that cluster's link (the agent reads the pods'
logs through its backend) and hands the call the PodLogLines the link's reader passes back with the same
request id. Nothing is stored: the lines go from the agent to the caller as they come, and a caller that goes
away tells the agent to stop (LogStop). The agent must answer within ANSWER_S and keep a followed stream
alive; a link that ends ends its requests with AgentUnavailable.
"""
from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

from dispatcher.errors import AgentUnavailable, NotFound, ResourceExhausted
from sluice.v1 import agents_pb2, jobs_pb2

ANSWER_S = 5.0  # the agent's first answer to a request, and the silence after which a read that does not follow ends
QUEUED_MOST = 1000  # PodLogLines messages waiting for a caller that reads slower than the agent sends


class LogRelay:
    """The links of the agents connected to this process, by cluster, and the log requests open on them. Used on
    the event loop only."""

    def __init__(self) -> None:
        self._links: dict[str, asyncio.Queue] = {}  # cluster -> its link's outgoing queue (Connect's `out`)
        self._requests: dict[int, tuple[str, asyncio.Queue]] = {}  # request id -> (cluster, its lines)
        self._ids = itertools.count(1)

    def attach(self, cluster: str, out: asyncio.Queue) -> None:
        """A cluster's link is up: its log requests go on `out` (a newer link of the same cluster replaces it)."""
        self._links[cluster] = out

    def detach(self, cluster: str, out: asyncio.Queue) -> None:
        """The link on `out` ended: the requests open on it end with AgentUnavailable."""
        if self._links.get(cluster) is not out:
            return
        del self._links[cluster]
        for on, lines in list(self._requests.values()):
            if on == cluster:
                lines.put_nowait(AgentUnavailable(f"the agent of cluster {cluster} disconnected while sending logs"))

    def deliver(self, message: agents_pb2.PodLogLines) -> None:
        """An agent's answer, from its link's reader; one for a request nobody waits for is dropped."""
        found = self._requests.get(message.request_id)
        if found is None:
            return
        lines = found[1]
        if lines.qsize() >= QUEUED_MOST:  # the caller does not keep up: end its request rather than hold it all
            lines.put_nowait(ResourceExhausted("logs: the client read too slowly; ask again with --tail"))
        else:
            lines.put_nowait(message)

    async def read(self, cluster: str, job_id: int, attempt: int, *, pod: str = "", pod_set: str = "",
                   tail_lines: int = 0, follow: bool = False) -> AsyncIterator[list[jobs_pb2.LogLine]]:
        """The attempt's log lines as its cluster's agent sends them, a message's worth at a time. Raises
        AgentUnavailable (no link here, no answer in time, the link ended) or NotFound (the pods are gone)."""
        out = self._links.get(cluster)
        if out is None:
            raise AgentUnavailable(f"the agent of cluster {cluster} is not connected to this dispatcher: its logs "
                                   "cannot be read now (sluice clusters shows whether it is reachable)")
        request_id = next(self._ids)
        lines: asyncio.Queue = asyncio.Queue()
        self._requests[request_id] = (cluster, lines)
        out.put_nowait(agents_pb2.DispatcherMessage(logs=agents_pb2.LogRequest(
            request_id=request_id, job_id=job_id, attempt=attempt, pod=pod, pod_set=pod_set, tail_lines=tail_lines,
            follow=follow)))
        ended = False
        try:
            answered = False
            while True:
                try:
                    # A followed pod may be quiet for long; the agent's link itself is watched by its heartbeats.
                    message = await (lines.get() if answered and follow else asyncio.wait_for(lines.get(), ANSWER_S))
                except TimeoutError:
                    raise AgentUnavailable(f"the agent of cluster {cluster} did not answer within {ANSWER_S:g}s "
                                           "with logs") from None
                answered = True
                if isinstance(message, Exception):
                    ended = True
                    raise message
                if message.lines:
                    yield list(message.lines)
                if message.end:
                    ended = True
                    if message.error:
                        raise (NotFound if message.gone else AgentUnavailable)(f"logs: {message.error}")
                    return
        finally:
            del self._requests[request_id]
            if not ended and self._links.get(cluster) is out:  # the caller left first: the agent may stop reading
                out.put_nowait(agents_pb2.DispatcherMessage(log_stop=agents_pb2.LogStop(request_id=request_id)))
