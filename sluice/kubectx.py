"""`kubectl sluice`: what the plugin takes from kubectl's world, as pure functions over plain values.

- plugin_args: the kubectl flags of the plugin's arguments (`--kubeconfig`, `--context`, `-n/--namespace`,
  `-A/--all-namespaces`, and the plugin's own `--sluice-context` and `--verbose`), wherever they stand on the
  line, as kubectl users type them (`-n ml`, `-nml`, `-n=ml`, `--namespace=ml`), taken out of the arguments
  the `sluice` app parses. The server commands keep their arguments whole (`agent run` has a --kubeconfig
  and a --context of its own).
- kubeconfig_files and merge: the kubeconfig as kubectl reads it: `--kubeconfig FILE` (which must exist),
  else the files of $KUBECONFIG (':'-separated; missing files skipped), else ~/.kube/config; of several
  files the first to set `current-context` wins, and the first to define a context of a name keeps it whole.
  read_kubeconfig does the reading.
- kube_target: the Kubernetes context in effect and its namespace (`-n`, else the context's, else `default`).
- sluice_context: the Sluice client context a Kubernetes context selects: the one of the same name, if the
  Sluice config holds one (else None: the config's current context).
- namespace_queue: the queue a namespace maps to on the dispatcher's Cluster objects (their documents, as
  `sluice admin get clusters -o json` prints them): `spec.kubernetes.intake[NS].queues[0]` where NS is an
  intake namespace, else the queue Q whose `spec.kubernetes.namespaces[Q]` is NS, else the queue named
  like NS if there is one, else none. Clusters that disagree are an AmbiguousNamespace.

No kubernetes client (the CLI stays light: PyYAML reads the files) and no Sluice client: the caller
(sluice.cli.kubectl) reads the dispatcher.
"""
from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import yaml

DEFAULT_NAMESPACE = "default"  # kubectl's, for a context that names none
# The commands that run a server: their arguments pass through whole (their own --kubeconfig, --context, -v).
PASS_THROUGH = ("up", "demo", "dispatcher", "agent")
VALUE_FLAGS = {"--kubeconfig": "kubeconfig", "--context": "context", "--namespace": "namespace", "-n": "namespace",
               "--sluice-context": "sluice_context"}
BOOL_FLAGS = {"-A": "all_namespaces", "--all-namespaces": "all_namespaces", "--verbose": "verbose"}
ROOT_VALUE_OPTIONS = ("--config", "--ca")  # the `sluice` app's own options before the command that take a value
SLUICE_CONTEXT_OPTION = "--sluice-context"  # the app's --context (the Sluice context) when it runs as the plugin


class FlagError(Exception):
    """A kubectl flag without its value: a usage error."""


class KubeconfigError(Exception):
    """A kubeconfig that cannot be used (unreadable, not a kubeconfig, no such context): one line."""


class AmbiguousNamespace(Exception):
    """Clusters map the namespace to different queues."""


# -- the arguments ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class PluginArgs:
    args: list[str]  # what the `sluice` app parses
    kubeconfig: str | None = None
    context: str | None = None  # the Kubernetes context (--context)
    namespace: str | None = None  # -n/--namespace
    all_namespaces: bool = False
    sluice_context: str | None = None
    verbose: bool = False
    passed_through: bool = False  # a server command: nothing taken out


def _command(argv: list[str]) -> str | None:
    """The first word that is neither an option nor the value of one: the command."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[i + 1] if i + 1 < len(argv) else None
        if not arg.startswith("-") or arg == "-":
            return arg
        i += 2 if arg in ROOT_VALUE_OPTIONS or arg in VALUE_FLAGS else 1
    return None


def _flag(arg: str) -> tuple[str, str | None] | None:
    """(flag, value given in the same word or None) when `arg` is a kubectl flag of the plugin."""
    name, eq, value = arg.partition("=")
    if name in VALUE_FLAGS or name in BOOL_FLAGS:
        return name, value if eq else None
    if arg.startswith("-n") and not arg.startswith("--") and len(arg) > 2:  # -nml, as pflag reads it
        return "-n", arg[2:]
    return None


def plugin_args(argv: list[str]) -> PluginArgs:
    """The kubectl flags of `argv` taken out, wherever they stand (up to a `--`); the last of a flag given
    twice wins, as in kubectl. A server command's argv is left whole. FlagError for a flag without a value."""
    if _command(argv) in PASS_THROUGH:
        return PluginArgs(args=list(argv), passed_through=True)
    found: dict = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        flag = _flag(arg)
        if flag is None:
            rest.append(arg)
            i += 1
            continue
        name, value = flag
        if name in BOOL_FLAGS:
            if value is not None and value.lower() not in ("true", "false"):
                raise FlagError(f"{name}: expected true or false, got {value!r}")
            found[BOOL_FLAGS[name]] = value is None or value.lower() == "true"
            i += 1
            continue
        if value is None:
            if i + 1 == len(argv):
                raise FlagError(f"flag needs an argument: {name}")
            value = argv[i + 1]
            i += 2
        else:
            i += 1
        if not value:
            raise FlagError(f"flag needs a non-empty argument: {name}")
        found[VALUE_FLAGS[name]] = value
    sluice_context = found.get("sluice_context")
    args = [SLUICE_CONTEXT_OPTION, sluice_context, *rest] if sluice_context else rest
    return PluginArgs(args=args, **found)


