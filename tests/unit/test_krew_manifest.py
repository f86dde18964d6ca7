"""deploy/krew/sluice.yaml: a krew plugin manifest krew's own validation would take (the rules of krew's
internal/index/validation: apiVersion, kind, a safe name equal to the file's, a semantic version, a one-line
short description, platforms each with uri, a sha256 of 64 lowercase hex digits, bin, and a selector on os
and arch only), naming the launcher beside it, which runs the same entry point as the `kubectl-sluice`
console script."""
from __future__ import annotations

import io
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
KREW = ROOT / "deploy" / "krew"
MANIFEST = KREW / "sluice.yaml"
SEMVER = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")


def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def test_the_manifest_has_what_krew_requires():
    plugin = manifest()
    assert plugin["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2" and plugin["kind"] == "Plugin"
    name = plugin["metadata"]["name"]
    assert name == MANIFEST.stem == "sluice" and re.fullmatch(r"[\w-]+", name)
    spec = plugin["spec"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert SEMVER.match(spec["version"]) and spec["version"] == f"v{project['version']}"
    assert spec["shortDescription"] and not set(spec["shortDescription"]) & {"\r", "\n"}
    assert spec["description"].strip() and spec["caveats"].strip()
    assert spec["platforms"]
    for platform in spec["platforms"]:
        assert platform["uri"].startswith("https://") and platform["uri"].endswith((".tar.gz", ".zip"))
        assert re.fullmatch(r"[a-f0-9]{64}", platform["sha256"])
        selector = platform["selector"]
        keys = [*selector.get("matchLabels", {}), *(e["key"] for e in selector.get("matchExpressions", []))]
        assert keys and set(keys) <= {"os", "arch"}
        assert "files" not in platform or all(f.get("from") and f.get("to") for f in platform["files"])
        # the console script's name: what a pip install puts on PATH, and the launcher a release archives
        assert platform["bin"] == "kubectl-sluice" and "kubectl-sluice" in project["scripts"]
    assert "windows" not in MANIFEST.read_text()  # krew runs only .exe entry points on Windows


def test_a_release_archive_of_the_launcher_holds_the_bin():
    """What the manifest's comment says a release builds: the archive's top holds `bin`, executable."""
    launcher = KREW / "kubectl-sluice"
    assert os.access(launcher, os.X_OK)
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as archive:
        archive.add(launcher, arcname="kubectl-sluice")
    with tarfile.open(fileobj=io.BytesIO(data.getvalue())) as archive:
        member = archive.getmember(manifest()["spec"]["platforms"][0]["bin"])
        assert member.mode & 0o111


def test_the_launcher_runs_the_plugin_entry_point(tmp_path):
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["kubectl-sluice"]
    module, function = entry.split(":")
    assert f"from {module} import {function}; {function}()" in (KREW / "kubectl-sluice").read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    done = subprocess.run([str(KREW / "kubectl-sluice"), "list", "--help"], capture_output=True, text=True,
                          timeout=60, env={**env, "SLUICE_PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
                                           "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "Usage: kubectl sluice list" in done.stdout
