"""The dispatcher's side of TLS: credentials that follow their files, and the cluster an agent certificate names.

Certificates and keys are read again when their files change (size, mtime or inode), at the next handshake,
so rotating them needs no restart: write the new files (cert-manager, `sluice dispatcher certs`, or any tool
that replaces them) and new connections get them; open connections keep theirs. A pair that does not load
(half written, key not matching) is logged and the old one kept until the files are whole again.
"""
from __future__ import annotations

import functools
import logging
import os
import pathlib
import ssl
import threading
from dataclasses import dataclass

import grpc

from sluice.certs import AgentIdentity, agent_identity
from sluice.transport import host_of, is_loopback_host

log = logging.getLogger(__name__)


class TlsError(OSError):
    """TLS files that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ServerTls:
    cert: pathlib.Path  # PEM: the dispatcher's certificate (chain)
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


class _Files:
    """A certificate, its key and optionally a CA, read together; `changed` says whether any file moved."""

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


def grpc_credentials(tls: ServerTls, *, agents: bool = False) -> grpc.ServerCredentials:
    """Server credentials for a gRPC port. agents=True: the mTLS port, which requires a client certificate
    signed by tls.client_ca (gRPC either requires client certificates on a port or never asks for them)."""
    if agents and tls.client_ca is None:
        raise TlsError("an agent port needs a client CA (--client-ca)")
    files = _Files(tls, with_ca=agents)

    def configuration() -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(files.key, files.cert)], root_certificates=files.ca)

    def fetch() -> grpc.ServerCertificateConfiguration | None:  # gRPC asks at every new handshake
        return configuration() if files.reload() else None

    return grpc.dynamic_ssl_server_credentials(configuration(), fetch, require_client_authentication=agents)


class HttpTls:
    """An ssl.SSLContext for an HTTP server, made again when the files change."""

    def __init__(self, tls: ServerTls):
        self._files = _Files(tls, with_ca=False)
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


def agent_certificate(context: grpc.ServicerContext) -> AgentIdentity | None:
    """What the client certificate of an agent on the agent port says, or None.

    Only the agent port asks for client certificates, and gRPC hands over the peer's certificate only after
    verifying it against that port's client CA; elsewhere there is none to read."""
    pem = (context.auth_context() or {}).get("x509_pem_cert")
    return _agent_identity(pem[0]) if pem else None


_agent_identity = functools.lru_cache(maxsize=4096)(agent_identity)  # one parse per certificate, not per call
