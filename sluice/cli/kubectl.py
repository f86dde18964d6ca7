"""`kubectl sluice ...`: the `sluice` app run as a kubectl plugin (the `kubectl-sluice` console script).

kubectl passes the plugin's arguments through unchanged and sets nothing else, so the plugin reads the
kubeconfig itself (sluice.kubectx: the flags, the merge of the files, the rules). As the plugin:
- `--context`, `--kubeconfig`, `-n/--namespace` and `-A/--all-namespaces` are kubectl's, anywhere on the
  line; the Sluice context is chosen by `--sluice-context NAME` (or $SLUICE_CONTEXT), else the Sluice
  context named like the Kubernetes context, else the Sluice config's current one;
- `submit` and `list` without a queue use the namespace's queue (kubectx.namespace_queue), read from the
  dispatcher's Cluster objects: an admin reads them; a user may not, and then gets the usual default
  (`--verbose` says so);
- `--verbose` prints on stderr what the plugin chose and why.

The kubeconfig is read only by the commands that reach a dispatcher, when they do: `kubectl sluice --help`
needs none. Like the rest of the CLI, no grpc and no kubernetes client at import time.
"""
from __future__ import annotations

import os
import sys

from sluice import kubectx
from sluice.cli.common import Failed, call

PROG = "kubectl sluice"
EPILOG = ("As a kubectl plugin it also takes, anywhere on the line: --kubeconfig FILE, --context NAME (the "
          "Kubernetes context), -n/--namespace NS (submit and list without --queue use the queue it maps to), "
          "-A/--all-namespaces (list every queue), --sluice-context NAME (the Sluice context; default: the one "
          "named like the Kubernetes context, else the current one), --verbose (say what was chosen and why).")


class Plugin:
    """What one `kubectl sluice` command line took from kubectl's world, read when first needed."""

    def __init__(self, parsed: kubectx.PluginArgs, env: dict | None = None):
        self.parsed = parsed
        self.env = os.environ if env is None else env
        self._target: kubectx.KubeTarget | None = None
        self._queue: tuple[str | None] | None = None
        self._said: set[str] = set()

    def note(self, text: str) -> None:
        """One line on stderr with --verbose (once each)."""
        if self.parsed.verbose and text not in self._said:
            self._said.add(text)
            print(f"{PROG}: {text}", file=sys.stderr)

    def target(self, what: str) -> kubectx.KubeTarget:
        """The Kubernetes context and namespace in effect; a kubeconfig it cannot use fails the command."""
        if self._target is None:
            try:
                config = kubectx.read_kubeconfig(self.parsed.kubeconfig, self.env)
                self._target = kubectx.kube_target(config, self.parsed.context, self.parsed.namespace)
            except kubectx.KubeconfigError as exc:
                raise Failed(what, f"kubeconfig: {exc}") from None
            self.note(f"Kubernetes context {self._target.context or '(none)'} ({config.where()}), "
                      f"namespace {self._target.namespace or '(none)'} ({self._target.namespace_from})")
        return self._target

    def sluice_context(self, what: str, config_option) -> str | None:
        """The Sluice context the Kubernetes context selects, when no --sluice-context or $SLUICE_CONTEXT
        named one: the Sluice context of its name, else None (the config's current context)."""
        from sluice.config import ConfigError, chosen_path, read
        target = self.target(what)
        path = chosen_path(config_option)
        try:
            names = read(path).names
        except ConfigError:
            return None  # loading the config says what is wrong with it
        chosen = kubectx.sluice_context(target.context, names)
        if chosen is not None:
            self.note(f"Sluice context {chosen}: named like the Kubernetes context ({path})")
        else:
            self.note(f"Sluice context: the current one of {path} (none is named like the Kubernetes context)")
        return chosen

    def queue(self, what: str, client) -> str | None:
        """The queue the namespace maps to, for a command given none; None for the usual default (no
        namespace, -A, no mapping, or Cluster objects this token may not read)."""
        if self._queue is None:
            self._queue = (self._mapped(what, client),)
        return self._queue[0]

    def _mapped(self, what: str, client) -> str | None:
        if self.parsed.all_namespaces:
            self.note("all namespaces (-A): no queue chosen")
            return None
        namespace = self.target(what).namespace
        if namespace is None:
            return None
        clusters = call(what, lambda: _clusters(client))
        if clusters is None:
            self.note(f"namespace {namespace}: this token may not read the Cluster objects (an admin's may), so "
                      "the namespace maps to no queue here: the usual default applies")
            return None
        queues = [queue["name"] for queue in call(what, client.queues)]
        try:
            mapped = kubectx.namespace_queue(namespace, clusters, queues)
        except kubectx.AmbiguousNamespace as exc:
            raise Failed(what, str(exc)) from None
        self.note(f"namespace {namespace}: queue {mapped.queue} ({mapped.why})" if mapped.queue
                  else f"namespace {namespace}: {mapped.why}: the usual default applies")
        return mapped.queue


def _clusters(client) -> list[dict] | None:
    """The Cluster documents, or None when the token may not read them (a user's)."""
    from sluice.client import ClientError
    try:
        return client.get_objects("Cluster")
    except ClientError as exc:
        if exc.code == "PERMISSION_DENIED":
            return None
        raise
