"""The CustomResourceDefinitions of sluice/crds.py: valid for Kubernetes, structural, and in agreement with the
parser of `sluice admin apply` (sluice.objects).

Kubernetes' side is checked with real schema tools, offline: each CRD with `kubernetes-validate` (the
Kubernetes OpenAPI schemas, strict: an unknown or mistyped field of the CRD is an error), the structural
rules the API server adds with structural_problems() below, and custom resources with `jsonschema`'s
Draft 4 validator (OpenAPI v3's base: boolean exclusiveMinimum) extended with what the API server does
around it: null fields dropped, unknown fields refused (kubectl's strict field validation), integral
numbers taken as integers, x-kubernetes-list-type set and map, RE2's `$`, the name and labels rules of
metadata. server_errors() is that emulation.

Agreement: every document to_document() writes passes; every document in test_objects' table of invalid
ones, and every one-field mutation of complete documents, is refused by both or accepted by both, except
for the rules crds.RULES_NOT_IN_SCHEMA and crds.STRICTER_THAN_SLUICE list.
"""
from __future__ import annotations

import copy
import json
import math
import pathlib
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sluice import crds
from sluice._validate import SpecError
from sluice.objects import (
    KINDS,
    BurstPolicyObject,
    ClusterObject,
    QueueObject,
    ServiceClassObject,
    SimulatedSpec,
    default_objects,
    kind_named,
    object_from_document,
)
from sluice.quantity import MAX_MILLI, QuantityError, format_duration_exact, format_quantity, parse_duration
from tests.unit.test_objects import API_EXAMPLE, INVALID_DOCUMENTS

ROOT = pathlib.Path(__file__).resolve().parents[2]
VERSIONS = ("1.27.0", "1.33.0")  # the oldest Kubernetes docs/install.md supports, and the one the CRDs target
CRDS = {c["spec"]["names"]["kind"]: c for c in crds.crds()}


def schema_of(kind: str) -> dict:
    return CRDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


# -- the API server, emulated -----------------------------------------------------------------------

def _integer(checker, value) -> bool:
    """Kubernetes (kube-openapi) takes a number with no fraction as an integer, up to 2^53."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**53


def _pattern(validator, pattern, instance, schema):
    """Go's RE2: `$` without the multi-line flag ends the text (Python's also matches before a final newline)."""
    if isinstance(instance, str) and not re.search(re.sub(r"(?<!\\)\$$", r"\\Z", pattern), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _list_type(validator, list_type, instance, schema):
    if not isinstance(instance, list):
        return
    if list_type == "set":
        keys = [json.dumps(item, sort_keys=True) for item in instance]
    elif list_type == "map":
        keys = [json.dumps([item.get(k) for k in schema["x-kubernetes-list-map-keys"]]) for item in instance
                if isinstance(item, dict)]
    else:
        return
    for i, item in enumerate(keys):
        if item in keys[:i]:
            yield jsonschema.ValidationError(f"Duplicate value: {instance[i]!r}")


Validator = jsonschema.validators.extend(
    jsonschema.Draft4Validator, {"pattern": _pattern, "x-kubernetes-list-type": _list_type},
    type_checker=jsonschema.Draft4Validator.TYPE_CHECKER.redefine("integer", _integer))
VALIDATORS = {kind: Validator(schema_of(kind)) for kind in CRDS}

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _label_problems(labels) -> list[str]:
    """ObjectMeta's labels, as the API server checks them."""
    if not isinstance(labels, dict):
        return ["metadata.labels: must be a map of strings"]
    problems = []
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if ("/" in key and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix))) or len(name) > 63 \
                or not _LABEL_NAME.fullmatch(name):
            problems.append(f"metadata.labels: invalid key {key!r}")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            problems.append(f"metadata.labels.{key}: invalid value {value!r}")
    return problems


def _without_nulls(value, schema: dict):
    """A field set to null is dropped before validation (nullable is false throughout)."""
    if isinstance(value, dict) and schema.get("type") == "object":
        out = {}
        for key, item in value.items():
            below = schema.get("properties", {}).get(key, schema.get("additionalProperties"))
            if item is None and isinstance(below, dict):
                continue
            out[key] = _without_nulls(item, below) if isinstance(below, dict) else item
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_without_nulls(item, schema["items"]) for item in value]
    return value


