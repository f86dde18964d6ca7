"""`kubectl sluice` without a dispatcher: the kubectl flags anywhere on the line (sluice.kubectx.plugin_args),
the kubeconfig as kubectl merges it, the context and namespace in effect, the Sluice context a Kubernetes
context selects, the namespace-to-queue rule (intake, namespaces, the queue of the namespace's name, the
ambiguous case), the plugin's glue (sluice.cli.kubectl.Plugin) against a fake client, and the
`kubectl-sluice` entry point's help and errors in a subprocess."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from sluice import kubectx
from sluice.cli.common import Failed
from sluice.cli.kubectl import Plugin
from sluice.client import ClientError
from sluice.kubectx import (
    AmbiguousNamespace,
    FlagError,
    KubeConfig,
    KubeconfigError,
    kube_target,
    kubeconfig_files,
    merge,
    namespace_queue,
    plugin_args,
    read_kubeconfig,
    sluice_context,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]


# -- the flags ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["-n", "ml", "--context", "kind-a", "list", "--state", "QUEUED"],
    ["list", "--state", "QUEUED", "-n", "ml", "--context", "kind-a"],
    ["list", "-nml", "--state", "QUEUED", "--context=kind-a"],
    ["list", "--namespace=ml", "--state", "QUEUED", "--context", "kind-a"],
    ["list", "-n=ml", "--context", "kind-a", "--state", "QUEUED"],
    ["--context", "other", "-n", "x", "list", "--state", "QUEUED", "--namespace", "ml", "--context", "kind-a"],
])
def test_kubectl_flags_are_taken_out_wherever_they_stand(argv):
    parsed = plugin_args(argv)
    assert parsed.args == ["list", "--state", "QUEUED"]
    assert (parsed.namespace, parsed.context, parsed.kubeconfig) == ("ml", "kind-a", None)
    assert not parsed.passed_through and not parsed.all_namespaces and not parsed.verbose


def test_the_other_flags_and_the_sluice_context():
    parsed = plugin_args(["--config", "c.yaml", "list", "-A", "--kubeconfig", "/k/config", "--verbose",
                          "--sluice-context", "prod", "--limit", "5"])
    assert parsed.args == ["--sluice-context", "prod", "--config", "c.yaml", "list", "--limit", "5"]
    assert parsed.kubeconfig == "/k/config" and parsed.all_namespaces and parsed.verbose
    assert parsed.sluice_context == "prod"
    assert plugin_args(["list", "--all-namespaces=false", "--verbose=true"]).all_namespaces is False
    assert plugin_args(["list", "--all-namespaces"]).all_namespaces is True


def test_a_value_written_with_its_option_is_left_alone():
    parsed = plugin_args(["list", "--name=-nightly", "--user=-A", "-n", "ml"])
    assert parsed.args == ["list", "--name=-nightly", "--user=-A"] and parsed.namespace == "ml"
    assert not parsed.all_namespaces


def test_a_double_dash_ends_the_flags():
    parsed = plugin_args(["submit", "-f", "-", "--", "-n", "x"])
    assert parsed.args == ["submit", "-f", "-", "--", "-n", "x"] and parsed.namespace is None


@pytest.mark.parametrize("argv", [
    ["agent", "run", "--cluster", "a", "--backend", "kubernetes", "--kubeconfig", "k", "--context", "c", "-v"],
    ["--config", "c.yaml", "dispatcher", "serve", "--verbose"],
    ["up", "--verbose"],
    ["demo", "-v"],
])
def test_server_commands_keep_their_arguments_whole(argv):
    parsed = plugin_args(argv)
    assert parsed.passed_through and parsed.args == argv and parsed.context is None


@pytest.mark.parametrize("argv, message", [
    (["list", "-n"], "flag needs an argument: -n"),
    (["list", "--context"], "flag needs an argument: --context"),
    (["list", "--kubeconfig="], "flag needs a non-empty argument: --kubeconfig"),
    (["list", "-A=maybe"], "-A: expected true or false, got 'maybe'"),
])
def test_a_flag_without_its_value_is_a_usage_error(argv, message):
    with pytest.raises(FlagError, match=message):
        plugin_args(argv)


# -- the kubeconfig ----------------------------------------------------------------------------------

def test_which_files_kubectl_reads():
    assert kubeconfig_files("/x/config", {"KUBECONFIG": "/a:/b"}, "/home/u") == (["/x/config"], True)
    assert kubeconfig_files(None, {"KUBECONFIG": f"/a{os.pathsep}{os.pathsep}/b{os.pathsep}/a"}, "/home/u") \
        == (["/a", "/b"], False)
    assert kubeconfig_files(None, {"KUBECONFIG": ""}, "/home/u") == (["/home/u/.kube/config"], False)
    assert kubeconfig_files(None, {}, "/home/u") == (["/home/u/.kube/config"], False)


def _context(name, namespace=None, cluster="c"):
    extra = {"namespace": namespace} if namespace else {}
    return {"name": name, "context": {"cluster": cluster, "user": "u", **extra}}


def test_the_first_file_to_set_a_value_wins():
    first = {"contexts": [_context("a", "ns-first")]}  # no current-context here
    second = {"current-context": "b", "contexts": [_context("a", None, cluster="other"), _context("b", "ns-b")]}
    third = {"current-context": "a", "contexts": [_context("c")]}
    config = merge([("/1", first), ("/2", second), ("/empty", None), ("/3", third)])
    assert config.current_context == "b"  # the first file that sets it
    assert config.contexts["a"] == {"cluster": "c", "user": "u", "namespace": "ns-first"}  # whole, from the first
    assert set(config.contexts) == {"a", "b", "c"} and config.files == ("/1", "/2", "/empty", "/3")


@pytest.mark.parametrize("data, message", [
    (["not", "a", "mapping"], "/k: not a kubeconfig"),
    ({"contexts": {"a": 1}}, "/k: contexts: expected a list"),
    ({"contexts": [{"context": {}}]}, r"/k: contexts\[0\]: expected a mapping with a name"),
    ({"contexts": [{"name": "a", "context": "x"}]}, r"/k: contexts\[0\] \(a\): context: expected a mapping"),
    ({"contexts": [{"name": "a", "context": {"namespace": 3}}]}, r"namespace: expected a string"),
    ({"current-context": ["a"]}, "/k: current-context: expected a context's name"),
])
def test_what_is_not_a_kubeconfig_is_one_error_naming_the_file(data, message):
    with pytest.raises(KubeconfigError, match=message):
        merge([("/k", data)])


def test_reading_the_files_of_kubeconfig(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "a",
                                   "contexts": [_context("a", "team-a")]}))
    two.write_text(yaml.safe_dump({"current-context": "b", "contexts": [_context("b", "team-b")]}))
    env = {"KUBECONFIG": os.pathsep.join([str(tmp_path / "missing"), str(one), str(two)])}
    config = read_kubeconfig(None, env, str(tmp_path))
    assert config.files == (str(one), str(two)) and config.current_context == "a" and set(config.contexts) == {"a", "b"}
    assert read_kubeconfig(str(two), env, str(tmp_path)).current_context == "b"  # --kubeconfig: that file alone
    assert read_kubeconfig(None, {}, str(tmp_path)) == KubeConfig()  # no ~/.kube/config: nothing
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text(two.read_text())
    assert read_kubeconfig(None, {}, str(tmp_path)).current_context == "b"

    with pytest.raises(KubeconfigError, match=r"^--kubeconfig .*/nowhere: no such file$"):
        read_kubeconfig(str(tmp_path / "nowhere"), {}, str(tmp_path))
    two.write_text("contexts: [unclosed\n")
    with pytest.raises(KubeconfigError, match=r"two: not valid YAML: ") as caught:
        read_kubeconfig(None, env, str(tmp_path))
    assert "\n" not in str(caught.value)


def test_the_context_and_namespace_in_effect():
    config = KubeConfig(("/k",), "a", {"a": {"namespace": "team-a"}, "b": {}})
    assert kube_target(config) == kubectx.KubeTarget("a", "team-a", "the namespace of Kubernetes context a")
    assert kube_target(config, "b").namespace == "default"  # a context naming none: kubectl's default
    assert kube_target(config, "b", "ml").namespace == "ml"
    assert kube_target(KubeConfig()) == kubectx.KubeTarget(None, None, "no Kubernetes context")
    assert kube_target(KubeConfig(), namespace_flag="ml").namespace == "ml"  # -n alone, without a kubeconfig
    with pytest.raises(KubeconfigError, match=r"^--context c: no such context in the kubeconfig \(/k; contexts: a, b"):
        kube_target(config, "c")
    with pytest.raises(KubeconfigError, match=r"^current-context 'gone': no such context"):
        kube_target(KubeConfig(("/k",), "gone", {"a": {}}))


def test_the_sluice_context_named_like_the_kubernetes_one():
    assert sluice_context("kind-a", ["prod", "kind-a"]) == "kind-a"
    assert sluice_context("kind-b", ["prod", "kind-a"]) is None  # the Sluice config's current context
    assert sluice_context(None, ["prod"]) is None


# -- the namespace's queue -----------------------------------------------------------------------------

def cluster(name, namespaces=None, intake=None):
    kubernetes = {"namespaces": namespaces or {}, "createNamespaces": False, "gangStartTimeout": "5m",
                  "workload": "pods"}
    if intake is not None:
        kubernetes["intake"] = intake
    return {"apiVersion": "sluice.io/v1", "kind": "Cluster", "metadata": {"name": name, "labels": {}},
            "spec": {"tier": "onprem", "kubernetes": kubernetes}}


QUEUES = ["default", "vision", "nlp", "ml"]


def test_an_intake_namespace_uses_its_first_queue_before_any_other_mapping():
    clusters = [cluster("a", namespaces={"nlp": "ml"}, intake={"ml": {"user": "alice", "queues": ["vision", "nlp"]}}),
                cluster("b", intake={"ml": {"user": "alice", "queues": ["vision"]}})]
    mapped = namespace_queue("ml", clusters, QUEUES)
    assert mapped.queue == "vision" and mapped.why == "spec.kubernetes.intake of clusters a, b"


def test_a_namespace_where_a_queue_runs_maps_to_that_queue():
    clusters = [cluster("a", namespaces={"vision": "ml", "nlp": "text"}), cluster("b"),
                cluster("c", namespaces={"vision": "ml"}, intake={"other": {"user": "u", "queues": ["nlp"]}})]
    assert namespace_queue("ml", clusters, QUEUES) == kubectx.Mapped(
        "vision", "spec.kubernetes.namespaces of clusters a, c")
    assert namespace_queue("text", clusters, QUEUES).queue == "nlp"


def test_an_unmapped_namespace_uses_the_queue_of_its_name_if_there_is_one():
    clusters = [cluster("a", namespaces={"vision": "team-vision"})]
    assert namespace_queue("nlp", clusters, QUEUES).queue == "nlp"
    assert namespace_queue("default", [], QUEUES).queue == "default"
    assert namespace_queue("nowhere", clusters, QUEUES).queue is None  # the usual default
    assert namespace_queue("ml", [], []).queue is None


def test_an_intake_entry_without_queues_names_none():
    clusters = [cluster("a", namespaces={"vision": "ml"}, intake={"ml": {"user": "u", "queues": []}})]
    assert namespace_queue("ml", clusters, QUEUES).queue == "vision"


@pytest.mark.parametrize("clusters, message", [
    ([cluster("a", namespaces={"vision": "ml"}), cluster("b", namespaces={"nlp": "ml"}),
      cluster("c", namespaces={"nlp": "ml"})],
     "namespace ml maps to several queues: nlp (spec.kubernetes.namespaces of clusters b, c); "
     "vision (spec.kubernetes.namespaces of cluster a); name one with --queue"),
    ([cluster("a", namespaces={"vision": "ml", "nlp": "ml"})],
     "namespace ml maps to several queues: nlp (spec.kubernetes.namespaces of cluster a); "
     "vision (spec.kubernetes.namespaces of cluster a); name one with --queue"),
    ([cluster("a", intake={"ml": {"user": "u", "queues": ["vision"]}}),
      cluster("b", intake={"ml": {"user": "v", "queues": ["nlp", "vision"]}})],
     "namespace ml maps to several queues: nlp (spec.kubernetes.intake of cluster b); "
     "vision (spec.kubernetes.intake of cluster a); name one with --queue"),
])
def test_clusters_that_disagree_are_one_line_naming_them(clusters, message):
    with pytest.raises(AmbiguousNamespace) as caught:
        namespace_queue("ml", clusters, QUEUES)
    assert str(caught.value) == message


def test_documents_of_another_shape_are_read_as_mapping_nothing():
    odd = [None, {"metadata": "x"}, {"spec": {"kubernetes": []}}, {"spec": {"kubernetes": {"namespaces": [1],
                                                                                          "intake": {"ml": "x"}}}}]
    assert namespace_queue("ml", odd, QUEUES).queue == "ml"


# -- the plugin's glue, against a fake client -----------------------------------------------------------

class FakeClient:
    def __init__(self, clusters=None, refused: str | None = None):
        self._clusters, self.refused, self.calls = clusters or [], refused, []

    def get_objects(self, kind):
        self.calls.append(kind)
        if self.refused:
            raise ClientError(self.refused, "alice (user) may not call this; needs admin")
        return self._clusters

    def queues(self):
        return [{"name": name} for name in QUEUES]


def _kubeconfig(tmp_path, namespace="ml", current="kind-a") -> dict:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({"current-context": current,
                                    "contexts": [_context("kind-a", namespace), _context("kind-b")]}))
    return {"KUBECONFIG": str(path)}


def test_the_plugin_maps_the_namespace_through_the_client(tmp_path, capsys):
    env = _kubeconfig(tmp_path)
    client = FakeClient([cluster("a", namespaces={"vision": "ml"})])
    plugin = Plugin(plugin_args(["list", "--verbose"]), env)
    assert plugin.queue("list", client) == "vision" and plugin.queue("list", client) == "vision"
    assert client.calls == ["Cluster"]  # read once per command
    err = capsys.readouterr().err
    assert "kubectl sluice: namespace ml: queue vision (spec.kubernetes.namespaces of cluster a)" in err
    assert "Kubernetes context kind-a" in err

    assert Plugin(plugin_args(["list", "-A"]), env).queue("list", client) is None
    assert Plugin(plugin_args(["list", "-n", "nlp"]), env).queue("list", client) == "nlp"
    assert Plugin(plugin_args(["list", "--context", "kind-b"]), env).queue("list", client) == "default"
    assert Plugin(plugin_args(["list"]), {"KUBECONFIG": str(tmp_path / "none")}).queue("list", client) is None


def test_a_token_that_may_not_read_clusters_gets_the_usual_default(tmp_path, capsys):
    plugin = Plugin(plugin_args(["submit", "--verbose"]), _kubeconfig(tmp_path))
    assert plugin.queue("submit f", FakeClient(refused="PERMISSION_DENIED")) is None
    assert "may not read the Cluster objects" in capsys.readouterr().err
    with pytest.raises(Failed) as caught:  # any other refusal is the command's error
        Plugin(plugin_args(["list"]), _kubeconfig(tmp_path)).queue("list", FakeClient(refused="UNAUTHENTICATED"))
    assert caught.value.what == "list"


def test_the_plugin_fails_one_line_on_an_ambiguous_namespace_or_a_bad_kubeconfig(tmp_path):
    client = FakeClient([cluster("a", namespaces={"vision": "ml"}), cluster("b", namespaces={"nlp": "ml"})])
    with pytest.raises(Failed, match="namespace ml maps to several queues"):
        Plugin(plugin_args(["list"]), _kubeconfig(tmp_path)).queue("list", client)
    with pytest.raises(Failed, match="kubeconfig: --context nope: no such context"):
        Plugin(plugin_args(["list", "--context", "nope"]), _kubeconfig(tmp_path)).queue("list", client)


def test_the_sluice_context_follows_the_kubernetes_context(tmp_path):
    config = tmp_path / "client.yaml"
    config.write_text(yaml.safe_dump({"current-context": "prod", "contexts": [
        {"name": "prod", "address": "a:1", "token": "t"}, {"name": "kind-a", "address": "b:1", "token": "t"}]}))
    env = _kubeconfig(tmp_path)
    assert Plugin(plugin_args(["list"]), env).sluice_context("list", str(config)) == "kind-a"
    assert Plugin(plugin_args(["list", "--context", "kind-b"]), env).sluice_context("list", str(config)) is None


# -- the console script's entry point -----------------------------------------------------------------

def kubectl_sluice(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "KUBECONFIG"))}
    code = "import sys; from sluice.cli import kubectl_main; sys.argv[0] = 'kubectl-sluice'; kubectl_main()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**base, "PYTHONPATH": str(ROOT), **(env or {})})


def test_the_console_script_is_declared():
    import tomllib
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-sluice"] == "sluice.cli:kubectl_main" and scripts["sluice"] == "sluice.cli:main"


def test_help_says_kubectl_sluice_and_names_the_kubectl_flags(tmp_path):
    done = kubectl_sluice("--help", env={"HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "Usage: kubectl sluice" in done.stdout and "--sluice-context" in done.stdout
    assert "-n/--namespace" in " ".join(done.stdout.split())
    done = kubectl_sluice("submit", "--help", "-n", "ml", env={"HOME": str(tmp_path)})
    assert done.returncode == 0 and "Usage: kubectl sluice submit" in done.stdout


@pytest.mark.parametrize("args, code, start", [
    (["list", "-n"], 2, "error: kubectl sluice: flag needs an argument: -n"),
    (["bogus"], 2, "error: kubectl sluice: No such command 'bogus'"),
    (["get", "x"], 2, "error: kubectl sluice get: "),
    (["list", "--context", "nope"], 1, "error: list: kubeconfig: --context nope: no such context in the kubeconfig"),
    (["list", "--kubeconfig", "/nonexistent/k"], 1, "error: list: kubeconfig: --kubeconfig /nonexistent/k: no such"),
])
def test_errors_are_one_line_with_the_cli_exit_codes(tmp_path, args, code, start):
    done = kubectl_sluice(*args, env={"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert done.returncode == code and done.stderr.startswith(start) and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_a_broken_kubeconfig_is_one_line(tmp_path):
    (tmp_path / "k").write_text("current-context: [\n")
    done = kubectl_sluice("clusters", env={"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "k")})
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: clusters: kubeconfig: {tmp_path / 'k'}: not valid YAML")


def test_the_plugin_imports_nothing_heavy(tmp_path):
    """As `sluice`'s client commands (test_client_imports), the plugin reads the kubeconfig with PyYAML:
    neither the kubernetes client nor server code, even while it runs a command."""
    (tmp_path / "k").write_text(yaml.safe_dump({"current-context": "a", "contexts": [_context("a", "ml")]}))
    code = ("import json, sys\nfrom sluice.cli import kubectl_main\nsys.argv = ['kubectl-sluice', 'list', '-n', 'x']\n"
            "try:\n    kubectl_main()\nexcept SystemExit:\n    pass\n"
            "heavy = ('kubernetes', 'sqlalchemy', 'psycopg', 'dispatcher', 'agent')\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path),
                               "KUBECONFIG": str(tmp_path / "k"), "XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert json.loads(done.stdout.splitlines()[-1]) == [], done.stderr
    assert done.stderr.startswith("error: list: no dispatcher configured")
