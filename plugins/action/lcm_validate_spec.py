"""Action plugin: validate the cluster spec, the inventory groups, the lock and the mirror settings.

Runs on the controller only (playbooks/validate.yml, hosts: localhost) with lcm_runner.spec, the same
validator the runner uses. Fails with one line per error: field, value found, what is expected.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

try:
    from lcm_runner.spec import validate
except ImportError:  # controller venv without the editable install: use the checkout this plugin lives in
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from lcm_runner.spec import validate

from lcm_runner.spec.errors import SpecError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ARTIFACT_KEYS = {"version", "url", "sha256", "filename", "filename_template", "url_template", "note"}


def check_lock(lock: Any) -> list[SpecError]:
    """lcm_lock: packages name -> exact version; artifacts name -> {version, url, sha256|null, filename}."""
    if not isinstance(lock, dict):
        return [
            SpecError("lcm_lock", lock, "a mapping (versions.lock.yml linked as group_vars/all/lock.yml)")
        ]
    errors: list[SpecError] = []
    for name, ver in (lock.get("packages") or {}).items():
        if not isinstance(ver, str) or not ver or any(c in ver for c in " *<>"):
            errors.append(SpecError(f"lcm_lock.packages.{name}", ver, "an exact Debian version string"))
    for name, art in (lock.get("artifacts") or {}).items():
        path = f"lcm_lock.artifacts.{name}"
        if not isinstance(art, dict):
            errors.append(SpecError(path, art, "a mapping {version, url, sha256, filename}"))
            continue
        for key in sorted(set(art) - _ARTIFACT_KEYS):
            errors.append(SpecError(f"{path}.{key}", art[key], "no such field (unknown key)"))
        for key in ("version", "url", "filename"):
            if not isinstance(art.get(key), str) or not art.get(key):
                errors.append(SpecError(f"{path}.{key}", art.get(key), "a non-empty string"))
        sha = art.get("sha256")
        if sha is not None and not (isinstance(sha, str) and _SHA256.match(sha)):
            errors.append(
                SpecError(f"{path}.sha256", sha, "64 lowercase hex digits, or null (not locked yet)")
            )
        fname = art.get("filename")
        if isinstance(fname, str) and ("/" in fname or fname.startswith(".")):
            errors.append(SpecError(f"{path}.filename", fname, "a plain file name"))
    return errors


def check_mirror(mirror: Any, apt_mirror: Any, pip_index: Any, apt_security: Any = None) -> list[SpecError]:
    errors: list[SpecError] = []
    if mirror not in (None, "") and not (
        isinstance(mirror, str) and (mirror.startswith("/") or re.match(r"^https?://[^/\s]+", mirror))
    ):
        errors.append(SpecError("lcm_mirror", mirror, "null, an absolute directory or an http(s):// URL"))
    for name, val in (
        ("lcm_apt_mirror", apt_mirror),
        ("lcm_apt_security_mirror", apt_security),
        ("lcm_pip_index_url", pip_index),
    ):
        if val not in (None, "") and not (isinstance(val, str) and re.match(r"^(https?|file)://\S+$", val)):
            errors.append(SpecError(name, val, "null or an http(s):// or file:// URL"))
    return errors


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(
        ("spec", "groups", "lock", "mirror", "apt_mirror", "apt_security_mirror", "pip_index_url")
    )

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        if "spec" not in args:
            return {
                **result,
                "failed": True,
                "msg": "cluster: undefined (group_vars/all/cluster.yml missing?)",
            }
        spec = args["spec"]
        groups = args.get("groups", task_vars.get("groups", {}))
        errors = validate(spec, {k: list(v) for k, v in groups.items()})
        if "lock" in args:
            errors += check_lock(args["lock"])
        errors += check_mirror(
            args.get("mirror"),
            args.get("apt_mirror"),
            args.get("pip_index_url"),
            args.get("apt_security_mirror"),
        )
        result["changed"] = False
        result["errors"] = [str(e) for e in errors]
        if errors:
            result["failed"] = True
            result["msg"] = (
                f"{len(errors)} error(s) in the cluster spec / inventory; no host was touched:\n"
                + ("\n".join(f"  - {e}" for e in errors))
            )
        else:
            name = spec.get("name") if isinstance(spec, dict) else spec
            result["msg"] = f"cluster spec {name!r} and inventory valid"
        return result
