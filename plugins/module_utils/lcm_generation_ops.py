"""record / drift / restore of generations (node side, standard library only), used by lcm_generation.

Secrets (a manifest's `secrets`, e.g. /etc/munge/munge.key): a generation records their sha256/mode/owner
only, never a copy, so drift still sees a change; a restore leaves the current secret in place and says so
(kept_secret_paths). A path marked secret in any manifest is a secret everywhere: each record also takes
out any copy an older generation (before the marking) kept, and marks it secret in that generation's record.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ansible.module_utils.lcm_generation_store import (
    ROLE_RE,
    GenerationError,
    PkgQuery,
    _bad_path,
    atomic_write,
    current_number,
    dpkg_versions,
    file_state,
    generations,
    load_generation,
    manifest_text,
    point_current,
    read_manifests,
    sha256_file,
    stored_copy,
    write_generation,
)


def snapshot(managed_dir: Path, pkg_query: PkgQuery = dpkg_versions) -> dict[str, dict[str, Any]]:
    roles = read_manifests(managed_dir)
    secrets = {p for r in roles.values() for p in r["secrets"]}
    versions = pkg_query(sorted({p for r in roles.values() for p in r["packages"]}))
    return {
        role: {
            "files": {path: file_state(path) for path in r["files"]},
            "packages": {p: versions.get(p) for p in r["packages"]},
            "services": r["services"],
            "secrets": sorted(secrets & set(r["files"])),
        }
        for role, r in roles.items()
    }


def state_key(lock_sha256: str | None, spec_sha256: str | None, roles: dict[str, Any]) -> str:
    """What makes two generations the same (time, git revision and rollback_of do not)."""
    norm = {role: {**r, "secrets": sorted(r.get("secrets", []))} for role, r in roles.items()}
    return json.dumps({"lock": lock_sha256, "spec": spec_sha256, "roles": norm}, sort_keys=True)


def _mark_secrets(rec: dict[str, Any], secrets: set[str]) -> bool:
    """Mark `secrets` in every role of generation record `rec` that lists them; True when rec changed."""
    changed = False
    for r in rec["roles"].values():
        want = sorted(set(r.get("secrets", [])) | (secrets & set(r["files"])))
        if want != r.get("secrets"):
            r["secrets"] = want
            changed = True
    return changed


def purge_secrets(gen_dir: Path, secrets: set[str], check: bool = False) -> dict[int, list[str]]:
    """Remove stored copies of secrets from every generation and mark them in its record.

    Returns {generation: [paths whose copy was (or in check mode would be) removed]}."""
    purged: dict[int, list[str]] = {}
    for n in generations(gen_dir):
        rec = load_generation(gen_dir, n)
        marked = set(secrets)
        for r in rec["roles"].values():
            marked |= set(r.get("secrets", []))
        copies = sorted(p for p in marked if stored_copy(gen_dir, n, p).exists())
        if copies:
            purged[n] = copies
        rec_changed = _mark_secrets(rec, secrets)
        if check:
            continue
        for p in copies:
            stored_copy(gen_dir, n, p).unlink()
        if rec_changed:
            write_generation(gen_dir, rec)
    return purged


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
    """(changed, generation number, record). No new generation when nothing differs from current.

    The returned record also says (not stored) `recorded` (a new generation) and `purged_secret_paths`
    ({generation: [paths]} whose stored copies were removed); changed is true for either."""
    if rollback_of is not None:
        src = load_generation(gen_dir, rollback_of)
        lock_sha256, spec_sha256 = src["lock_sha256"], src["spec_sha256"]
    if not lock_sha256 or not spec_sha256:
        raise GenerationError("record needs lock_sha256 and spec_sha256 (or rollback_of)")
    roles = snapshot(managed_dir, pkg_query)
    secrets = {p for r in roles.values() for p in r["secrets"]}
    purged = purge_secrets(gen_dir, secrets, check) if gen_dir.is_dir() else {}
    cur = current_number(gen_dir)
    if cur is not None:
        prev = load_generation(gen_dir, cur)
        _mark_secrets(prev, secrets)  # as written by purge_secrets (in check mode: as it would be)
        if state_key(prev["lock_sha256"], prev["spec_sha256"], prev["roles"]) == state_key(
            lock_sha256, spec_sha256, roles
        ):
            return bool(purged), cur, {**prev, "purged_secret_paths": purged, "recorded": False}
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
        return True, n, {**rec, "purged_secret_paths": purged, "recorded": True}
    gen_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(gen_dir, 0o700)  # copies of managed files (secrets are never copied)
    for r in roles.values():
        for path, st in r["files"].items():
            if st is None or path in secrets:
                continue
            dest = stored_copy(gen_dir, n, path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            os.chmod(dest, 0o600)
            if sha256_file(dest) != st["sha256"]:
                raise GenerationError(f"{path} changed while being recorded; run again")
    write_generation(gen_dir, rec)
    point_current(gen_dir, n)
    return True, n, {**rec, "purged_secret_paths": purged, "recorded": True}


def drift(
    gen_dir: Path, managed_dir: Path, pkg_query: PkgQuery = dpkg_versions
) -> tuple[int | None, list[dict[str, Any]]]:
    """Every difference between the node now and the current generation (secrets by hash/mode/owner)."""
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
        secrets = set(w.get("secrets", [])) | set(h["secrets"])
        for path in sorted(set(w["files"]) | set(h["files"])):
            ws, hs = w["files"].get(path), h["files"].get(path)
            if ws != hs:
                d = {"kind": "file", "role": role, "path": path, "expected": ws, "actual": hs}
                out.append({**d, "hash_only": True} if path in secrets else d)
        for pkg in sorted(set(w["packages"]) | set(h["packages"])):
            wv, hv = w["packages"].get(pkg), h["packages"].get(pkg)
            if wv != hv:
                out.append({"kind": "package", "role": role, "name": pkg, "expected": wv, "actual": hv})
    return cur, out


def _current_secrets(managed_dir: Path) -> set[str]:
    """Secrets the node's manifests mark now (unreadable manifests skipped: a restore rewrites them)."""
    try:
        return {p for r in read_manifests(managed_dir).values() for p in r["secrets"]}
    except GenerationError:
        return set()


