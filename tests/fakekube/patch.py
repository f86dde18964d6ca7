"""The API server's three patch formats, applied to an object (a dict) as `kubectl patch` sends them:

- JSON merge patch (RFC 7386, `application/merge-patch+json`): maps merge, `null` deletes a key, anything
  else (lists included) replaces;
- strategic merge patch (`application/strategic-merge-patch+json`, built-in kinds only): a merge patch whose
  lists follow the Go types' `patchStrategy` tags: `metadata.finalizers` is a set of strings (union, with
  the `$deleteFromPrimitiveList/finalizers` directive to remove), `status.conditions`,
  `metadata.ownerReferences` and the pod template's containers, env, ports, volume mounts and volumes are
  merged by their `patchMergeKey` (an element with `$patch: delete` removes its match, `$patch: replace`
  replaces the list); every other list replaces. Maps take `$patch: replace|delete` and `$retainKeys`;
  `$setElementOrder/...` is accepted and ignored;
- JSON patch (RFC 6902, `application/json-patch+json`): add, remove, replace, move, copy and test on
  JSON pointers (RFC 6901).

Errors are `PatchError(code, message)`: 400 for a body that is not a patch of its kind, 422 for one that does
not apply (a failed `test`, a missing path), as the API server answers.
"""
from __future__ import annotations

import copy

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH_TYPES = ("application/apply-patch+yaml", "application/apply-patch+cbor")

_PRIMITIVE = object()  # a list of scalars merged as a set (patchStrategy "merge" without a merge key)

# (parent field, field) -> merge key (or _PRIMITIVE): the `patchStrategy:"merge"` lists of the built-in kinds
# this server serves (k8s.io/api core/v1, batch/v1, meta/v1). Any other list is replaced whole.
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
_MERGE_KEYS: dict[tuple[str, str], object] = {
    ("metadata", "finalizers"): _PRIMITIVE,
    ("metadata", "ownerReferences"): "uid",
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("spec", "volumes"): "name",
    ("spec", "imagePullSecrets"): "name",
    ("spec", "hostAliases"): "ip",
    **{("spec", c): "name" for c in _CONTAINER_LISTS},
    **{(c, "env"): "name" for c in _CONTAINER_LISTS},
    **{(c, "ports"): "containerPort" for c in _CONTAINER_LISTS},
    **{(c, "volumeMounts"): "mountPath" for c in _CONTAINER_LISTS},
    **{(c, "volumeDevices"): "devicePath" for c in _CONTAINER_LISTS},
}


class PatchError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


# -- RFC 7386 ------------------------------------------------------------------------------------------

def merge_patch(target: object, patch: object) -> object:
    """RFC 7386: the result of applying `patch` to `target` (neither is modified)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# -- strategic merge patch -----------------------------------------------------------------------------

_DELETE = object()


def strategic_merge_patch(target: dict, patch: dict, *, merge_lists: bool = True) -> dict:
    """A strategic merge patch on a built-in object (see the module docstring for the list strategies;
    merge_lists False for a kind none of whose lists has a patch strategy, as CustomResourceDefinition)."""
    if not isinstance(patch, dict):
        raise PatchError(400, "the body of the request was in an unknown format: a strategic merge patch must be "
                              "a JSON object")
    result = _smp_map(target if isinstance(target, dict) else {}, patch, (), _MERGE_KEYS if merge_lists else {})
    return {} if result is _DELETE else result


def _strip(value: object) -> object:
    """A patch value without its directives (what lands in the object when nothing is there to merge with)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items()
                if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip(v) for v in value if not (isinstance(v, dict) and v.get("$patch") in ("replace", "delete"))]
    return copy.deepcopy(value)


