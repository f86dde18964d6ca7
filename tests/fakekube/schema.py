"""CustomResourceDefinitions as the API server takes them: the checks on a CRD itself, and the pruning,
defaulting and validation of custom objects against a version's `openAPIV3Schema`.

Errors are `(field path, message)` pairs worded as the API server's field errors are (`spec.weight`,
`Invalid value: "string": spec.weight in body must be of type integer: "string"`); the server turns them
into a 422 Invalid Status.

Custom objects (`prune`, `default`, `validate`): unknown fields are dropped unless a node says
`x-kubernetes-preserve-unknown-fields` (or has `additionalProperties`), nulls of non-nullable fields are
dropped, `default`s fill absent fields, then the value is checked: `type` (integer is not number, a boolean
is not an integer), `x-kubernetes-int-or-string`, `nullable`, `enum`, `minimum`/`maximum` (and exclusive),
`multipleOf`, `minLength`/`maxLength`, `pattern`, `minItems`/`maxItems`, `minProperties`/`maxProperties`,
`required`, `properties`, `additionalProperties` (schema), `items`, `allOf`/`anyOf`/`oneOf`/`not`, and the
uniqueness of `x-kubernetes-list-type: set|map` lists. `format` is not checked; nor are
`x-kubernetes-validations` (CEL) rules. A `pattern` is Go's RE2 syntax: Python's `re` reads it, or the
`regex` package (when installed) what `re` cannot (such as Unicode classes); a pattern neither reads is not checked.

CRDs (`crd_errors`): the name is `plural.group`, the group a domain with a dot, scope and names, exactly
one storage version and unique version names, a schema for every version, each schema structural (every
node has a `type` unless `x-kubernetes-int-or-string` / `x-kubernetes-preserve-unknown-fields`, object at the
root, arrays have `items`, `properties` and `additionalProperties` are exclusive, no `additionalProperties`
at the root, no `uniqueItems`, no `$ref`, metadata at the root restricts only name and generateName, known
types, valid patterns and list types), defaults that validate against their own schema, printer columns.
"""
from __future__ import annotations

import copy
import json
import math
import re

OBJECT_META_FIELDS = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences", "finalizers",
    "managedFields"})
_TYPES = ("array", "boolean", "integer", "number", "object", "string")
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1035_MESSAGE = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
                    "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")
_COLUMN_TYPES = ("boolean", "date", "integer", "number", "string")
_COLUMN_FORMATS = ("byte", "date", "date-time", "double", "float", "int32", "int64", "password")


_PATTERNS: dict[str, object] = {}


def _pattern(text: str):
    """A schema pattern compiled (Go's RE2 syntax: Python's `re`, or the `regex` package for what `re` lacks,
    such as \\p{L}); None when neither can read it and no checker is at hand (then it is not checked). Raises
    re.error for a pattern that is invalid."""
    if text not in _PATTERNS:
        try:
            _PATTERNS[text] = re.compile(text)
        except re.error:
            try:
                import regex
            except ImportError:
                _PATTERNS[text] = None
            else:
                try:
                    _PATTERNS[text] = regex.compile(text)
                except regex.error as exc:
                    raise re.error(str(exc)) from None
    return _PATTERNS[text]


def go_value(value: object) -> str:
    """A value as the API server prints it in a field error."""
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _name(path: str) -> str:
    return f"{path} " if path else ""


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _is_type(value: object, wanted: str) -> bool:
    actual = type_name(value)
    return actual == wanted or (wanted == "number" and actual == "integer")


# -- custom objects ------------------------------------------------------------------------------------

def prune(obj: dict, schema: dict) -> list[str]:
    """Drop, in place, the fields `schema` does not specify (at the root, apiVersion and kind stay and metadata
    keeps the ObjectMeta fields). Returns the paths dropped (`spec.foo`), for the API server's warnings."""
    dropped: list[str] = []
    for key in [k for k in obj if k not in ("apiVersion", "kind", "metadata")]:
        properties = schema.get("properties") or {}
        if key in properties:
            obj[key] = _prune(obj[key], properties[key], key, dropped)
        elif not schema.get("x-kubernetes-preserve-unknown-fields"):
            del obj[key]
            dropped.append(key)
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        for key in [k for k in metadata if k not in OBJECT_META_FIELDS]:
            del metadata[key]
            dropped.append(f"metadata.{key}")
    return dropped