# -- the kubeconfig --------------------------------------------------------------------------------

@dataclass(frozen=True)
class KubeConfig:
    files: tuple[str, ...] = ()  # those read, in order
    current_context: str | None = None
    contexts: dict[str, dict] = field(default_factory=dict)  # name: its `context` mapping (cluster, user, namespace)

    def where(self) -> str:
        return ", ".join(self.files) if self.files else "no kubeconfig file found"


def kubeconfig_files(flag: str | None, env: Mapping[str, str], home: str) -> tuple[list[str], bool]:
    """The kubeconfig files kubectl reads, in order, and whether they must exist: `--kubeconfig` (one, must
    exist), else $KUBECONFIG's (':'-separated, empty entries and repeats dropped, missing files skipped),
    else ~/.kube/config (skipped when missing)."""
    if flag:
        return [os.path.expanduser(flag)], True
    listed = env.get("KUBECONFIG", "")
    if listed:
        out: list[str] = []
        for entry in listed.split(os.pathsep):
            if entry and entry not in out:
                out.append(entry)
        if out:
            return out, False
    return [str(pathlib.Path(home) / ".kube" / "config")], False


def merge(documents: Iterable[tuple[str, object]]) -> KubeConfig:
    """The kubeconfig that files (path, parsed YAML, in order) make together, as kubectl merges them: the
    first file that sets `current-context` wins, and a context is taken whole from the first file that
    defines its name. An empty file adds nothing. KubeconfigError, naming the file, for what no kubeconfig
    holds."""
    files: list[str] = []
    current: str | None = None
    contexts: dict[str, dict] = {}
    for path, data in documents:
        files.append(path)
        if data is None:
            continue
        if not isinstance(data, dict):
            raise KubeconfigError(f"{path}: not a kubeconfig (expected a mapping with contexts)")
        value = data.get("current-context")
        if value is not None and not isinstance(value, str):
            raise KubeconfigError(f"{path}: current-context: expected a context's name")
        if value and current is None:
            current = value
        listed = data.get("contexts") or []
        if not isinstance(listed, list):
            raise KubeconfigError(f"{path}: contexts: expected a list")
        for n, item in enumerate(listed):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
                raise KubeconfigError(f"{path}: contexts[{n}]: expected a mapping with a name")
            context = item.get("context") or {}
            if not isinstance(context, dict):
                raise KubeconfigError(f"{path}: contexts[{n}] ({item['name']}): context: expected a mapping")
            namespace = context.get("namespace")
            if namespace is not None and not isinstance(namespace, str):
                raise KubeconfigError(f"{path}: contexts[{n}] ({item['name']}): namespace: expected a string")
            contexts.setdefault(item["name"], context)
    return KubeConfig(tuple(files), current, contexts)


