"""The container logs of an attempt's pods, read through the API server (the backend's `logs`).

`select_pods` (pure) picks the pods a request names from a fresh list of the attempt's pods, in name
order, or raises LogsGone saying what the attempt holds instead. `PodLogs` reads them:

- `read`: one pod after another, each container's lines in order; every read is bounded by the request
  timeout. A container that has not started has no log yet and yields nothing.
- `follow`: one thread per container, all feeding one queue, so lines come as they are written (one
  container's in order, different pods' interleaved). A container not started yet is looked at again
  every `poll_s` until it starts or its pod ends. It ends when every stream has ended (the container
  terminated or the pod was deleted), when `stopped` is set, or when the backend stops; an API error in
  any stream ends it with that error.

A pod of several containers gets each line prefixed with `[container] `.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from agent.backends.base import LogsGone
from agent.backends.kubernetes import status as ks
from agent.backends.kubernetes.api import KubeApi, KubeError, LogStream
from agent.backends.kubernetes.objects import LABEL_POD_SET

_END = object()  # a follow thread is done
_CHECK_S = 0.1  # how often a follow consumer with nothing to yield looks at `stopped`


def select_pods(pods: list[dict], job_id: int, attempt: int, *, pod: str = "", pod_set: str = "") -> list[dict]:
    """The pods of the attempt a log request names (all, the pods of `pod_set`, or the one named `pod`),
    in name order. LogsGone when there are none."""
    where = f"job {job_id} attempt {attempt}"
    chosen = sorted(pods, key=ks.name_of)
    if not chosen:
        raise LogsGone(f"the cluster holds no pods of {where} (deleted, or never created)")
    if pod_set:
        sets = sorted({_pod_set(p) for p in chosen})
        chosen = [p for p in chosen if _pod_set(p) == pod_set]
        if not chosen:
            raise LogsGone(f"no pod set {pod_set} in {where}; its pod sets: {', '.join(sets)}")
        where = f"pod set {pod_set} of {where}"
    if pod:
        names = [ks.name_of(p) for p in chosen]
        chosen = [p for p in chosen if ks.name_of(p) == pod]
        if not chosen:
            raise LogsGone(f"no pod named {pod} in {where}; its pods: {', '.join(names)}")
    return chosen


def containers(pod: dict) -> list[str]:
    """The pod's containers as its template lists them (init containers are not read)."""
    return [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, dict)]


def started(pod: dict, container: str) -> bool:
    """Whether the container has a log to read: it runs, or ran."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            state = status.get("state") or {}
            return "running" in state or "terminated" in state or bool((status.get("lastState") or {})
                                                                        .get("terminated"))
    return False


def _pod_set(pod: dict) -> str:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_POD_SET, "")


def _waiting(error: KubeError) -> bool:
    """The API server's answer for a container that has not started ("... is waiting to start: ...")."""
    return error.status == 400 and "waiting to start" in error.message


def _about(pod: str, error: KubeError) -> KubeError:
    return KubeError(error.status, error.reason, f"reading the log of pod {pod}: {error.message}",
                     error.retry_after)


class PodLogs:
    """Reads pods' logs; `retrying` runs one call with the backend's backoff, `halted` is the backend's stop."""

    def __init__(self, api: KubeApi, *, retrying: Callable, poll_s: float, halted: threading.Event):
        self._api, self._retrying, self._poll_s, self._halted = api, retrying, poll_s, halted

    def _open(self, namespace: str, name: str, container: str, tail_lines: int, *, follow: bool) -> LogStream:
        return self._retrying(lambda: self._api.pod_log(namespace, name, container, tail_lines=tail_lines,
                                                        follow=follow))

    def read(self, pods: list[dict], tail_lines: int, job_id: int, attempt: int) -> Iterator[tuple[str, str]]:
        gone = 0
        for pod in pods:
            name, namespace = ks.name_of(pod), (pod.get("metadata") or {}).get("namespace", "")
            names = containers(pod)
            prefix = len(names) > 1
            try:
                for container in names:
                    if not started(pod, container):
                        continue
                    try:
                        stream = self._open(namespace, name, container, tail_lines, follow=False)
                    except KubeError as exc:
                        if _waiting(exc):
                            continue
                        raise
                    for line in stream.lines():
                        yield name, f"[{container}] {line}" if prefix else line
            except KubeError as exc:
                if exc.status == 404:  # deleted since it was listed
                    gone += 1
                    continue
                raise _about(name, exc) from exc
        if gone and gone == len(pods):
            raise LogsGone(f"the pods of job {job_id} attempt {attempt} were deleted before their logs were read")

    def follow(self, pods: list[dict], tail_lines: int, stopped: threading.Event) -> Iterator[tuple[str, str]]:
        out: queue.Queue = queue.Queue()
        done = threading.Event()
        streams: set[LogStream] = set()
        lock = threading.Lock()

        def keep(stream: LogStream) -> bool:
            """Note an open stream so that ending the follow closes it; False (and closed) when it has ended."""
            with lock:
                if done.is_set():
                    stream.close()
                    return False
                streams.add(stream)
                return True

        threads = []
        for pod in pods:
            names = containers(pod)
            for container in names:
                prefix = f"[{container}] " if len(names) > 1 else ""
                threads.append(threading.Thread(target=self._follow_one, name=f"kube-logs-{ks.name_of(pod)}",
                                                args=(pod, container, prefix, tail_lines, out, done, keep),
                                                daemon=True))
        for thread in threads:
            thread.start()
        running = len(threads)
        try:
            while running and not stopped.is_set() and not self._halted.is_set():
                try:
                    item = out.get(timeout=_CHECK_S)
                except queue.Empty:
                    continue
                if item is _END:
                    running -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            done.set()
            with lock:
                opened = list(streams)
            for stream in opened:
                stream.close()

    def _follow_one(self, pod: dict, container: str, prefix: str, tail_lines: int, out: queue.Queue,
                    done: threading.Event, keep: Callable[[LogStream], bool]) -> None:
        name, namespace = ks.name_of(pod), (pod.get("metadata") or {}).get("namespace", "")
        current: dict | None = pod
        try:
            while not done.is_set() and current is not None:
                if not started(current, container):
                    if ks.finished_pod(current):
                        return  # ended without ever running this container: no log
                    done.wait(self._poll_s)
                    current = self._retrying(lambda: self._api.read_pod(namespace, name))
                    continue
                try:
                    stream = self._open(namespace, name, container, tail_lines, follow=True)
                except KubeError as exc:
                    if exc.status == 404:
                        return
                    if not _waiting(exc):
                        raise
                    current = {**current, "status": {}}  # our copy of the pod ran ahead of the API server
                    continue
                if keep(stream):
                    for line in stream.lines():
                        out.put((name, prefix + line))
                return
        except KubeError as exc:
            if not done.is_set() and not self._halted.is_set():  # stopping the backend cuts every stream
                out.put(_about(name, exc))
        except Exception as exc:  # the consumer must hear of it, not wait for a line that never comes
            if not done.is_set():
                out.put(exc)
        finally:
            out.put(_END)
