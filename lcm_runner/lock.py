"""`lcm-runner lock update <dir>`: lock artifacts from files you have (sha256 computed, never guessed).

versions.lock.yml, `lcm_lock.artifacts.<name>`:
    version, filename, url, sha256 (null = not locked yet: roles/_artifacts refuses to install it),
    filename_template / url_template (optional, with {version} and {filename}): a file that matches the
    template at another version moves the entry to that version (url rebuilt from url_template),
    note (optional free text, kept).

The update rewrites only the `artifacts:` block, which must be the last block under `lcm_lock:` (comments
and everything above it are kept byte for byte; comments inside the block are not: use `note`).
No ruamel.yaml here, so the block is re-emitted in one canonical format.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ARTIFACT_KEYS = ("version", "filename", "url", "sha256", "filename_template", "url_template", "note")
_VERSION_RE = r"(?P<version>[0-9][0-9A-Za-z.+~_-]*?)"
_BLOCK = re.compile(r"^  artifacts:.*$", re.MULTILINE)


class LockError(ValueError):
    """The lock cannot be updated as asked; nothing was written."""


@dataclass(frozen=True)
class Change:
    name: str
    file: str
    old_version: str
    new_version: str
    old_sha256: str | None
    new_sha256: str

    def __str__(self) -> str:
        ver = (
            self.new_version
            if self.old_version == self.new_version
            else f"{self.old_version} -> {self.new_version}"
        )
        was = (
            "unlocked"
            if self.old_sha256 is None
            else ("same" if self.old_sha256 == self.new_sha256 else "changed")
        )
        return f"{self.name}: {self.file} version {ver} sha256 {self.new_sha256} ({was})"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_lock(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("lcm_lock"), dict):
        raise LockError(f"{path}: expected a mapping with top-level key lcm_lock")
    lock: dict[str, Any] = doc["lcm_lock"]
    return lock


def release_lock(lock: dict[str, Any], release: str = "bookworm") -> dict[str, Any]:
    """lock flattened for a host of release (releases dropped): lcm_lock.packages is that release's pins (the
    versions.lock.yml template over lcm_lock.releases), or an inventory's own flat packages mapping.
    Raises LockError when the lock pins nothing for release."""
    if lock.get("releases") is None:
        return lock
    releases = lock["releases"]
    if not isinstance(releases.get(release), dict) or not isinstance(releases[release].get("packages"), dict):
        raise LockError(
            f"lcm_lock.releases.{release}.packages: missing (the lock pins {', '.join(releases)})"
        )
    flat = {k: v for k, v in lock.items() if k != "releases"}
    return {**flat, "packages": dict(releases[release]["packages"])}


def _template_regex(template: str) -> re.Pattern[str]:
    if template.count("{version}") < 1:
        raise LockError(f"filename_template {template!r} has no {{version}}")
    parts = template.split("{version}")
    # the first {version} captures, later ones must repeat it
    body = (
        re.escape(parts[0])
        + _VERSION_RE
        + "".join("(?P=version)" + re.escape(p) if i else re.escape(p) for i, p in enumerate(parts[1:]))
    )
    return re.compile("^" + body + "$")


def match_file(name: str, artifacts: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """(artifact name, version) for a file name; raises LockError when none or several match."""
    exact = [a for a, e in artifacts.items() if e.get("filename") == name]
    if len(exact) == 1:
        return exact[0], str(artifacts[exact[0]]["version"])
    found: list[tuple[str, str]] = []
    for a, e in artifacts.items():
        tpl = e.get("filename_template")
        if tpl:
            m = _template_regex(tpl).match(name)
            if m:
                found.append((a, m.group("version")))
    if len(found) == 1:
        return found[0]
    if not found:
        raise LockError(f"{name}: matches no artifact's filename or filename_template in the lock")
    raise LockError(f"{name}: matches several artifacts ({', '.join(a for a, _ in found)})")


def plan_update(lock: dict[str, Any], directory: Path) -> tuple[dict[str, dict[str, Any]], list[Change]]:
    """New artifacts mapping and the changes, from every regular file in directory. Raises on any problem."""
    artifacts: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (lock.get("artifacts") or {}).items()}
    if not directory.is_dir():
        raise LockError(f"{directory}: not a directory")
    files = sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise LockError(f"{directory}: no files to lock")
    errors, changes, seen = [], [], {}
    for f in files:
        try:
            name, version = match_file(f.name, artifacts)
        except LockError as exc:
            errors.append(str(exc))
            continue
        if name in seen:
            errors.append(f"{f.name}: artifact {name} already matched by {seen[name]}")
            continue
        seen[name] = f.name
        entry, digest = artifacts[name], sha256_file(f)
        changes.append(Change(name, f.name, str(entry.get("version")), version, entry.get("sha256"), digest))
        if version != str(entry.get("version")) or f.name != entry.get("filename"):
            if not entry.get("url_template"):
                errors.append(f"{f.name}: {name} would move to version {version} but has no url_template")
                continue
            entry["version"], entry["filename"] = version, f.name
            entry["url"] = entry["url_template"].format(version=version, filename=f.name)
        entry["sha256"] = digest
    if errors:
        raise LockError("refusing to update the lock (nothing written):\n  " + "\n  ".join(errors))
    return artifacts, changes


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise LockError(f"artifact fields are strings or null, got {value!r}")


def render_artifacts(artifacts: dict[str, dict[str, Any]]) -> str:
    if not artifacts:
        return "  artifacts: {}\n"
    out = ["  artifacts:"]
    for name in artifacts:
        e = artifacts[name]
        unknown = set(e) - set(ARTIFACT_KEYS)
        if unknown:
            raise LockError(f"artifact {name}: unknown keys {sorted(unknown)}")
        out.append(f"    {name}:")
        for key in ARTIFACT_KEYS:
            if key == "note" and isinstance(e.get(key), str) and len(e[key]) > 80:
                # folded block: reads back as the same one-line string (single spaces between words)
                out.append(f"      {key}: >-")
                out += [
                    f"        {line}"
                    for line in textwrap.wrap(
                        " ".join(e[key].split()), 96, break_on_hyphens=False, break_long_words=False
                    )
                ]
            elif key in e:
                out.append(f"      {key}: {_scalar(e[key])}")
    return "\n".join(out) + "\n"


def write_artifacts(lock_path: Path, artifacts: dict[str, dict[str, Any]]) -> None:
    text = lock_path.read_text(encoding="utf-8")
    matches = list(_BLOCK.finditer(text))
    if len(matches) != 1:
        raise LockError(f"{lock_path}: expected exactly one '  artifacts:' line under lcm_lock")
    rest = text[matches[0].end() :].splitlines()
    if any(line and not line.startswith(("    ", "#", "  #")) for line in rest):
        raise LockError(f"{lock_path}: the artifacts block must be the last block of lcm_lock")
    new = text[: matches[0].start()] + render_artifacts(artifacts)
    before = load_lock(lock_path)
    tmp = lock_path.with_name(lock_path.name + ".tmp")
    tmp.write_text(new, encoding="utf-8")
    after = load_lock(tmp)
    if {k: v for k, v in after.items() if k != "artifacts"} != {
        k: v for k, v in before.items() if k != "artifacts"
    }:
        tmp.unlink()
        raise LockError("internal: rewriting artifacts changed another block; nothing written")
    if after.get("artifacts") != artifacts:
        tmp.unlink()
        raise LockError("internal: the rewritten artifacts block does not read back equal; nothing written")
    tmp.replace(lock_path)


def update(lock_path: Path, directory: Path, dry_run: bool = False) -> list[Change]:
    artifacts, changes = plan_update(load_lock(lock_path), directory)
    if not dry_run:
        write_artifacts(lock_path, artifacts)
    return changes


def _cmd_update(args: argparse.Namespace) -> int:
    try:
        changes = update(Path(args.lock), Path(args.directory), args.dry_run)
    except LockError as exc:
        print(f"lock update: {exc}", file=sys.stderr)
        return 2
    for c in changes:
        print(c)
    print(f"{'would update' if args.dry_run else 'updated'} {len(changes)} artifact(s) in {args.lock}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("lock", help="update versions.lock.yml artifacts from local files")
    sub = p.add_subparsers(dest="lock_cmd", required=True)
    u = sub.add_parser("update", help="hash every file in DIR and lock the artifact it matches")
    u.add_argument("directory", help="directory holding downloaded artifacts (every file must match one)")
    u.add_argument("--lock", default="versions.lock.yml", help="lock file (default versions.lock.yml)")
    u.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    u.set_defaults(func=_cmd_update)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lcm-runner")
    add_parser(ap.add_subparsers(dest="cmd", required=True))
    args = ap.parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
