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
import os
import pathlib
import re
import shutil
import subprocess

import jsonschema
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
_spec = importlib.util.spec_from_file_location("sluice_deploy_sync_crds", DEPLOY / "sync_crds.py")
sync_crds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync_crds)

# Components (kind: Component) are rendered only through a kustomization that lists them.
COMPONENTS = ("deploy/components/agent-port", "deploy/components/agent-mtls", "deploy/components/monitoring")
AGENT_PORT, AGENT_MTLS, MONITORING = COMPONENTS
ALERTS = DEPLOY / "monitoring" / "alerts.yaml"  # the Prometheus rules the PrometheusRule carries
KUSTOMIZATIONS = sorted(set(p.parent.relative_to(ROOT).as_posix() for p in DEPLOY.rglob("kustomization.yaml"))
                        - set(COMPONENTS))
# An install is the migration, the dispatcher and the agent of one overlay (docs/install.md's order).
OVERLAYS = ("kind", "production")
DEV_ONLY = "deploy/overlays/kind/postgres"  # the kind cluster's throw-away database: not in the chart


def install(overlay: str) -> list[dict]:
    base = DEPLOY / "overlays" / overlay
    return [*render.kustomize(base / "migration"), *render.kustomize(base), *render.kustomize(base / "agent")]


def with_components(where: pathlib.Path, resource: str, components: tuple[str, ...]) -> pathlib.Path:
    """A kustomization in `where` of the repository's `resource` directory and `components`, as a user's
    overlay lists them (kustomize takes relative paths only)."""
    where.mkdir(parents=True, exist_ok=True)
    relative = [os.path.relpath(ROOT / d, where) for d in (resource, *components)]
    (where / "kustomization.yaml").write_text(yaml.safe_dump({"resources": relative[:1], "components": relative[1:]}))
    return where


def mtls_install(overlay: str, tmp_path: pathlib.Path) -> list[dict]:
    """install(overlay) with mTLS for agents: agent-port on the dispatcher, agent-mtls on the agent."""
    base = f"deploy/overlays/{overlay}"
    return [*render.kustomize(DEPLOY / "overlays" / overlay / "migration"),
            *render.kustomize(with_components(tmp_path / "dispatcher", base, (AGENT_PORT,))),
            *render.kustomize(with_components(tmp_path / "agent", f"{base}/agent", (AGENT_MTLS,)))]


def monitoring_install(overlay: str, tmp_path: pathlib.Path) -> list[dict]:
    """install(overlay) with the dispatcher's alert rules: the monitoring component on the dispatcher."""
    base = DEPLOY / "overlays" / overlay
    return [*render.kustomize(base / "migration"),
            *render.kustomize(with_components(tmp_path / "dispatcher", f"deploy/overlays/{overlay}", (MONITORING,))),
            *render.kustomize(base / "agent")]


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
    tmp = namespace_values.parent
    return {"kind": helm("ci/kind-values.yaml"), "production": helm("ci/production-values.yaml"),
            "create-namespaces": helm(namespace_values), "no-agent": helm(no_agent),
            "mtls": helm("ci/kind-values.yaml", _mtls_values(tmp)),
            "monitoring": helm("ci/production-values.yaml", _monitoring_values(tmp)),
            "cert-manager": helm("ci/production-values.yaml", _cert_manager_values(tmp), _mtls_values(tmp)),
            "crds": helm("ci/production-values.yaml", _crds_values(tmp)),
            "admin-objects": helm("ci/production-values.yaml", _admin_objects_values(tmp))}


def every_rendering(namespace_values: pathlib.Path) -> dict[str, list[dict]]:
    out = {f"kustomize {d}": render.kustomize(ROOT / d) for d in KUSTOMIZATIONS}
    out.update({f"kustomize {o} with mTLS": mtls_install(o, namespace_values.parent / f"mtls-{o}") for o in OVERLAYS})
    out.update({f"kustomize {o} with monitoring": monitoring_install(o, namespace_values.parent / f"monitoring-{o}")
                for o in OVERLAYS})
    out.update({f"helm {name}": objs for name, objs in helm_renderings(namespace_values).items()})
    return out


