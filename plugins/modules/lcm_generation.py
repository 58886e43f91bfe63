#!/usr/bin/python
"""Generations of a node's managed state: record, drift, restore (runs on the node, standard library only).

Every role writes /var/lib/lcm/managed.d/<role>.json (lcm_managed_dir) through roles/_generation's
`manifest` entry point:
    {"role": "<role>", "files": [absolute paths], "packages": [distro packages], "services": [units],
     "secrets": [those of files never copied into the store]}
("services": units to restart when a rollback changes that role's files; "services" and "secrets" may be
missing in a hand-written manifest.)

A generation /var/lib/lcm/generations/<n>.json holds the lock and spec hashes, the git revision, the time
and, per role, every file's sha256/mode/owner (null = absent), every package's installed version and the
secrets; copies of the non-secret files live in <n>/files/<absolute path>. `current` is a symlink to the
newest <n>.json.

The code is in plugins/module_utils: lcm_generation_store.py (manifests, hashes, the store on disk) and
lcm_generation_ops.py (record, drift, restore); this file holds the module's interface.
"""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils.lcm_generation_ops import (
    drift,
    purge_secrets,
    record,
    restore,
    snapshot,
    state_key,
    write_manifest,
)
from ansible.module_utils.lcm_generation_store import (
    GenerationError,
    dpkg_versions,
    file_state,
    generations,
    load_generation,
    manifest_text,
    parse_manifest,
    read_manifests,
)

__all__ = [
    "GenerationError",
    "dpkg_versions",
    "drift",
    "file_state",
    "generations",
    "load_generation",
    "manifest_text",
    "parse_manifest",
    "purge_secrets",
    "read_manifests",
    "record",
    "restore",
    "snapshot",
    "state_key",
    "write_manifest",
]

DOCUMENTATION = r"""
module: lcm_generation
short_description: Record, compare and restore generations of a node's lcm-managed files and packages
description:
  - C(record) snapshots every file and package listed in managed.d manifests and writes a new generation
    unless nothing differs from C(current) (lock hash, spec hash, file hashes/modes/owners, package versions).
  - C(drift) lists every managed file or package that differs from C(current).
  - C(manifest) writes one role's manifest <managed_dir>/<role>.json (I(role), I(files), I(packages),
    I(services), I(secrets)) in the canonical form restore writes, only when it differs (roles/_generation's
    manifest entry point).
  - C(restore) puts back generation C(generation)'s files and manifests, and returns the packages whose
    versions differ and the services to restart (the playbook installs and restarts them).
  - A file a manifest lists in C(secrets) is never copied into the store (only its sha256, mode and
    owner are recorded): drift still reports a change, restore leaves the current secret in place and lists
    it in C(kept_secret_paths). C(record) also removes copies older generations kept of files now marked
    secret.
options:
  state:
    description: What to do.
    type: str
    choices: [record, drift, restore, manifest]
    required: true
  generations_dir:
    description: Where generations live.
    type: path
    default: /var/lib/lcm/generations
  managed_dir:
    description: Where roles write their manifests.
    type: path
    default: /var/lib/lcm/managed.d
  lock_sha256:
    description: sha256 of the lock (canonical JSON of lcm_lock). Required for record unless rollback_of.
    type: str
  spec_sha256:
    description: sha256 of the cluster spec (canonical JSON). Required for record unless rollback_of.
    type: str
  git_revision:
    description: Git revision of the project that converged.
    type: str
  rollback_of:
    description: For record after a restore, the generation restored (its lock/spec hashes are kept).
    type: int
  generation:
    description: Generation to restore.
    type: int
  role:
    description: The role whose manifest to write (state=manifest).
    type: str
  files:
    description: Absolute paths the role renders (state=manifest); secrets are added.
    type: list
    elements: str
  packages:
    description: Distro packages the role pins (state=manifest).
    type: list
    elements: str
  services:
    description: Units to restart when a rollback changes the role's files (state=manifest).
    type: list
    elements: str
  secrets:
    description: Secret files, never copied into the store (state=manifest).
    type: list
    elements: str
author: lcm-infra
"""