def read_kubeconfig(flag: str | None = None, env: Mapping[str, str] | None = None,
                    home: str | None = None) -> KubeConfig:
    """The merged kubeconfig of the files kubectl would read (kubeconfig_files). KubeconfigError for a file
    `--kubeconfig` names that is missing, and for any file that cannot be read or parsed."""
    env = os.environ if env is None else env
    paths, required = kubeconfig_files(flag, env, home if home is not None else os.path.expanduser("~"))
    documents = []
    for path in paths:
        try:
            text = pathlib.Path(path).read_text()
        except FileNotFoundError:
            if required:
                raise KubeconfigError(f"--kubeconfig {path}: no such file") from None
            continue
        except OSError as exc:
            raise KubeconfigError(f"{path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise KubeconfigError(f"{path}: not UTF-8 text") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise KubeconfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
        documents.append((path, data))
    return merge(documents)


@dataclass(frozen=True)
class KubeTarget:
    context: str | None  # the Kubernetes context in effect; None: no kubeconfig names one
    namespace: str | None  # None: no context and no -n
    namespace_from: str = ""  # how it was chosen, for --verbose


def kube_target(config: KubeConfig, context_flag: str | None = None, namespace_flag: str | None = None) -> KubeTarget:
    """The Kubernetes context (`--context`, else `current-context`) and namespace (`-n`, else the context's,
    else `default`) in effect. Without any context and without -n there is no namespace. KubeconfigError for
    a context the kubeconfig does not define."""
    name = context_flag or config.current_context
    if name is not None and name not in config.contexts:
        said = f"--context {name}" if context_flag else f"current-context {name!r}"
        known = ", ".join(sorted(config.contexts)) or "none"
        raise KubeconfigError(f"{said}: no such context in the kubeconfig ({config.where()}; contexts: {known})")
    if namespace_flag:
        return KubeTarget(name, namespace_flag, "-n/--namespace")
    if name is None:
        return KubeTarget(None, None, "no Kubernetes context")
    namespace = config.contexts[name].get("namespace")
    if namespace:
        return KubeTarget(name, namespace, f"the namespace of Kubernetes context {name}")
    return KubeTarget(name, DEFAULT_NAMESPACE, f"Kubernetes context {name} names none: {DEFAULT_NAMESPACE}")


# -- what it selects in Sluice ---------------------------------------------------------------------

def sluice_context(kube_context: str | None, sluice_contexts: Iterable[str]) -> str | None:
    """The Sluice context of the same name as the Kubernetes context, if the Sluice config holds one; None
    otherwise (the Sluice config's current context is used)."""
    if kube_context is not None and kube_context in set(sluice_contexts):
        return kube_context
    return None


@dataclass(frozen=True)
class Mapped:
    queue: str | None  # None: the namespace maps to no queue
    why: str  # for --verbose


def _kubernetes(document: object) -> tuple[str, dict]:
    """(name, spec.kubernetes) of a Cluster document, {} for what it does not hold."""
    if not isinstance(document, dict):
        return "?", {}
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    spec = document.get("spec") if isinstance(document.get("spec"), dict) else {}
    kubernetes = spec.get("kubernetes")
    return str(metadata.get("name", "?")), kubernetes if isinstance(kubernetes, dict) else {}


def _intake_queue(kubernetes: dict, namespace: str) -> str | None:
    """intake[namespace].queues[0], if the cluster takes Jobs in from that namespace and names a queue."""
    intake = kubernetes.get("intake")
    entry = intake.get(namespace) if isinstance(intake, dict) else None
    queues = entry.get("queues") if isinstance(entry, dict) else None
    if isinstance(queues, list) and queues and isinstance(queues[0], str) and queues[0]:
        return queues[0]
    return None


def _one(namespace: str, found: dict[str, list[str]], how: str) -> Mapped:
    """The single queue of `found` (queue: clusters), or AmbiguousNamespace naming them all."""
    if len(found) > 1:
        listed = "; ".join(f"{queue} ({how} of cluster{'s' if len(names) > 1 else ''} {', '.join(names)})"
                           for queue, names in sorted(found.items()))
        raise AmbiguousNamespace(f"namespace {namespace} maps to several queues: {listed}; name one with --queue")
    (queue, names), = found.items()
    return Mapped(queue, f"{how} of cluster{'s' if len(names) > 1 else ''} {', '.join(names)}")


def namespace_queue(namespace: str, clusters: Iterable[dict], queues: Iterable[str]) -> Mapped:
    """The queue the namespace maps to, by the Cluster documents `clusters` and the names of the queues that
    exist: an intake namespace's first queue (`spec.kubernetes.intake[NS].queues[0]`), else the queue whose
    jobs run in it (`spec.kubernetes.namespaces[Q] == NS`), else the queue of the namespace's name, else
    none. AmbiguousNamespace when clusters map it to different queues."""
    clusters = list(clusters)
    intake: dict[str, list[str]] = {}
    mapped: dict[str, list[str]] = {}
    for document in clusters:
        name, kubernetes = _kubernetes(document)
        queue = _intake_queue(kubernetes, namespace)
        if queue is not None:
            intake.setdefault(queue, []).append(name)
        namespaces = kubernetes.get("namespaces")
        for queue, target in (namespaces.items() if isinstance(namespaces, dict) else ()):
            if target == namespace and isinstance(queue, str):
                mapped.setdefault(queue, []).append(name)
    if intake:
        return _one(namespace, intake, "spec.kubernetes.intake")
    if mapped:
        return _one(namespace, mapped, "spec.kubernetes.namespaces")
    if namespace in set(queues):
        return Mapped(namespace, "no cluster maps the namespace; the queue of its name")
    return Mapped(None, "no cluster maps the namespace and no queue has its name")