def _unknown_fields(value, schema: dict, path: str) -> list[str]:
    """kubectl's strict field validation: a field the schema does not name is an error (metadata aside)."""
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [p for i, item in enumerate(value) for p in _unknown_fields(item, schema["items"], f"{path}[{i}]")]
    if not isinstance(value, dict) or schema.get("type") != "object":
        return []
    problems = []
    for key, item in value.items():
        at = f"{path}.{key}" if path else key
        if key in schema.get("properties", {}):
            if at != "metadata":
                problems += _unknown_fields(item, schema["properties"][key], at)
        elif isinstance(schema.get("additionalProperties"), dict):
            problems += _unknown_fields(item, schema["additionalProperties"], at)
        elif "properties" in schema:
            problems.append(f"{at}: unknown field")
    return problems


def server_errors(resource) -> list[str]:
    """Why the API server refuses to create `resource` (a Sluice custom resource), or []."""
    try:
        resource = json.loads(json.dumps(resource, allow_nan=False))  # what kubectl can send at all
    except ValueError as exc:
        return [f"not JSON: {exc}"]
    if not isinstance(resource, dict):
        return ["not an object"]
    kind = resource.get("kind")
    if resource.get("apiVersion") != f"{crds.GROUP}/{crds.VERSION}" or kind not in CRDS:
        return [f"no kind {kind!r} in {resource.get('apiVersion')!r}"]
    metadata = resource.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        return [f"metadata.name: {name!r} is not a DNS subdomain"]
    problems = _label_problems(metadata["labels"]) if metadata.get("labels") is not None else []
    schema = schema_of(kind)
    resource = _without_nulls(resource, schema)
    problems += _unknown_fields(resource, schema, "")
    problems += [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATORS[kind].iter_errors(resource)]
    return problems


def stored(resource):
    """`resource` as the sync reads it back from the API server: JSON, with Go's float64 printing a number that
    has no fraction (2.0) as an integer (2)."""
    def go(value):
        if isinstance(value, dict):
            return {k: go(v) for k, v in value.items()}
        if isinstance(value, list):
            return [go(v) for v in value]
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
            return int(value)
        return value
    return go(json.loads(json.dumps(resource, allow_nan=False)))


def sluice_error(resource) -> SpecError | None:
    """Why the sync's validation (`sluice admin apply`'s) refuses what the API server stored, or None."""
    try:
        object_from_document(crds.admin_document(stored(resource)))
    except SpecError as exc:
        return exc
    return None


# -- the CRDs themselves ----------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_crd_validates_against_the_kubernetes_schemas(kind, version):
    kubernetes_validate.validate(CRDS[kind], version, strict=True)


def test_there_is_one_crd_per_admin_kind_named_as_kubectl_and_sluice_admin_get_name_it():
    assert list(CRDS) == list(KINDS) == list(crds.NAMES)
    for kind, definition in CRDS.items():
        plural, singular, short_names = crds.NAMES[kind]
        spec = definition["spec"]
        assert definition["metadata"]["name"] == f"{plural}.sluice.io" == f"{spec['names']['plural']}.{spec['group']}"
        assert (spec["group"], spec["scope"]) == ("sluice.io", "Cluster")
        assert [(v["name"], v["served"], v["storage"]) for v in spec["versions"]] == [("v1", True, True)]
        assert spec["versions"][0]["subresources"] == {"status": {}}
        assert spec["names"] == {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": singular,
                                 "shortNames": list(short_names), "categories": ["sluice"]}
        assert kind_named(plural) == kind_named(singular) == kind  # `sluice admin get queues` too


BUILT_IN_SHORT_NAMES = {"cm", "cs", "csr", "cj", "crd", "crds", "deploy", "ds", "ep", "ev", "hpa", "ing", "limits",
                        "netpol", "no", "ns", "pc", "pdb", "po", "pv", "pvc", "quota", "rc", "rs", "sa", "sc", "sts",
                        "svc", "vac"}


def test_no_name_is_one_a_built_in_resource_uses():
    path = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / "v1.33.0-local-strict"
    definitions = json.loads((path / "_definitions.json").read_text())["$defs"]
    built_in = {g["kind"].lower() for d in definitions.values() for g in d.get("x-kubernetes-group-version-kind", [])}
    assert "storageclass" in built_in and "pod" in built_in
    for kind, (plural, singular, short_names) in crds.NAMES.items():
        assert kind.lower() not in built_in and singular not in built_in
        assert {plural, *short_names}.isdisjoint(BUILT_IN_SHORT_NAMES | {k + "s" for k in built_in})


# What a structural schema may hold, by where it is (the API server's apiextensions validation).
_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
_FORBIDDEN = ("$ref", "id", "definitions", "dependencies", "patternProperties", "additionalItems")
_IN_JUNCTORS = {"pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
                "minItems", "maxItems", "minProperties", "maxProperties", "multipleOf", "enum", "required", "format",
                "items", "properties", *_JUNCTORS}
