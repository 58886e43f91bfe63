"""Load the cluster spec schema and check a value against it.

The schema (schema.yml) is a real JSON Schema (draft 2020-12; tests check it with the jsonschema package).
Nodes run the runner without jsonschema installed, so this module checks the subset the schema uses itself
(type, enum, required, properties, additionalProperties, items, uniqueItems, minItems, minimum, maximum,
pattern) and words each error as field / value / expected.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

import yaml

from .errors import SpecError

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
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(SpecError(path, value, f"a string matching {schema['pattern']}"))
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
