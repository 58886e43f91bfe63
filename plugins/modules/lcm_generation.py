#!/usr/bin/python
"""Generations of a node's managed state: record, drift, restore (runs on the node, standard library only).

A role that renders files or pins packages writes /var/lib/lcm/managed.d/<role>.json:
    {"role": "<role>", "files": [absolute paths], "packages": [distro packages], "services": [units]}
("services" optional: units to restart when a rollback changes that role's files.)

A generation /var/lib/lcm/generations/<n>.json holds the lock and spec hashes, the git revision, the time
and, per role, every file's sha256/mode/owner (null = absent) and every package's installed version;
copies of the files live in <n>/files/<absolute path>. `current` is a symlink to the newest <n>.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOCUMENTATION = r"""
module: lcm_generation
short_description: Record, compare and restore generations of a node's lcm-managed files and packages
description:
  - C(record) snapshots every file and package listed in managed.d manifests and writes a new generation
    unless nothing differs from C(current) (lock hash, spec hash, file hashes/modes/owners, package versions).
  - C(drift) lists every managed file or package that differs from C(current).
  - C(restore) puts back generation C(generation)'s files and manifests, and returns the packages whose
    versions differ and the services to restart (the playbook installs and restarts them).
options:
  state:
    description: What to do.
    type: str
    choices: [record, drift, restore]
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
"""

PkgQuery = Callable[[list[str]], dict[str, str | None]]


class GenerationError(Exception):
    pass


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_state(path: str) -> dict[str, Any] | None:
    p = Path(path)
    if not p.exists():
        return None
    if not p.is_file():
        raise GenerationError(f"managed path {path} is not a regular file")
    st = p.stat()
    return {
        "sha256": sha256_file(p),
        "mode": f"{st.st_mode & 0o7777:04o}",
        "uid": st.st_uid,
        "gid": st.st_gid,
    }


def dpkg_versions(names: list[str]) -> dict[str, str | None]:
    """Installed version of each package (None when not installed)."""
    out: dict[str, str | None] = dict.fromkeys(names)
    if not names:
        return out
    res = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n", "--", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in res.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0] in out and parts[2].startswith("ii"):
            out[parts[0]] = parts[1]
    return out


def read_manifests(managed_dir: Path) -> dict[str, dict[str, Any]]:
    roles: dict[str, dict[str, Any]] = {}
    if not managed_dir.is_dir():
        return roles
    for f in sorted(managed_dir.glob("*.json")):
        try:
            m = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise GenerationError(f"{f}: not valid JSON ({exc})") from exc
        if not isinstance(m, dict) or m.get("role") != f.stem:
            raise GenerationError(f'{f}: expected {{"role": "{f.stem}", "files": [...], "packages": [...]}}')
        files, pkgs, svcs = m.get("files", []), m.get("packages", []), m.get("services", [])
        for key, val in (("files", files), ("packages", pkgs), ("services", svcs)):
            if not isinstance(val, list) or not all(isinstance(v, str) for v in val):
                raise GenerationError(f"{f}: {key} must be a list of strings")
        bad = [p for p in files if not p.startswith("/")]
        if bad:
            raise GenerationError(f"{f}: files must be absolute paths: {bad}")
        roles[f.stem] = {"files": sorted(set(files)), "packages": sorted(set(pkgs)), "services": list(svcs)}
    return roles


def snapshot(managed_dir: Path, pkg_query: PkgQuery = dpkg_versions) -> dict[str, dict[str, Any]]:
    roles = read_manifests(managed_dir)
    all_pkgs = sorted({p for r in roles.values() for p in r["packages"]})
    versions = pkg_query(all_pkgs)
    return {
        role: {
            "files": {path: file_state(path) for path in r["files"]},
            "packages": {p: versions.get(p) for p in r["packages"]},
            "services": r["services"],
        }
        for role, r in roles.items()
    }


def state_key(lock_sha256: str | None, spec_sha256: str | None, roles: dict[str, Any]) -> str:
    """What makes two generations the same (time, git revision and rollback_of do not)."""
    return json.dumps({"lock": lock_sha256, "spec": spec_sha256, "roles": roles}, sort_keys=True)


def generations(gen_dir: Path) -> list[int]:
    return sorted(int(p.stem) for p in gen_dir.glob("*.json") if p.stem.isdigit())


def current_number(gen_dir: Path) -> int | None:
    link = gen_dir / "current"
    if not link.is_symlink():
        return None
    target = os.readlink(link)
    stem = Path(target).stem
    return int(stem) if stem.isdigit() else None


def load_generation(gen_dir: Path, n: int) -> dict[str, Any]:
    f = gen_dir / f"{n}.json"
    if not f.exists():
        have = ", ".join(map(str, generations(gen_dir))) or "none"
        raise GenerationError(f"generation {n} does not exist on this node (have: {have})")
    rec: dict[str, Any] = json.loads(f.read_text(encoding="utf-8"))
    return rec


def _atomic_write(
    path: Path, data: bytes, mode: int = 0o644, uid: int | None = None, gid: int | None = None
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if uid is not None and gid is not None:
            os.chown(tmp, uid, gid)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _point_current(gen_dir: Path, n: int) -> None:
    tmp = gen_dir / f".current.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(f"{n}.json", tmp)
    os.replace(tmp, gen_dir / "current")


def record(
    gen_dir: Path,
    managed_dir: Path,
    lock_sha256: str | None,
    spec_sha256: str | None,
    git_revision: str | None = None,
    rollback_of: int | None = None,
    pkg_query: PkgQuery = dpkg_versions,
    check: bool = False,
) -> tuple[bool, int | None, dict[str, Any]]:
    """(changed, generation number, record). No new generation when nothing differs from current."""
    if rollback_of is not None:
        src = load_generation(gen_dir, rollback_of)
        lock_sha256, spec_sha256 = src["lock_sha256"], src["spec_sha256"]
    if not lock_sha256 or not spec_sha256:
        raise GenerationError("record needs lock_sha256 and spec_sha256 (or rollback_of)")
    roles = snapshot(managed_dir, pkg_query)
    cur = current_number(gen_dir)
    if cur is not None:
        prev = load_generation(gen_dir, cur)
        if state_key(prev["lock_sha256"], prev["spec_sha256"], prev["roles"]) == state_key(
            lock_sha256, spec_sha256, roles
        ):
            return False, cur, prev
    n = (max(generations(gen_dir), default=0)) + 1
    rec = {
        "generation": n,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_revision": git_revision,
        "lock_sha256": lock_sha256,
        "spec_sha256": spec_sha256,
        "rollback_of": rollback_of,
        "previous": cur,
        "roles": roles,
    }
    if check:
        return True, n, rec
    gen_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(gen_dir, 0o700)  # copies of managed files may include secrets (munge.key)
    files_dir = gen_dir / str(n) / "files"
    for r in roles.values():
        for path, st in r["files"].items():
            if st is not None:
                dest = files_dir / path.lstrip("/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)
                os.chmod(dest, 0o600)
                if sha256_file(dest) != st["sha256"]:
                    raise GenerationError(f"{path} changed while being recorded; run again")
    _atomic_write(gen_dir / f"{n}.json", (json.dumps(rec, indent=2, sort_keys=True) + "\n").encode(), 0o600)
    _point_current(gen_dir, n)
    return True, n, rec


def drift(
    gen_dir: Path, managed_dir: Path, pkg_query: PkgQuery = dpkg_versions
) -> tuple[int | None, list[dict[str, Any]]]:
    """Every difference between the node now and the current generation."""
    cur = current_number(gen_dir)
    if cur is None:
        raise GenerationError(f"no current generation in {gen_dir}: converge (site.yml) first")
    want = load_generation(gen_dir, cur)["roles"]
    have = snapshot(managed_dir, pkg_query)
    out: list[dict[str, Any]] = []
    for role in sorted(set(want) | set(have)):
        w, h = want.get(role), have.get(role)
        if w is None or h is None:
            out.append(
                {
                    "kind": "manifest",
                    "role": role,
                    "path": str(managed_dir / f"{role}.json"),
                    "expected": "present" if w else "absent",
                    "actual": "present" if h else "absent",
                }
            )
            continue
        for path in sorted(set(w["files"]) | set(h["files"])):
            ws, hs = w["files"].get(path), h["files"].get(path)
            if ws != hs:
                out.append({"kind": "file", "role": role, "path": path, "expected": ws, "actual": hs})
        for pkg in sorted(set(w["packages"]) | set(h["packages"])):
            wv, hv = w["packages"].get(pkg), h["packages"].get(pkg)
            if wv != hv:
                out.append({"kind": "package", "role": role, "name": pkg, "expected": wv, "actual": hv})
    return cur, out


def restore(
    gen_dir: Path, managed_dir: Path, n: int, pkg_query: PkgQuery = dpkg_versions, check: bool = False
) -> dict[str, Any]:
    """Put back generation n's files and manifests; return packages to install and services to restart."""
    rec = load_generation(gen_dir, n)
    files_dir = gen_dir / str(n) / "files"
    restored: list[str] = []
    removed: list[str] = []
    services: list[str] = []
    for role, r in sorted(rec["roles"].items()):
        touched = False
        for path, st in sorted(r["files"].items()):
            now = file_state(path)
            if now == st:
                continue
            touched = True
            if st is None:
                removed.append(path)
                if not check:
                    Path(path).unlink()
                continue
            restored.append(path)
            if not check:
                src = files_dir / path.lstrip("/")
                data = src.read_bytes()
                if hashlib.sha256(data).hexdigest() != st["sha256"]:
                    raise GenerationError(f"stored copy {src} does not match generation {n}'s hash")
                _atomic_write(Path(path), data, int(st["mode"], 8), st["uid"], st["gid"])
        if touched:
            services += [s for s in r.get("services", []) if s not in services]
        manifest = {
            "role": role,
            "files": sorted(r["files"]),
            "packages": sorted(r["packages"]),
            "services": r.get("services", []),
        }
        mpath = managed_dir / f"{role}.json"
        body = (json.dumps(manifest, indent=2) + "\n").encode()
        if not check and (not mpath.exists() or json.loads(mpath.read_text()) != manifest):
            _atomic_write(mpath, body, 0o644)
    extra = (
        sorted(p.stem for p in managed_dir.glob("*.json") if p.stem not in rec["roles"])
        if managed_dir.is_dir()
        else []
    )
    if not check:
        for role in extra:
            (managed_dir / f"{role}.json").unlink()
    wanted = {p: v for r in rec["roles"].values() for p, v in r["packages"].items() if v is not None}
    installed = pkg_query(sorted(wanted))
    packages = {p: v for p, v in sorted(wanted.items()) if installed.get(p) != v}
    changed = bool(restored or removed or extra or packages)
    return {
        "changed": changed,
        "generation": n,
        "restored_files": restored,
        "removed_files": removed,
        "removed_manifests": extra,
        "packages": packages,
        "services": services,
    }


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["record", "drift", "restore"]},
            "generations_dir": {"type": "path", "default": "/var/lib/lcm/generations"},
            "managed_dir": {"type": "path", "default": "/var/lib/lcm/managed.d"},
            "lock_sha256": {"type": "str"},
            "spec_sha256": {"type": "str"},
            "git_revision": {"type": "str"},
            "rollback_of": {"type": "int"},
            "generation": {"type": "int"},
        },
        required_if=[("state", "restore", ["generation"])],
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
                drift=[],
                packages={},
                services=[],
            )
        elif p["state"] == "drift":
            cur, diffs = drift(gen_dir, managed_dir)
            module.exit_json(changed=False, generation=cur, drift=diffs, packages={}, services=[])
        else:
            res = restore(gen_dir, managed_dir, p["generation"], check=module.check_mode)
            module.exit_json(drift=[], **res)
    except GenerationError as exc:
        module.fail_json(msg=str(exc), generation=p.get("generation"), drift=[], packages={}, services=[])


if __name__ == "__main__":
    main()