# -- rendering and validation -----------------------------------------------------------------------
def test_the_expected_kustomizations_exist():
    assert all((ROOT / c / "kustomization.yaml").is_file() for c in COMPONENTS)
    assert {"deploy/base/dispatcher", "deploy/base/migration", "deploy/base/agent", "deploy/base/crds",
            "deploy/base/agent-namespace-creation", "deploy/base/agent-admin-objects",
            "deploy/overlays/kind", "deploy/overlays/kind/migration",
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
                if obj["kind"] == "Certificate":  # a custom resource: no schema in kubernetes-validate
                    _validate_certificate(obj)
                    continue
                if obj["kind"] == "PrometheusRule":  # the same: kubernetes-validate has no schema for it. Its
                    continue  # spec is alerts.yaml's groups, promtool-checked (test_the_prometheus_rule_...)
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                problems.append(f"{source}: {'/'.join(key(obj))}: {'.'.join(map(str, exc.path))}: {exc.message}")
            except kubernetes_validate.utils.SchemaNotFoundError as exc:
                problems.append(f"{source}: {'/'.join(key(obj))}: {exc.message}")
            except jsonschema.ValidationError as exc:
                problems.append(f"{source}: {'/'.join(key(obj))}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert not problems, "\n".join(problems)
    assert count > 50


def test_no_secret_values_are_committed(namespace_values):
    for source, objects in every_rendering(namespace_values).items():
        assert not [o for o in objects if o["kind"] == "Secret"], f"{source} holds a Secret"
    # Only the Secrets docs/install.md creates are referenced, with these keys (None: the whole Secret, a
    # kubernetes.io/tls one mounted as a directory); and one ConfigMap made outside: the CA agents trust.
    for overlay in OVERLAYS:
        objects = install(overlay)
        assert _refs(objects, "secret") == {("sluice-database", "database-url"), ("sluice-agent-token", "token"),
                                            ("sluice-dispatcher-tls", None)}
        made = {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
        assert {r for r in _refs(objects, "configMap") if r[0] not in made} == {("sluice-ca", "ca.crt")}


def _refs(objects: list[dict], source: str) -> set[tuple[str, str | None]]:
    """(name, key) of each Secret (source "secret") or ConfigMap ("configMap") the pods read, from env or a
    volume; key None: the whole object, mounted as a directory."""
    refs = set()
    for obj in objects:
        for pod in _pod_specs(obj):
            for container in pod["containers"]:
                for env in container.get("env", []):
                    ref = env.get("valueFrom", {}).get(f"{source}KeyRef")
                    if ref:
                        refs.add((ref["name"], ref["key"]))
            for volume in pod.get("volumes", []):
                if source in volume:
                    name = volume[source]["secretName" if source == "secret" else "name"]
                    items = volume[source].get("items")
                    refs.update({(name, i["key"]) for i in items} if items else {(name, None)})
    return refs


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


def test_the_management_cluster_rights_are_the_same_opt_in_in_both(namespace_values):
    extra = {key(o): o for o in helm("ci/production-values.yaml", _admin_objects_values(namespace_values.parent))}
    for k in map(key, helm("ci/production-values.yaml")):
        extra.pop(k)
    kustomized = {key(o): o for o in render.kustomize(DEPLOY / "base" / "agent-admin-objects")}
    assert sorted(extra) == sorted(kustomized)
    for k, obj in kustomized.items():
        assert _without_chart_metadata(extra[k]) == _without_chart_metadata(obj)


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
ADMIN_RESOURCES = ("queues", "serviceclasses", "clusters", "burstpolicies")
AGENT_RULES = {
    "sluice-agent": {("", "nodes"): {"get", "list", "watch"},
                     ("", "pods"): {"list", "watch"},
                     ("", "namespaces"): {"get"},
                     ("batch", "jobs"): {"list", "watch"}},
    "sluice-agent-workloads": {("", "pods"): {"create", "get", "list", "watch", "delete"},
                               ("batch", "jobs"): {"create", "get", "list", "watch", "delete", "patch"},
                               ("batch", "jobs/status"): {"patch"},
                               ("", "events"): {"create", "list", "watch"},
                               ("", "pods/log"): {"get"}},
    "sluice-agent-namespaces": {("", "namespaces"): {"create"}},
    "sluice-agent-admin-objects": {**{("sluice.io", r): {"get", "list", "watch", "patch"} for r in ADMIN_RESOURCES},
                                   **{("sluice.io", f"{r}/status"): {"patch"} for r in ADMIN_RESOURCES}},
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
    _assert_references_resolve(objects)
    by_key = {key(o): o for o in objects}
    dispatcher = by_key[("Deployment", "sluice", "sluice-dispatcher")]
    assert dispatcher["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["dispatcher", "serve"]
    agent = by_key[("Deployment", "sluice", "sluice-agent")]
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["agent", "run", "--backend", "kubernetes"]
    assert args[args.index("--token-file") + 1] == "/var/run/sluice/token"
    assert agent["spec"]["replicas"] == 1 and agent["spec"]["strategy"]["type"] == "Recreate"
    config_maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    assert config_maps["sluice-agent"]["SLUICE_DISPATCHER"] == "sluice-dispatcher.sluice.svc:7070"


def _assert_references_resolve(objects: list[dict]) -> None:
    """Selectors, service accounts, ConfigMap keys, $(VARS), ports and probes fit together."""
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
                    if spec and "grpc" in spec:  # the kubelet speaks no TLS: the plaintext health port
                        assert spec["grpc"]["port"] == ports["health"] != ports["grpc"]
                    if spec and "httpGet" in spec:
                        assert spec["httpGet"]["port"] in ports
                for port_name, number in ports.items():  # the ConfigMap's listen addresses use the same ports
                    listen = {"grpc": "SLUICE_LISTEN", "metrics": "SLUICE_METRICS_LISTEN",
                              "health": "SLUICE_HEALTH_LISTEN", "agents": "SLUICE_AGENT_LISTEN"}
                    if container["name"] == "agent":
                        listen = {"metrics": "SLUICE_AGENT_METRICS_LISTEN"}
                    if port_name in listen:
                        cm = next(r["valueFrom"]["configMapKeyRef"]["name"] for r in container["env"]
                                  if r["name"] == listen[port_name])
                        assert config_maps[cm][listen[port_name]] == f"0.0.0.0:{number}"
                for mount in container.get("volumeMounts", []):
                    assert mount["name"] in {v["name"] for v in pod.get("volumes", [])}, mount


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


# -- TLS ---------------------------------------------------------------------------------------------
def _deployment(objects: list[dict], name: str) -> tuple[dict, dict, dict]:
    """The Deployment, its pod spec and its one container."""
    obj = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name)
    pod = obj["spec"]["template"]["spec"]
    return obj, pod, pod["containers"][0]


def _env(container: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _file_volume(pod: dict, container: dict, path: str) -> dict:
    """The volume a file lies on, mounted read-only as a whole directory: a subPath mount never sees the
    Secret's or ConfigMap's updates, so a certificate rotated there would never reach the process."""
    mounts = [m for m in container.get("volumeMounts", []) if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1, f"{path} is on {len(mounts)} mounts"
    assert "subPath" not in mounts[0] and "subPathExpr" not in mounts[0] and mounts[0]["readOnly"] is True
    assert path.rsplit("/", 1)[0] == mounts[0]["mountPath"].rstrip("/"), f"{path}: a file at the volume's top"
    return next(v for v in pod["volumes"] if v["name"] == mounts[0]["name"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_dispatcher_serves_tls_from_its_secret_mounted_as_a_directory(overlay):
    dispatcher, pod, container = _deployment(install(overlay), "sluice-dispatcher")
    env = _env(container)
    for var, name in (("SLUICE_TLS_CERT", "tls.crt"), ("SLUICE_TLS_KEY", "tls.key")):  # kubernetes.io/tls keys
        assert env[var].rsplit("/", 1)[1] == name
        volume = _file_volume(pod, container, env[var])
        # The whole Secret, so ca.crt comes along where the Secret has one (cert-manager writes it).
        assert volume["secret"] == {"secretName": "sluice-dispatcher-tls", "defaultMode": 0o440}
    assert dispatcher["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    assert "SLUICE_CLIENT_CA" not in env and "agents" not in {p["name"] for p in container["ports"]}  # opt-in


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_use_the_plaintext_health_port(overlay):
    objects = install(overlay)
    _, _, container = _deployment(objects, "sluice-dispatcher")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] not in (ports["grpc"], ports["metrics"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == ports["health"], probe
    # Liveness asks a service that stays SERVING while Postgres is away ("" follows the store: readiness).
    assert container["livenessProbe"]["grpc"].get("service") == "liveness"
    assert "service" not in container["readinessProbe"]["grpc"]
    health = next(e for e in container["env"] if e["name"] == "SLUICE_HEALTH_LISTEN")
    config = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "sluice-dispatcher")
    assert health["valueFrom"]["configMapKeyRef"] == {"name": "sluice-dispatcher", "key": "SLUICE_HEALTH_LISTEN"}
    assert config["data"]["SLUICE_HEALTH_LISTEN"] == f"0.0.0.0:{ports['health']}"
    service = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "sluice-dispatcher")
    assert "health" not in {p["targetPort"] for p in service["spec"]["ports"]}  # for the kubelet only


def test_nothing_in_deploy_asks_for_plaintext(namespace_values, tmp_path):
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "--insecure" not in text and "SLUICE_INSECURE" not in text, path
    renderings = every_rendering(namespace_values) | {"mtls": helm("ci/kind-values.yaml", _mtls_values(tmp_path))}
    for source, objects in renderings.items():
        assert "insecure" not in yaml.safe_dump_all(objects).lower(), source


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_agent_verifies_the_dispatcher_by_a_mounted_ca(overlay):
    _, pod, container = _deployment(install(overlay), "sluice-agent")
    ca = _env(container)["SLUICE_CA"]  # `sluice agent run --ca`
    assert _file_volume(pod, container, ca)["configMap"] == {"name": "sluice-ca",
                                                             "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert ca.endswith("/ca.crt")
    assert "SLUICE_TLS_CERT" not in _env(container)  # a client certificate is opt-in (mTLS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_agent_serves_its_metrics_over_https(overlay):
    agent, _, container = _deployment(install(overlay), "sluice-agent")
    assert agent["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    # No certificate given: `sluice agent run` makes one at start, since it listens off loopback.
    assert "SLUICE_AGENT_METRICS_TLS_CERT" not in _env(container)


def test_the_agent_serves_its_metrics_with_a_given_certificate_under_helm(tmp_path):
    values = tmp_path / "metrics-tls.yaml"
    values.write_text("agent: {metricsTlsSecret: sluice-agent-metrics-tls}\n")
    objects = helm("ci/kind-values.yaml", values)
    _assert_references_resolve(objects)
    _, pod, container = _deployment(objects, "sluice-agent")
    env = _env(container)
    for var, name in (("SLUICE_AGENT_METRICS_TLS_CERT", "tls.crt"), ("SLUICE_AGENT_METRICS_TLS_KEY", "tls.key")):
        assert env[var].rsplit("/", 1)[1] == name
        assert _file_volume(pod, container, env[var])["secret"] == {"secretName": "sluice-agent-metrics-tls",
                                                                    "defaultMode": 0o440}


def _mtls_values(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "mtls.yaml"
    path.write_text("dispatcher: {agentPort: {enabled: true}}\nagent: {clientCertSecret: sluice-agent-tls}\n")
    return path


def test_agents_may_authenticate_by_client_certificate_under_helm(tmp_path):
    objects = helm("ci/kind-values.yaml", _mtls_values(tmp_path))
    _assert_references_resolve(objects)
    _, pod, container = _deployment(objects, "sluice-dispatcher")
    env, ports = _env(container), {p["name"]: p["containerPort"] for p in container["ports"]}
    assert env["SLUICE_CLIENT_CA"].endswith("/ca.crt")  # by default the ca.crt of the dispatcher's TLS Secret
    assert _file_volume(pod, container, env["SLUICE_CLIENT_CA"])["secret"]["secretName"] == "sluice-dispatcher-tls"
    assert env["SLUICE_TLS_CERT"].rsplit("/", 1)[0] == env["SLUICE_CLIENT_CA"].rsplit("/", 1)[0]
    config = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    assert config["sluice-dispatcher"]["SLUICE_AGENT_LISTEN"] == f"0.0.0.0:{ports['agents']}"
    service = next(o for o in objects if o["kind"] == "Service")
    assert {"name": "agents", "port": ports["agents"], "targetPort": "agents", "protocol": "TCP"} \
        in service["spec"]["ports"]
    _, pod, container = _deployment(objects, "sluice-agent")
    env = _env(container)
    assert "--token-file" not in container["args"]
    for var, name in (("SLUICE_TLS_CERT", "tls.crt"), ("SLUICE_TLS_KEY", "tls.key")):
        assert env[var].rsplit("/", 1)[1] == name
        assert _file_volume(pod, container, env[var])["secret"] == {"secretName": "sluice-agent-tls",
                                                                    "defaultMode": 0o440}
    assert env["SLUICE_CA"].endswith("/ca.crt")
    assert config["sluice-agent"]["SLUICE_DISPATCHER"] == f"sluice-dispatcher.sluice.svc:{ports['agents']}"
    assert _refs(objects, "secret") == {("sluice-database", "database-url"), ("sluice-dispatcher-tls", None),
                                     ("sluice-agent-tls", None)}
    # A CA of its own for the agents' certificates: one key of another Secret.
    own_ca = tmp_path / "own-ca.yaml"
    own_ca.write_text("dispatcher: {agentPort: {clientCA: {secretName: sluice-agent-ca}}}\n")
    objects = helm("ci/kind-values.yaml", _mtls_values(tmp_path), own_ca)
    _, pod, container = _deployment(objects, "sluice-dispatcher")
    client_ca = _env(container)["SLUICE_CLIENT_CA"]
    assert _file_volume(pod, container, client_ca)["secret"] == {
        "secretName": "sluice-agent-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}], "defaultMode": 0o440}
    _assert_references_resolve(objects)
    # An agent certificate for a dispatcher without an agent port would dial a port nobody serves.
    no_port = tmp_path / "no-port.yaml"
    no_port.write_text("agent: {cluster: kind-sluice, clientCertSecret: sluice-agent-tls}\n")
    with pytest.raises(render.RenderError, match="dispatcher.agentPort.enabled"):
        helm("ci/kind-values.yaml", no_port)


def _options_read_from_env(group: str, command: str) -> set[str]:
    import click
    import typer

    from sluice.cli import app
    root = typer.main.get_command(app)
    context = click.Context(root)
    found = root.get_command(context, group).get_command(context, command)
    return {p.envvar for p in found.params if isinstance(p.envvar, str)}


def test_every_variable_a_container_gets_is_read_by_its_command(namespace_values):
    """A misspelt variable (SLUICE_TLS_CRT) would be ignored, and the dispatcher refuse to start without TLS."""
    for source, objects in every_rendering(namespace_values).items():
        for obj in objects:
            for pod in _pod_specs(obj):
                for container in pod["containers"]:
                    if container["name"] == "postgres":
                        continue
                    read = _options_read_from_env(*container["args"][:2])
                    used = {v for arg in container["args"] for v in re.findall(r"\$\(([A-Z_]+)\)", arg)}
                    unread = {e["name"] for e in container.get("env", [])} - read - used
                    assert not unread, f"{source}: {container['name']}: {sorted(unread)} are read by nothing"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_mtls_components_render_what_helm_does(overlay, tmp_path):
    kustomized = {key(o): o for o in mtls_install(overlay, tmp_path)}
    helmed = {key(o): o for o in helm(f"ci/{overlay}-values.yaml", _mtls_values(tmp_path))}
    assert sorted(helmed) == sorted(kustomized)
    for k, obj in kustomized.items():
        assert _without_chart_metadata(helmed[k]) == _without_chart_metadata(obj), f"{'/'.join(k)} differs"
    _assert_references_resolve(list(kustomized.values()))


# -- the dispatcher's alert rules (PrometheusRule) ----------------------------------------------------
def _monitoring_values(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "monitoring.yaml"
    path.write_text("monitoring: {prometheusRule: {enabled: true}}\n")
    return path


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_monitoring_component_renders_what_helm_does(overlay, tmp_path):
    kustomized = {key(o): o for o in monitoring_install(overlay, tmp_path)}
    helmed = {key(o): o for o in helm(f"ci/{overlay}-values.yaml", _monitoring_values(tmp_path))}
    assert sorted(helmed) == sorted(kustomized)
    assert ("PrometheusRule", "sluice", "sluice-dispatcher") in kustomized
    for k, obj in kustomized.items():
        assert _without_chart_metadata(helmed[k]) == _without_chart_metadata(obj), f"{'/'.join(k)} differs"
        assert helmed[k]["metadata"]["labels"].items() >= obj["metadata"]["labels"].items(), k


def test_the_prometheus_rule_carries_exactly_the_groups_of_alerts_yaml(tmp_path):
    """Neither kustomize nor Helm can include deploy/monitoring/alerts.yaml from their directories, so the
    groups are written in the component and the template too (by deploy/monitoring/sync.py): this keeps
    them equal. tests/unit/test_alerts.py checks alerts.yaml itself with promtool."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert [g["name"] for g in groups] == ["sluice"]
    labelled = tmp_path / "labels.yaml"
    labelled.write_text("monitoring: {prometheusRule: {enabled: true, labels: {release: kube-prometheus-stack}}}\n")
    renderings = {"helm": helm("ci/production-values.yaml", _monitoring_values(tmp_path)),
                  "helm with labels": helm("ci/kind-values.yaml", labelled),
                  **{f"kustomize {o}": monitoring_install(o, tmp_path / o) for o in OVERLAYS}}
    for source, objects in renderings.items():
        rules = [o for o in objects if o["kind"] == "PrometheusRule"]
        assert len(rules) == 1, source
        assert rules[0]["apiVersion"] == "monitoring.coreos.com/v1", source
        assert set(rules[0]) == {"apiVersion", "kind", "metadata", "spec"}, source
        assert rules[0]["spec"] == {"groups": groups}, f"{source}: run python deploy/monitoring/sync.py"
    labels = next(o for o in renderings["helm with labels"] if o["kind"] == "PrometheusRule")["metadata"]["labels"]
    assert labels["release"] == "kube-prometheus-stack"  # for the operator's ruleSelector


def test_the_prometheus_rule_is_rendered_only_when_asked(namespace_values):
    renderings = {f"kustomize {d}": render.kustomize(ROOT / d) for d in KUSTOMIZATIONS}
    renderings.update({f"helm {name}": objs for name, objs in helm_renderings(namespace_values).items()
                       if name != "monitoring"})
    for source, objects in renderings.items():
        assert not [o for o in objects if o["kind"] == "PrometheusRule"], source  # off by default


# cert-manager.io/v1 Certificate: kubernetes-validate has no schema for a custom resource, so what the chart
# writes is checked against this subset of cert-manager's CRD (its field names and types; any other field
# is an error, as strict validation makes it for the built-in kinds).
_STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}}
_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(h|m|s|ms))+$"}
CERTIFICATE_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"}, "kind": {"const": "Certificate"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {"type": "object", "required": ["secretName", "issuerRef"], "additionalProperties": False,
                 "properties": {
                     "secretName": {"type": "string", "minLength": 1},
                     "issuerRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                   "properties": {"name": {"type": "string", "minLength": 1},
                                                  "kind": {"type": "string"}, "group": {"type": "string"}}},
                     "commonName": {"type": "string"}, "dnsNames": _STRINGS, "ipAddresses": _STRINGS,
                     "uris": _STRINGS, "duration": _DURATION, "renewBefore": _DURATION,
                     "usages": {"type": "array", "items": {"enum": [
                         "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
                         "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
                         "server auth", "client auth", "code signing", "email protection", "s/mime",
                         "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
                         "microsoft sgc", "netscape sgc"]}},
                     "privateKey": {"type": "object", "additionalProperties": False, "properties": {
                         "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]}, "size": {"type": "integer"},
                         "encoding": {"enum": ["PKCS1", "PKCS8"]}, "rotationPolicy": {"enum": ["Never", "Always"]}}},
                 }},
    },
}


def _validate_certificate(obj: dict) -> None:
    jsonschema.validate(obj, CERTIFICATE_SCHEMA)


def _cert_manager_values(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "cert-manager.yaml"
    path.write_text("tls: {certManager: {enabled: true, issuerRef: {name: sluice-ca, kind: ClusterIssuer}}}\n")
    return path


def test_cert_manager_issues_the_certificates_only_when_asked(namespace_values, tmp_path):
    default = {f"kustomize {d}": render.kustomize(ROOT / d) for d in KUSTOMIZATIONS} | {
        "kind": helm("ci/kind-values.yaml"), "mtls": helm("ci/kind-values.yaml", _mtls_values(tmp_path))}
    for source, objects in default.items():
        assert not [o for o in objects if o["kind"] == "Certificate"], source  # off by default
    objects = helm("ci/kind-values.yaml", _cert_manager_values(tmp_path))
    certificates = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Certificate"}
    assert list(certificates) == ["sluice-dispatcher"]
    certificate = certificates["sluice-dispatcher"]
    _validate_certificate(certificate)
    _, pod, container = _deployment(objects, "sluice-dispatcher")
    volume = _file_volume(pod, container, _env(container)["SLUICE_TLS_CERT"])
    spec = certificate["spec"]
    assert spec["secretName"] == volume["secret"]["secretName"] == "sluice-dispatcher-tls"
    assert spec["issuerRef"] == {"name": "sluice-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    # Every name the agents and clients dial the Service by (the agent's default SLUICE_DISPATCHER among them).
    dispatcher_host = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "sluice-agent")[
        "data"]["SLUICE_DISPATCHER"].rsplit(":", 1)[0]
    assert {"sluice-dispatcher", "sluice-dispatcher.sluice", dispatcher_host,
            "sluice-dispatcher.sluice.svc.cluster.local"} <= set(spec["dnsNames"])
    assert "server auth" in spec["usages"] and "client auth" not in spec["usages"]
    # With mTLS for agents, the agent's client certificate too: its URI names its cluster.
    from sluice.certs import CLUSTER_URI
    objects = helm("ci/kind-values.yaml", _cert_manager_values(tmp_path), _mtls_values(tmp_path))
    certificates = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Certificate"}
    assert sorted(certificates) == ["sluice-agent", "sluice-dispatcher"]
    agent = certificates["sluice-agent"]
    _validate_certificate(agent)
    assert agent["spec"]["secretName"] == "sluice-agent-tls" and agent["spec"]["uris"] == [CLUSTER_URI + "kind-sluice"]
    assert agent["spec"]["usages"] == ["digital signature", "client auth"] and "dnsNames" not in agent["spec"]
    assert agent["spec"]["issuerRef"] == spec["issuerRef"]
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text("tls: {certManager: {enabled: true}}\n")
    with pytest.raises(render.RenderError, match="issuerRef"):
        helm("ci/kind-values.yaml", unnamed)


def test_the_certificate_schema_refuses_what_cert_manager_would():
    good = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": {"name": "a", "namespace": "b"},
            "spec": {"secretName": "s", "issuerRef": {"name": "i"}, "duration": "2160h"}}
    _validate_certificate(good)
    for bad in ({"secretName": "s"}, {"secretName": "s", "issuerRef": {"name": "i"}, "dnsName": ["x"]},
                {"secretName": "s", "issuerRef": {"name": "i"}, "usages": ["server"]},
                {"secretName": "s", "issuerRef": {"name": "i"}, "duration": "90d"}):
        with pytest.raises(jsonschema.ValidationError):
            _validate_certificate(good | {"spec": bad})


# -- the CustomResourceDefinitions of the admin objects ----------------------------------------------
def _crds_values(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "crds.yaml"
    path.write_text("crds: {enabled: true}\n")
    return path


def _admin_objects_values(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "admin-objects.yaml"
    path.write_text("agent: {adminObjects: true}\n")
    return path


def test_the_checked_in_crds_are_what_the_code_generates():
    """deploy/base/crds and the chart's templates/crds.yaml are written by deploy/sync_crds.py from sluice/crds.py."""
    for path, text in sync_crds.files().items():
        assert path.is_file() and path.read_text() == text, f"{path.relative_to(ROOT)}: run python deploy/sync_crds.py"
    base = DEPLOY / "base" / "crds"
    assert {p.name for p in base.iterdir()} == {"kustomization.yaml"} | {
        p.name for p in sync_crds.files() if p.parent == base}


def test_kustomize_and_helm_ship_the_crds_sluice_admin_crds_prints(tmp_path):
    from sluice import crds
    printed = {key(c): c for c in crds.crds()}
    assert len(printed) == 4
    kustomized = {key(o): o for o in render.kustomize(DEPLOY / "base" / "crds")}
    assert kustomized == printed  # the base's label is one every definition has
    helmed = {key(o): o for o in helm("ci/production-values.yaml", _crds_values(tmp_path))
              if o["kind"] == "CustomResourceDefinition"}
    assert sorted(helmed) == sorted(printed)
    for k, definition in printed.items():
        assert _without_chart_metadata(helmed[k]) == _without_chart_metadata(definition), f"{'/'.join(k)} differs"
        assert helmed[k]["metadata"]["labels"].items() >= definition["metadata"]["labels"].items()
        assert helmed[k]["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    for values in ((), ("ci/kind-values.yaml",), ("ci/production-values.yaml",)):  # only where asked for
        cluster_only = tmp_path / "cluster-only.yaml"
        cluster_only.write_text("agent: {cluster: prod-a}\n")
        assert not [o for o in helm(*(values or (cluster_only,))) if o["kind"] == "CustomResourceDefinition"]
    assert not [o for d in KUSTOMIZATIONS if d != "deploy/base/crds" for o in render.kustomize(ROOT / d)
                if o["kind"] == "CustomResourceDefinition"]


# -- the rendered dispatcher pod, run here -----------------------------------------------------------
def _kubelet_writes(directory: pathlib.Path, files: dict[str, bytes], generation: int) -> None:
    """Write a Secret volume as the kubelet's atomic writer does: the files in a new hidden directory,
    `..data` renamed onto a symlink to it, and each key a symlink through `..data`."""
    stamp = directory / f"..generation_{generation}"
    stamp.mkdir(parents=True)
    for name, data in files.items():
        (stamp / name).write_bytes(data)
    (directory / "..data_tmp").symlink_to(stamp.name)
    (directory / "..data_tmp").replace(directory / "..data")
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")


def test_the_rendered_dispatcher_pod_serves_tls_answers_probes_and_takes_a_replaced_secret(db_url, tmp_path):
    """The kind overlay's dispatcher container, as the kubelet would start it (its env, its args with $(VARS)
    expanded, its volumes) but on loopback ports here: TLS from the mounted Secret, the probe's plaintext
    health check, and a replaced Secret served from the next handshake on, by the same process."""
    import signal
    import socket
    import ssl
    import subprocess
    import sys
    import time

    import grpc
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from sluice import certs
    from tests.integration.test_cli import base_env, free_port

    objects = install("kind")
    _, pod, container = _deployment(objects, "sluice-dispatcher")
    config = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "sluice-dispatcher")
    mounts = {m["mountPath"]: tmp_path / m["name"] for m in container["volumeMounts"]}
    loopback: dict[int, int] = {}  # the container's port -> the port it has here (tests bind loopback)

    def here(value: str) -> str:
        for path, directory in mounts.items():
            if value == path or value.startswith(path + "/"):
                return str(directory) + value[len(path):]
        if value.startswith("0.0.0.0:"):
            value = f"127.0.0.1:{loopback.setdefault(int(value.split(':')[1]), free_port())}"
        return value
    env = base_env(tmp_path)
    for var in container["env"]:
        source = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = here(var["value"])
        elif "configMapKeyRef" in source:
            env[var["name"]] = here(config["data"][source["configMapKeyRef"]["key"]])
        else:
            assert source["secretKeyRef"] == {"name": "sluice-database", "key": "database-url"}
            env[var["name"]] = db_url.replace("postgresql+psycopg://", "postgresql://")
    args = [re.sub(r"\$\(([A-Z_]+)\)", lambda m: env[m.group(1)], arg) for arg in container["args"]]
    ports = {p["name"]: loopback[p["containerPort"]] for p in container["ports"]}

    service_name = "sluice-dispatcher.sluice.svc"  # as the agent dials it
    ca = certs.make_ca()
    first, second = certs.make_server(ca, [service_name]), certs.make_server(ca, [service_name])
    secret = pathlib.Path(here("/etc/sluice/tls"))
    assert secret in mounts.values() and pathlib.Path(env["SLUICE_TLS_CERT"]).parent == secret
    _kubelet_writes(secret, {"tls.crt": first.cert, "tls.key": first.key, "ca.crt": ca.cert}, 1)
    trusting = ssl.create_default_context(cadata=ca.cert.decode())
    trusting.set_alpn_protocols(["h2"])

    def served(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                trusting.wrap_socket(raw, server_hostname=service_name) as tls:
            return tls.getpeercert(binary_form=True)

    def der(issued: certs.Issued) -> bytes:
        return x509.load_pem_x509_certificate(issued.cert).public_bytes(Encoding.DER)

    proc = subprocess.Popen([sys.executable, "-m", *container["command"], *args], env=env, cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        ready = proc.stderr.readline()
        assert ready.startswith("serving on ") and "(TLS)" in ready, ready + proc.stderr.read()
        with grpc.insecure_channel(f"127.0.0.1:{ports['health']}") as channel:  # what the kubelet's probe does
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert served(ports["grpc"]) == served(ports["metrics"]) == der(first)
        _kubelet_writes(secret, {"tls.crt": second.cert, "tls.key": second.key, "ca.crt": ca.cert}, 2)
        deadline = time.monotonic() + 10
        while served(ports["grpc"]) != der(second):
            assert time.monotonic() < deadline, "the replaced Secret's certificate is not served"
            time.sleep(0.1)
        assert served(ports["metrics"]) == der(second) and proc.poll() is None  # the same process
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0


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


@pytest.mark.skipif(_kubectl_kustomize() is None, reason="no kubectl with kustomize v4+ on PATH")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_renderer_matches_kubectl_kustomize_with_the_components(overlay, tmp_path):
    for directory in (with_components(tmp_path / "d", f"deploy/overlays/{overlay}", (AGENT_PORT,)),
                      with_components(tmp_path / "a", f"deploy/overlays/{overlay}/agent", (AGENT_MTLS,)),
                      with_components(tmp_path / "m", f"deploy/overlays/{overlay}", (MONITORING,))):
        done = subprocess.run([_kubectl_kustomize(), "kustomize", str(directory)], capture_output=True, text=True,
                              timeout=30, check=False)
        assert done.returncode == 0, done.stderr
        theirs = {key(o): o for o in yaml.safe_load_all(done.stdout) if o}
        assert {key(o): o for o in render.kustomize(directory)} == theirs


def test_components_add_to_and_patch_what_lists_them(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources: [extra.yaml]\npatches:\n"
        "- target: {kind: ConfigMap, name: a}\n  patch: '[{op: add, path: /data/y, value: \"2\"}]'\n")
    (tmp_path / "c" / "extra.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "kustomization.yaml").write_text("resources: [a.yaml]\ncomponents: [../c]\n")
    (tmp_path / "o" / "a.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {x: '1'}\n")
    assert render.kustomize(tmp_path / "o") == [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"x": "1", "y": "2"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}}]
    with pytest.raises(render.RenderError, match="kind Component where a Kustomization is expected"):
        render.kustomize(tmp_path / "c")
    (tmp_path / "o" / "kustomization.yaml").write_text("resources: [a.yaml, ../c]\n")
    with pytest.raises(render.RenderError, match="kind Component where a Kustomization is expected"):
        render.kustomize(tmp_path / "o")


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


def test_an_action_ends_outside_its_string_literals(tmp_path):
    """{{ "{{" }} and {{ "}}" }} print the braces (how the chart passes Prometheus's own templates through)."""
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("a: 1\n")
    (chart / "templates" / "x.yaml").write_text(
        'x: \'{{ "{{" }} $labels.cluster {{ "}}" }} {{ .Values.a }}\'\ny: {{ "a \\" }}" | quote }}\n')
    assert render.helm(chart) == [{"x": "{{ $labels.cluster }} 1", "y": 'a " }}'}]


def test_fail_stops_the_rendering_with_its_message(tmp_path):
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("enabled: false\n")
    (chart / "templates" / "x.yaml").write_text(
        'x: 1\n{{- if not .Values.enabled }}{{ fail "set enabled: true" }}{{ end }}\n')
    with pytest.raises(render.RenderError, match="fail: set enabled: true"):
        render.helm(chart)
    (chart / "values.yaml").write_text("enabled: true\n")
    assert render.helm(chart) == [{"x": 1}]


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
                   "helm install sluice deploy/helm/sluice", "not run here",
                   # TLS: the Secret and the CA both ways, rotation, mTLS for agents
                   "sluice dispatcher certs --dir certs --host sluice-dispatcher.sluice.svc",
                   "create secret tls sluice-dispatcher-tls", "--type=kubernetes.io/tls", "create configmap sluice-ca",
                   "--from-file=ca.crt=", "SLUICE_CA=", "tls.certManager.enabled=true",
                   "tls.certManager.issuerRef.name", "kind: Certificate", "no restart", "subPath",
                   "dispatcher.agentPort.enabled=true", "agent.clientCertSecret=sluice-agent-tls",
                   "--cluster kind-sluice", "prometheus.io/scheme"):
        assert needle in text, needle
    assert "plaintext gRPC" not in text and "no TLS yet" not in text
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