_AT_ROOT_WITH_STATUS = {"description", "type", "format", "title", "required", "properties", "externalDocs",
                        "example", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-validations"}
_RE2_UNSUPPORTED = re.compile(r"\(\?[=!<]|\\[1-9]|\(\?P=")  # lookaround and backreferences


def structural_problems(crd: dict) -> list[str]:
    """What the API server refuses in a CRD beyond its OpenAPI schema: the structural-schema rules, list types,
    metadata, names and printer columns."""
    problems = []
    spec = crd["spec"]
    if len(spec["group"].split(".")) < 2 or not _DNS_SUBDOMAIN.fullmatch(spec["group"]):
        problems.append("spec.group must be a DNS subdomain with a dot")
    if crd["metadata"]["name"] != f"{spec['names']['plural']}.{spec['group']}":
        problems.append("metadata.name must be spec.names.plural + '.' + spec.group")
    dns_label = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
    names = spec["names"]
    for word in (names["plural"], names["singular"], names["kind"].lower(), names["listKind"].lower(),
                 *names.get("shortNames", []), *names.get("categories", [])):
        if len(word) > 63 or not dns_label.fullmatch(word):
            problems.append(f"spec.names: {word!r} is not a DNS-1035 label")
    if names["kind"] == names["listKind"]:
        problems.append("spec.names: kind and listKind are the same")
    if [v["storage"] for v in spec["versions"]].count(True) != 1:
        problems.append("spec.versions: exactly one storage version")
    for version in spec["versions"]:
        root = version["schema"]["openAPIV3Schema"]
        where = f"spec.versions[{version['name']}].schema.openAPIV3Schema"
        if root.get("type") != "object":
            problems.append(f"{where}: the root must be an object")
        if "status" in version.get("subresources", {}):
            problems += [f"{where}.{k}: not allowed at the root with the status subresource"
                         for k in set(root) - _AT_ROOT_WITH_STATUS]
        metadata = root.get("properties", {}).get("metadata")
        if metadata is not None and (set(metadata) - {"type", "properties"} or metadata.get("type") != "object"
                                     or set(metadata.get("properties", {})) - {"name", "generateName"}):
            problems.append(f"{where}.properties.metadata: may restrict only name and generateName")
        problems += _structural(root, where, "root")
        for column in version.get("additionalPrinterColumns", []):
            problems += _column_problems(column, root, f"{where} column {column.get('name')}")
    return problems


def _structural(node: dict, where: str, level: str) -> list[str]:
    problems = []
    kind = node.get("type")
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    problems += [f"{where}.{k}: not supported" for k in _FORBIDDEN if k in node]
    if kind is None and not int_or_string and preserve is not True:
        problems.append(f"{where}: no type")
    if kind is not None and kind not in ("string", "number", "integer", "boolean", "array", "object"):
        problems.append(f"{where}: type {kind!r}")
    if int_or_string and (kind is not None or preserve is not None
                          or node.get("anyOf") != [{"type": "integer"}, {"type": "string"}]):
        problems.append(f"{where}: x-kubernetes-int-or-string needs exactly anyOf [integer, string] and no type")
    if preserve is False:
        problems.append(f"{where}: x-kubernetes-preserve-unknown-fields must be true or absent")
    if node.get("uniqueItems"):
        problems.append(f"{where}: uniqueItems is forbidden (use x-kubernetes-list-type: set)")
    additional = node.get("additionalProperties")
    if additional is not None:
        if additional is False:
            problems.append(f"{where}: additionalProperties cannot be false")
        if "properties" in node:
            problems.append(f"{where}: additionalProperties and properties are mutually exclusive")
        if level == "root":
            problems.append(f"{where}: additionalProperties at the root")
    if kind == "array" and not isinstance(node.get("items"), dict):
        problems.append(f"{where}: an array needs one items schema")
    if (kind == "object") != ("properties" in node or "additionalProperties" in node) and not preserve:
        if kind == "object":
            problems.append(f"{where}: an object with neither properties nor additionalProperties prunes everything")
        else:
            problems.append(f"{where}: properties on a {kind}")
    if "pattern" in node:
        try:
            re.compile(node["pattern"])
        except re.error as exc:
            problems.append(f"{where}.pattern: {exc}")
        if _RE2_UNSUPPORTED.search(node["pattern"]):
            problems.append(f"{where}.pattern: not RE2 (lookaround or backreference)")
    list_type = node.get("x-kubernetes-list-type")
    if list_type is not None:
        items = node.get("items") or {}
        if kind != "array" or list_type not in ("atomic", "set", "map"):
            problems.append(f"{where}: x-kubernetes-list-type {list_type!r} on a {kind}")
        if list_type == "set" and items.get("type") in ("object", "array"):
            problems.append(f"{where}: a set's items must be scalars")
        if list_type == "map":
            keys = node.get("x-kubernetes-list-map-keys") or []
            if items.get("type") != "object" or not keys or not set(keys) <= set(items.get("required", [])) or any(
                    items["properties"].get(k, {}).get("type") in (None, "object", "array") for k in keys):
                problems.append(f"{where}: a map list needs required scalar keys")
    elif "x-kubernetes-list-map-keys" in node:
        problems.append(f"{where}: x-kubernetes-list-map-keys without x-kubernetes-list-type: map")
    if "default" in node:
        problems.append(f"{where}: defaults are not used here")  # none are: the parser's defaults apply
    for junctor in _JUNCTORS:
        subs = node.get(junctor, []) if junctor != "not" else [node["not"]] if "not" in node else []
        for i, sub in enumerate(subs):
            if int_or_string and junctor == "anyOf":
                continue
            problems += [f"{where}.{junctor}[{i}].{k}: not allowed in a junctor" for k in set(sub) - _IN_JUNCTORS]
    for key, below in node.get("properties", {}).items():
        problems += _structural(below, f"{where}.properties.{key}", "field")
    if isinstance(additional, dict):
        problems += _structural(additional, f"{where}.additionalProperties", "field")
    if isinstance(node.get("items"), dict):
        problems += _structural(node["items"], f"{where}.items", "item")
    return problems


_COLUMN_TYPES = {"integer": ("integer",), "number": ("number",), "boolean": ("boolean",),
                 "string": ("string", "int-or-string"), "date": ("date-time",)}


def _column_problems(column: dict, root: dict, where: str) -> list[str]:
    problems = []
    if set(column) - {"name", "type", "format", "description", "priority", "jsonPath"} or not column.get("name"):
        problems.append(f"{where}: fields")
    path = column.get("jsonPath", "")
    if not re.fullmatch(r"(\.[A-Za-z][A-Za-z0-9]*)+", path):
        problems.append(f"{where}: {path!r} is not a simple JSON path")
        return problems
    if path == ".metadata.creationTimestamp":
        found = "date-time"
    else:
        node = root
        for part in path[1:].split("."):
            node = node.get("properties", {}).get(part)
            if node is None:
                return [*problems, f"{where}: {path} is not in the schema"]
        found = "int-or-string" if node.get("x-kubernetes-int-or-string") else node.get("type")
    if found not in _COLUMN_TYPES.get(column.get("type"), ()):
        problems.append(f"{where}: a {column.get('type')} column shows {path}, a {found}")
    return problems


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_crd_is_structural_and_its_columns_show_fields_it_has(kind):
    assert structural_problems(CRDS[kind]) == []
    jsonschema.Draft4Validator.check_schema(schema_of(kind))  # and a valid JSON Schema (draft 4, OpenAPI's base)


def test_the_structural_check_finds_what_the_api_server_refuses():
    def broken(change, kind="Queue") -> list[str]:
        definition = copy.deepcopy(CRDS[kind])
        change(definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        return structural_problems(definition)

    spec = "properties.spec.properties"

    def at(root, path):
        node = root
        for part in path.split("."):
            node = node[part]
        return node

    cases = {
        "no type": lambda r: at(r, spec + ".weight").pop("type"),
        "int-or-string": lambda r: at(r, spec + ".usageHalfLife").update(type="string"),
        "uniqueItems": lambda r: at(r, spec + ".members").update(uniqueItems=True),
        "mutually exclusive": lambda r: at(r, spec + ".guaranteed").update(properties={"cpu": {"type": "string"}}),
        "cannot be false": lambda r: at(r, "properties.spec").update(additionalProperties=False),
        "needs one items": lambda r: at(r, spec + ".members").pop("items"),
        "must be scalars": lambda r: at(r, spec + ".serviceClasses").update(items={"type": "object",
                                                                                   "properties": {}}),
        "not RE2": lambda r: at(r, spec + ".parent").update(pattern="^(?!x).*$"),
        "only name and generateName": lambda r: at(r, "properties.metadata.properties").update(
            labels={"type": "object"}),
        "not in the schema": lambda r: at(r, "properties.status.properties").pop("used"),
        "not allowed in a junctor": lambda r: at(r, spec + ".max").update(anyOf=[{"type": "object"}]),
        "defaults": lambda r: at(r, spec + ".weight").update(default=1),
        "at the root": lambda r: r.update(additionalProperties={"type": "string"}),
    }
    for needle, change in cases.items():
        found = broken(change)
        assert [p for p in found if needle in p], f"{needle}: {found}"
    shown = copy.deepcopy(CRDS["Queue"])
    shown["spec"]["versions"][0]["additionalPrinterColumns"][1]["type"] = "integer"  # Weight is a number
    assert [p for p in structural_problems(shown) if "a integer column shows .spec.weight" in p]


def test_a_drift_between_schema_and_parser_fails_the_build():
    with pytest.raises(crds.SchemaDrift, match=r"X: described here but unknown to the parser: c; known to the "
                                               r"parser but not described here: b"):
        crds._object("X", ("a", "b"), "", {"a": {"type": "string"}, "c": {"type": "string"}})


# -- every document Sluice writes passes --------------------------------------------------------------

FULL = [  # every field set, with values off the defaults
    QueueObject("research", usage_half_life_s=5400.0, guaranteed={"cpu": 64000}, weight=2.5),
    QueueObject("vision", parent="research", guaranteed={"cpu": 500, "memory": 256 * 2**30 * 1000, "nvidia.com/gpu": 0},
                max={"cpu": 128000, "memory": 512 * 2**30 * 1000 + 1500, "example.com/fpga": 2000}, weight=0.25,
                members=("alice", "b@c"),
                service_classes=("standard", "critical", "batch")),
    ServiceClassObject("gold", priority=-1000, preemptible=True, can_preempt=True, weight=3.0,
                       reservation_after_s=0.25, price_multiplier=0.0, burst_allowed=True, burst_after_s=90.5),
    ServiceClassObject("lead", priority=1000, reservation_after_s=1e-7, burst_after_s=0.0),
    ClusterObject("gpu-a", labels={"tier": "cloud", "example.com/region": "eu-1", "empty": ""}, tier="cloud",
                  site="s" * 63, lease_duration_s=2.5, price={"cpu": 0.04, "nvidia.com/gpu": 2, "memory": 0},
                  prometheus={"url": "https://p:9090", "selector": '{c="a"}', "timeout": 2.5, "retries": 10,
                              "headers": {"Authorization": "Bearer x"},
                              "queries": {"allocatable": "a{{sel}}", "scraped_time": "t"}},
                  elastic={"maxNodes": 10_000, "provisioningDelay": 0.0, "scaleDownAfter": 86400.0 * 3,
                           "node": {"cpu": 8000}},
                  pod_policy={"allowPrivileged": True, "allowHostPath": True, "allowHostNetwork": True,
                              "allowHostPID": True, "serviceAccounts": ("builder", "runner")},
                  kubernetes={"namespaces": {"vision": "team-vision", "a.b_c": "x" * 63}, "createNamespaces": True,
                              "gangStartTimeout": 45.5, "workload": "jobs"},
                  simulated=SimulatedSpec(0, {"cpu": 16000, "memory": 3 * 2**30 * 1000})),
    ClusterObject("edge-1", tier="edge", prometheus={"url": "http://p"}, simulated=SimulatedSpec(1, {"cpu": 1})),
    BurstPolicyObject("all", queues=("vision", "research"), service_classes=("gold",),
                      cluster_selector={"tier": "cloud", "example.com/zone": ""}, after_s=600.0, budget_per_hour=0.0,
                      budget_per_day=1e6, max_resources={"nvidia.com/gpu": 32000},
                      queue_budget_per_hour=2.5, queue_budget_per_day=10.0, queue_max_resources={"cpu": 1}),
]


def _docs_yaml_objects() -> list[dict]:
    """The admin objects in docs/'s YAML examples that `sluice admin apply` takes."""
    found = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        for block in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.DOTALL):
            try:
                docs = [d for d in yaml.safe_load_all(block) if isinstance(d, dict)]
            except yaml.YAMLError:
                continue
            for doc in docs:
                if doc.get("apiVersion") == "sluice.io/v1" and doc.get("kind") in KINDS:
                    try:
                        object_from_document(doc)
                    except SpecError:
                        continue  # an example of a mistake
                    found.append(doc)
    return found


def written_documents() -> list[dict]:
    files = [ROOT / "examples" / "cluster-config.yaml", ROOT / "deploy" / "examples" / "kind-objects.yaml"]
    raw = [d for path in files for d in yaml.safe_load_all(path.read_text()) if d]
    raw += list(yaml.safe_load_all(API_EXAMPLE)) + _docs_yaml_objects()
    objects = [*default_objects(), *FULL, *(object_from_document(d) for d in raw)]
    return raw + [obj.to_document() for obj in objects]


def test_the_written_documents_cover_every_kind_and_the_docs_examples():
    documents = written_documents()
    assert {d["kind"] for d in documents} == set(KINDS)
    assert len(_docs_yaml_objects()) >= 6  # docs/api.md's four and the admin guide's
    assert len(documents) > 50


def test_every_document_sluice_writes_or_reads_passes_the_crd_schema():
    problems = {}
    for doc in written_documents():
        assert sluice_error(doc) is None
        errors = server_errors(doc)
        if errors:
            problems[f"{doc['kind']}/{doc['metadata']['name']}"] = errors
    assert not problems, problems


def test_a_custom_resource_with_kubernetes_metadata_and_status_is_the_same_sluice_document():
    resource = {**QueueObject("vision", parent="org").to_document(),
                "status": {"accepted": True, "observedGeneration": 3, "guaranteed": "-", "max": "-", "used": "cpu=2",
                           "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                                           "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3}]}}
    resource["metadata"] |= {"uid": "u", "generation": 3, "resourceVersion": "9", "labels": {"team": "a"},
                             "annotations": {"a": "b"}, "creationTimestamp": "2026-01-01T00:00:00Z"}
    assert server_errors(resource) == []
    assert crds.admin_document(resource) == QueueObject("vision", parent="org").to_document()
    cluster = ClusterObject("c", labels={"zone": "a"}).to_document()
    assert crds.admin_document({**cluster, "status": {}}) == cluster
    assert "labels" not in crds.admin_document({**cluster, "metadata": {"name": "c", "labels": {}}})["metadata"]
    twice = copy.deepcopy(resource)
    twice["status"]["conditions"] *= 2
    assert [e for e in server_errors(twice) if "Duplicate" in e]


