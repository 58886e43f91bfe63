"""The generation store's on-disk pieces (node side, standard library only), used by lcm_generation.

Manifests: <managed_dir>/<role>.json, written by roles/_generation/tasks/manifest.yml (every role calls it)
and by a restore, in one canonical form (manifest_text):
    {"files": [...], "packages": [...], "role": "<role>", "secrets": [...], "services": [...]}
`files` are absolute paths; `secrets` are those of them whose content is never copied into the store
(only sha256/mode/owner are recorded). `services` and `secrets` may be missing in a hand-written manifest.

Generations: <generations_dir>/<n>.json (+ <n>/files/<absolute path> copies of the non-secret files),
`current` a symlink to the newest <n>.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

PkgQuery = Callable[[list[str]], dict[str, str | None]]
ROLE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MANIFEST_KEYS = ("files", "packages", "services", "secrets")


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


def _bad_path(p: str) -> bool:
    return not p.startswith("/") or any(part in (".", "..") for part in p.split("/")[1:])


def parse_manifest(f: Path) -> dict[str, Any]:
    """One manifest, validated and normalised: files/packages/secrets sorted and unique, services in order."""
    try:
        m = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GenerationError(f"{f}: not valid JSON ({exc})") from exc
    if not isinstance(m, dict) or m.get("role") != f.stem or not ROLE_RE.match(f.stem):
        raise GenerationError(f'{f}: expected {{"role": "{f.stem}", "files": [...], "packages": [...]}}')
    vals = {key: m.get(key, []) for key in MANIFEST_KEYS}
    for key, val in vals.items():
        if not isinstance(val, list) or not all(isinstance(v, str) for v in val):
            raise GenerationError(f"{f}: {key} must be a list of strings")
    bad = [p for p in vals["files"] + vals["secrets"] if _bad_path(p)]
    if bad:
        raise GenerationError(f"{f}: files must be absolute paths (no . or ..): {bad}")
    stray = sorted(set(vals["secrets"]) - set(vals["files"]))
    if stray:
        raise GenerationError(f"{f}: secrets must also be listed in files: {stray}")
    return {
        "files": sorted(set(vals["files"])),
        "packages": sorted(set(vals["packages"])),
        "services": list(dict.fromkeys(vals["services"])),
        "secrets": sorted(set(vals["secrets"])),
    }


def read_manifests(managed_dir: Path) -> dict[str, dict[str, Any]]:
    if not managed_dir.is_dir():
        return {}
    return {f.stem: parse_manifest(f) for f in sorted(managed_dir.glob("*.json"))}


def manifest_text(
    role: str, files: list[str], packages: list[str], services: list[str], secrets: list[str]
) -> bytes:
    """A manifest's bytes (lcm_generation state=manifest and restore write them): Ansible's to_nice_json + a
    newline, what roles/_generation wrote with the copy module before."""
    body = {
        "role": role,
        "files": sorted(set(files) | set(secrets)),
        "packages": sorted(set(packages)),
        "services": list(dict.fromkeys(services)),
        "secrets": sorted(set(secrets)),
    }
    return (json.dumps(body, indent=4, sort_keys=True, separators=(",", ": ")) + "\n").encode()


def generations(gen_dir: Path) -> list[int]:
    return sorted(int(p.stem) for p in gen_dir.glob("*.json") if p.stem.isdigit())


def current_number(gen_dir: Path) -> int | None:
    link = gen_dir / "current"
    if not link.is_symlink():
        return None
    stem = Path(os.readlink(link)).stem
    return int(stem) if stem.isdigit() else None


def load_generation(gen_dir: Path, n: int) -> dict[str, Any]:
    f = gen_dir / f"{n}.json"
    if not f.exists():
        have = ", ".join(map(str, generations(gen_dir))) or "none"
        raise GenerationError(f"generation {n} does not exist on this node (have: {have})")
    rec: dict[str, Any] = json.loads(f.read_text(encoding="utf-8"))
    return rec


def stored_copy(gen_dir: Path, n: int, path: str) -> Path:
    return gen_dir / str(n) / "files" / path.lstrip("/")


def atomic_write(
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


def write_generation(gen_dir: Path, rec: dict[str, Any]) -> None:
    body = (json.dumps(rec, indent=2, sort_keys=True) + "\n").encode()
    atomic_write(gen_dir / f"{rec['generation']}.json", body, 0o600)


def point_current(gen_dir: Path, n: int) -> None:
    tmp = gen_dir / f".current.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(f"{n}.json", tmp)
    os.replace(tmp, gen_dir / "current")
