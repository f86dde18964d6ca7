"""deploy/: every kustomization and the Helm chart render, every object validates against the Kubernetes
schemas of one fixed version, the two renderings are the same objects, and the agent's RBAC is exactly
the least-privilege rules it needs.

Rendering is deploy/render.py (no kustomize or helm can be installed here from the package registries;
its docstring says what it implements). Where a kubectl with kustomize v4+ is on PATH, the renderer's
output is also checked against `kubectl kustomize`. Validation is `kubernetes-validate`, which ships its
schemas: nothing here touches the network.
"""
from __future__ import annotations

import importlib.util
import pathlib
import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "sluice"
KUBERNETES_VERSION = "1.32.0"  # the schemas every manifest is validated against (strict: no unknown fields)
IMAGE = re.compile(r"^ghcr\.io/sluice-io/sluice:[A-Za-z0-9_][A-Za-z0-9_.-]*$")

_spec = importlib.util.spec_from_file_location("sluice_deploy_render", DEPLOY / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)

KUSTOMIZATIONS = sorted(p.parent.relative_to(ROOT).as_posix() for p in DEPLOY.rglob("kustomization.yaml"))
# An install is the migration, the dispatcher and the agent of one overlay (docs/install.md's order).
OVERLAYS = ("kind", "production")
DEV_ONLY = "deploy/overlays/kind/postgres"  # the kind cluster's throw-away database: not in the chart


def install(overlay: str) -> list[dict]:
    base = DEPLOY / "overlays" / overlay
    return [*render.kustomize(base / "migration"), *render.kustomize(base), *render.kustomize(base / "agent")]


def helm(*values: pathlib.Path | str) -> list[dict]:
    return render.helm(CHART, [CHART / v if isinstance(v, str) else v for v in values],
                       release="sluice", namespace="sluice")


def key(obj: dict) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


