"""Action plugin: validate the cluster spec, the inventory groups, the lock and the mirror settings.

Runs on the controller only (playbooks/validate.yml, hosts: localhost) with lcm_runner.spec, the same
validator the runner uses. Fails with one line per error: field, value found, what is expected. On
success it returns `cluster`: the spec with the schema's defaults filled in.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

try:
    from lcm_runner.spec import fill_defaults, validate
except ImportError:  # controller venv without the editable install: use the checkout this plugin lives in
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from lcm_runner.spec import fill_defaults, validate

from lcm_runner.spec.errors import SpecError
from lcm_runner.spec.lock_rules import SETTINGS, check_lock

__all__ = ["ActionModule", "check_lock", "check_mirror"]


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
        (
            "spec",
            "groups",
            "lock",
            "settings",
            "mirror",
            "apt_mirror",
            "apt_security_mirror",
            "pip_index_url",
        )
    )

    def _inventory_settings(self, task_vars: dict[str, Any]) -> dict[str, Any]:
        """SETTINGS the inventory defines: for localhost, or else for the first cluster host."""
        hostvars = task_vars.get("hostvars") or {}
        hosts = [h for h in task_vars.get("groups", {}).get("all", []) if h != "localhost"]
        view = hostvars[hosts[0]] if hosts and hosts[0] in hostvars else {}
        out: dict[str, Any] = {}
        for name in SETTINGS:
            if name in task_vars:
                out[name] = self._templar.template(task_vars[name])
            elif name in view:
                out[name] = view[name]
        return out

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
        # Role settings the lock's needs depend on (lock_rules.SETTINGS): the inventory's values where it
        # sets one (the `settings` argument, else the play's variables); the rest are the roles' defaults.
        settings = args.get("settings")
        if settings is None:
            settings = self._inventory_settings(task_vars)
        settings = {k: v for k, v in settings.items() if k in SETTINGS}
        errors = validate(spec, {k: list(v) for k, v in groups.items()}, args.get("lock"), settings)
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
            # The spec with the schema's defaults filled in: playbooks/validate.yml sets it as every
            # host's `cluster`, so the roles read one complete, validated spec and restate no default.
            result["cluster"] = fill_defaults(spec)
        return result
