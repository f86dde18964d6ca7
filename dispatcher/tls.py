"""The dispatcher's gRPC side of TLS: credentials that follow their files (sluice.serving.TlsFiles: rotation
without a restart), and what an agent's client certificate says on the agent port.
"""
from __future__ import annotations

import functools

import grpc

from sluice.certs import AgentIdentity, agent_identity
from sluice.serving import ServerTls, TlsError, TlsFiles


def grpc_credentials(tls: ServerTls, *, agents: bool = False) -> grpc.ServerCredentials:
    """Server credentials for a gRPC port. agents=True: the mTLS port, which requires a client certificate
    signed by tls.client_ca (gRPC either requires client certificates on a port or never asks for them)."""
    if agents and tls.client_ca is None:
        raise TlsError("an agent port needs a client CA (--client-ca)")
    files = TlsFiles(tls, with_ca=agents)

    def configuration() -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(files.key, files.cert)], root_certificates=files.ca)

    def fetch() -> grpc.ServerCertificateConfiguration | None:  # gRPC asks at every new handshake
        return configuration() if files.reload() else None

    return grpc.dynamic_ssl_server_credentials(configuration(), fetch, require_client_authentication=agents)


def agent_certificate(context: grpc.ServicerContext) -> AgentIdentity | None:
    """What the client certificate of an agent on the agent port says, or None.

    Only the agent port asks for client certificates, and gRPC hands over the peer's certificate only after
    verifying it against that port's client CA; elsewhere there is none to read."""
    pem = (context.auth_context() or {}).get("x509_pem_cert")
    return _agent_identity(pem[0]) if pem else None


_agent_identity = functools.lru_cache(maxsize=4096)(agent_identity)  # one parse per certificate, not per call
