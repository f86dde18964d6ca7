"""Write the CustomResourceDefinitions of sluice/crds.py (what `sluice admin crds` prints) into deploy/:

- deploy/base/crds/sluice.io_<plural>.yaml, one per kind: the kustomize base (`kubectl apply -k deploy/base/crds`),
  whose kustomization.yaml lists them;
- deploy/helm/sluice/templates/crds.yaml: the chart's, rendered with `crds.enabled=true`, the same definitions
  with the chart's labels and `helm.sh/resource-policy: keep` (uninstalling the chart must not delete every
  object of the four kinds with them).

Neither kustomize nor Helm can run Python, so the definitions are written out here; sluice/crds.py (and the
models of sluice/objects.py it reads) is the source: edit it, then run

    python deploy/sync_crds.py

tests/unit/test_deploy.py fails while the files differ from what this writes.
"""
from __future__ import annotations

import pathlib
import re
import sys

DEPLOY = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DEPLOY.parent))  # the repository's sluice, also when it is not installed

from sluice import crds  # noqa: E402

BASE = DEPLOY / "base" / "crds"
TEMPLATE = DEPLOY / "helm" / "sluice" / "templates" / "crds.yaml"
GENERATED = "# Written by deploy/sync_crds.py from sluice/crds.py: edit that, not this file.\n"


def base_path(definition: dict) -> pathlib.Path:
    return BASE / f"{crds.GROUP}_{definition['spec']['names']['plural']}.yaml"


def _helm_escaped(text: str) -> str:
    return re.sub(r"\{\{|\}\}", lambda m: '{{ "' + m.group(0) + '" }}', text)


def template_text() -> str:
    """The chart's template: each definition with the chart's labels, kept by Helm on uninstall."""
    documents = []
    for definition in crds.crds():
        head = (f"apiVersion: {definition['apiVersion']}\nkind: {definition['kind']}\nmetadata:\n"
                f"  name: {definition['metadata']['name']}\n  labels:\n"
                '    {{- include "sluice.labels" . | nindent 4 }}\n'
                "  annotations:\n    helm.sh/resource-policy: keep\n")
        documents.append(head + _helm_escaped(crds.manifests_yaml([{"spec": definition["spec"]}])))
    return ("{{- if .Values.crds.enabled }}\n" + GENERATED
            + "# Sluice's admin objects as Kubernetes resources, for the management cluster (crds.enabled).\n"
            + "---\n".join(documents) + "{{- end }}\n")


def files() -> dict[pathlib.Path, str]:
    """Every file this writes, and its text."""
    out = {base_path(d): GENERATED + crds.manifests_yaml([d]) for d in crds.crds()}
    out[TEMPLATE] = template_text()
    return out


def main() -> None:
    for path, text in files().items():
        path.write_text(text)
    for stale in set(BASE.glob(f"{crds.GROUP}_*.yaml")) - set(files()):
        stale.unlink()


if __name__ == "__main__":
    main()
