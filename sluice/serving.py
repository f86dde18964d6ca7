"""What Sluice's servers share: TLS files that follow rotation, the loopback rule for plaintext, and the
/metrics endpoint over HTTP(S).

Certificates and keys are read again when their files change (size, mtime or inode), at the next handshake,
so rotating them needs no restart: write the new files (cert-manager, `sluice dispatcher certs`, or any tool
that replaces them) and new connections get them; open connections keep theirs. A pair that does not load
(half written, key not matching) is logged and the old one kept until the files are whole again.

Plaintext is served on loopback only: a token, or metrics naming clusters and jobs, would otherwise cross
the network in clear. The dispatcher serves its gRPC ports with these files (dispatcher/tls.py) and its
/metrics here; an agent serves its own /metrics here too.
"""
from __future__ import annotations

import errno
import logging
import os
import pathlib
import socket
import ssl
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from sluice import certs
from sluice.transport import host_of, is_loopback_host

log = logging.getLogger(__name__)


class TlsError(OSError):
    """TLS files that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ServerTls:
    cert: pathlib.Path  # PEM: the server's certificate (chain)
    key: pathlib.Path  # PEM: its private key
    # PEM: the CA whose client certificates authenticate agents (mTLS), on ServerSettings.agent_listen.
    client_ca: pathlib.Path | None = None


def is_loopback(listen: str) -> bool:
    """Whether HOST:PORT binds loopback only (127.0.0.0/8, ::1, localhost)."""
    return is_loopback_host(host_of(listen))


def refuse_plaintext_off_loopback(listen: str) -> None:
    """Raise OSError if plaintext on `listen` would carry tokens beyond this host."""
    if not is_loopback(listen):
        raise OSError(f"refusing plaintext on {listen}: not a loopback address; give a TLS certificate and key "
                      "(--tls-cert, --tls-key)")


def refuse_port_in_use(listen: str) -> None:
    """Raise OSError if a socket listens on HOST:PORT already. gRPC binds with SO_REUSEPORT, so a server started on
    a port that another process serves would bind it too, and the kernel would split the connections between the
    two; a probe bound without SO_REUSEPORT finds the port taken. Port 0 (a free one) is never taken."""
    port = listen.rsplit(":", 1)[-1]
    if not port.isdigit() or int(port) == 0:
        return
    try:
        addresses = socket.getaddrinfo(host_of(listen) or None, int(port), type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # not an address: the server's own bind says so
    for family, kind, proto, _name, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT is no user
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise OSError(f"cannot listen on {listen}: address in use (another server listens there)") from None


def _stamp(path: pathlib.Path) -> tuple:
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return st.st_ino, st.st_size, st.st_mtime_ns


def _read(path: pathlib.Path, what: str) -> bytes:
    try:
        data = pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"{what} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TlsError(f"{what} {path}: not a PEM file")
    return data


class TlsFiles:
    """A certificate, its key and optionally a CA, read together, and again by `reload` when a file moved."""

    def __init__(self, tls: ServerTls, *, with_ca: bool):
        self._paths = [tls.cert, tls.key] + ([tls.client_ca] if with_ca and tls.client_ca else [])
        self._lock = threading.Lock()
        self._stamps: list[tuple] = []
        self.cert, self.key, self.ca = self._load(tls, with_ca)
        self._tls, self._with_ca = tls, with_ca

    def _load(self, tls: ServerTls, with_ca: bool) -> tuple[bytes, bytes, bytes | None]:
        stamps = [_stamp(p) for p in self._paths]
        cert, key = _read(tls.cert, "certificate"), _read(tls.key, "private key")
        ca = _read(tls.client_ca, "client CA") if with_ca and tls.client_ca else None
        check_pair(tls.cert, tls.key)
        self._stamps = stamps
        return cert, key, ca

    def reload(self) -> bool:
        """Read the files again if any changed; True when the new ones loaded and replace the old."""
        with self._lock:
            if [_stamp(p) for p in self._paths] == self._stamps:
                return False
            try:
                self.cert, self.key, self.ca = self._load(self._tls, self._with_ca)
            except TlsError as exc:
                log.warning("TLS files changed but do not load; keeping the previous ones", extra={"error": str(exc)})
                return False
            log.info("TLS certificate reloaded", extra={"cert": str(self._tls.cert)})
            return True


def check_pair(cert: pathlib.Path, key: pathlib.Path) -> None:
    """Raise TlsError unless the certificate and key load and belong together."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(f"certificate {cert} and key {key} do not load as a pair: "
                       f"{getattr(exc, 'reason', None) or exc}") from None


