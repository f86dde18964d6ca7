"""Where the client finds its dispatcher: address, token and how to trust it, possibly among several.

Order: --config FILE, then $SLUICE_CONFIG, then ~/.config/sluice/client.yaml (which `sluice up` points
at its own data dir). $SLUICE_ADDRESS, $SLUICE_TOKEN, $SLUICE_CA (or --ca) and $SLUICE_INSECURE=1 override
single fields of the dispatcher chosen.

A file holds one dispatcher (`address`, `token` or `tokenFile`, `ca`, `insecure`, `timeout` at the top,
read as the context named `default`), or several, as kubeconfig does: `contexts`, a list of those fields
each with a `name`, and `current-context`, the one used unless --context or $SLUICE_CONTEXT names another.
A file of one context and no `current-context` uses that context. The `sluice config` commands edit it;
each change is checked whole before the file is replaced (atomically, mode 0600: it holds tokens).

The dispatcher is reached over TLS and verified against `ca` (a PEM file; a relative path, like
`tokenFile`'s, is taken from the config file's directory, as kubeconfig does) or, without one, the
system's trusted roots. `insecure: true` is plaintext, to loopback addresses only (sluice.transport).
"""
from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from sluice.documents import yaml_documents
from sluice.transport import Tls

DEFAULT_CONTEXT = "default"  # the name of the dispatcher of a file without contexts
UP_CONTEXT = "up"  # the context `sluice up` points at itself in a file of contexts
CONTEXTS_KEYS = ("current-context", "contexts")  # the top of a file of contexts


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


@dataclass(frozen=True)
class ConfigFile:
    """A client config file as read: its contexts (mappings of a dispatcher's fields and `name`, in file order) and the
    current one. A file of one dispatcher reads as the one context `default`, current."""
    path: pathlib.Path
    contexts: tuple[dict, ...] = ()
    current: str | None = None  # `current-context`
    single: bool = False  # one dispatcher, written without contexts
    exists: bool = False

    @property
    def names(self) -> list[str]:
        return [c["name"] for c in self.contexts]

    def find(self, name: str) -> dict | None:
        return next((c for c in self.contexts if c["name"] == name), None)

    def chosen(self) -> str | None:
        """The context used when none is named: the current one, or the only one."""
        if self.current is not None:
            return self.current
        return self.names[0] if len(self.contexts) == 1 else None

    def unknown(self, name: str) -> ConfigError:
        return ConfigError(f"no context {name!r} in {self.path}; contexts: {', '.join(self.names) or '(none)'}")


def default_path() -> pathlib.Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return pathlib.Path(base) / "sluice" / "client.yaml"


def chosen_path(path: str | os.PathLike | None = None) -> pathlib.Path:
    """The file the client reads: `path` (--config), else $SLUICE_CONFIG, else the default."""
    return pathlib.Path(path or os.environ.get("SLUICE_CONFIG") or default_path())


def read(path: pathlib.Path) -> ConfigFile:
    """The file's contexts; an absent file holds none. ConfigError (one line naming the file) for anything
    unusable in its layout; the fields of each dispatcher are checked when it is used (load)."""
    if not path.exists():  # a symlink to a data dir since deleted too
        return ConfigFile(path)
    try:
        documents = [d for d in yaml_documents(path.read_text()) if d is not None]
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    data = documents[0] if len(documents) == 1 else {} if not documents else None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with address and token, or with contexts")
    if "contexts" not in data and "current-context" not in data:
        single = {"name": DEFAULT_CONTEXT, **data} if data else None
        return ConfigFile(path, (single,) if single else (), DEFAULT_CONTEXT if single else None,
                          single=bool(single), exists=True)
    extra = [str(k) for k in data if k not in CONTEXTS_KEYS]
    if extra:
        raise ConfigError(f"{path}: {', '.join(extra)}: not expected beside contexts (a file of contexts holds "
                          "current-context and contexts; each context its own address and token)")
    contexts = data.get("contexts") or []
    if not isinstance(contexts, list):
        raise ConfigError(f"{path}: contexts: expected a list of mappings, each with a name, got {_shown(contexts)}")
    seen: set[str] = set()
    for n, context in enumerate(contexts):
        if not isinstance(context, dict) or not isinstance(context.get("name"), str) or not context["name"]:
            raise ConfigError(f"{path}: contexts[{n}]: expected a mapping with a name, got {_shown(context)}")
        if context["name"] in seen:
            raise ConfigError(f"{path}: contexts: {context['name']!r} is named twice")
        seen.add(context["name"])
    current = data.get("current-context")
    if current is not None and not isinstance(current, str):
        raise ConfigError(f"{path}: current-context: expected a context's name, got {_shown(current)}")
    return ConfigFile(path, tuple(contexts), current or None, exists=True)


