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
from dataclasses import dataclass

import yaml

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
    """The config at `path` (or as the module's docstring says); `ca` (--ca) overrides the file's."""
    chosen = pathlib.Path(path or os.environ.get("SLUICE_CONFIG") or default_path())
    data: dict = {}
    if chosen.exists():
        try:
            data = yaml.safe_load(chosen.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{chosen}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{chosen}: expected a mapping with address and token")
    elif path or os.environ.get("SLUICE_CONFIG"):
        raise ConfigError(f"{chosen}: no such file")
    address = os.environ.get("SLUICE_ADDRESS") or data.get("address")
    token = os.environ.get("SLUICE_TOKEN") or data.get("token")
    if not address or not token:
        raise ConfigError(f"no dispatcher configured ({chosen} missing or incomplete): "
                          "start one with `sluice up`, or give --config / SLUICE_ADDRESS and SLUICE_TOKEN")
    ca = ca or os.environ.get("SLUICE_CA") or _relative_to(chosen, data.get("ca"))
    insecure = os.environ.get("SLUICE_INSECURE", "").lower() in ("1", "true") or data.get("insecure", False)
    if not isinstance(insecure, bool):
        raise ConfigError(f"{chosen}: insecure must be true or false")
    return ClientConfig(str(address), str(token), float(data.get("timeout", 30.0)), ca=str(ca) if ca else None,
                        insecure=insecure)


def _relative_to(config: pathlib.Path, ca) -> str | None:
    if not ca:
        return None
    path = pathlib.Path(str(ca)).expanduser()
    return str(path if path.is_absolute() else config.parent / path)
