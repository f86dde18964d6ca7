"""Copy the rule groups of deploy/monitoring/alerts.yaml into the two PrometheusRule manifests that carry them:

- deploy/components/monitoring/prometheusrule.yaml (the kustomize component), and
- deploy/helm/sluice/templates/dispatcher-prometheusrule.yaml (the chart, monitoring.prometheusRule.enabled),
  where every `{{` and `}}` of the rules' own templates is escaped as {{ "{{" }} and {{ "}}" }} so that Helm
  prints them for Prometheus instead of running them.

Neither kustomize nor Helm can include a file from outside its own directory, so the groups are written in
both; alerts.yaml is the source (its comments say what each threshold is): edit it, then run

    python deploy/monitoring/sync.py

tests/unit/test_deploy.py checks that both render exactly alerts.yaml's groups.
"""
from __future__ import annotations

import pathlib
import re

import yaml

DEPLOY = pathlib.Path(__file__).resolve().parents[1]
RULES = DEPLOY / "monitoring" / "alerts.yaml"
COMPONENT = DEPLOY / "components" / "monitoring" / "prometheusrule.yaml"
TEMPLATE = DEPLOY / "helm" / "sluice" / "templates" / "dispatcher-prometheusrule.yaml"
GENERATED = "# Written by deploy/monitoring/sync.py from deploy/monitoring/alerts.yaml: edit that file, not this one.\n"

COMPONENT_HEAD = GENERATED + """\
# The dispatcher's alert rules as a prometheus-operator PrometheusRule (deploy/components/monitoring).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: sluice-dispatcher
  namespace: sluice
  labels:
    app.kubernetes.io/name: sluice
    app.kubernetes.io/instance: sluice
    app.kubernetes.io/part-of: sluice
    app.kubernetes.io/component: dispatcher
"""

TEMPLATE_HEAD = """\
{{- if .Values.monitoring.prometheusRule.enabled }}
""" + GENERATED + """\
# The dispatcher's alert rules as a prometheus-operator PrometheusRule (monitoring.prometheusRule.enabled).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: {{ .Release.Name }}-dispatcher
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
    app.kubernetes.io/component: dispatcher
    {{- with .Values.monitoring.prometheusRule.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the longer expressions) as literal blocks, as alerts.yaml writes them."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _string)


def spec_text() -> str:
    """`spec:` with alerts.yaml's groups, as YAML text."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return yaml.dump({"spec": {"groups": groups}}, Dumper=_Dumper, sort_keys=False, width=120,
                     default_flow_style=False)


def helm_escaped(text: str) -> str:
    return re.sub(r"\{\{|\}\}", lambda m: '{{ "' + m.group(0) + '" }}', text)


def main() -> None:
    spec = spec_text()
    COMPONENT.write_text(COMPONENT_HEAD + spec)
    TEMPLATE.write_text(TEMPLATE_HEAD + helm_escaped(spec) + "{{- end }}\n")


if __name__ == "__main__":
    main()
