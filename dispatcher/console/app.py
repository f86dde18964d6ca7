"""The console's HTTP side (WSGI): its pages, their script and style, and the JSON API under /api/v1/.

Every answer carries a strict Content-Security-Policy (scripts and styles from this origin only, nothing
inline, nothing fetched from elsewhere) and `X-Content-Type-Options: nosniff`. An API error is
{"error": "..."} with its HTTP status; nothing unexpected reaches the caller beyond a one-line error.
"""
from __future__ import annotations

import json
import logging
import re
from importlib import resources
from urllib.parse import parse_qs

from dispatcher.console.gateway import ApiError, Gateway
from sluice.quantity import QuantityError, parse_duration

log = logging.getLogger(__name__)

SECURITY_HEADERS = [
    ("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    ("Cache-Control", "no-store"),
]
# Every page is the same shell: console.js draws the page its path names.
PAGES = re.compile(r"^/(|login|queues|clusters|usage|jobs/[^/]+)$")
STATIC = {"/static/console.js": ("console.js", "text/javascript; charset=utf-8"),
          "/static/console.css": ("console.css", "text/css; charset=utf-8"),
          "/favicon.ico": ("favicon.svg", "image/svg+xml")}
JOB_PATH = re.compile(r"^/api/v1/jobs/([^/]*)(/explain|/cancel|/logs)?$")
MAX_JOB_ID = (1 << 63) - 1
MAX_PAGE = 1000  # jobs on one page of the listing, as Jobs.List allows
LIST_PARAMS = ("queue", "state", "user", "cluster", "name", "limit", "page")
USAGE_PARAMS = ("by", "since")
LOG_PARAMS = ("tail", "pod", "podSet", "attempt")
LOG_TAIL = 200  # each pod's last lines a page shows unless it asks for another number
MAX_LOG_TAIL = 10_000
STATUS_TEXT = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
               405: "Method Not Allowed", 429: "Too Many Requests", 500: "Internal Server Error",
               503: "Service Unavailable"}


def _static(name: str) -> bytes:
    return resources.files("dispatcher.console").joinpath("static", name).read_bytes()


