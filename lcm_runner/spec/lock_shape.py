"""The lock's shape (versions.lock.yml, `lcm_lock`) and its per-release view: which Debian releases it pins
packages for, exact versions, artifact entries; and the lock as the roles see it on a node of the spec's
release (lcm_runner.lock.release_lock), with errors named where the entry lives
(lcm_lock.releases.<release>.packages.<name>). lock_rules checks that view against the spec."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..lock import LockError, release_lock
from .errors import SpecError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ARTIFACT_KEYS = {"version", "url", "sha256", "filename", "filename_template", "url_template", "note"}

# The Debian releases a lock may pin packages for (the spec's cluster.os.release enum).
RELEASES = ("bookworm", "trixie")


def check_lock(lock: Any) -> list[SpecError]:
    """lcm_lock: releases.<release>.packages name -> exact version (packages: the roles' template that picks
    the host's release), or packages name -> exact version for every release (an inventory's own flat lock);
    artifacts name -> {version, url, sha256|null, filename}."""
    if not isinstance(lock, dict):
        return [
            SpecError("lcm_lock", lock, "a mapping (versions.lock.yml linked as group_vars/all/lock.yml)")
        ]
    errors: list[SpecError] = []
    tables: list[tuple[str, Any]] = []
    flat, releases = lock.get("packages"), lock.get("releases")
    if releases is None:
        # an inventory's own flat lock: one table for whatever release its nodes run
        if isinstance(flat, dict):
            tables.append(("lcm_lock.packages", flat))
        elif flat is not None:
            errors.append(SpecError("lcm_lock.packages", flat, "a mapping name -> exact version"))
    elif not isinstance(releases, dict):
        errors.append(SpecError("lcm_lock.releases", releases, "a mapping release -> {packages}"))
    else:
        # packages is the roles' template over releases (or, handed over by Ansible, its value on one host)
        for rel, body in releases.items():
            path = f"lcm_lock.releases.{rel}"
            if rel not in RELEASES:
                errors.append(
                    SpecError(path, rel, f"a Debian release the spec knows ({', '.join(RELEASES)})")
                )
            elif not isinstance(body, dict) or not isinstance(body.get("packages"), dict):
                errors.append(SpecError(f"{path}.packages", body, "a mapping name -> exact version"))
            else:
                tables.append((f"{path}.packages", body["packages"]))
    for prefix, table in tables:
        for name, ver in table.items():
            if not isinstance(ver, str) or not ver or any(c in ver for c in " *<>"):
                errors.append(SpecError(f"{prefix}.{name}", ver, "an exact Debian version string"))
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


def release_view(cluster: Mapping[str, Any], lock: dict[str, Any]) -> tuple[dict[str, Any], str] | SpecError:
    """(the lock with packages = the pins of the spec's release, where those pins live in the file), or the
    error when the lock pins nothing for that release. lock has passed check_lock."""
    if lock.get("releases") is None:
        return lock, "lcm_lock.packages"  # an inventory's own flat lock
    release = cluster.get("os", {}).get("release", RELEASES[0])
    try:
        return release_lock(lock, release), f"lcm_lock.releases.{release}.packages"
    except LockError:
        return SpecError(
            f"lcm_lock.releases.{release}",
            None,
            f"the packages of cluster.os.release {release} (the lock pins {', '.join(lock['releases'])})",
        )


def in_release(error: SpecError, prefix: str) -> SpecError:
    """The error with lcm_lock.packages.<name> named where it lives: lcm_lock.releases.<release>.packages."""
    if prefix == "lcm_lock.packages":
        return error
    path = error.path.replace("lcm_lock.packages.", prefix + ".")
    return SpecError(path, error.value, error.expected.replace("lcm_lock.packages.", prefix + "."))
