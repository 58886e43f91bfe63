"""roles/_artifacts through ansible-playbook, with real files served by real HTTP servers on 127.0.0.1.

The "node" is this machine over the local connection with its artifact directory under tmp_path, so the
whole path runs: lock check -> controller fetch + sha256 -> copy to the node -> node hash check.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
AUDIT = Path(__file__).resolve().parent / "netaudit"
FILES = {
    "enroot": ("enroot_9.9.9-1_amd64.deb", b"enroot test artifact\n" * 100),
    "pyxis": ("pyxis-9.9.9.tar.gz", b"pyxis test artifact\n" * 50),
}

PLAYBOOK = """
- name: Deliver artifacts
  hosts: node1
  gather_facts: false
  tasks:
    - name: Deliver
      ansible.builtin.include_role:
        name: _artifacts
      vars:
        _artifacts_names: [enroot, pyxis]
    - name: Record the published paths
      ansible.builtin.copy:
        content: "{{ _artifacts_paths | to_json }}"
        dest: "{{ paths_out }}"
        mode: "0644"
"""


@dataclass
class Server:
    root: Path
    requests: list[str] = field(default_factory=list)
    port: int = 0


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Server]:
    """An 'upstream' HTTP server on 127.0.0.1 holding the artifacts at the lock's URLs."""
    srv = Server(tmp_path / "origin")
    srv.root.mkdir()
    for fname, data in FILES.values():
        (srv.root / fname).write_bytes(data)

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:
            srv.requests.append(self.path)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(srv.root)))
    srv.port = httpd.server_address[1]
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield srv
    httpd.shutdown()


def _setup(tmp_path: Path, base_url: str, sha_override: dict[str, str | None] | None = None) -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        "node1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                    }
                }
            }
        )
    )
    arts = {}
    for name, (fname, data) in FILES.items():
        sha = hashlib.sha256(data).hexdigest()
        if sha_override and name in sha_override:
            sha = sha_override[name]
        arts[name] = {"version": "9.9.9", "filename": fname, "url": f"{base_url}/{fname}", "sha256": sha}
    (inv / "group_vars" / "all" / "lock.yml").write_text(
        yaml.safe_dump({"lcm_lock": {"packages": {}, "artifacts": arts}})
    )
    (tmp_path / "site.yml").write_text(PLAYBOOK)
    return inv


def _cmd(tmp_path: Path, inv: Path, mirror: str | None) -> list[str]:
    exe = shutil.which("ansible-playbook")
    assert exe
    extra = {
        "_artifacts_node_dir": str(tmp_path / "node"),
        "lcm_artifacts_cache": str(tmp_path / "cache"),
        "paths_out": str(tmp_path / "paths.json"),
        "lcm_mirror": mirror,
    }
    return [exe, "-i", str(inv), str(tmp_path / "site.yml"), "-e", json.dumps(extra)]


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "at"),
        "PYTHONPATH": str(AUDIT),
        "LCM_NET_AUDIT": str(tmp_path / "net.jsonl"),
    }


def _run(tmp_path: Path, inv: Path, mirror: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _cmd(tmp_path, inv, mirror), capture_output=True, text=True, env=_env(tmp_path), timeout=300
    )


def _node_files(tmp_path: Path) -> list[Path]:
    node = tmp_path / "node"
    return sorted(p for p in node.rglob("*") if p.is_file()) if node.exists() else []