def load(path: str | os.PathLike | None = None, *, ca: str | os.PathLike | None = None,
         context: str | None = None) -> ClientConfig:
    """The client config of the context named `context` (--context), else $SLUICE_CONTEXT, else the file's
    current one; `ca` (--ca) overrides its CA. ConfigError (one line naming the file) for anything unusable."""
    chosen = chosen_path(path)
    if (path or os.environ.get("SLUICE_CONFIG")) and not chosen.exists():
        raise ConfigError(f"{chosen}: no such file")
    found = read(chosen)
    name = context or os.environ.get("SLUICE_CONTEXT") or None
    if name is not None:
        data = found.find(name)
        if data is None:
            raise found.unknown(name)
    elif found.chosen() is not None:
        name = found.chosen()
        data = found.find(name)
        if data is None:
            raise ConfigError(f"{chosen}: current-context {name!r} is not among its contexts "
                              f"({', '.join(found.names) or 'none'}); pick one with `sluice config use-context NAME`")
    elif found.contexts:
        raise ConfigError(f"{chosen}: {len(found.contexts)} contexts and no current-context; pick one with "
                          "`sluice config use-context NAME` or --context NAME")
    else:
        data = {}
    named = not found.single and bool(found.contexts)
    where = f"{chosen}: context {name!r}" if named else str(chosen)
    return _client_config(data, chosen, where, ca, name if named else None, os.environ)