def self_signed(directory: pathlib.Path, host: str) -> ServerTls:
    """TLS files made now in `directory`, for a server given none: a certificate for `host` and this
    machine's name, signed by a CA made for it alone and then forgotten. The traffic is encrypted, though no
    client can verify who serves it (a scraper skips verification, or is given a real certificate instead)."""
    hosts = list(dict.fromkeys(h for h in (host, socket.gethostname(), *certs.local_hosts())
                               if h and h not in ("0.0.0.0", "::")))
    certs.make_server(certs.make_ca("Sluice self-signed"), hosts).write(directory / "tls.crt", directory / "tls.key")
    return ServerTls(directory / "tls.crt", directory / "tls.key")


class HttpTls:
    """An ssl.SSLContext for an HTTP server, made again when the files change."""

    def __init__(self, tls: ServerTls):
        self._files = TlsFiles(tls, with_ca=False)
        self._tls = tls
        self._context = self._make()

    def _make(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self._tls.cert), str(self._tls.key))
        return context

    def context(self) -> ssl.SSLContext:
        if self._files.reload():
            try:
                self._context = self._make()
            except (ssl.SSLError, OSError) as exc:  # replaced again between the check and this read
                log.warning("TLS files changed but do not load; keeping the previous ones", extra={"error": str(exc)})
        return self._context



class _HttpServer(ThreadingWSGIServer):
    """The /metrics server; with TLS, each connection's handshake runs on its own thread (a client that
    never finishes one holds only that thread, not the accepting loop)."""

    tls: HttpTls | None = None
    handshake_timeout_s = 10.0

    def finish_request(self, request, client_address) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(self.handshake_timeout_s)
        try:
            secured = self.tls.context().wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return  # a plaintext or broken client: nothing can be answered
        try:
            super().finish_request(secured, client_address)
        finally:
            secured.close()


class _HttpServer6(_HttpServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Scrapes every few seconds would flood the log."""


def _metrics_beside(metrics, other):
    """One WSGI app: /metrics answered by `metrics`, every other path by `other`."""
    def app(environ, start_response):
        return (metrics if environ.get("PATH_INFO", "") == "/metrics" else other)(environ, start_response)
    return app


class MetricsServer:
    """/metrics for one registry on HOST:PORT (port 0 picks a free one), over TLS when `tls` is given.
    Without `app` every path answers with the metrics; with it, /metrics does and `app` (WSGI) serves the rest."""

    def __init__(self, listen: str, registry: CollectorRegistry, tls: ServerTls | None = None, app=None):
        host, sep, port = listen.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit():
            raise OSError(f"cannot serve metrics on {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
        if tls is None and not is_loopback(listen):
            raise OSError(f"refusing plaintext /metrics on {listen}: not a loopback address (give a TLS "
                          "certificate and key)")
        https = HttpTls(tls) if tls is not None else None
        try:
            served = make_wsgi_app(registry) if app is None else _metrics_beside(make_wsgi_app(registry), app)
            self._server = make_server(host, int(port), served,
                                       _HttpServer6 if ":" in host else _HttpServer, handler_class=_QuietHandler)
        except (OSError, OverflowError) as exc:
            raise OSError(f"cannot serve metrics on {listen}: {exc}") from exc
        self._server.tls = https
        # serve_forever checks for a stop this often: stop() waits up to as long
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="metrics-http",
                                        daemon=True)
        self._thread.start()
        self.host = self._server.socket.getsockname()[0]  # as bound: tests check it is loopback
        self.port = self._server.server_port
        self.address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        self.scheme = "https" if https else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}/metrics"

    @property
    def root_url(self) -> str:
        return f"{self.scheme}://{self.address}/"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