def _assert_delivered(tmp_path: Path) -> None:
    paths = json.loads((tmp_path / "paths.json").read_text())
    for name, (fname, data) in FILES.items():
        p = Path(paths[name])
        assert p == tmp_path / "node" / name / fname
        assert hashlib.sha256(p.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()


def test_fetch_once_verify_copy_and_idempotent(tmp_path: Path, origin: Server) -> None:
    inv = _setup(tmp_path, f"http://127.0.0.1:{origin.port}")
    out = _run(tmp_path, inv)
    assert out.returncode == 0, out.stdout + out.stderr
    _assert_delivered(tmp_path)
    assert sorted(origin.requests) == sorted(f"/{f}" for f, _ in FILES.values())
    again = _run(tmp_path, inv)
    assert again.returncode == 0, again.stdout
    assert len(origin.requests) == 2, "the cached artifacts were downloaded again"
    assert re.search(r"node1\s+: ok=\d+\s+changed=0 ", again.stdout), again.stdout  # idempotent


def test_tampered_download_rejected_nothing_installed(tmp_path: Path, origin: Server) -> None:
    inv = _setup(tmp_path, f"http://127.0.0.1:{origin.port}")
    (origin.root / FILES["pyxis"][0]).write_bytes(b"tampered\n")
    out = _run(tmp_path, inv)
    assert out.returncode != 0
    expected = hashlib.sha256(FILES["pyxis"][1]).hexdigest()
    actual = hashlib.sha256(b"tampered\n").hexdigest()
    assert "artifact pyxis: sha256 mismatch" in out.stdout
    assert f"expected {expected} (lock), got {actual}" in out.stdout
    assert _node_files(tmp_path) == [], "something reached the node"
    assert not (tmp_path / "cache" / "pyxis" / FILES["pyxis"][0]).exists()
    assert not list((tmp_path / "cache" / "pyxis").glob(".*partial*"))


def test_tampered_cache_rejected(tmp_path: Path, origin: Server) -> None:
    inv = _setup(tmp_path, f"http://127.0.0.1:{origin.port}")
    assert _run(tmp_path, inv).returncode == 0
    shutil.rmtree(tmp_path / "node")
    (tmp_path / "cache" / "enroot" / FILES["enroot"][0]).write_bytes(b"evil\n")
    out = _run(tmp_path, inv)
    assert out.returncode != 0
    assert "changed after download" in out.stdout
    assert _node_files(tmp_path) == []


def test_unlocked_artifact_refused_before_download(tmp_path: Path, origin: Server) -> None:
    inv = _setup(tmp_path, f"http://127.0.0.1:{origin.port}", {"enroot": None})
    out = _run(tmp_path, inv)
    assert out.returncode != 0
    assert "not locked (sha256 is null): enroot_9.9.9-1_amd64.deb" in out.stdout
    assert "lcm-runner lock update" in out.stdout
    assert origin.requests == [] and _node_files(tmp_path) == []


def _offline(tmp_path: Path, mirror_dir: Path, mirror: str) -> dict[str, Any]:
    """Converge inside a network namespace that has only loopback; lock URLs point at the internet."""
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -n not permitted here (needs root / CAP_SYS_ADMIN)")
    inv = _setup(tmp_path, "https://github.com/NVIDIA/enroot/releases/download/v9.9.9")
    cmd = _cmd(tmp_path, inv, mirror)
    out = subprocess.run(
        [
            "unshare",
            "-n",
            sys.executable,
            str(AUDIT / "offline_converge.py"),
            str(mirror_dir),
            json.dumps(cmd),
            str(tmp_path / "net.jsonl"),
        ],
        capture_output=True,
        text=True,
        env={k: v for k, v in _env(tmp_path).items() if k != "LCM_NET_AUDIT"},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _audit(tmp_path: Path) -> list[dict[str, Any]]:
    f = tmp_path / "net.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def _inet(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e["target"], list) or e["event"] != "socket.connect"]


def test_mirror_http_offline_no_outbound(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for fname, data in FILES.values():
        (mirror / fname).write_bytes(data)
    res = _offline(tmp_path, mirror, "http://127.0.0.1:@MIRROR_PORT@/")
    assert res["rc"] == 0, res["out"]
    _assert_delivered(tmp_path)
    assert sorted(res["requests"]) == sorted(f"/{f}" for f, _ in FILES.values())
    events = _inet(_audit(tmp_path))
    connects = [e for e in events if e["event"] == "socket.connect"]
    assert connects, "the audit hook recorded nothing: it is not active"
    assert all(e["target"][0] == "127.0.0.1" and e["target"][1] == res["port"] for e in connects), connects
    lookups = {str(e["target"]) for e in events if e["event"] != "socket.connect"}
    assert lookups <= {"127.0.0.1"}, lookups
    assert not any("github.com" in json.dumps(e) for e in _audit(tmp_path))


def test_mirror_directory_offline_no_network_at_all(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for fname, data in FILES.values():
        (mirror / fname).write_bytes(data)
    res = _offline(tmp_path, mirror, str(mirror))
    assert res["rc"] == 0, res["out"]
    _assert_delivered(tmp_path)
    assert res["requests"] == []
    events = _inet(_audit(tmp_path))
    assert events, "the audit hook recorded nothing: it is not active"
    # ansible's own processes look up the loopback address; nothing connects anywhere
    assert [e for e in events if e["event"] == "socket.connect"] == []
    assert {str(e["target"]) for e in events} <= {"127.0.0.1", "localhost"}


def test_mirror_missing_file_fails_without_trying_upstream(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / FILES["enroot"][0]).write_bytes(FILES["enroot"][1])
    res = _offline(tmp_path, mirror, str(mirror))
    assert res["rc"] != 0
    assert f"artifact pyxis: cannot read {mirror}/{FILES['pyxis'][0]}" in res["out"]
    assert [
        e for e in _audit(tmp_path) if e["event"] == "socket.connect" and isinstance(e["target"], list)
    ] == []


def test_check_mode_downloads_nothing(tmp_path: Path, origin: Server) -> None:
    """The plan (--check) reports what would be fetched and copied, and changes nothing anywhere."""
    inv = _setup(tmp_path, f"http://127.0.0.1:{origin.port}")
    out = subprocess.run(
        [*_cmd(tmp_path, inv, None), "--check", "-v"],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=300,
    )
    assert out.returncode == 0, out.stdout
    assert "would fetch enroot (check mode)" in out.stdout and "would fetch pyxis (check mode)" in out.stdout
    assert origin.requests == []
    assert _node_files(tmp_path) == [] and not (tmp_path / "cache").exists()
