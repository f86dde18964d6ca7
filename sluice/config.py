"""Where the client finds its dispatcher: address and token.

Order: --config FILE, then $SLUICE_CONFIG, then ~/.config/sluice/client.yaml (which `sluice up` points
at its own data dir). $SLUICE_ADDRESS and $SLUICE_TOKEN override single fields.
"""
from __future__ import annotations

import os
import pathlib
import re
from dataclasses import dataclass

import yaml

from sluice.spec import yaml_documents


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
    """The client config; ConfigError (one line naming the file) for anything unusable in it."""
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
    return ClientConfig(address, token, float(timeout))


_PRINTABLE = re.compile(r"^[!-~]+$")


def printable(value: object) -> bool:
    """Whether value is one word of printable ASCII: what a gRPC target or metadata value (a token) can carry."""
    return isinstance(value, str) and _PRINTABLE.match(value) is not None


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else type(value).__name__