def _client_config(data: dict, chosen: pathlib.Path, where: str, ca, context: str | None,
                   env: Mapping[str, str]) -> ClientConfig:
    """The dispatcher that `data` (a context, or a file of one: `context` None) describes, with the overrides
    of `env` ($SLUICE_ADDRESS and the like)."""
    address = env.get("SLUICE_ADDRESS") or data.get("address")
    token = env.get("SLUICE_TOKEN") or data.get("token")
    if not token and data.get("tokenFile") is not None:
        token = _token_from_file(chosen, where, data["tokenFile"])
    if (not address or not token) and context is not None:
        what, fix = ("address", "--address HOST:PORT") if not address else ("token", "--token or --token-file")
        raise ConfigError(f"{where}: has no {what}; give it with `sluice config set-context {context} {fix}`")
    if not address or not token:
        raise ConfigError(f"no dispatcher configured ({chosen} missing or incomplete): "
                          "start one with `sluice up`, or give --config / SLUICE_ADDRESS and SLUICE_TOKEN")
    if not printable(address):
        where_address = "SLUICE_ADDRESS" if env.get("SLUICE_ADDRESS") else f"{where}: address"
        raise ConfigError(f"{where_address}: expected HOST:PORT, got {_shown(address)}")
    if not printable(token):
        where_token = "SLUICE_TOKEN" if env.get("SLUICE_TOKEN") else f"{where}: token"
        raise ConfigError(f"{where_token}: expected one word of printable ASCII (as `sluice up` or an admin "
                          "gave it)")
    timeout = data.get("timeout", 30.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 1e9:
        raise ConfigError(f"{where}: timeout: expected a positive number of seconds, got {_shown(timeout)}")
    ca = ca or env.get("SLUICE_CA")  # from the command line: relative to where it runs
    if not ca:
        ca = data.get("ca")
        if ca is not None and not isinstance(ca, str):
            raise ConfigError(f"{where}: ca: expected the path of a PEM file, got {_shown(ca)}")
        ca = _relative_to(chosen, ca)
    insecure = env.get("SLUICE_INSECURE", "").lower() in ("1", "true") or data.get("insecure", False)
    if not isinstance(insecure, bool):
        raise ConfigError(f"{where}: insecure: expected true or false, got {_shown(insecure)}")
    return ClientConfig(address, token, float(timeout), ca=str(ca) if ca else None, insecure=insecure)


def _token_from_file(chosen: pathlib.Path, where: str, token_file) -> str:
    if not isinstance(token_file, str) or not token_file:
        raise ConfigError(f"{where}: tokenFile: expected the path of a file holding the token, "
                          f"got {_shown(token_file)}")
    path = _relative_to(chosen, token_file)
    try:
        token = pathlib.Path(path).read_bytes().decode("ascii").strip()
    except OSError as exc:
        raise ConfigError(f"{where}: tokenFile: {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        token = ""
    if not printable(token):
        raise ConfigError(f"{where}: tokenFile: {path}: expected one word of printable ASCII (a token)")
    return token


def _relative_to(config: pathlib.Path, ca: str | None) -> str | None:
    """A path in the config file, taken from the file's directory when relative (as kubeconfig does)."""
    if not ca:
        return None
    path = pathlib.Path(ca).expanduser()
    return str(path if path.is_absolute() else config.parent / path)


# -- writing -----------------------------------------------------------------------------------------

def write(path: pathlib.Path, config: ClientConfig) -> None:
    """A file of one dispatcher (what `sluice up` writes into its data dir)."""
    _replace(path, _fields(config))


def _fields(config: ClientConfig) -> dict:
    return {"address": config.address, "token": config.token} | ({"ca": config.ca} if config.ca else {}) \
        | ({"insecure": True} if config.insecure else {})


def make_default(path: pathlib.Path) -> None:
    """Make the dispatcher of `path` (a file of one) this user's default. A default file of contexts keeps
    them: `path`'s dispatcher becomes its current context (the one already there with the same fields, else
    the context `up`, added or updated). Otherwise the default becomes a symlink to `path`, replaced
    atomically."""
    link = default_path()
    if link.is_file() and not link.is_symlink():
        try:
            found = read(link)
        except ConfigError:
            found = None  # unreadable as a client config: replaced, as before contexts existed
        if found is not None and not found.single and found.contexts:
            mine = {**read(path).contexts[0], "name": UP_CONTEXT}
            same = next((c for c in found.contexts if {**c, "name": UP_CONTEXT} == mine), None)
            if same is None:
                _write_contexts(link, _upserted(found.contexts, mine), UP_CONTEXT)
            elif found.current != same["name"]:
                _write_contexts(link, list(found.contexts), same["name"])
            return
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(link.name + ".tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(path.resolve())
    tmp.replace(link)


def set_context(path: pathlib.Path, name: str, *, address: str | None = None, token: str | None = None,
                token_file: str | None = None, ca: str | None = None, insecure: bool | None = None) -> bool:
    """Create the context `name`, or update the fields given of the one there; whether it was created. A file
    of one dispatcher becomes a file of contexts, that dispatcher the context `default`, still current; a
    file without a current context gets this one. `token` and `token_file` replace each other. Nothing is
    written unless the whole context is usable."""
    if not printable(name):
        raise ConfigError(f"context name: expected one word of printable ASCII, got {_shown(name)}")
    if token is not None and token_file is not None:
        raise ConfigError("give --token or --token-file, not both")
    found = read(path)
    old = found.find(name)
    context = dict(old or {"name": name})
    if address is not None:
        context["address"] = address
    if token is not None:
        context["token"] = token
        context.pop("tokenFile", None)
    if token_file is not None:
        context["tokenFile"] = token_file
        context.pop("token", None)
    if ca is not None:
        context["ca"] = ca
    if insecure is not None:
        context.pop("insecure", None)
        if insecure:
            context["insecure"] = True
    where = f"{path}: context {name!r}"
    if not context.get("address"):
        raise ConfigError(f"{where}: needs an address: give --address HOST:PORT")
    if not context.get("token") and not context.get("tokenFile"):
        raise ConfigError(f"{where}: needs a token: give --token TOKEN or --token-file FILE")
    for option, value in (("--ca", ca), ("--token-file", token_file)):
        if value is not None and not pathlib.Path(_relative_to(path, value)).is_file():
            raise ConfigError(f"{option} {value}: no such file")
    _client_config(context, path, where, None, name, {})  # usable as written, whatever the environment says
    _write_contexts(path, _upserted(found.contexts, context), found.chosen() or name)
    return old is None


def use_context(path: pathlib.Path, name: str) -> None:
    """Make `name` the current context."""
    found = read(path)
    if found.find(name) is None:
        raise found.unknown(name)
    if found.single or found.current == name:
        return
    _write_contexts(path, list(found.contexts), name)


def delete_context(path: pathlib.Path, name: str) -> None:
    """Remove the context `name`; not the current one (switch first: a command would otherwise find none)."""
    found = read(path)
    if found.find(name) is None:
        raise found.unknown(name)
    if found.chosen() == name:
        others = [n for n in found.names if n != name]
        hint = f"switch first with `sluice config use-context {others[0]}`" if others else "it is the only one"
        raise ConfigError(f"{path}: context {name!r} is the current context; {hint}")
    _write_contexts(path, [c for c in found.contexts if c["name"] != name], found.current)


def _upserted(contexts, context: dict) -> list[dict]:
    """`contexts` with `context` in the place of the one of its name, or added last."""
    if any(c["name"] == context["name"] for c in contexts):
        return [context if c["name"] == context["name"] else c for c in contexts]
    return [*contexts, context]


ORDER = ("name", "address", "token", "tokenFile", "ca", "insecure", "timeout")  # of a context's keys, written


def _write_contexts(path: pathlib.Path, contexts: list[dict], current: str | None) -> None:
    def ordered(context: dict) -> dict:
        return {k: context[k] for k in ORDER if k in context} | {k: v for k, v in context.items() if k not in ORDER}
    _replace(path, ({"current-context": current} if current else {}) | {"contexts": [ordered(c) for c in contexts]})


def _replace(path: pathlib.Path, data: dict) -> None:
    """Write `data` to `path` as YAML, mode 0600 from the start, by renaming a file written beside it: a
    reader sees the old file or the new one, and a symlink at `path` is replaced, not written through."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if path.parent.exists() and not path.parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{path.parent} is not a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(yaml.safe_dump(data, sort_keys=False))
        os.chmod(tmp, 0o600)  # O_CREAT's mode applies to a new file only
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None


_PRINTABLE = re.compile(r"^[!-~]+$")


def printable(value: object) -> bool:
    """Whether value is one word of printable ASCII: what a gRPC target or metadata value (a token) can carry."""
    return isinstance(value, str) and _PRINTABLE.match(value) is not None


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else type(value).__name__
