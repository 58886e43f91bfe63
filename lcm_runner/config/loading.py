"""Loading a run config: YAML -> the typed dataclasses (types.py), with type checking; to_dict/from_dict.

Unknown keys and wrong types are problems (never silently dropped); a type-correct config is then
validated as a whole (validation.py) and every problem is reported at once in a ConfigError. The cluster
spec is read through lcm_runner.spec (its loader and schema, the ones Ansible uses too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from lcm_runner.spec import SpecInvalid
from lcm_runner.spec import load_cluster as _spec_load_cluster
from lcm_runner.spec import validate as _spec_validate
from lcm_runner.spec.loader import spec_file

from .types import ConfigError, RunConfig
from .validation import validate


def _build(cls: type, data: Any, path: str, problems: list[str]) -> Any:
    """A dataclass from a mapping: unknown keys and wrong types become problems (never silently dropped)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.append(f"{path or '<top>'}: must be a mapping, got {type(data).__name__}")
        return cls()
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in known:
            problems.append(f"{where}: unknown key (known: {', '.join(sorted(known))})")
            continue
        default = getattr(cls(), key)
        if dataclasses.is_dataclass(default):
            kwargs[key] = _build(type(default), value, where, problems)
            continue
        checked = _check_type(where, known[key].type, default, value, problems)
        if checked is not _BAD:
            kwargs[key] = checked
    return cls(**kwargs)


_BAD = object()


def _check_type(where: str, annotation: Any, default: Any, value: Any, problems: list[str]) -> Any:
    text = str(annotation)
    optional = "None" in text
    if value is None:
        if optional:
            return None
        problems.append(f"{where}: must not be empty")
        return _BAD
    if isinstance(default, bool) or text == "bool":
        if not isinstance(value, bool):
            problems.append(f"{where}: must be true or false, got {value!r}")
            return _BAD
        return value
    if isinstance(default, int) or text.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{where}: must be an integer, got {value!r}")
            return _BAD
        return value
    if isinstance(default, float) or text.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(f"{where}: must be a number, got {value!r}")
            return _BAD
        return float(value)
    if isinstance(default, list) or text.startswith("list"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problems.append(f"{where}: must be a list of strings, got {value!r}")
            return _BAD
        return list(value)
    if isinstance(default, dict) or text.startswith("dict"):
        if not isinstance(value, dict):
            problems.append(f"{where}: must be a mapping, got {value!r}")
            return _BAD
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(default, str) or text.startswith("str"):
        if not isinstance(value, str):
            problems.append(f"{where}: must be a string, got {value!r}")
            return _BAD
        return value
    return value


def from_dict(data: Any, source: str = "<run config>") -> RunConfig:
    problems: list[str] = []
    cfg = _build(RunConfig, data, "", problems)
    if not problems:
        problems = validate(cfg)
    if problems:
        raise ConfigError(source, problems)
    return cfg


def load_run_config(path: str | Path) -> RunConfig:
    """Load and validate a run.yml; ConfigError names every problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not YAML: {exc}"]) from exc
    return from_dict(data, str(path))


def with_container(
    cfg: RunConfig, image: str | None, mounts: list[str] | None = None, source: str = "command line"
) -> RunConfig:
    """cfg with the container image (and extra mounts) of the command line, validated as a whole
    (ConfigError); unchanged when neither is given."""
    if image is None and not mounts:
        return cfg
    out = dataclasses.replace(
        cfg,
        container_image=image if image is not None else cfg.container_image,
        container_mounts=[*cfg.container_mounts, *[m for m in mounts or [] if m not in cfg.container_mounts]],
    )
    problems = validate(out)
    if mounts and not out.container_image:
        problems.append("--container-mount needs a container image (--container-image or container_image)")
    if problems:
        raise ConfigError(source, problems)
    return out


def to_dict(cfg: RunConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


# ----------------------------------------------------------------------------- the cluster spec

cluster_spec_path = spec_file  # inventories/<name> (or the cluster.yml itself) -> the spec file


def load_cluster(path: str | Path) -> dict[str, Any]:
    """The validated `cluster` mapping of a spec file or inventory directory.

    The one place the runner reads the spec: lcm_runner.spec's loader and validator (the schema Ansible
    also uses); raises lcm_runner.spec.SpecInvalid listing every problem.
    """
    cluster = _spec_load_cluster(path)
    errors = _spec_validate(cluster)
    if errors:
        raise SpecInvalid(errors)
    return cluster