# -- what Sluice refuses, the schema refuses: the differences are the listed ones ----------------------

# Each difference, to the entry of crds.RULES_NOT_IN_SCHEMA (the schema takes what Sluice refuses) or
# crds.STRICTER_THAN_SLUICE (the other way round) that explains it.
CROSS_FIELD, OTHER_OBJECTS, MAP_KEYS, MAGNITUDES, NULLS = crds.RULES_NOT_IN_SCHEMA
WHOLE_NUMBERS, NO_SPACES, NO_UNDERSCORE, LABEL_VALUES = crds.STRICTER_THAN_SLUICE
assert "between fields" in CROSS_FIELD and "keys of maps" in MAP_KEYS and "null" in NULLS
assert "whole number" in WHOLE_NUMBERS and "spaces" in NO_SPACES and "'_'" in NO_UNDERSCORE


def _schema_nodes(node: dict, path: str = ""):
    """(dotted path, schema) of every field the schema describes ('*' for a map's entries)."""
    yield path, node
    for key, below in node.get("properties", {}).items():
        yield from _schema_nodes(below, f"{path}.{key}" if path else key)
    if isinstance(node.get("additionalProperties"), dict):
        yield from _schema_nodes(node["additionalProperties"], f"{path}.*")
    if isinstance(node.get("items"), dict):
        yield from _schema_nodes(node["items"], f"{path}[]")