def _smp_map(original: dict, patch: dict, path: tuple[str, ...], table: dict) -> object:
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    if directive == "replace":
        return _strip({k: v for k, v in patch.items() if k != "$patch"})
    if directive is not None:
        raise PatchError(400, f"Unknown patch type: {directive}")
    result = copy.deepcopy(original)
    for key, value in patch.items():  # deletions from primitive lists first, as the API server does
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if not isinstance(value, list):
                raise PatchError(400, "invalid patch: $deleteFromPrimitiveList must be a list")
            if isinstance(result.get(name), list):
                result[name] = [item for item in result[name] if item not in value]
    for key, value in patch.items():
        if key.startswith("$"):
            if key in ("$retainKeys",) or key.startswith(("$setElementOrder/", "$deleteFromPrimitiveList/")):
                continue
            raise PatchError(400, f"unknown patch directive {key}")
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _smp_map(result[key] if isinstance(result.get(key), dict) else {}, value, (*path, key), table)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _smp_list(result.get(key), value, (*path, key), table.get((path[-1] if path else "", key)),
                                    table)
        else:
            result[key] = copy.deepcopy(value)
    retain = patch.get("$retainKeys")
    if retain is not None:
        if not isinstance(retain, list):
            raise PatchError(400, "invalid patch: $retainKeys must be a list")
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _smp_list(original: object, patch: list, path: tuple[str, ...], strategy: object | None, table: dict) -> list:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch) or strategy is None \
            or not isinstance(original, list):
        return _strip(patch)
    if strategy is _PRIMITIVE:
        result = list(original)
        for item in patch:
            if isinstance(item, (dict, list)):
                raise PatchError(400, "the body of the request was in an unknown format: a list of primitives "
                                      "cannot hold objects")
            if item not in result:
                result.append(item)
        return result
    result = copy.deepcopy(original)
    for item in patch:
        if not isinstance(item, dict):
            raise PatchError(400, f"the body of the request was in an unknown format: {path[-1]} holds objects")
        if strategy not in item:
            raise PatchError(400, f"map: {item} does not contain declared merge key: {strategy}")
        index = next((i for i, old in enumerate(result)
                      if isinstance(old, dict) and old.get(strategy) == item[strategy]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(_strip(item))
        else:
            merged = _smp_map(result[index], item, path, table)
            if merged is _DELETE:
                del result[index]
            else:
                result[index] = merged
    return result


# -- RFC 6902 ------------------------------------------------------------------------------------------

def _pointer(text: object) -> list[str]:
    if not isinstance(text, str) or (text and not text.startswith("/")):
        raise PatchError(422, f"JSON pointer {text!r} must be empty or start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in text.split("/")[1:]] if text else []


def _index(container: list, token: str, *, adding: bool) -> int:
    if token == "-" and adding:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(422, f"invalid array index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not adding):
        raise PatchError(422, f"array index {index} out of bounds")
    return index


def _parent(doc: object, tokens: list[str], path: str) -> object:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(422, f"doc is missing path: {path}: missing value")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, adding=False)]
        else:
            raise PatchError(422, f"doc is missing path: {path}: missing value")
    return node


def _get(doc: object, path: str) -> object:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(422, f"doc is missing key: {path}: missing value")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, adding=False)]
    raise PatchError(422, f"doc is missing path: {path}: missing value")


def _add(doc: object, path: str, value: object) -> object:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, adding=True), value)
    else:
        raise PatchError(422, f"add operation does not apply: doc is missing path: {path}: missing value")
    return doc


def _remove(doc: object, path: str) -> tuple[object, object]:
    tokens = _pointer(path)
    if not tokens:
        raise PatchError(422, "unable to remove the whole document")
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(422, f"unable to remove nonexistent key: {last}: missing value")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, adding=False))
    raise PatchError(422, f"remove operation does not apply: doc is missing path: {path}: missing value")


def json_patch(target: object, operations: object) -> object:
    """RFC 6902: the result of applying `operations` to `target` (which is not modified)."""
    if not isinstance(operations, list):
        raise PatchError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for operation in operations:
        if not isinstance(operation, dict):
            raise PatchError(400, "json: cannot unmarshal a non-object into Go value of type jsonpatch.Operation")
        op, path = operation.get("op"), operation.get("path")
        if op in ("add", "replace", "test") and "value" not in operation:
            raise PatchError(422, f"{op} operation has no value")
        value = copy.deepcopy(operation.get("value"))
        if op == "add":
            doc = _add(doc, path, value)
        elif op == "remove":
            doc, _ = _remove(doc, path)
        elif op == "replace":
            tokens = _pointer(path)
            if tokens:
                parent = _parent(doc, tokens, path)
                if isinstance(parent, dict) and tokens[-1] not in parent:
                    raise PatchError(422, f"replace operation does not apply: doc is missing key: {path}: "
                                          "missing value")
                doc, _ = _remove(doc, path)
            doc = _add(doc, path, value)
        elif op == "test":
            try:
                actual = _get(doc, path)
            except PatchError:
                actual = _Missing
            if not _json_equal(actual, value):
                raise PatchError(422, f"testing value {path} failed: test failed")
        elif op in ("move", "copy"):
            source = operation.get("from")
            moved = copy.deepcopy(_get(doc, source))
            if op == "move":
                if isinstance(path, str) and isinstance(source, str) and path.startswith(source + "/"):
                    raise PatchError(422, f"move operation cannot move {source} into its own child {path}")
                doc, _ = _remove(doc, source)
            doc = _add(doc, path, moved)
        else:
            raise PatchError(422, f"Unexpected kind: {op}")
    return doc


class _Missing:
    pass


def _json_equal(a: object, b: object) -> bool:
    """Equality of JSON values (true is not 1, as it is in Python)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b
