"""Where the client finds its dispatcher: address and token.

Order: --config FILE, then $SLUICE_CONFIG, then ~/.config/sluice/client.yaml (which `sluice up` points
at its own data dir). $SLUICE_ADDRESS and $SLUICE_TOKEN override single fields.
"""
from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

import yaml


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class ClientConfig:
    address: str  # host:port of a dispatcher
    token: str
    timeout_s: float = 30.0  # per unary call


def default_path() -> pathlib.Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return pathlib.Path(base) / "sluice" / "client.yaml"


def write(path: pathlib.Path, address: str, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"address": address, "token": token}))
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


def load(path: str | os.PathLike | None = None) -> ClientConfig:
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
    return ClientConfig(str(address), str(token), float(data.get("timeout", 30.0)))