MAP_PATHS = {path for kind in CRDS for path, node in _schema_nodes(schema_of(kind)) if "additionalProperties" in node}


def not_in_schema(error: SpecError, resource: dict) -> str | None:
    """The RULES_NOT_IN_SCHEMA entry behind a refusal the schema does not make, or None."""
    message, path = error.message, error.path
    if any(m in message for m in ("cannot be its own parent", "must not exceed spec.max", "only a top-level queue",
                                  "must be at least spec.simulated.nodes", "unless the cluster is elastic")):
        return CROSS_FIELD
    if (path in MAP_PATHS and "must be a mapping" not in message) or (
            path.startswith(("spec.clusterSelector", "metadata.labels")) and "key" in message):
        return MAP_KEYS
    if "is too large" in message or "finite duration" in message:
        return MAGNITUDES
    kind_schema = schema_of(resource["kind"]) if resource.get("kind") in CRDS else None
    if kind_schema and _without_nulls(resource, kind_schema) != resource \
            and sluice_error(_without_nulls(resource, kind_schema)) is None:
        return NULLS
    return None


def _int_or_string_values(value, schema: dict):
    """The values `value` holds where the schema has an int-or-string (a quantity or a duration)."""
    if schema.get("x-kubernetes-int-or-string"):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            below = schema.get("properties", {}).get(key, schema.get("additionalProperties"))
            if isinstance(below, dict):
                yield from _int_or_string_values(item, below)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            yield from _int_or_string_values(item, schema["items"])


