"""deploy/monitoring/alerts.yaml: promtool accepts the rules and passes their unit tests
(deploy/monitoring/alerts_test.yaml); every alert carries what a responder needs, its runbook is a heading of
docs/operations.md, and the unit tests show each alert both firing and not firing.

The PrometheusRule of the chart and of deploy/components/monitoring carry the same groups:
tests/unit/test_deploy.py checks that.
"""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "monitoring" / "alerts.yaml"
TESTS = ROOT / "deploy" / "monitoring" / "alerts_test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
PROMTOOL = shutil.which("promtool") or ("/usr/bin/promtool" if pathlib.Path("/usr/bin/promtool").exists() else None)
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install "
                                                             "prometheus); the rules are not checked by it")

# The situations docs/operations.md describes, and how urgent each is.
SEVERITIES = {
    "SluiceNoSchedulingLeader": "critical",
    "SluiceClusterUnreachable": "warning",
    "SluiceClusterCapacityStale": "warning",
    "SluiceQueueStarved": "warning",
    "SluiceBurstBudgetNearlySpent": "warning",
    "SluiceOutboxBacklogGrowing": "warning",
    "SluiceSubmitErrors": "warning",
    "SluiceDispatcherDatabaseDown": "critical",
}

# The labels each alert keeps from its expression, which its description names (the leader and the submit
# alerts aggregate them all away).
LABELS = {
    "SluiceClusterUnreachable": ("cluster",),
    "SluiceClusterCapacityStale": ("cluster", "source"),
    "SluiceQueueStarved": ("queue",),
    "SluiceBurstBudgetNearlySpent": ("policy", "queue", "budget"),
    "SluiceOutboxBacklogGrowing": ("cluster",),
    "SluiceDispatcherDatabaseDown": ("instance",),
}


def alerts() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert [g["name"] for g in groups] == ["sluice"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def promtool(*args: str) -> None:
    done = subprocess.run([PROMTOOL, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"promtool {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"


@needs_promtool
def test_promtool_accepts_the_rules():
    promtool("check", "rules", str(RULES.relative_to(ROOT)))


@needs_promtool
def test_the_rules_pass_their_promtool_unit_tests():
    promtool("test", "rules", str(TESTS.relative_to(ROOT)))


def test_the_expected_alerts_with_their_severities():
    assert {a["alert"]: a["labels"]["severity"] for a in alerts()} == SEVERITIES


def test_every_alert_carries_what_a_responder_needs():
    for alert in alerts():
        name = alert["alert"]
        assert set(alert) == {"alert", "expr", "for", "labels", "annotations"}, name
        assert re.fullmatch(r"\d+[smh]", alert["for"]), name
        assert alert["labels"]["severity"] in ("critical", "warning"), name
        assert set(alert["annotations"]) == {"summary", "description", "runbook"}, name
        assert all(str(v).strip() for v in alert["annotations"].values()), name
        runbook = alert["annotations"]["runbook"]
        assert runbook == f"docs/operations.md#{name.lower()}", name  # in the repository, not a URL
        for label in LABELS.get(name, ()):
            assert f"$labels.{label}" in alert["annotations"]["description"], f"{name}: {label}"


def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_runbook_is_a_heading_of_docs_operations_md():
    text = OPERATIONS.read_text()
    anchors = {_github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}
    assert "alerts" in anchors
    for alert in alerts():
        path, _, anchor = alert["annotations"]["runbook"].partition("#")
        assert (ROOT / path).resolve() == OPERATIONS, alert["alert"]
        assert anchor in anchors, f"{alert['alert']}: no heading for #{anchor} in docs/operations.md"
        assert f"### {alert['alert']}\n" in text, alert["alert"]


def test_every_alert_is_tested_firing_and_not_firing():
    spec = yaml.safe_load(TESTS.read_text())
    assert spec["rule_files"] == [RULES.name]  # relative to the test file
    firing, quiet = set(), set()
    for test in spec["tests"]:
        for case in test.get("alert_rule_test", []):
            expected = case.get("exp_alerts") or []
            (firing if expected else quiet).add(case["alertname"])
            for alert in expected:  # a firing case checks the labels and the annotations
                assert alert["exp_labels"]["severity"] == SEVERITIES[case["alertname"]], test["name"]
                assert set(alert["exp_annotations"]) == {"summary", "description", "runbook"}, test["name"]
    names = {a["alert"] for a in alerts()}
    assert not names - firing, f"never tested firing: {sorted(names - firing)}"
    assert not names - quiet, f"never tested not firing: {sorted(names - quiet)}"
    assert firing | quiet <= names, f"tests of alerts that do not exist: {sorted((firing | quiet) - names)}"


def test_the_anchor_function_follows_github():
    assert _github_anchor("SluiceNoSchedulingLeader") == "sluicenoschedulingleader"
    assert _github_anchor("How to: load the rules") == "how-to-load-the-rules"
