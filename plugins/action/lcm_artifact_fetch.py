"""Action plugin: fetch one locked artifact into the controller's cache and verify its sha256.

Source: the lock entry's `url`, or in mirror mode ONLY the mirror (`lcm_mirror`: a directory, a file://
URL or an http(s) URL of an internal mirror; the artifact's `filename` under it); the lock's URL is then
never opened. The download goes to a temporary name, is hashed while it streams and is moved into the
cache only when the sha256 equals the lock's. A cached file is re-hashed on every run: a file changed
after download fails instead of being delivered. Runs on the controller only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

CHUNK = 1 << 20


class FetchError(Exception):
    pass


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def source_for(entry: dict[str, Any], mirror: str | None) -> str:
    """Where this artifact comes from: mirror + filename in mirror mode, else the lock's url."""
    if not mirror:
        return str(entry["url"])
    if mirror.startswith(("http://", "https://", "file://")):
        return mirror.rstrip("/") + "/" + urllib.parse.quote(str(entry["filename"]))
    return str(Path(mirror) / str(entry["filename"]))


def _copy_stream(src: str, dest: Path, timeout: float) -> str:
    h = hashlib.sha256()
    if src.startswith(("http://", "https://", "file://")):
        req = urllib.request.Request(src, headers={"User-Agent": "lcm-infra-artifacts"})
        ctx = urllib.request.urlopen(req, timeout=timeout)
    else:
        ctx = open(src, "rb")  # noqa: SIM115 (closed by the with below)
    with ctx as r, dest.open("wb") as w:
        for chunk in iter(lambda: r.read(CHUNK), b""):
            h.update(chunk)
            w.write(chunk)
    return h.hexdigest()


def fetch(
    name: str, entry: dict[str, Any], cache_dir: Path, mirror: str | None, timeout: float = 60
) -> dict[str, Any]:
    """Ensure cache_dir/name/filename holds the locked bytes. Returns path, sha256, source, downloaded."""
    expected = entry.get("sha256")
    if not expected:
        raise FetchError(
            f"artifact {name} is not locked (lcm_lock.artifacts.{name}.sha256 is null): download "
            f"{entry.get('filename')} and run `lcm-runner lock update <dir>`; nothing was installed"
        )
    final = cache_dir / name / str(entry["filename"])
    src = source_for(entry, mirror)
    if final.exists():
        actual = sha256_of(final)
        if actual != expected:
            raise FetchError(
                f"artifact {name}: cached file {final} has sha256 {actual}, the lock expects {expected}; "
                "it changed after download (delete it to fetch again); nothing was installed"
            )
        return {"path": str(final), "sha256": actual, "source": str(final), "downloaded": False}
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f".{final.name}.partial-{os.getpid()}")
    try:
        try:
            actual = _copy_stream(src, partial, timeout)
        except OSError as exc:
            raise FetchError(f"artifact {name}: cannot read {src}: {exc}") from exc
        if actual != expected:
            raise FetchError(
                f"artifact {name}: sha256 mismatch for {src}: expected {expected} (lock), got {actual}; "
                "the file was discarded and nothing was installed"
            )
        shutil.move(str(partial), str(final))
    finally:
        partial.unlink(missing_ok=True)
    final.chmod(0o644)
    return {"path": str(final), "sha256": actual, "source": src, "downloaded": True}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("name", "entry", "cache_dir", "mirror", "timeout"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        a = self._task.args
        try:
            for key in ("name", "entry", "cache_dir"):
                if not a.get(key):
                    raise FetchError(f"lcm_artifact_fetch: argument {key} is required")
            cached = (
                Path(os.path.expanduser(str(a["cache_dir"])))
                / str(a["name"])
                / str(a["entry"].get("filename"))
            )
            if self._play_context.check_mode and not cached.exists():
                result.update(changed=True, msg=f"would fetch {a['name']} (check mode)", skipped_fetch=True)
                return result
            out = fetch(
                str(a["name"]),
                dict(a["entry"]),
                Path(os.path.expanduser(str(a["cache_dir"]))),
                a.get("mirror") or None,
                float(a.get("timeout", 60)),
            )
        except FetchError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        result.update(out, changed=out["downloaded"])
        return result
