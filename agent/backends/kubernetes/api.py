"""The one adapter to the official `kubernetes` client: connection config, calls, errors, watch streams.

Only this module imports `kubernetes`. Objects go in and come out as the API's JSON dicts (every call
uses `_preload_content=False` and parses the body itself), so nothing above it depends on the client's
model classes. Errors become `KubeError` with the HTTP status, the API's reason and message, and
Retry-After when sent; `KubeError.transient` says whether trying again later makes sense (no answer,
429, 5xx). The client's own retries on status codes are off: the backend's backoff decides.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import random
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

log = logging.getLogger(__name__)

# plural -> (api group attribute, list across namespaces or cluster-scoped, create, delete)
_CALLS = {
    "pods": ("core", "list_pod_for_all_namespaces", "create_namespaced_pod", "delete_namespaced_pod"),
    "jobs": ("batch", "list_job_for_all_namespaces", "create_namespaced_job", "delete_namespaced_job"),
    "nodes": ("core", "list_node", None, None),
    "events": ("core", "list_event_for_all_namespaces", "create_namespaced_event", None),
    "namespaces": ("core", "list_namespace", "create_namespace", None),
}

# The cluster-scoped custom resources the agent reads (plural.group, version v1): Sluice's admin objects.
CUSTOM_RESOURCES = ("queues.sluice.io", "serviceclasses.sluice.io", "clusters.sluice.io", "burstpolicies.sluice.io")
# (plural, the status subresource) -> (api group attribute, merge-patch call)
_PATCHES = {("jobs", False): ("batch", "patch_namespaced_job"),
            ("jobs", True): ("batch", "patch_namespaced_job_status")}


class KubeError(Exception):
    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status  # HTTP status; 0 when the API server did not answer
        self.reason = reason  # the Status object's reason: AlreadyExists, NotFound, Invalid, Expired, ...
        self.message = message
        self.retry_after = retry_after  # seconds, from Retry-After

    @property
    def transient(self) -> bool:
        return self.status == 0 or self.status == 429 or self.status >= 500


class ConfigError(Exception):
    """No usable cluster connection config (kubeconfig, context, in-cluster service account)."""


@dataclass(frozen=True)
class ApiSettings:
    kubeconfig: str | None = None  # path; None: in-cluster when running in a pod, else the default kubeconfig
    context: str | None = None  # kubeconfig context; None: its current-context
    request_timeout_s: float = 30.0  # per call (connect and read)
    connect_retries: int = 2  # urllib3 retries of a refused or dropped connection, before any answer


def _from_api_exception(exc: ApiException) -> KubeError:
    reason, message = str(exc.reason or ""), ""
    try:
        body = json.loads(exc.body) if exc.body else {}
        if isinstance(body, dict):
            reason = body.get("reason") or reason
            message = body.get("message") or ""
    except (ValueError, TypeError):
        message = str(exc.body or "")[:500]
    retry_after = None
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    if value is not None:
        try:
            retry_after = float(value)
        except ValueError:
            retry_after = None
    return KubeError(int(exc.status or 0), reason, message or reason, retry_after)


def _translate(exc: BaseException) -> KubeError:
    if isinstance(exc, ApiException):
        return _from_api_exception(exc)
    if isinstance(exc, ValueError):  # the typed client refused the body before sending it (pydantic)
        return KubeError(422, "Invalid", f"the kubernetes client refused the object: {exc}".splitlines()[0]
                         + "".join(f"; {line.strip()}" for line in str(exc).splitlines()[1:3]))
    return KubeError(0, "Unreachable", f"{type(exc).__name__}: {exc}")


_CLIENT_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError)


class KubeApi:
    """Calls against one cluster. Thread-safe (the client's connection pool is)."""

    def __init__(self, settings: ApiSettings):
        self.settings = settings
        configuration = client.Configuration()
        try:
            if settings.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config(client_configuration=configuration)
            else:
                config.load_kube_config(config_file=settings.kubeconfig, context=settings.context,
                                        client_configuration=configuration)
        except (ConfigException, OSError, TypeError, ValueError) as exc:
            where = settings.kubeconfig or "the default kubeconfig (or in-cluster config)"
            raise ConfigError(f"cannot load {where}: {exc}") from exc
        configuration.retries = urllib3.Retry(total=settings.connect_retries, connect=settings.connect_retries,
                                              read=0, redirect=0, status=0, other=0,
                                              respect_retry_after_header=False)
        self.host = configuration.host
        self._client = client.ApiClient(configuration)
        self._groups = {"core": client.CoreV1Api(self._client), "batch": client.BatchV1Api(self._client),
                        "custom": client.CustomObjectsApi(self._client)}
        self._open: set = set()
        self._open_lock = threading.Lock()

    def close(self) -> None:
        self.interrupt()
        self._client.close()

    def _call(self, plural: str, which: int):
        if plural in CUSTOM_RESOURCES:  # cluster-scoped custom objects: the list (and watch) call
            if which != 0:
                raise ValueError(f"{plural}: operation not supported")
            resource, group = plural.split(".", 1)
            return functools.partial(self._groups["custom"].list_cluster_custom_object, group, "v1", resource)
        group, *names = _CALLS[plural]
        name = names[which]
        if name is None:
            raise ValueError(f"{plural}: operation not supported")
        return getattr(self._groups[group], name)

    def _timeout(self) -> tuple[float, float]:
        return (self.settings.request_timeout_s, self.settings.request_timeout_s)

    # -- calls -----------------------------------------------------------------------------------
    def list(self, plural: str, *, label_selector: str | None = None) -> tuple[list[dict], str]:
        """Every object of the kind (across namespaces), and the list's resourceVersion."""
        kwargs = {"label_selector": label_selector} if label_selector else {}
        try:
            response = self._call(plural, 0)(_preload_content=False, _request_timeout=self._timeout(), **kwargs)
            body = json.loads(response.data)
        except _CLIENT_ERRORS as exc:
            raise _translate(exc) from exc
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion") or "")

    def create(self, plural: str, namespace: str | None, body: dict) -> dict:
        try:
            call = self._call(plural, 1)
            if namespace is None:
                response = call(body, _preload_content=False, _request_timeout=self._timeout())
            else:
                response = call(namespace, body, _preload_content=False, _request_timeout=self._timeout())
            return json.loads(response.data)
        except _CLIENT_ERRORS as exc:
            raise _translate(exc) from exc

    def delete(self, plural: str, namespace: str, name: str, *, propagation: str = "Foreground") -> bool:
        """Delete one object; False when it was already gone."""
        try:
            self._call(plural, 2)(name, namespace, body={"propagationPolicy": propagation},
                                  _preload_content=False, _request_timeout=self._timeout())
            return True
        except _CLIENT_ERRORS as exc:
            error = _translate(exc)
            if error.status == 404:
                return False
            raise error from exc

    def patch(self, plural: str, namespace: str, name: str, body: dict, *, status: bool = False,
              strategic: bool = False) -> dict:
        """A JSON merge patch (RFC 7386) of one namespaced object, or of its status subresource; the object
        as patched. A `metadata.resourceVersion` in the body makes it conditional (409 when it moved on).
        strategic: a strategic merge patch instead, whose lists merge by their keys (a condition by its type)."""
        group, method = _PATCHES[(plural, status)]
        kind = "strategic-merge-patch" if strategic else "merge-patch"
        try:
            response = getattr(self._groups[group], method)(
                name, namespace, body, _content_type=f"application/{kind}+json", _preload_content=False,
                _request_timeout=self._timeout())
            return json.loads(response.data)
        except _CLIENT_ERRORS as exc:
            raise _translate(exc) from exc

    def patch_custom(self, plural: str, name: str, body: dict, *, status: bool = False) -> dict:
        """A JSON merge patch of one cluster-scoped custom object (`plural`: e.g. queues.sluice.io), or of its
        status subresource; the object as patched."""
        resource, group = plural.split(".", 1)
        custom = self._groups["custom"]
        call = custom.patch_cluster_custom_object_status if status else custom.patch_cluster_custom_object
        try:
            response = call(group, "v1", resource, name, body, _content_type="application/merge-patch+json",
                            _preload_content=False, _request_timeout=self._timeout())
            return json.loads(response.data)
        except _CLIENT_ERRORS as exc:
            raise _translate(exc) from exc

    def read_namespace(self, name: str) -> dict | None:
        return self._read_core(self._groups["core"].read_namespace, name)

    def read_pod(self, namespace: str, name: str) -> dict | None:
        return self._read_core(self._groups["core"].read_namespaced_pod, name, namespace)

    def read_job(self, namespace: str, name: str) -> dict | None:
        return self._read_core(self._groups["batch"].read_namespaced_job, name, namespace)

    def _read_core(self, read, *names: str) -> dict | None:
        """One object by a read method; None when it does not exist."""
        try:
            return json.loads(read(*names, _preload_content=False, _request_timeout=self._timeout()).data)
        except _CLIENT_ERRORS as exc:
            error = _translate(exc)
            if error.status == 404:
                return None
            raise error from exc

    def pod_log(self, namespace: str, name: str, container: str, *, tail_lines: int = 0,
                follow: bool = False) -> LogStream:
        """Open one container's log. Without follow every read is bounded by the request timeout. With follow
        the stream stays open until the container ends, the pod goes, or it is closed: a quiet container may
        write nothing for hours, so there is no timeout at all (the client takes no read timeout alone)."""
        kwargs: dict = {"container": container}
        if tail_lines > 0:
            kwargs["tail_lines"] = tail_lines
        if follow:
            kwargs["follow"] = True
        timeout = None if follow else self._timeout()
        try:
            response = self._groups["core"].read_namespaced_pod_log(name, namespace, _preload_content=False,
                                                                    _request_timeout=timeout, **kwargs)
        except _CLIENT_ERRORS as exc:
            raise _translate(exc) from exc
        return LogStream(self, response)

    def watch(self, plural: str, resource_version: str, *, label_selector: str | None = None,
              timeout_s: int = 300) -> Iterator[tuple[str, dict]]:
        """(type, object) events after resource_version: ADDED, MODIFIED, DELETED, BOOKMARK (object holds
        only the new resourceVersion). Ends when the server closes the stream (its timeout); an ERROR
        event raises KubeError (410 Expired: the resourceVersion is too old, list again)."""
        kwargs = {"label_selector": label_selector} if label_selector else {}
        try:
            response = self._call(plural, 0)(
                watch=True, resource_version=resource_version, allow_watch_bookmarks=True, timeout_seconds=timeout_s,
                _preload_content=False, _request_timeout=(self.settings.request_timeout_s, timeout_s + 15), **kwargs)
        except _CLIENT_ERRORS as exc:
            raise _translate(exc) from exc
        with self._open_lock:
            self._open.add(response)
        try:
            buffer = b""
            for chunk in response.stream(amt=None, decode_content=False):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        raise KubeError(int(obj.get("code") or 500), obj.get("reason") or "Error",
                                        obj.get("message") or "watch error")
                    yield kind, obj
        except KubeError:
            raise
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as exc:
            raise _translate(exc) from exc
        finally:
            with self._open_lock:
                self._open.discard(response)
            response.close()  # a watch connection is not worth reusing

    def interrupt(self) -> None:
        """End every open watch and log stream now (stopping)."""
        with self._open_lock:
            responses = list(self._open)
        for response in responses:
            _shutdown(response)


def _shutdown(response) -> None:
    """End a response's read from another thread."""
    try:
        response.shutdown()
    except Exception:  # older urllib3 has no shutdown(); closing the socket ends the read too
        try:
            sock = getattr(getattr(response, "connection", None), "sock", None)
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class LogStream:
    """One open container log: `lines()` yields its lines as they arrive (without the newline, undecodable
    bytes replaced); `close()`, from any thread, ends it, and `lines()` then just stops."""

    def __init__(self, api: KubeApi, response):
        self._api, self._response = api, response
        self._lock = threading.Lock()  # close() must not shut down a connection already back in the pool
        self._closed = self._finished = False
        with api._open_lock:
            api._open.add(response)

    def lines(self) -> Iterator[str]:
        buffer, complete = b"", False
        try:
            for chunk in self._response.stream(65536, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", errors="replace")
            if buffer:
                yield buffer.decode("utf-8", errors="replace")
            complete = True
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as exc:
            if not self._closed:
                raise _translate(exc) from exc
        finally:
            with self._lock:
                self._finished = True
                with self._api._open_lock:
                    self._api._open.discard(self._response)
                if complete:
                    self._response.release_conn()  # read to the end: the connection can serve another call
                else:
                    self._response.close()

    def close(self) -> None:
        with self._lock:
            if self._finished or self._closed:
                return
            self._closed = True
            _shutdown(self._response)
        with self._api._open_lock:
            self._api._open.discard(self._response)


_RETRY_AFTER_MAX_S = 120.0  # a longer Retry-After is taken as this


class Backoff:
    """Delays between retries of an API call or a watch: doubling up to `maximum`, with jitter, or what
    the API server's Retry-After says (within reason)."""

    def __init__(self, initial: float, maximum: float):
        self.initial, self.maximum, self.current = initial, maximum, initial

    def next(self, retry_after: float | None = None) -> float:
        if retry_after is not None:  # the API server said how long: take it (within reason)
            delay = min(max(retry_after, 0.0), _RETRY_AFTER_MAX_S)
        else:
            delay = self.current * random.uniform(0.8, 1.2)  # jitter: agents of many clusters do not align
        self.current = min(self.current * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self.current = self.initial