@pytest.fixture(scope="module")
def namespace_values(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("values") / "create-namespaces.yaml"
    path.write_text("agent: {cluster: kind-sluice, createNamespaces: true}\n")
    return path


def helm_renderings(namespace_values: pathlib.Path) -> dict[str, list[dict]]:
    no_agent = namespace_values.with_name("no-agent.yaml")
    no_agent.write_text("agent: {enabled: false}\n")
    return {"kind": helm("ci/kind-values.yaml"), "production": helm("ci/production-values.yaml"),
            "create-namespaces": helm(namespace_values), "no-agent": helm(no_agent)}


def every_rendering(namespace_values: pathlib.Path) -> dict[str, list[dict]]:
    out = {f"kustomize {d}": render.kustomize(ROOT / d) for d in KUSTOMIZATIONS}
    out.update({f"helm {name}": objs for name, objs in helm_renderings(namespace_values).items()})
    return out


# -- rendering and validation -----------------------------------------------------------------------
def test_the_expected_kustomizations_exist():
    assert {"deploy/base/dispatcher", "deploy/base/migration", "deploy/base/agent",
            "deploy/base/agent-namespace-creation", "deploy/overlays/kind", "deploy/overlays/kind/migration",
            "deploy/overlays/kind/agent", DEV_ONLY, "deploy/overlays/production",
            "deploy/overlays/production/migration", "deploy/overlays/production/agent"} <= set(KUSTOMIZATIONS)


def test_every_manifest_validates(namespace_values):
    problems = []
    count = 0
    for source, objects in every_rendering(namespace_values).items():
        assert objects, f"{source} renders nothing"
        for obj in objects:
            count += 1
            try:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                problems.append(f"{source}: {'/'.join(key(obj))}: {'.'.join(map(str, exc.path))}: {exc.message}")
            except kubernetes_validate.utils.SchemaNotFoundError as exc:
                problems.append(f"{source}: {'/'.join(key(obj))}: {exc.message}")
    assert not problems, "\n".join(problems)
    assert count > 50


def test_no_secret_values_are_committed(namespace_values):
    for source, objects in every_rendering(namespace_values).items():
        assert not [o for o in objects if o["kind"] == "Secret"], f"{source} holds a Secret"
    # Only the two Secrets docs/install.md creates are referenced, with these keys.
    refs = set()
    for obj in install("kind") + install("production"):
        for pod in _pod_specs(obj):
            for container in pod["containers"]:
                for env in container.get("env", []):
                    if "secretKeyRef" in env.get("valueFrom", {}):
                        refs.add((env["valueFrom"]["secretKeyRef"]["name"], env["valueFrom"]["secretKeyRef"]["key"]))
            for volume in pod.get("volumes", []):
                if "secret" in volume:
                    refs.update((volume["secret"]["secretName"], i["key"]) for i in volume["secret"]["items"])
    assert refs == {("sluice-database", "database-url"), ("sluice-agent-token", "token")}


# -- kustomize and helm agree -----------------------------------------------------------------------
def _without_chart_metadata(obj: dict) -> dict:
    """Top-level labels and annotations differ by tool (helm.sh/chart, hooks); everything else must not."""
    out = yaml.safe_load(yaml.safe_dump(obj))
    out["metadata"].pop("labels", None)
    out["metadata"].pop("annotations", None)
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_helm_renders_the_same_objects_as_the_overlay(overlay):
    kustomized = {key(o): o for o in install(overlay)}
    helmed = {key(o): o for o in helm(f"ci/{overlay}-values.yaml")}
    assert sorted(helmed) == sorted(kustomized)
    for k, obj in kustomized.items():
        assert _without_chart_metadata(helmed[k]) == _without_chart_metadata(obj), f"{'/'.join(k)} differs"
        assert helmed[k]["metadata"]["labels"].items() >= obj["metadata"]["labels"].items(), k


def test_helm_default_values_render_the_production_kinds_and_names(namespace_values):
    cluster_only = namespace_values.with_name("cluster-only.yaml")
    cluster_only.write_text("agent: {cluster: prod-a}\n")  # agent.cluster has no default
    assert sorted(map(key, helm(cluster_only))) == sorted(map(key, install("production")))
    with pytest.raises(render.RenderError, match="agent.cluster"):
        helm()  # the chart refuses to render an agent without its cluster name


def test_namespace_creation_is_the_same_opt_in_in_both(namespace_values):
    extra = {key(o): o for o in helm(namespace_values)}
    for k in map(key, helm("ci/kind-values.yaml")):
        extra.pop(k)
    kustomized = {key(o): o for o in render.kustomize(DEPLOY / "base" / "agent-namespace-creation")}
    assert sorted(extra) == sorted(kustomized)
    for k, obj in kustomized.items():
        assert _without_chart_metadata(extra[k]) == _without_chart_metadata(obj)


def test_the_migration_runs_before_the_dispatcher_under_helm():
    job = next(o for o in helm("ci/kind-values.yaml") if o["kind"] == "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    # A pre-install hook runs before the chart's other objects exist: it must need none of them.
    pod = job["spec"]["template"]["spec"]
    assert "serviceAccountName" not in pod and pod["automountServiceAccountToken"] is False
    assert not [e for e in pod["containers"][0]["env"] if "configMapKeyRef" in e.get("valueFrom", {})]


# -- RBAC -------------------------------------------------------------------------------------------
AGENT_RULES = {
    "sluice-agent": {("", "nodes"): {"get", "list", "watch"},
                     ("", "pods"): {"list", "watch"},
                     ("", "namespaces"): {"get"}},
    "sluice-agent-workloads": {("", "pods"): {"create", "get", "list", "watch", "delete"},
                               ("batch", "jobs"): {"create", "get", "list", "watch", "delete"},
                               ("", "events"): {"list", "watch"}},
    "sluice-agent-namespaces": {("", "namespaces"): {"create"}},
}


def _rules(role: dict) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"{role['metadata']['name']}: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_rbac_is_exactly_the_least_privilege_rules(namespace_values):
    for source, objects in every_rendering(namespace_values).items():
        for obj in objects:
            if obj["kind"] in ("Role", "ClusterRole"):
                assert "*" not in yaml.safe_dump(obj["rules"]), f"{source}: a wildcard in {obj['metadata']['name']}"
                assert obj["kind"] == "ClusterRole" and obj["metadata"]["name"] in AGENT_RULES, source
                assert _rules(obj) == AGENT_RULES[obj["metadata"]["name"]], f"{source}: {obj['metadata']['name']}"
            if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
                assert obj["subjects"] == [{"kind": "ServiceAccount", "name": "sluice-agent", "namespace": "sluice"}]
                assert obj["roleRef"]["kind"] == "ClusterRole" and obj["roleRef"]["name"] in AGENT_RULES
                if obj["kind"] == "RoleBinding":  # per managed namespace: the workload rights only
                    assert obj["roleRef"]["name"] == "sluice-agent-workloads"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_by_default_the_agent_gets_pod_and_job_rights_only_in_its_namespaces(overlay):
    bindings = {(o["kind"], o["roleRef"]["name"]) for o in install(overlay) if o["kind"].endswith("Binding")}
    assert bindings == {("ClusterRoleBinding", "sluice-agent"), ("RoleBinding", "sluice-agent-workloads")}
    assert {o["kind"] for o in install(overlay) if "rules" in o} == {"ClusterRole"}
    assert not [o for o in install(overlay) if o["metadata"]["name"] == "sluice-agent-namespaces"]


# -- the objects fit together -----------------------------------------------------------------------
def _pod_specs(obj: dict) -> list[dict]:
    if obj["kind"] in ("Deployment", "Job"):
        return [obj["spec"]["template"]["spec"]]
    return []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_references_resolve_within_an_install(overlay):
    objects = install(overlay)
    if overlay == "kind":
        objects += render.kustomize(ROOT / DEV_ONLY)
    by_key = {key(o): o for o in objects}
    config_maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    pods = {o["metadata"]["name"]: o["spec"]["template"] for o in objects if o["kind"] == "Deployment"}
    for obj in objects:
        if obj["kind"] == "Deployment":
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items(), obj["metadata"]["name"]
        if obj["kind"] in ("Service", "PodDisruptionBudget"):
            selector = obj["spec"]["selector"] if obj["kind"] == "Service" else obj["spec"]["selector"]["matchLabels"]
            targets = [n for n, t in pods.items() if selector.items() <= t["metadata"]["labels"].items()]
            assert len(targets) == 1, f"{obj['kind']} {obj['metadata']['name']} selects {targets}"
            if obj["kind"] == "Service":
                ports = {p["name"] for c in pods[targets[0]]["spec"]["containers"] for p in c.get("ports", [])}
                assert {p["targetPort"] for p in obj["spec"]["ports"]} <= ports
        for pod in _pod_specs(obj):
            name = pod.get("serviceAccountName")
            assert name is None or name in accounts, name
            for container in pod["containers"]:
                if container["name"] != "postgres":
                    assert IMAGE.match(container["image"]), container["image"]
                    assert container["command"] == ["sluice"]
                env = {e["name"] for e in container.get("env", [])}
                for e in container.get("env", []):
                    ref = e.get("valueFrom", {}).get("configMapKeyRef")
                    if ref:
                        assert ref["key"] in config_maps[ref["name"]], ref
                for arg in container.get("args", []):
                    for var in re.findall(r"\$\(([A-Z_]+)\)", arg):
                        assert var in env, f"{container['name']}: $({var}) is not in its env"
                ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    spec = container.get(probe)
                    if spec and "grpc" in spec:
                        assert spec["grpc"]["port"] == ports["grpc"]
                    if spec and "httpGet" in spec:
                        assert spec["httpGet"]["port"] in ports
                for port_name, number in ports.items():  # the ConfigMap's listen addresses use the same ports
                    listen = {"grpc": "SLUICE_LISTEN", "metrics": "SLUICE_METRICS_LISTEN"}
                    if container["name"] == "agent":
                        listen = {"metrics": "SLUICE_AGENT_METRICS_LISTEN"}
                    if port_name in listen:
                        cm = next(r["valueFrom"]["configMapKeyRef"]["name"] for r in container["env"]
                                  if r["name"] == listen[port_name])
                        assert config_maps[cm][listen[port_name]] == f"0.0.0.0:{number}"
    dispatcher = by_key[("Deployment", "sluice", "sluice-dispatcher")]
    assert dispatcher["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["dispatcher", "serve"]
    agent = by_key[("Deployment", "sluice", "sluice-agent")]
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["agent", "run", "--backend", "kubernetes"]
    assert args[args.index("--token-file") + 1] == "/var/run/sluice/token"
    assert agent["spec"]["replicas"] == 1 and agent["spec"]["strategy"]["type"] == "Recreate"
    assert config_maps["sluice-agent"]["SLUICE_DISPATCHER"] == "sluice-dispatcher.sluice.svc:7070"


def test_overlays_set_replicas_image_and_resources():
    def dispatcher(overlay):
        return next(o for o in install(overlay) if o["metadata"]["name"] == "sluice-dispatcher"
                    and o["kind"] == "Deployment")
    base = render.kustomize(DEPLOY / "base" / "dispatcher")
    assert next(o for o in base if o["kind"] == "Deployment")["spec"]["replicas"] == 2
    assert dispatcher("kind")["spec"]["replicas"] == 1
    assert dispatcher("production")["spec"]["replicas"] == 3
    for overlay, tag in (("kind", "dev"), ("production", "0.1.0")):
        images = {c["image"] for o in install(overlay) for p in _pod_specs(o) for c in p["containers"]}
        assert images == {f"ghcr.io/sluice-io/sluice:{tag}"}
    assert dispatcher("production")["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"


# -- the renderer -----------------------------------------------------------------------------------
def _kubectl_kustomize() -> str | None:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return None
    try:
        out = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"Kustomize Version: v(\d+)", out)
    return kubectl if match and int(match.group(1)) >= 4 else None


@pytest.mark.skipif(_kubectl_kustomize() is None, reason="no kubectl with kustomize v4+ on PATH")
@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_the_renderer_matches_kubectl_kustomize(directory):
    done = subprocess.run([_kubectl_kustomize(), "kustomize", str(ROOT / directory)], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    theirs = {key(o): o for o in yaml.safe_load_all(done.stdout) if o}
    assert {key(o): o for o in render.kustomize(ROOT / directory)} == theirs


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(render.RenderError, match="namePrefix"):
        render.kustomize(tmp_path)
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("a: 1\n")
    (chart / "templates" / "x.yaml").write_text("x: {{ .Values.a | upper }}\n")
    with pytest.raises(render.RenderError, match="upper"):
        render.helm(chart)
    (chart / "templates" / "x.yaml").write_text("x: {{ .Values.b }}\n")
    with pytest.raises(render.RenderError, match="no field 'b'"):
        render.helm(chart)


def test_go_template_trimming_and_blocks(tmp_path):
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\nappVersion: '2'\n")
    (chart / "values.yaml").write_text("enabled: true\nnames: [a, b]\nres: {cpu: 1}\ntag: ''\n")
    (chart / "templates" / "_h.tpl").write_text('{{- define "l" -}}\nk: {{ .Release.Name }}\n{{- end }}\n')
    (chart / "templates" / "x.yaml").write_text(
        "{{- if .Values.enabled }}\nkind: X\nmetadata:\n  labels:\n    {{- include \"l\" . | nindent 4 }}\n"
        "tag: {{ .Values.tag | default .Chart.AppVersion | quote }}\nres:\n  {{- toYaml .Values.res | nindent 2 }}\n"
        "names:\n{{- range .Values.names }}\n- {{ $.Release.Namespace }}-{{ . }}\n{{- end }}\n{{- end }}\n")
    assert render.helm(chart, release="r", namespace="n") == [
        {"kind": "X", "metadata": {"labels": {"k": "r"}}, "tag": "2", "res": {"cpu": 1}, "names": ["n-a", "n-b"]}]


# -- docs/install.md and the other files it uses ----------------------------------------------------
def test_install_guide_matches_the_manifests():
    text = (ROOT / "docs" / "install.md").read_text()
    for path in re.findall(r"-k (deploy/[\w/.-]*\w)", text):
        assert (ROOT / path / "kustomization.yaml").is_file(), path
    for path in re.findall(r"-f (deploy/[\w/.-]+\.yaml)", text):
        assert (ROOT / path).is_file(), path
    for needle in ("secret generic sluice-database", "--from-literal=database-url=",
                   "secret generic sluice-agent-token", "--from-file=token=", "job/sluice-migrate",
                   "deploy/sluice-dispatcher", "svc/sluice-dispatcher", "--cluster kind-sluice", "sluice-jobs",
                   "postgresql://sluice@sluice-postgres:5432/sluice", "ghcr.io/sluice-io/sluice:dev",
                   "helm install sluice deploy/helm/sluice", "not run here"):
        assert needle in text, needle
    kind = {key(o): o for o in install("kind")}
    assert kind[("ConfigMap", "sluice", "sluice-agent")]["data"]["SLUICE_CLUSTER"] == "kind-sluice"
    assert ("RoleBinding", "sluice-jobs", "sluice-agent") in kind
    postgres = {key(o) for o in render.kustomize(ROOT / DEV_ONLY)}
    assert ("Service", "sluice", "sluice-postgres") in postgres


def test_the_example_objects_and_job_load():
    from sluice.objects import load_objects
    from sluice.spec import load_jobs
    objects = load_objects((DEPLOY / "examples" / "kind-objects.yaml").read_text())
    cluster = next(o for o in objects if o.kind == "Cluster")
    assert cluster.name == "kind-sluice" and cluster.kubernetes["namespaces"] == {"default": "sluice-jobs"}
    assert [j.queue for j in load_jobs((DEPLOY / "examples" / "hello-job.yaml").read_text())] == ["default"]


def test_the_dockerfile_builds_the_image_the_manifests_run():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.MULTILINE)
    assert "pip install ." in text
    assert re.search(r"^USER 10001:10001$", text, re.MULTILINE)  # runAsUser/runAsGroup in every Sluice pod
    assert 'ENTRYPOINT ["sluice"]' in text