def _prune(value: object, schema: dict, path: str, dropped: list[str]) -> object:
    if isinstance(value, dict) and schema.get("type") in ("object", None):
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        embedded = schema.get("x-kubernetes-embedded-resource")
        for key in list(value):
            if key in properties:
                value[key] = _prune(value[key], properties[key], _child(path, key), dropped)
            elif isinstance(additional, dict):
                value[key] = _prune(value[key], additional, _child(path, key), dropped)
            elif additional is True or schema.get("x-kubernetes-preserve-unknown-fields") \
                    or (embedded and key in ("apiVersion", "kind", "metadata")):
                continue
            else:
                del value[key]
                dropped.append(_child(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune(item, schema["items"], f"{path}[{i}]", dropped) for i, item in enumerate(value)]
    return value


def default(obj: object, schema: dict) -> None:
    """Drop non-nullable nulls and fill absent fields with their schema's `default`, in place (the API server
    does both on every write and read)."""
    if isinstance(obj, dict):
        properties = schema.get("properties") or {}
        for key, sub in properties.items():
            if key in obj and obj[key] is None and not sub.get("nullable"):
                del obj[key]
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
        additional = schema.get("additionalProperties")
        for key, value in obj.items():
            if key in properties:
                default(value, properties[key])
            elif isinstance(additional, dict):
                default(value, additional)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            default(item, schema["items"])


def validate(obj: dict, schema: dict) -> list[tuple[str, str]]:
    """The schema violations of a custom object (after pruning and defaulting), in the API server's words."""
    errors: list[tuple[str, str]] = []
    body = {k: v for k, v in obj.items() if k != "metadata"}
    _validate(body, {**schema, "properties": {k: v for k, v in (schema.get("properties") or {}).items()
                                              if k != "metadata"}}, "", errors)
    return errors


def _invalid(errors: list, path: str, value: object, detail: str) -> None:
    errors.append((path, f"Invalid value: {go_value(value)}: {detail}"))


def _validate(value: object, schema: dict, path: str, errors: list) -> None:
    where = path  # "" at the root, where the API server says "in body ..." with no name
    if value is None:
        if schema.get("nullable"):
            return
    if schema.get("x-kubernetes-int-or-string"):
        if type_name(value) not in ("integer", "string"):
            errors.append((path, f'Invalid value: "{type_name(value)}": {_name(where)}in body must be of type '
                                 f'integer,string: "{type_name(value)}"'))
            return
    elif schema.get("type") and not _is_type(value, schema["type"]):
        actual = type_name(value)
        errors.append((path, f'Invalid value: "{actual}": {_name(where)}in body must be of type {schema["type"]}: '
                             f'"{actual}"'))
        return
    if "enum" in schema and not any(_json_equal(value, allowed) for allowed in schema["enum"]):
        allowed = ", ".join(json.dumps(a if isinstance(a, str) else json.dumps(a)) for a in schema["enum"])
        errors.append((path, f"Unsupported value: {go_value(value)}: supported values: {allowed}"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        _number(value, schema, path, where, errors)
    elif isinstance(value, str):
        _string(value, schema, path, where, errors)
    elif isinstance(value, list):
        _array(value, schema, path, where, errors)
    elif isinstance(value, dict):
        _object(value, schema, path, where, errors)
    for sub in schema.get("allOf") or []:
        _validate(value, sub, path, errors)
    alternatives = schema.get("anyOf") or []
    if alternatives and not _int_or_string_pattern(schema) and all(_errors(value, s) for s in alternatives):
        _invalid(errors, path, value, f"{_name(where)}in body must validate at least one schema (anyOf)")
    if schema.get("oneOf") and sum(1 for s in schema["oneOf"] if not _errors(value, s)) != 1:
        _invalid(errors, path, value, f"{_name(where)}in body must validate one and only one schema (oneOf)")
    if isinstance(schema.get("not"), dict) and not _errors(value, schema["not"]):
        _invalid(errors, path, value, f"{_name(where)}in body must not validate the schema (not)")


def _int_or_string_pattern(schema: dict) -> bool:
    return schema.get("x-kubernetes-int-or-string") and \
        sorted(s.get("type", "") for s in schema.get("anyOf") or []) == ["integer", "string"]


def _errors(value: object, schema: dict) -> list:
    found: list = []
    _validate(value, schema, "", found)
    return found


def _number(value: float, schema: dict, path: str, where: str, errors: list) -> None:
    for key, exclusive, word in (("minimum", "exclusiveMinimum", "greater"), ("maximum", "exclusiveMaximum", "less")):
        bound = schema.get(key)
        if bound is None:
            continue
        strict = bool(schema.get(exclusive))
        beyond = (value < bound or (strict and value == bound)) if word == "greater" \
            else (value > bound or (strict and value == bound))
        if beyond:
            relation = f"{word} than" if strict else f"{word} than or equal to"
            _invalid(errors, path, value, f"{_name(where)}in body should be {relation} {go_value(bound)}")
    step = schema.get("multipleOf")
    if step and not math.isclose(value / step, round(value / step)):
        _invalid(errors, path, value, f"{_name(where)}in body should be a multiple of {go_value(step)}")


def _string(value: str, schema: dict, path: str, where: str, errors: list) -> None:
    if schema.get("maxLength") is not None and len(value) > schema["maxLength"]:
        unit = "byte" if schema["maxLength"] == 1 else "bytes"
        errors.append((path, f"Too long: may not be more than {schema['maxLength']} {unit}"))
    if schema.get("minLength") is not None and len(value) < schema["minLength"]:
        _invalid(errors, path, value, f"{_name(where)}in body should be at least {schema['minLength']} chars long")
    try:
        compiled = _pattern(schema["pattern"]) if schema.get("pattern") else None
    except re.error:
        compiled = None  # an invalid pattern: the CRD's own validation says so
    if compiled is not None and not compiled.search(value):
        _invalid(errors, path, value, f"{_name(where)}in body should match '{schema['pattern']}'")


def _array(value: list, schema: dict, path: str, where: str, errors: list) -> None:
    if schema.get("maxItems") is not None and len(value) > schema["maxItems"]:
        errors.append((path, f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
    if schema.get("minItems") is not None and len(value) < schema["minItems"]:
        _invalid(errors, path, len(value), f"{_name(where)}in body should have at least {schema['minItems']} items")
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            _validate(item, items, f"{path}[{i}]", errors)
    list_type = schema.get("x-kubernetes-list-type")
    if list_type in ("set", "map"):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen: list = []
        for i, item in enumerate(value):
            identity = ({k: item.get(k) for k in keys} if list_type == "map" and isinstance(item, dict) else item)
            if any(_json_equal(identity, other) for other in seen):
                errors.append((f"{path}[{i}]", f"Duplicate value: {go_value(identity)}"))
            seen.append(identity)


def _object(value: dict, schema: dict, path: str, where: str, errors: list) -> None:
    for name in schema.get("required") or []:
        if name not in value:
            errors.append((_child(path, name), "Required value"))
    if schema.get("maxProperties") is not None and len(value) > schema["maxProperties"]:
        errors.append((path, f"Too many: {len(value)}: must have at most {schema['maxProperties']} items"))
    if schema.get("minProperties") is not None and len(value) < schema["minProperties"]:
        _invalid(errors, path, len(value), f"{_name(where)}in body should have at least {schema['minProperties']} "
                                           "properties")
    properties = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    for key, item in value.items():
        if key in properties:
            _validate(item, properties[key], _child(path, key), errors)
        elif isinstance(additional, dict):
            _validate(item, additional, _child(path, key), errors)


def _json_equal(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


# -- the CRD itself ------------------------------------------------------------------------------------

def crd_defaults(crd: dict) -> None:
    """The defaults apiextensions.k8s.io/v1 fills in a CRD's spec."""
    spec = crd.get("spec")
    if not isinstance(spec, dict):
        return
    names = spec.get("names")
    if isinstance(names, dict) and isinstance(names.get("kind"), str) and names["kind"]:
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", names["kind"] + "List")
    spec.setdefault("conversion", {"strategy": "None"})


def crd_errors(crd: dict) -> list[tuple[str, str]]:
    """What the API server refuses in a (defaulted) apiextensions.k8s.io/v1 CustomResourceDefinition beyond
    its OpenAPI schema."""
    errors: list[tuple[str, str]] = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural = spec.get("group") or "", names.get("plural") or ""
    name = (crd.get("metadata") or {}).get("name") or ""
    if name != f"{plural}.{group}":
        errors.append(("metadata.name", f'Invalid value: {go_value(name)}: must be spec.names.plural+"."+spec.group'))
    if not group:
        errors.append(("spec.group", "Required value"))
    elif not _DNS_SUBDOMAIN.fullmatch(group) or len(group) > 253:
        errors.append(("spec.group", f"Invalid value: {go_value(group)}: a lowercase RFC 1123 subdomain must consist "
                                     "of lower case alphanumeric characters, '-' or '.'"))
    elif "." not in group:
        errors.append(("spec.group", f"Invalid value: {go_value(group)}: should be a domain with at least one dot"))
    scope = spec.get("scope")
    if not scope:
        errors.append(("spec.scope", "Required value"))
    elif scope not in ("Cluster", "Namespaced"):
        errors.append(("spec.scope", f'Unsupported value: {go_value(scope)}: supported values: "Cluster", '
                                     '"Namespaced"'))
    for key in ("plural", "singular", "kind", "listKind"):
        if not names.get(key):
            errors.append((f"spec.names.{key}", "Required value"))
    for key in ("plural", "singular"):
        if names.get(key) and not _DNS1035.fullmatch(names[key]):
            errors.append((f"spec.names.{key}", f"Invalid value: {go_value(names[key])}: {_DNS1035_MESSAGE}"))
    for key in ("kind", "listKind"):
        if names.get(key) and not _DNS1035.fullmatch(names[key].lower()):
            errors.append((f"spec.names.{key}", f"Invalid value: {go_value(names[key])}: may have mixed case, but "
                                                f"should otherwise match: {_DNS1035_MESSAGE}"))
    if names.get("kind") and names.get("kind") == names.get("listKind"):
        errors.append(("spec.names.listKind", f"Invalid value: {go_value(names['listKind'])}: kind and listKind may "
                                              "not be the same"))
    for list_key in ("shortNames", "categories"):
        for i, item in enumerate(names.get(list_key) or []):
            if not _DNS1035.fullmatch(item):
                errors.append((f"spec.names.{list_key}[{i}]", f"Invalid value: {go_value(item)}: {_DNS1035_MESSAGE}"))
    versions = spec.get("versions") or []
    if sum(1 for v in versions if v.get("storage")) != 1:
        errors.append(("spec.versions", "Invalid value: \"\": must have exactly one version marked as storage version"))
    seen = set()
    for i, version in enumerate(versions):
        where = f"spec.versions[{i}]"
        vname = version.get("name") or ""
        if not _DNS1035.fullmatch(vname):
            errors.append((f"{where}.name", f"Invalid value: {go_value(vname)}: {_DNS1035_MESSAGE}"))
        if vname in seen:
            errors.append(("spec.versions", "Invalid value: \"\": must contain unique version names"))
        seen.add(vname)
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema is None:
            errors.append((f"{where}.schema.openAPIV3Schema", "Required value: schemas are required"))
        else:
            errors += schema_errors(schema, f"{where}.schema.openAPIV3Schema")
        for j, column in enumerate(version.get("additionalPrinterColumns") or []):
            errors += _column_errors(column, f"{where}.additionalPrinterColumns[{j}]")
    strategy = (spec.get("conversion") or {}).get("strategy")
    if strategy not in ("None", "Webhook"):
        errors.append(("spec.conversion.strategy", f'Unsupported value: {go_value(strategy)}: supported values: '
                                                   '"None", "Webhook"'))
    return errors


def _column_errors(column: dict, where: str) -> list[tuple[str, str]]:
    errors = []
    if not column.get("name"):
        errors.append((f"{where}.name", "Required value"))
    kind = column.get("type")
    if not kind:
        errors.append((f"{where}.type", f"Required value: must be one of {','.join(_COLUMN_TYPES)}"))
    elif kind not in _COLUMN_TYPES:
        errors.append((f"{where}.type", f"Invalid value: {go_value(kind)}: must be one of {','.join(_COLUMN_TYPES)}"))
    if column.get("format") and column["format"] not in _COLUMN_FORMATS:
        errors.append((f"{where}.format", f"Invalid value: {go_value(column['format'])}: must be one of "
                                          f"{','.join(_COLUMN_FORMATS)}"))
    if not column.get("jsonPath"):
        errors.append((f"{where}.JSONPath", "Required value"))
    return errors


def schema_errors(schema: dict, where: str) -> list[tuple[str, str]]:
    """The structural-schema and value checks on one version's openAPIV3Schema."""
    errors: list[tuple[str, str]] = []
    if schema.get("nullable"):
        errors.append((f"{where}.nullable", "Forbidden: nullable cannot be true at the root"))
    if schema.get("type") not in (None, "object"):
        errors.append((f"{where}.type", f"Invalid value: {go_value(schema['type'])}: must be object at the root"))
    if "additionalProperties" in schema:
        errors.append((f"{where}.additionalProperties", "Forbidden: must not be used at the root"))
    metadata = (schema.get("properties") or {}).get("metadata")
    if metadata is not None:
        if metadata.get("type") not in (None, "object"):
            errors.append((f"{where}.properties[metadata].type", f"Invalid value: {go_value(metadata['type'])}: "
                                                                 "must be object"))
        rest = {k: v for k, v in metadata.items() if k not in ("type", "description")}
        allowed = set(rest.pop("properties", None) or {}) <= {"name", "generateName"}
        if rest or not allowed:
            errors.append((f"{where}.properties[metadata]", "Forbidden: must not specify anything other than name "
                                                            "and generateName, but metadata is implicitly specified"))
    _node_errors(schema, where, "root", errors)
    return errors


def _node_errors(node: dict, where: str, level: str, errors: list) -> None:
    if not isinstance(node, dict):
        errors.append((where, "Invalid value: must be a schema object"))
        return
    kind = node.get("type")
    int_or_string = node.get("x-kubernetes-int-or-string")
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    if "$ref" in node:
        errors.append((f"{where}.$ref", "Forbidden: $ref is not supported"))
    if kind is not None and kind not in _TYPES:
        errors.append((f"{where}.type", f"Unsupported value: {go_value(kind)}: supported values: "
                                        + ", ".join(f'"{t}"' for t in _TYPES)))
    if not kind and not int_or_string and not preserve:
        detail = {"root": "must not be empty at the root", "item": "must not be empty for specified array items",
                  "field": "must not be empty for specified object fields"}[level]
        errors.append((f"{where}.type", f"Required value: {detail}"))
    if int_or_string and preserve:
        errors.append((f"{where}.x-kubernetes-preserve-unknown-fields", "Invalid value: true: must be false if "
                                                                        "x-kubernetes-int-or-string is true"))
    if preserve is False:
        errors.append((f"{where}.x-kubernetes-preserve-unknown-fields", "Invalid value: false: must be true or "
                                                                        "undefined"))
    if node.get("uniqueItems"):
        errors.append((f"{where}.uniqueItems", "Forbidden: uniqueItems cannot be set to true since the runtime "
                                               "complexity becomes quadratic"))
    additional = node.get("additionalProperties")
    if additional is not None and node.get("properties") and (additional is not True):
        errors.append((f"{where}.additionalProperties", "Forbidden: additionalProperties and properties are mutual "
                                                        "exclusive"))
    if kind == "array" and not isinstance(node.get("items"), dict):
        errors.append((f"{where}.items", "Required value: must be specified"))
    if node.get("pattern") is not None:
        try:
            _pattern(node["pattern"])
        except (re.error, TypeError) as exc:
            errors.append((f"{where}.pattern", f"Invalid value: {go_value(node['pattern'])}: must be a valid regular "
                                               f"expression, but isn't: {exc}"))
    list_type = node.get("x-kubernetes-list-type")
    if list_type is not None:
        if kind != "array":
            errors.append((f"{where}.type", "Required value: must be array if x-kubernetes-list-type is specified"))
        if list_type not in ("atomic", "set", "map"):
            errors.append((f"{where}.x-kubernetes-list-type", f'Unsupported value: {go_value(list_type)}: supported '
                                                              'values: "atomic", "set", "map"'))
        if list_type == "map":
            keys = node.get("x-kubernetes-list-map-keys") or []
            item_props = (node.get("items") or {}).get("properties") or {}
            if not keys:
                errors.append((f"{where}.x-kubernetes-list-map-keys", "Required value: must not be empty if "
                                                                      "x-kubernetes-list-type is map"))
            elif any(k not in item_props for k in keys):
                errors.append((f"{where}.x-kubernetes-list-map-keys", f"Invalid value: {go_value(keys)}: entries must "
                                                                      "all be names of item properties"))
    if "default" in node and level != "root":
        default_errors: list = []
        _validate(node["default"], node, "", default_errors)
        for path, message in default_errors:
            errors.append((f"{where}.default" + (f".{path}" if path else ""), message))
    for key, sub in (node.get("properties") or {}).items():
        _node_errors(sub, f"{where}.properties[{key}]", "field", errors)
    if isinstance(node.get("items"), dict):
        _node_errors(node["items"], f"{where}.items", "item", errors)
    if isinstance(additional, dict):
        _node_errors(additional, f"{where}.additionalProperties", "field", errors)
    for junctor in ("allOf", "anyOf", "oneOf"):
        for i, sub in enumerate(node.get(junctor) or []):
            if isinstance(sub, dict) and sub.get("type") and not (junctor == "anyOf" and int_or_string):
                errors.append((f"{where}.{junctor}[{i}].type", "Forbidden: must be empty to be structural"))