class Console:
    """The WSGI app: pages, static files and the JSON API, answering through `gateway`."""

    def __init__(self, gateway: Gateway):
        self._gateway = gateway
        self._shell = _static("console.html")
        self._static = {path: (_static(name), kind) for path, (name, kind) in STATIC.items()}

    def __call__(self, environ, start_response):
        path, method = environ.get("PATH_INFO", "") or "/", environ.get("REQUEST_METHOD", "GET")
        try:
            if path.startswith("/api/"):
                (status, body), kind = self._api(environ, path, method), "application/json"
            else:
                status, body, kind = self._file(path, method)
        except ApiError as exc:
            status, body, kind = exc.status, _json({"error": exc.message}), "application/json"
        except Exception:  # one line to the caller; the trace to the log
            log.exception("console request failed", extra={"path": path})
            status, body, kind = 500, _json({"error": "internal error; the dispatcher's log has the details"}), \
                "application/json"
        headers = [("Content-Type", kind), ("Content-Length", str(len(body))), *SECURITY_HEADERS]
        if status == 401:
            headers.append(("WWW-Authenticate", 'Bearer realm="sluice"'))
        if status == 405:
            headers.append(("Allow", "POST" if path.endswith("/cancel") else "GET"))
        start_response(f"{status} {STATUS_TEXT.get(status, 'Error')}", headers)
        return [body] if method != "HEAD" else []

    def _file(self, path: str, method: str) -> tuple[int, bytes, str]:
        if method not in ("GET", "HEAD"):
            raise ApiError(405, f"{method} {path}: pages are read with GET")
        if path in self._static:
            body, kind = self._static[path]
            return 200, body, kind
        if PAGES.match(path):
            return 200, self._shell, "text/html; charset=utf-8"
        return 404, b"not found\n", "text/plain; charset=utf-8"

    def _api(self, environ, path: str, method: str) -> tuple[int, bytes]:
        authorization = environ.get("HTTP_AUTHORIZATION", "")
        if not (authorization.isascii() and authorization.isprintable()):
            raise ApiError(400, "Authorization: not a valid header value (expected 'Bearer <token>')")
        query = _query(environ.get("QUERY_STRING", ""))
        gateway = self._gateway
        if (found := JOB_PATH.match(path)) is not None:
            job_id, action = _job_id(found.group(1)), found.group(2)
            if action == "/logs":
                _method(method, "GET", path)
                _only(query, LOG_PARAMS)
                return 200, _json(gateway.logs(
                    authorization, job_id, tail=_count("tail", query.get("tail", ""), LOG_TAIL, MAX_LOG_TAIL),
                    pod=query.get("pod", ""), pod_set=query.get("podSet", ""),
                    attempt=_count("attempt", query.get("attempt", ""), 0, (1 << 31) - 1)))
            _only(query, ())
            if action == "/cancel":
                _method(method, "POST", path)
                return 200, _json(gateway.cancel(authorization, job_id))
            _method(method, "GET", path)
            answer = gateway.explain(authorization, job_id) if action else gateway.describe(authorization, job_id)
            return 200, _json(answer)
        simple = {"/api/v1/jobs": LIST_PARAMS, "/api/v1/queues": (), "/api/v1/clusters": (),
                  "/api/v1/usage": USAGE_PARAMS}
        if path not in simple:
            raise ApiError(404, f"{path}: no such API path (see docs/api.md, the console's JSON API)")
        _method(method, "GET", path)
        _only(query, simple[path])
        if path == "/api/v1/jobs":
            return 200, _json(gateway.jobs(authorization, queue=query.get("queue", ""), state=query.get("state", ""),
                                           user=query.get("user", ""), cluster=query.get("cluster", ""),
                                           name=query.get("name", ""),
                                           limit=_count("limit", query.get("limit", ""), 0, MAX_PAGE),
                                           page=query.get("page", "")))
        if path == "/api/v1/queues":
            return 200, _json(gateway.queues(authorization))
        if path == "/api/v1/clusters":
            return 200, _json(gateway.clusters(authorization))
        return 200, _json(gateway.usage(authorization, by=query.get("by", ""), since_s=_since(query.get("since", ""))))


def _json(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _query(text: str) -> dict[str, str]:
    try:
        pairs = parse_qs(text, keep_blank_values=True, strict_parsing=False, max_num_fields=50)
    except ValueError as exc:
        raise ApiError(400, f"query string: {exc}") from None
    for key, values in pairs.items():
        if len(values) > 1:
            raise ApiError(400, f"{key}: given {len(values)} times; give it once")
    return {key: values[0] for key, values in pairs.items()}


def _only(query: dict[str, str], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        known = f"it takes {', '.join(allowed)}" if allowed else "it takes none"
        raise ApiError(400, f"query parameter {unknown[0]!r} is not known here; {known}")


def _method(method: str, wanted: str, path: str) -> None:
    if method != wanted and not (wanted == "GET" and method == "HEAD"):
        raise ApiError(405, f"{method} {path}: use {wanted}")


def _job_id(text: str) -> int:
    if not text.isdigit() or not text.isascii() or not 0 < int(text) <= MAX_JOB_ID:
        raise ApiError(400, f"job id {text!r}: not a job id (a whole number from 1)")
    return int(text)


def _count(name: str, text: str, default: int, most: int) -> int:
    if not text:
        return default
    if not text.isdigit() or not text.isascii() or not 0 < int(text) <= most:
        raise ApiError(400, f"{name} {text!r}: must be a whole number from 1 to {most}")
    return int(text)


def _since(text: str) -> float:
    """A duration back from now ('24h', '7d', a number of seconds), or 'all' or nothing for all time."""
    if text in ("", "all"):
        return 0.0
    try:
        return parse_duration(text)
    except QuantityError as exc:
        raise ApiError(400, f"since: {exc}") from None
