"""Load the cluster spec schema and check a value against it.

The schema (schema.yml) is a real JSON Schema (draft 2020-12; tests check it with the jsonschema package).
Nodes run the runner without jsonschema installed, so this module checks the subset the schema uses itself
(type, enum, required, properties, additionalProperties, items, uniqueItems, minItems, minimum, maximum,
pattern) and words each error as field / value / expected.

Patterns are searched with JSON Schema (ECMA-262) semantics: `$` matches only at the very end, not before
a trailing newline as Python's `$` does (so "lab\\n" does not pass "^[a-z]+$"). A field with `x-safe: path`
is a path that must be safe to use as a shell word (lcm_runner/spec/safe.py); its error says why not.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from importlib import resources
from typing import Any

import yaml

from .errors import SpecError
from .safe import path_problem

# x-safe kinds: value -> None, or the expected text saying what is wrong.
_SAFE = {"path": path_problem}

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


@cache
def load_schema() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("schema.yml").read_text(encoding="utf-8")
    schema: dict[str, Any] = yaml.safe_load(text)
    return schema


@cache
def _regex(pattern: str) -> re.Pattern[str]:
    """pattern compiled with ECMA-262's `$` (end of input only): each unescaped `$` outside [...] -> \\Z."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "$":
            ch = r"\Z"
        out.append(ch)
        i += 1
    return re.compile("".join(out))


def _is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


def _type_names(schema: dict[str, Any]) -> list[str]:
    t = schema.get("type")
    if t is None:
        return []
    return [t] if isinstance(t, str) else list(t)


def check(value: Any, schema: dict[str, Any], path: str) -> list[SpecError]:
    """Errors of value against schema; path names value (e.g. 'cluster')."""
    types = _type_names(schema)
    if types and not any(_is_type(value, t) for t in types):
        return [SpecError(path, value, f"a value of type {' or '.join(types)}")]
    errors: list[SpecError] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(SpecError(path, value, "one of " + ", ".join(map(str, schema["enum"]))))
    if isinstance(value, str) and "pattern" in schema and not _regex(schema["pattern"]).search(value):
        safe = _SAFE.get(schema.get("x-safe", ""))
        why = safe(value) if safe else None
        errors.append(SpecError(path, value, why or f"a string matching {schema['pattern']}"))
    if _is_type(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(SpecError(path, value, f"a number >= {schema['minimum']}"))
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(SpecError(path, value, f"a number <= {schema['maximum']}"))
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(SpecError(f"{path}.{key}", None, "a value (required field is missing)"))
        for key, sub in value.items():
            if key in props:
                errors.extend(check(sub, props[key], f"{path}.{key}"))
            elif schema.get("additionalProperties") is False:
                errors.append(
                    SpecError(
                        f"{path}.{key}", sub, "no such field (unknown key; known: " + ", ".join(props) + ")"
                    )
                )
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(SpecError(path, value, f"at least {schema['minItems']} item(s)"))
        if schema.get("uniqueItems"):
            seen: list[Any] = []
            for item in value:
                if item in seen:
                    errors.append(SpecError(path, value, f"unique items ({item!r} appears twice)"))
                    break
                seen.append(item)
        if "items" in schema:
            for i, item in enumerate(value):
                errors.extend(check(item, schema["items"], f"{path}[{i}]"))
    return errors


def defaults(schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """Default values of optional fields, nested like the spec (only where the schema names one)."""
    schema = schema or load_schema()
    out: dict[str, Any] = {}
    for key, sub in schema.get("properties", {}).items():
        if "default" in sub:
            out[key] = sub["default"]
        elif sub.get("type") == "object":
            nested = defaults(sub)
            if nested:
                out[key] = nested
    return out


def fill(value: Any, schema: dict[str, Any]) -> Any:
    """A deep copy of value with every absent field that has a schema `default` filled in.

    Recurses into present mappings and into the items of lists; an absent mapping without a default of
    its own stays absent (e.g. storage.nfs: the caller decides when it applies). Values of the wrong type
    are copied unchanged (fill after validation).
    """
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties", {})
        out = {k: fill(v, props[k]) if k in props else copy.deepcopy(v) for k, v in value.items()}
        for key, sub in props.items():
            if key not in out and "default" in sub:
                out[key] = fill(copy.deepcopy(sub["default"]), sub)
        return out
    if isinstance(value, list):
        items = schema.get("items", {})
        return [fill(v, items) for v in value]
    return copy.deepcopy(value)


def fill_defaults(spec: Any) -> Any:
    """A copy of spec with the schema's defaults filled in (storage.nfs's only for storage type nfs).

    Meant for a spec that passed check(); values of the wrong type are copied unchanged. Idempotent.
    """
    schema = load_schema()
    out = fill(spec, schema)
    storage = out.get("storage") if isinstance(out, dict) else None
    if isinstance(storage, dict) and storage.get("type") == "nfs" and "nfs" not in storage:
        storage["nfs"] = fill({}, schema["properties"]["storage"]["properties"]["nfs"])
    return out