def stricter_than_sluice(resource: dict) -> str | None:
    """The STRICTER_THAN_SLUICE entry behind a refusal of what Sluice takes, or None."""
    metadata = resource.get("metadata") if isinstance(resource.get("metadata"), dict) else {}
    if isinstance(metadata.get("name"), str) and "_" in metadata["name"]:
        return NO_UNDERSCORE
    if resource.get("kind") == "Cluster" and metadata.get("labels") is not None \
            and _label_problems(metadata["labels"]):
        return LABEL_VALUES
    values = list(_int_or_string_values(resource, schema_of(resource["kind"])))
    if any(isinstance(v, float) and not v.is_integer() for v in values):
        return WHOLE_NUMBERS
    if any(isinstance(v, str) and v != v.strip() for v in values):
        return NO_SPACES
    return None


def disagreement(resource) -> str | None:
    """None when the API server and the sync's validation agree on `resource`, or differ by a listed rule;
    otherwise how they differ."""
    refused_by_server = server_errors(resource)
    try:
        refused_by_sluice = sluice_error(resource)
    except ValueError:  # not JSON: kubectl cannot send it
        return None if refused_by_server else "the server takes what is not JSON"
    if refused_by_sluice and not refused_by_server and not_in_schema(refused_by_sluice, resource) is None:
        return f"only Sluice refuses it: {refused_by_sluice}"
    if refused_by_server and not refused_by_sluice and stricter_than_sluice(resource) is None:
        return f"only the API server refuses it: {refused_by_server}"
    return None


