"""The cluster's pod policy: which pod templates the kubernetes agent refuses to create.

Pure: a template and the cluster's settings in, a list of violations out (empty: allowed). The agent
checks every pod set of an attempt before it creates anything, so a refused attempt leaves no object
behind. What is checked, and the Cluster field that allows it:

- `securityContext.privileged: true` on any container, init container or ephemeral container
  (`podPolicy.allowPrivileged`);
- a `hostPath` volume (`podPolicy.allowHostPath`);
- `hostNetwork: true` (`podPolicy.allowHostNetwork`);
- `hostPID: true`, and `hostIPC: true`, the same kind of host namespace (`podPolicy.allowHostPID`);
- `metadata.namespace` naming any namespace but the one the job's queue maps to (never allowed);
- `serviceAccountName` (or the deprecated `serviceAccount`) other than `default` and the names in
  `podPolicy.serviceAccounts`.
"""
from __future__ import annotations

from agent.backends.kubernetes.settings import ClusterSettings

_CONTAINER_GROUPS = ("initContainers", "containers", "ephemeralContainers")


def as_dict(value: object) -> dict:
    """A mapping from a user's template as it is; anything else as an empty one (left for the API server)."""
    return value if isinstance(value, dict) else {}


def as_list(value: object) -> list:
    """A list from a user's template as it is; anything else as an empty one (left for the API server)."""
    return value if isinstance(value, list) else []


def violations(template: dict, namespace: str, cluster: ClusterSettings) -> list[str]:
    """What in this pod template the cluster's policy forbids, one phrase each (empty: allowed)."""
    metadata = as_dict(template.get("metadata"))
    spec = as_dict(template.get("spec"))
    found: list[str] = []
    asked = metadata.get("namespace")
    if asked not in (None, "", namespace):
        found.append(f"namespace {asked!r} (this job's queue runs in namespace {namespace!r})")
    if not cluster.allow_privileged:
        for group in _CONTAINER_GROUPS:
            for container in as_list(spec.get(group)):
                context = as_dict(as_dict(container).get("securityContext"))
                if context.get("privileged") is True:
                    found.append(f"privileged container {as_dict(container).get('name', '?')!r} "
                                 "(podPolicy.allowPrivileged is false)")
    if not cluster.allow_host_path:
        for volume in as_list(spec.get("volumes")):
            if as_dict(volume).get("hostPath") is not None:
                found.append(f"hostPath volume {as_dict(volume).get('name', '?')!r} (podPolicy.allowHostPath is false)")
    if spec.get("hostNetwork") is True and not cluster.allow_host_network:
        found.append("hostNetwork (podPolicy.allowHostNetwork is false)")
    if not cluster.allow_host_pid:
        for key in ("hostPID", "hostIPC"):
            if spec.get(key) is True:
                found.append(f"{key} (podPolicy.allowHostPID is false)")
    for key in ("serviceAccountName", "serviceAccount"):
        account = spec.get(key)
        if account not in (None, "", "default") and account not in cluster.service_accounts:
            allowed = ", ".join(cluster.service_accounts) or "none besides default"
            found.append(f"service account {account!r} (podPolicy.serviceAccounts: {allowed})")
            break
    return found