EXAMPLES = r"""
- name: Record a generation
  lcm_generation:
    state: record
    lock_sha256: "{{ lcm_lock | to_json(sort_keys=true) | hash('sha256') }}"
    spec_sha256: "{{ cluster | to_json(sort_keys=true) | hash('sha256') }}"
"""

RETURN = r"""
generation:
  description: Generation recorded, restored, or current.
  type: int
  returned: always
drift:
  description: Differences from current (state=drift).
  type: list
  returned: always
packages:
  description: Package versions to install (state=restore).
  type: dict
  returned: always
services:
  description: Services to restart (state=restore).
  type: list
  returned: always
recorded:
  description: Whether a new generation was (check mode - would be) recorded (state=record).
  type: bool
  returned: when state=record
kept_secret_paths:
  description: Secrets whose content differs from the generation, left as they are (state=restore).
  type: list
  returned: always
purged_secret_paths:
  description: "Generation -> secrets whose stored copy was removed (state=record; check mode: would be)."
  type: dict
  returned: always
"""


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["record", "drift", "restore", "manifest"]},
            "generations_dir": {"type": "path", "default": "/var/lib/lcm/generations"},
            "managed_dir": {"type": "path", "default": "/var/lib/lcm/managed.d"},
            "lock_sha256": {"type": "str"},
            "spec_sha256": {"type": "str"},
            "git_revision": {"type": "str"},
            "rollback_of": {"type": "int"},
            "generation": {"type": "int"},
            "role": {"type": "str"},
            "files": {"type": "list", "elements": "str", "default": []},
            "packages": {"type": "list", "elements": "str", "default": []},
            "services": {"type": "list", "elements": "str", "default": []},
            "secrets": {"type": "list", "elements": "str", "default": []},
        },
        required_if=[("state", "restore", ["generation"]), ("state", "manifest", ["role"])],
        supports_check_mode=True,
    )
    p = module.params
    gen_dir, managed_dir = Path(p["generations_dir"]), Path(p["managed_dir"])
    try:
        if p["state"] == "record":
            changed, n, rec = record(
                gen_dir,
                managed_dir,
                p["lock_sha256"],
                p["spec_sha256"],
                p["git_revision"],
                p["rollback_of"],
                check=module.check_mode,
            )
            module.exit_json(
                changed=changed,
                generation=n,
                rollback_of=rec.get("rollback_of"),
                recorded=rec["recorded"],
                purged_secret_paths={str(k): v for k, v in rec["purged_secret_paths"].items()},
                kept_secret_paths=[],
                drift=[],
                packages={},
                services=[],
            )
        elif p["state"] == "manifest":
            changed = write_manifest(
                managed_dir,
                p["role"],
                p["files"],
                p["packages"],
                p["services"],
                p["secrets"],
                module.check_mode,
            )
            module.exit_json(
                changed=changed,
                generation=None,
                drift=[],
                packages={},
                services=[],
                kept_secret_paths=[],
                purged_secret_paths={},
            )
        elif p["state"] == "drift":
            cur, diffs = drift(gen_dir, managed_dir)
            module.exit_json(
                changed=False,
                generation=cur,
                drift=diffs,
                packages={},
                services=[],
                kept_secret_paths=[],
                purged_secret_paths={},
            )
        else:
            res = restore(gen_dir, managed_dir, p["generation"], check=module.check_mode)
            module.exit_json(drift=[], purged_secret_paths={}, **res)
    except GenerationError as exc:
        module.fail_json(
            msg=str(exc),
            generation=p.get("generation"),
            drift=[],
            packages={},
            services=[],
            kept_secret_paths=[],
            purged_secret_paths={},
        )


if __name__ == "__main__":
    main()
