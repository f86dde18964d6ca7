"""Where the client finds its dispatcher: address, token and how to trust it.

Order: --config FILE, then $SLUICE_CONFIG, then ~/.config/sluice/client.yaml (which `sluice up` points
at its own data dir). $SLUICE_ADDRESS, $SLUICE_TOKEN, $SLUICE_CA (or --ca) and $SLUICE_INSECURE=1 override
single fields.

The dispatcher is reached over TLS and verified against `ca` (a PEM file; a relative path is taken from
the config file's directory, as kubeconfig does) or, without one, the system's trusted roots. `insecure:
true` is plaintext, to loopback addresses only (sluice.transport).
"""
from __future__ import annotations

import os
import pathlib
import re
from dataclasses import dataclass

import yaml

from sluice.documents import yaml_documents
from sluice.transport import Tls


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class ClientConfig:
    address: str  # host:port of a dispatcher
    token: str
    timeout_s: float = 30.0  # per unary call
    ca: str | None = None  # PEM file of the CA the dispatcher's certificate is checked against; None: system roots
    insecure: bool = False  # plaintext (loopback only)

    @property
    def tls(self) -> Tls:
        return Tls(ca=self.ca, insecure=self.insecure)


def default_path() -> pathlib.Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return pathlib.Path(base) / "sluice" / "client.yaml"


def write(path: pathlib.Path, config: ClientConfig) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"address": config.address, "token": config.token} | ({"ca": config.ca} if config.ca else {}) \
        | ({"insecure": True} if config.insecure else {})
    path.write_text(yaml.safe_dump(data))
    path.chmod(0o600)


def make_default(path: pathlib.Path) -> None:
    """Point this user's default client config at `path` (a symlink, replaced atomically)."""
    link = default_path()
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(link.name + ".tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(path.resolve())
    tmp.replace(link)


def load(path: str | os.PathLike | None = None, *, ca: str | os.PathLike | None = None) -> ClientConfig:
    """The client config; `ca` (--ca) overrides the file's. ConfigError (one line naming the file) for anything
    unusable in it."""
    chosen = pathlib.Path(path or os.environ.get("SLUICE_CONFIG") or default_path())
    data: dict = {}
    if chosen.exists():
        try:
            documents = [d for d in yaml_documents(chosen.read_text()) if d is not None]
        except OSError as exc:
            raise ConfigError(f"{chosen}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{chosen}: not UTF-8 text") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{chosen}: not valid YAML: {' '.join(str(exc).split())}") from None
        data = documents[0] if len(documents) == 1 else {} if not documents else None
        if not isinstance(data, dict):
            raise ConfigError(f"{chosen}: expected a mapping with address and token")
    elif path or os.environ.get("SLUICE_CONFIG"):
        raise ConfigError(f"{chosen}: no such file")
    address = os.environ.get("SLUICE_ADDRESS") or data.get("address")
    token = os.environ.get("SLUICE_TOKEN") or data.get("token")
    if not address or not token:
        raise ConfigError(f"no dispatcher configured ({chosen} missing or incomplete): "
                          "start one with `sluice up`, or give --config / SLUICE_ADDRESS and SLUICE_TOKEN")
    if not printable(address):
        where = "SLUICE_ADDRESS" if os.environ.get("SLUICE_ADDRESS") else f"{chosen}: address"
        raise ConfigError(f"{where}: expected HOST:PORT, got {_shown(address)}")
    if not printable(token):
        where = "SLUICE_TOKEN" if os.environ.get("SLUICE_TOKEN") else f"{chosen}: token"
        raise ConfigError(f"{where}: expected one word of printable ASCII (as `sluice up` or an admin "
                          "gave it)")
    timeout = data.get("timeout", 30.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 1e9:
        raise ConfigError(f"{chosen}: timeout: expected a positive number of seconds, got {_shown(timeout)}")
    ca = ca or os.environ.get("SLUICE_CA")  # from the command line: relative to where it runs
    if not ca:
        ca = data.get("ca")
        if ca is not None and not isinstance(ca, str):
            raise ConfigError(f"{chosen}: ca: expected the path of a PEM file, got {_shown(ca)}")
        ca = _relative_to(chosen, ca)
    insecure = os.environ.get("SLUICE_INSECURE", "").lower() in ("1", "true") or data.get("insecure", False)
    if not isinstance(insecure, bool):
        raise ConfigError(f"{chosen}: insecure: expected true or false, got {_shown(insecure)}")
    return ClientConfig(address, token, float(timeout), ca=str(ca) if ca else None, insecure=insecure)


def _relative_to(config: pathlib.Path, ca: str | None) -> str | None:
    """A path in the config file, taken from the file's directory when relative (as kubeconfig does)."""
    if not ca:
        return None
    path = pathlib.Path(ca).expanduser()
    return str(path if path.is_absolute() else config.parent / path)


_PRINTABLE = re.compile(r"^[!-~]+$")


def printable(value: object) -> bool:
    """Whether value is one word of printable ASCII: what a gRPC target or metadata value (a token) can carry."""
    return isinstance(value, str) and _PRINTABLE.match(value) is not None


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else type(value).__name__
