"""`sluice admin` as an admin runs it: each command a subprocess against an in-process dispatcher,
pointed at it with SLUICE_ADDRESS and SLUICE_TOKEN; output and exit codes as docs/api.md promises."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.integration.test_admin import TREE, dispatcher  # noqa: F401  (the fixture)
from tests.integration.test_cli import base_env, ok, one_error_line, run_sluice


@pytest.fixture
def env(dispatcher, tmp_path):  # noqa: F811
    return {**base_env(tmp_path), "SLUICE_ADDRESS": dispatcher.address, "SLUICE_TOKEN": dispatcher.admin_token,
            "SLUICE_INSECURE": "1"}


def admin(env, *args, input=None):
    return run_sluice(env, "admin", *args, input=input)


def test_apply_dry_run_prints_the_diff_and_changes_nothing(env, tmp_path):
    path = tmp_path / "tree.yaml"
    path.write_text(TREE)
    out = ok(admin(env, "apply", "-f", str(path), "--dry-run"))
    assert out.startswith("ServiceClass/gold: created\n--- /dev/null\n+++ ServiceClass/gold\n"), out
    assert "\nQueue/research: created\n" in out and "\nQueue/cv: created\n" in out
    assert "+  parent: research\n" in out and "+    nvidia.com/gpu: '8'\n" in out
    assert out.endswith("dry run: nothing was changed\n")
    assert [q["metadata"]["name"] for q in json.loads(ok(admin(env, "get", "queues", "-o", "json")))] == ["default"]

    assert ok(admin(env, "apply", "-f", str(path))) == \
        "ServiceClass/gold: created\nQueue/research: created\nQueue/cv: created\n"
    path.write_text(TREE.replace('cpu: "32"', 'cpu: "16"'))
    out = ok(admin(env, "apply", "-f", "-", "--dry-run", input=path.read_text()))
    assert out == ("ServiceClass/gold: unchanged\nQueue/research: unchanged\nQueue/cv: updated\n"
                   "--- Queue/cv\n+++ Queue/cv\n@@ -5,7 +5,7 @@\n spec:\n   parent: research\n   guaranteed:\n"
                   "-    cpu: '32'\n+    cpu: '16'\n     nvidia.com/gpu: '4'\n   max: {}\n   weight: 1.0\n"
                   "dry run: nothing was changed\n"), out


def test_get_prints_stored_documents(env):
    ok(admin(env, "apply", "-f", "-", input=TREE))
    cv = json.loads(ok(admin(env, "get", "queue", "cv", "-o", "json")))
    assert cv == {"apiVersion": "sluice.io/v1", "kind": "Queue", "metadata": {"name": "cv"},
                  "spec": {"parent": "research", "guaranteed": {"cpu": "32", "nvidia.com/gpu": "4"}, "max": {},
                           "weight": 1.0, "members": [], "serviceClasses": []}}
    shown = ok(admin(env, "get", "Queues", "cv", "-o", "yaml"))
    assert yaml.safe_load(shown) == cv
    assert shown.startswith("apiVersion: sluice.io/v1\nkind: Queue\nmetadata:\n  name: cv\nspec:\n  parent: research\n")
    names = [d["metadata"]["name"] for d in json.loads(ok(admin(env, "get", "classes", "-o", "json")))]
    assert names == ["gold", "standard"]
    table = ok(admin(env, "get", "queues")).splitlines()
    assert table[0].split() == ["NAME", "PARENT", "GUARANTEED", "MAX", "WEIGHT", "MEMBERS", "SERVICECLASSES"]
    assert table[1].split() == ["cv", "research", "cpu=32,nvidia.com/gpu=4", "-", "1.0", "-", "-"]
    assert one_error_line(admin(env, "get", "queue", "nope")) == "error: admin get queue nope: queue 'nope' not found"
    usage = admin(env, "get", "tenants")
    assert one_error_line(usage, code=2).startswith("error: sluice admin get: ") and "unknown kind 'tenants'" in \
        usage.stderr


def test_an_invalid_file_is_one_error_line_and_changes_nothing(env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TREE.replace("guaranteed: {cpu: \"32\"", "guaranteed: {cpu: \"-32\""))
    line = one_error_line(admin(env, "apply", "-f", str(bad)))
    assert line == f"error: admin apply {bad}: document 3: spec.guaranteed.cpu: '-32' is not a quantity " \
                   "(examples: '500m', '2', '32Gi', '1.5')", line
    bad.write_text(TREE.replace('nvidia.com/gpu: "4"', 'nvidia.com/gpu: "16"'))  # valid alone, not with its parent
    line = one_error_line(admin(env, "apply", "-f", str(bad), "--dry-run"))
    assert line == f"error: admin apply {bad}: document 3: queue cv: spec.guaranteed.nvidia.com/gpu 16 exceeds its " \
                   "parent research's guaranteed 8", line
    assert [q["metadata"]["name"] for q in json.loads(ok(admin(env, "get", "queues", "-o", "json")))] == ["default"]
    assert json.loads(ok(admin(env, "audit", "-o", "json"))) == []


def test_quota_set(env):
    ok(admin(env, "apply", "-f", "-", input=TREE))
    out = ok(admin(env, "quota", "set", "cv", "--cpu", "8", "--memory", "32Gi", "--gpu", "2",
                   "--resource", "example.com/fpga=1", "--max-cpu", "16", "--max-gpu", "4"))
    assert out == ("Queue/cv: updated\n  guaranteed: cpu=8, example.com/fpga=1, memory=32Gi, nvidia.com/gpu=2\n"
                   "  max: cpu=16, nvidia.com/gpu=4\n"), out
    assert ok(admin(env, "quota", "set", "cv", "--memory", "", "--max-resource", "nvidia.com/gpu=")) == \
        "Queue/cv: updated\n  guaranteed: cpu=8, example.com/fpga=1, nvidia.com/gpu=2\n  max: cpu=16\n"
    spec = json.loads(ok(admin(env, "get", "queue", "cv", "-o", "json")))["spec"]
    assert spec["guaranteed"] == {"cpu": "8", "example.com/fpga": "1", "nvidia.com/gpu": "2"}
    assert spec["max"] == {"cpu": "16"}
    assert one_error_line(admin(env, "quota", "set", "cv", "--gpu", "9")) == \
        "error: admin quota set cv: queue cv: spec.guaranteed.nvidia.com/gpu 9 exceeds its parent research's " \
        "guaranteed 8"
    assert one_error_line(admin(env, "quota", "set", "cv"), code=2).startswith(
        "error: sluice admin quota set: Invalid value: give at least one of --cpu")
    assert admin(env, "quota", "set", "cv", "--resource", "fpga").returncode == 2
    audit = json.loads(ok(admin(env, "audit", "-o", "json")))
    assert [(r["actor"], r["action"], r["name"]) for r in audit[-2:]] == [("root", "quota-set", "cv")] * 2


def test_tokens_members_and_cluster_states(env, dispatcher):  # noqa: F811
    secret = ok(admin(env, "token", "create", "--role", "user", "--subject", "alice", "--expires", "30d")).strip()
    assert secret.startswith("sl_") and "\n" not in secret
    tokens = json.loads(ok(admin(env, "token", "list", "-o", "json")))
    alice = next(t for t in tokens if t["subject"] == "alice")
    assert alice["role"] == "user" and alice["expiresAt"] and alice["revokedAt"] is None
    assert admin(env, "token", "create", "--role", "agent", "--subject", "a").returncode == 2
    assert ok(admin(env, "queue", "add-member", "default", "alice")) == "Queue/default: updated\n  members: alice\n"
    assert ok(admin(env, "cluster", "cordon", "alpha")) == "Cluster/alpha: cordoned (was active)\n"
    assert ok(admin(env, "cluster", "uncordon", "alpha")) == "Cluster/alpha: active (was cordoned)\n"
    assert ok(admin(env, "token", "revoke", str(alice["id"]))) == f"token {alice['id']}: revoked\n"
    as_alice = {**env, "SLUICE_TOKEN": secret}
    assert one_error_line(run_sluice(as_alice, "list")) == "error: list: invalid, expired or revoked token"
    as_user = {**env, "SLUICE_TOKEN": ok(admin(env, "token", "create", "--role", "user", "--subject", "bob")).strip()}
    assert one_error_line(admin(as_user, "audit")) == "error: admin audit: bob (user) may not call this; needs admin"
    table = ok(admin(env, "audit")).splitlines()
    assert table[0].split() == ["ID", "AT", "ACTOR", "ACTION", "KIND", "NAME"]
    assert [line.split()[3] for line in table[1:]] == ["create", "add-member", "cordon", "uncordon", "revoke", "create"]
