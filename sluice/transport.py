"""How clients and agents reach a dispatcher: a gRPC channel over TLS, or plaintext to loopback only.

A bearer token sent in clear could be read by anyone on the path, so plaintext is used only when asked for
(`insecure`) and only to a loopback address; everything else is TLS, verified against the CA given (`ca`)
or the system's trusted roots. An agent may present a client certificate (`cert`, `key`) that binds it
to its cluster (docs/security.md).
"""
from __future__ import annotations

import ipaddress
import pathlib
from dataclasses import dataclass

import grpc


class TransportError(ValueError):
    """A TLS setting that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class Tls:
    ca: str | None = None  # PEM file of the CA that signed the dispatcher's certificate; None: the system's roots
    cert: str | None = None  # PEM client certificate (an agent's mTLS identity), with key
    key: str | None = None
    insecure: bool = False  # plaintext: loopback addresses only
    server_name: str | None = None  # the name to check the dispatcher's certificate for, if not the address's host


def host_of(address: str) -> str:
    if address.startswith(("ipv4:", "ipv6:", "dns:", "unix:")):
        address = address.split(":", 1)[1].lstrip("/")
        address = address.split(",", 1)[0]
    return address.rsplit(":", 1)[0].strip("[]") if ":" in address else address


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        data = pathlib.Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise TransportError(f"{what} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TransportError(f"{what} {path}: not a PEM file")
    return data


def channel(address: str, tls: Tls, options: list[tuple] | None = None) -> grpc.Channel:
    """A channel to `address` as `tls` says; raises TransportError for plaintext to a remote address or
    unreadable TLS files. The files are read here, at each new channel: a rotated certificate is used
    from the next connection on."""
    options = list(options or [])
    if tls.insecure:
        host = host_of(address)
        if not is_loopback_host(host):
            raise TransportError(f"plaintext (insecure) to {host} would send the token in clear; plaintext is "
                                 "for loopback addresses only: use TLS (ca) for a remote dispatcher")
        return grpc.insecure_channel(address, options=options)
    if bool(tls.cert) != bool(tls.key):
        raise TransportError("a client certificate needs both cert and key")
    credentials = grpc.ssl_channel_credentials(root_certificates=_read(tls.ca, "CA file"),
                                               private_key=_read(tls.key, "client key"),
                                               certificate_chain=_read(tls.cert, "client certificate"))
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.secure_channel(address, credentials, options=options)


PLAINTEXT = Tls(insecure=True)  # loopback only
