"""`kubectl sluice` as kubectl runs it: the `kubectl-sluice` console script (written as pip writes the one
pyproject.toml declares) in a subprocess, with a temporary kubeconfig ($KUBECONFIG, two files merged) and
Sluice config, against a real dispatcher (the `system` fixture). The Kubernetes context selects the Sluice
context of its name; its namespace selects the queue a Cluster object maps it to."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tomllib

import yaml

from tests.integration.test_cli import REPO, base_env, free_port, job_yaml

# What pip writes for a console script (its distlib template), from the entry point pyproject.toml declares.
SCRIPT = """#!{python}
import re
import sys
from {module} import {function}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({function}())
"""


def console_script(bin_dir) -> str:
    entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["kubectl-sluice"]
    module, function = entry.split(":")
    bin_dir.mkdir()
    path = bin_dir / "kubectl-sluice"
    path.write_text(SCRIPT.format(python=sys.executable, module=module, function=function))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def context(name: str, namespace: str | None = None) -> dict:
    return {"name": name, "context": {"cluster": name, "user": name, **({"namespace": namespace} if namespace else {})}}


def test_kubectl_sluice_submits_into_the_queue_the_namespace_maps_to(system, tmp_path):
    from sluice.admin_client import AdminClient

    settings = system.client_settings()
    with AdminClient(settings) as admin:
        admin.apply([{"apiVersion": "sluice.io/v1", "kind": "Queue", "metadata": {"name": "vision"}, "spec": {}}])
        onprem = admin.get_objects("Cluster", "onprem")[0]
        onprem["spec"]["kubernetes"]["namespaces"] = {"vision": "ml"}  # queue vision runs in namespace ml
        admin.apply([onprem])
        user_token = admin.create_token("user", "alice")["secret"]

    # The Sluice config: its current context leads nowhere; `kind-a` (named like the Kubernetes context) is
    # the real dispatcher as the admin, `as-alice` the same as a user.
    (tmp_path / "admin.token").write_text(settings.token + "\n")
    config = tmp_path / "client.yaml"
    config.write_text(yaml.safe_dump({"current-context": "nowhere", "contexts": [
        {"name": "nowhere", "address": f"127.0.0.1:{free_port()}", "token": "sl_nothing"},
        {"name": "kind-a", "address": settings.address, "tokenFile": str(tmp_path / "admin.token"),
         "ca": settings.ca},
        {"name": "as-alice", "address": settings.address, "token": user_token, "ca": settings.ca}]}))
    # Two kubeconfig files, merged as kubectl merges them: the first sets the current context.
    (tmp_path / "kube-1").write_text(yaml.safe_dump({"current-context": "kind-a",
                                                     "contexts": [context("kind-a", "ml")]}))
    (tmp_path / "kube-2").write_text(yaml.safe_dump({"current-context": "kind-b",
                                                     "contexts": [context("kind-a", "other"), context("kind-b")]}))
    env = {**base_env(tmp_path), "PYTHONPATH": str(REPO), "SLUICE_CONFIG": str(config),
           "KUBECONFIG": os.pathsep.join(str(tmp_path / f"kube-{n}") for n in (1, 2))}
    plugin = console_script(tmp_path / "bin")
    job = tmp_path / "job.yaml"
    job.write_text(job_yaml(name="mapped", queue_line=""))  # names no queue

    def kubectl_sluice(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([plugin, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)

    done = kubectl_sluice("submit", "-f", str(job), "--verbose")
    assert done.returncode == 0, done.stderr
    mapped = int(done.stdout)
    assert "Sluice context kind-a: named like the Kubernetes context" in done.stderr
    assert "namespace ml: queue vision (spec.kubernetes.namespaces of cluster onprem)" in done.stderr
    done = kubectl_sluice("get", str(mapped), "-o", "json")
    assert done.returncode == 0 and json.loads(done.stdout)["queue"] == "vision", done.stderr

    # -n after the command, as kubectl users type it: the namespace `default` maps to no queue, and the
    # queue of its name exists.
    done = kubectl_sluice("submit", "-f", str(job), "-n", "default")
    assert done.returncode == 0, done.stderr
    other = int(done.stdout)
    assert json.loads(kubectl_sluice("get", str(other), "-o", "json").stdout)["queue"] == "default"

    listed = kubectl_sluice("list", "-o", "json")  # namespace ml: its queue's jobs only
    assert listed.returncode == 0 and [j["id"] for j in json.loads(listed.stdout)] == [mapped], listed.stderr
    listed = kubectl_sluice("-A", "list", "-o", "json")
    assert {j["id"] for j in json.loads(listed.stdout)} == {mapped, other}
    listed = kubectl_sluice("list", "--namespace=default", "-o", "json", "--context", "kind-a")
    assert [j["id"] for j in json.loads(listed.stdout)] == [other]

    # A Kubernetes context with no Sluice context of its name: the Sluice config's current one (nowhere).
    refused = kubectl_sluice("list", "--context", "kind-b")
    assert refused.returncode == 1 and refused.stderr.startswith("error: list: dispatcher unavailable"), refused.stderr

    # A user may not read the Cluster objects: the usual default, which for a submit is "name a queue".
    done = kubectl_sluice("submit", "-f", str(job), "--sluice-context", "as-alice", "--verbose")
    assert done.returncode == 1, done.stderr
    assert "may not read the Cluster objects" in done.stderr
    assert done.stderr.splitlines()[-1] == "error: submit " + str(job) + ": document 1: spec.queue: required " \
                                          "(or give --queue)"
    done = kubectl_sluice("submit", "-f", str(job), "--sluice-context", "as-alice", "--queue", "vision")
    assert done.returncode == 0, done.stderr

    # Two clusters that map the namespace to different queues: one line naming them.
    with AdminClient(settings) as admin:
        cloud = admin.get_objects("Cluster", "cloud")[0]
        cloud["spec"]["kubernetes"]["namespaces"] = {"default": "ml"}
        admin.apply([cloud])
    done = kubectl_sluice("submit", "-f", str(job))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr == (f"error: submit {job}: namespace ml maps to several queues: default "
                           "(spec.kubernetes.namespaces of cluster cloud); vision (spec.kubernetes.namespaces of "
                           "cluster onprem); name one with --queue\n")
    # ...and `sluice` itself is as it was: its --context is the Sluice context, no kubeconfig read.
    done = subprocess.run([sys.executable, "-m", "sluice", "--context", "kind-a", "list", "-o", "json"], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and len(json.loads(done.stdout)) == 3, done.stderr