@pytest.mark.parametrize("document, path, message", INVALID_DOCUMENTS)
def test_what_the_parser_refuses_the_schema_refuses_unless_a_schema_cannot_say_it(document, path, message):
    assert disagreement(document) is None


def test_the_invalid_documents_the_api_server_takes_are_those_no_schema_can_refuse():
    taken = [(path, message) for document, path, message in INVALID_DOCUMENTS if not server_errors(document)]
    assert taken == [
        ("status", "unknown field (known: apiVersion, kind, metadata, spec)"),  # a resource's own: the sync drops it
        ("metadata.labels", "unknown field (known: name)"),  # Kubernetes': the sync passes a Cluster's alone
        ("spec.parent", "a queue cannot be its own parent"),
        ("spec.guaranteed.cpu", "must not exceed spec.max.cpu (128)"),
        ("spec.usageHalfLife", "only a top-level queue (no spec.parent) sets it: it applies to the whole tree below "
                               "that queue"),
        ("spec.price", 'must be a string, got integer 1 (quote it: "1")'),  # in JSON every key is a string
        ("spec.elastic.maxNodes", "must be at least spec.simulated.nodes (2)"),
        ("spec.simulated.nodes", "must be at least 1 unless the cluster is elastic"),
    ]


PROBES = [None, True, False, 0, 1, -1, 2, 0.5, 1.5, 2.0, -0.5, 11, 1000, 1001, -1000, -1001, 10_000, 10_001,
          MAX_MILLI // 1000, MAX_MILLI // 1000 + 1, "", " ", "x", "X", "a_b", "a.b", "-a", "a" * 63, "a" * 64,
          "1", "0", "500m", "1Gi", "1GiB", "-1", "1.5", " 1", "1e3", "9" * 400, "0s", "90s", "1.5s", "0.0m",
          "250ms", "1d", "9" * 400 + "d", "-1s", "1 s", "s", "http://p", "https://p", "ftp://p", "cloud", "edge",
          "space", "jobs", "deployments", "Ns-1", [], ["a"], ["a", "a"], [""], [1], ["Gold"], {}, {"cpu": "1"},
          {"cpu": "lots"}, {"cpu": 1.5}, {"cpu": -1}, {"cpu": " 2"}, {"": "1"}, {"a": "b"}, {"a": 1}, {"a": None},
          {"a/b": "c"}, {"A_": "x y"}]
REMOVED = object()


