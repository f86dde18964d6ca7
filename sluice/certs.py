"""Certificates for Sluice's TLS: a CA, the dispatcher's server certificate, an agent's client certificate.

`sluice up` makes a local CA and a server certificate in its data dir on first start (as `cockroach cert`
or kind do); `sluice dispatcher certs` makes the same files for a real deployment; the tests make theirs
here too. All of it is the `cryptography` package's X.509 builder: ECDSA P-256 keys, SHA-256 signatures.

An agent's certificate binds it to its cluster: its subject common name is the cluster's name and it
carries the URI `sluice://cluster/<name>` as a subject alternative name, which the dispatcher reads
(dispatcher.tls.agent_certificate) instead of an agent token.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import pathlib
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CLUSTER_URI = "sluice://cluster/"  # + the cluster's name: an agent certificate's identity
CA_DAYS = 3650
LEAF_DAYS = 825  # the longest validity browsers and most TLS stacks accept for a leaf


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, PEM-encoded."""

    cert: bytes
    key: bytes

    def write(self, cert_path: pathlib.Path, key_path: pathlib.Path) -> None:
        """Write both (the key readable by its owner only), each replaced whole so a reader never sees half."""
        _write(cert_path, self.cert, 0o644)
        _write(key_path, self.key, 0o600)


def _write(path: pathlib.Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    tmp.replace(path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Sluice"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(common_name: str = "Sluice CA", days: int = CA_DAYS) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name(common_name)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _alt_name(value: str) -> x509.GeneralName:
    if value.startswith(CLUSTER_URI):
        return x509.UniformResourceIdentifier(value)
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        return x509.DNSName(value)


def _issue(ca: Issued, common_name: str, alt_names: list[str], usage: x509.ObjectIdentifier, days: float) -> Issued:
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectAlternativeName([_alt_name(n) for n in alt_names]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def make_server(ca: Issued, hosts: list[str], days: float = LEAF_DAYS) -> Issued:
    """The dispatcher's certificate for the DNS names and IP addresses clients and agents dial."""
    if not hosts:
        raise ValueError("a server certificate needs at least one host name or IP address")
    return _issue(ca, hosts[0], hosts, ExtendedKeyUsageOID.SERVER_AUTH, days)


def make_agent(ca: Issued, cluster: str, days: float = LEAF_DAYS) -> Issued:
    """A client certificate that authenticates an agent as the agent of `cluster` (mTLS)."""
    if not cluster:
        raise ValueError("an agent certificate needs its cluster's name")
    return _issue(ca, cluster, [CLUSTER_URI + cluster], ExtendedKeyUsageOID.CLIENT_AUTH, days)


@dataclass(frozen=True)
class AgentIdentity:
    """What an agent certificate says: its cluster (its `sluice://cluster/<name>` URI), its serial number
    (lowercase hex: how it is revoked, `sluice admin cert revoke`) and the end of its validity."""

    cluster: str
    serial: str
    not_after: datetime.datetime


def agent_identity(pem: bytes) -> AgentIdentity | None:
    """The identity an agent certificate (PEM) carries; None for any other certificate or for bytes that are
    not one."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.UniformResourceIdentifier)
    except (ValueError, x509.ExtensionNotFound):
        return None
    for uri in uris:
        if uri.startswith(CLUSTER_URI) and len(uri) > len(CLUSTER_URI):
            return AgentIdentity(uri[len(CLUSTER_URI):], format(cert.serial_number, "x"), cert.not_valid_after_utc)
    return None


def load(cert_path: pathlib.Path, key_path: pathlib.Path) -> Issued:
    return Issued(cert_path.read_bytes(), key_path.read_bytes())


def local_hosts() -> list[str]:
    """What a loopback dispatcher is dialled as."""
    return ["localhost", "127.0.0.1", "::1"]


def names_and_lasts(cert_pem: bytes, hosts: list[str], *, days: int) -> bool:
    """Whether the certificate names every one of `hosts` and stays valid at least `days` more days."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    named = {str(n.value) for n in alt}
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return all(str(_alt_name(h).value) in named for h in hosts) and left > datetime.timedelta(days=days)