def restore(
    gen_dir: Path, managed_dir: Path, n: int, pkg_query: PkgQuery = dpkg_versions, check: bool = False
) -> dict[str, Any]:
    """Put back generation n's files and manifests; return packages to install and services to restart.

    A secret is never written: when its content differs from generation n it stays as it is and is listed
    in kept_secret_paths; when only its mode/owner differ, those are put back."""
    rec = load_generation(gen_dir, n)
    now_secrets = _current_secrets(managed_dir)
    restored: list[str] = []
    removed: list[str] = []
    kept: list[str] = []
    services: list[str] = []
    for role, r in sorted(rec["roles"].items()):
        secrets = (set(r.get("secrets", [])) | now_secrets) & set(r["files"])
        touched = False
        for path, st in sorted(r["files"].items()):
            now = file_state(path)
            if now == st:
                continue
            if path in secrets:
                if st is None or now is None or now["sha256"] != st["sha256"]:
                    kept.append(path)
                    continue
                restored.append(path)  # same content: mode and owner only
                touched = True
                if not check:
                    os.chown(path, st["uid"], st["gid"])
                    os.chmod(path, int(st["mode"], 8))
                continue
            touched = True
            if st is None:
                removed.append(path)
                if not check:
                    Path(path).unlink()
                continue
            restored.append(path)
            if not check:
                src = stored_copy(gen_dir, n, path)
                data = src.read_bytes()
                if hashlib.sha256(data).hexdigest() != st["sha256"]:
                    raise GenerationError(f"stored copy {src} does not match generation {n}'s hash")
                atomic_write(Path(path), data, int(st["mode"], 8), st["uid"], st["gid"])
        if touched:
            services += [s for s in r.get("services", []) if s not in services]
        body = manifest_text(
            role, list(r["files"]), list(r["packages"]), r.get("services", []), sorted(secrets)
        )
        mpath = managed_dir / f"{role}.json"
        if not check and (not mpath.exists() or mpath.read_bytes() != body):
            atomic_write(mpath, body, 0o644)
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
    return {
        "changed": bool(restored or removed or extra or packages),
        "generation": n,
        "restored_files": restored,
        "removed_files": removed,
        "removed_manifests": extra,
        "kept_secret_paths": kept,
        "packages": packages,
        "services": services,
    }


def write_manifest(
    managed_dir: Path,
    role: str,
    files: list[str],
    packages: list[str],
    services: list[str],
    secrets: list[str],
    check: bool = False,
) -> bool:
    """A role's manifest <managed_dir>/<role>.json (the manifest entry point of roles/_generation, in one
    module run): validated like parse_manifest reads it, written (atomically, 0644, the directory 0755)
    only when its bytes differ. Returns whether it changed (would, in check mode)."""
    bad = [p for p in files + secrets if _bad_path(p)]
    if not ROLE_RE.match(role) or bad:
        raise GenerationError(
            f"_generation manifest: role must be a role name (got '{role}') and files and secrets absolute "
            f"paths without . or .. parts; bad: {bad}"
        )
    body = manifest_text(role, files, packages, services, secrets)
    path = managed_dir / f"{role}.json"
    try:
        st = path.stat()
        if path.read_bytes() == body and (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o644, 0, 0):
            return False
    except OSError:
        pass
    if not check:
        managed_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(managed_dir, 0o755)
        atomic_write(path, body, 0o644, 0, 0)
    return True