def _key_paths(value, keys: tuple = ()):
    """The keys leading to every field and list entry below `value`."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield (*keys, key)
        yield from _key_paths(item, (*keys, key))


def _changed(document: dict, keys: tuple, value) -> dict:
    out = copy.deepcopy(document)
    parent = out
    for key in keys[:-1]:
        parent = parent[key]
    if value is REMOVED:
        del parent[keys[-1]]
    else:
        parent[keys[-1]] = copy.deepcopy(value)
    return out


def _mutations(document: dict):
    """(what changed, the changed document): each field and entry replaced by each probe, each removed, and
    an unknown field added to each mapping."""
    for keys in _key_paths(document):
        if keys in (("apiVersion",), ("kind",)):
            continue
        for probe in [*PROBES, REMOVED]:
            yield f"{'.'.join(map(str, keys))} = {'<removed>' if probe is REMOVED else repr(probe)}", \
                _changed(document, keys, probe)
        if isinstance(_at(document, keys), dict):
            yield f"{'.'.join(map(str, keys))}.zzzUnknown added", _changed(document, (*keys, "zzzUnknown"), "1")


def _at(document: dict, keys: tuple):
    for key in keys:
        document = document[key]
    return document


@pytest.mark.parametrize("obj", FULL, ids=lambda o: f"{o.kind}-{o.name}")
def test_every_one_field_change_is_refused_by_both_or_by_neither_but_for_the_listed_rules(obj):
    found, count = [], 0
    for change, mutated in _mutations(obj.to_document()):
        count += 1
        problem = disagreement(mutated)
        if problem:
            found.append(f"{change}: {problem}")
    assert count > 500
    assert not found, "\n".join(found[:40])


# -- quantities and durations: what the parser writes and reads, the patterns say ----------------------

def _node_accepts(node: dict, value) -> bool:
    return not list(Validator(node).iter_errors(value))


QUANTITY = CRDS["Queue"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
    "max"]["additionalProperties"]
DURATION = schema_of("ServiceClass")["properties"]["spec"]["properties"]["reservationAfter"]
POSITIVE_DURATION = schema_of("Cluster")["properties"]["spec"]["properties"]["leaseDuration"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "ephemeral-storage"]), st.integers(0, MAX_MILLI))
def test_every_quantity_sluice_writes_matches_the_pattern(resource, milli):
    assert _node_accepts(QUANTITY, format_quantity(resource, milli))


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0, max_value=1e12, allow_nan=False) | st.integers(0, 10**9).map(float))
def test_every_duration_sluice_writes_matches_the_pattern(seconds):
    text = format_duration_exact(seconds)
    assert _node_accepts(DURATION, text)
    assert _node_accepts(POSITIVE_DURATION, text) == (seconds > 0)


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"\A[0-9.]{0,5}(ms|s|m|h|d|x|)\Z") | st.integers(-5, 5) | st.floats(-2, 2, allow_nan=False))
def test_the_duration_patterns_take_what_the_parser_takes(value):
    try:
        seconds = parse_duration(value)
        parsed = math.isfinite(seconds)
    except QuantityError:
        parsed, seconds = False, 0.0
    whole = not isinstance(value, float) or value.is_integer()
    assert _node_accepts(DURATION, value) == (parsed and whole)
    assert _node_accepts(POSITIVE_DURATION, value) == (parsed and whole and seconds > 0)


def test_resource_summary_is_what_the_queue_columns_show():
    assert crds.resource_summary({"cpu": 64000, "memory": 256 * 2**30 * 1000, "nvidia.com/gpu": 500}) == \
        "cpu=64,memory=256Gi,nvidia.com/gpu=500m"
    assert crds.resource_summary({}) == "-"


# -- sluice admin crds ------------------------------------------------------------------------------

def _admin_crds(*args: str):
    from sluice.cli import app
    return CliRunner().invoke(app, ["admin", "crds", *args])


def test_sluice_admin_crds_prints_the_four_definitions_as_yaml_or_a_json_list():
    done = _admin_crds()
    assert done.exit_code == 0, done.output
    assert list(yaml.safe_load_all(done.stdout)) == crds.crds()
    assert done.stdout == crds.manifests_yaml(crds.crds())
    done = _admin_crds("-o", "json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {"apiVersion": "v1", "kind": "List", "items": crds.crds()}
    assert _admin_crds("--output", "yaml").stdout == crds.manifests_yaml(crds.crds())


def test_sluice_admin_crds_refuses_a_table():
    done = _admin_crds("-o", "table")
    assert done.exit_code == 2
    assert "table" in done.output


def test_the_admin_guide_names_the_resources_and_columns():
    guide = (ROOT / "docs" / "admin-guide.md").read_text()
    part = guide[guide.index("## Admin objects as Kubernetes resources"):]
    part = part[:part.index("\n## ", 5)]
    for kind, (plural, _, short_names) in crds.NAMES.items():
        columns = ", ".join(c["name"] for c in crds.COLUMNS[kind] if not c.get("priority"))
        assert f"| `{kind}` | `{plural}.sluice.io` | `{'`, `'.join(short_names)}` | {columns} |" in part
    for needle in ("sluice admin crds", "kubectl apply -k deploy/base/crds", "crds.enabled=true", "cluster-scoped",
                   "deploy/sync_crds.py", "helm.sh/resource-policy: keep", "status.guaranteed"):
        assert needle in part, needle
