"""roles/lcm_runner/tasks/venv.yml run for real: two inventory hosts on this machine (connection local),
one shared bundle directory. The first host that needs a missing bundle builds it with pip, the others
unpack it after checking its sha256; a damaged bundle is refused before the venv is touched; without a
bundle directory, or when the builder fails, every host uses pip itself.

The hosts share one venv path (a venv is not relocatable, so the path is part of the bundle key);
forks=1 keeps their pip runs apart. The locks are two small real packages, installed by real pip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _role_run import REPO

HOSTS = ("h1", "h2")


def _run(
    tmp_path: Path,
    bundle_dir: str,
    homes: dict[str, Path] | None = None,
    mounts: dict[str, str] | None = None,
) -> dict:
    venv = tmp_path / "venv"
    homes = homes or {h: tmp_path / "home" for h in HOSTS}
    hosts = list(homes)
    for home in set(homes.values()):
        req = home / "requirements"
        if not req.exists():
            req.mkdir(parents=True)
            (req / "node.lock").write_text("six==1.16.0\n")
            (req / "megatron.lock").write_text("idna==3.10\n")
    inventory = {
        "all": {
            "hosts": {
                h: {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                    "lcm_runner_home": str(homes[h]),
                    # the node sees the bundle's storage (an existing path) or not
                    "lcm_runner_venv_bundle_mount": (mounts or {}).get(h, str(tmp_path)),
                }
                for h in hosts
            }
        }
    }
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inventory))
    play = [
        {
            "name": "venv bundle",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [{"ansible.builtin.include_role": {"name": "lcm_runner", "tasks_from": "venv.yml"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    extra = {
        "cluster": {},
        "lcm_runner_python": sys.executable,
        "lcm_runner_venv": str(venv),
        "lcm_runner_venv_bundle_dir": bundle_dir,
        # what preflight computed: the checksums of pyproject.toml, node.lock, megatron.lock
        "_lcm_runner_inputs": {"results": [{"stat": {"checksum": c}} for c in ("p", "n", "m")]},
    }
    (tmp_path / "vars.json").write_text(json.dumps(extra))
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text(
        f"[defaults]\nroles_path = {REPO / 'roles'}\nstdout_callback = ansible.builtin.json\nforks = 1\n"
        "retry_files_enabled = false\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")} | {
        "ANSIBLE_CONFIG": str(cfg),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".ansible-tmp"),
    }
    playbook = str(Path(sys.executable).parent / "ansible-playbook")
    p = subprocess.run(
        [
            playbook,
            "-i",
            str(tmp_path / "inv.yml"),
            str(tmp_path / "play.yml"),
            "-e",
            f"@{tmp_path / 'vars.json'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = json.loads(p.stdout[p.stdout.index("{") :])
    ran: dict[str, list[str]] = {h: [] for h in hosts}
    failed: dict[str, str] = {}
    facts: dict[str, dict] = {h: {} for h in hosts}
    for play_out in out["plays"]:
        for task in play_out["tasks"]:
            for host, res in task["hosts"].items():
                if res.get("failed"):
                    failed[host] = str(res.get("stderr") or res.get("msg"))
                elif not res.get("skipped"):
                    ran[host].append(task["task"]["name"].removeprefix("lcm_runner : "))
                facts[host].update(res.get("ansible_facts") or {})
    return {"rc": p.returncode, "ran": ran, "failed": failed, "facts": facts, "venv": venv, "out": p.stdout}


def _imports(venv: Path) -> bool:
    return (
        subprocess.run([str(venv / "bin" / "python"), "-c", "import six, idna"], check=False).returncode == 0
    )


def _how(r: dict) -> dict[str, str]:
    return {h: f.get("_lcm_runner_venv_how", "").strip() for h, f in r["facts"].items()}


PACK = "Pack the venv into the bundle (tar + sha256, renamed into place; the two newest bundles kept)"
UNPACK = "Unpack the bundle (its sha256 checked first; the old venv replaced only once it is complete)"
PIP = "Install the trainer's pinned needs (requirements/node.lock)"


@pytest.fixture
def bundles(tmp_path: Path) -> Path:
    return tmp_path / "shared" / "venv-bundles"


def test_one_host_builds_the_bundle_the_others_unpack_it_and_a_damaged_one_is_refused(
    tmp_path: Path, bundles: Path
) -> None:
    r = _run(tmp_path, str(bundles))
    assert r["rc"] == 0, r["failed"] or r["out"][-3000:]
    assert _how(r) == {"h1": "build", "h2": "unpack"}
    assert PIP in r["ran"]["h1"] and PACK in r["ran"]["h1"]
    assert UNPACK in r["ran"]["h2"] and PIP not in r["ran"]["h2"] and PACK not in r["ran"]["h2"]
    (tar,) = bundles.glob("venv-*.tar")
    recorded = (bundles / f"{tar.name}.sha256").read_text().strip()
    assert (
        recorded == subprocess.run(["sha256sum", str(tar)], capture_output=True, text=True).stdout.split()[0]
    )
    assert _imports(r["venv"])
    assert r["facts"]["h2"]["_lcm_runner_venv_from"].strip() == f"bundle {tar.name}"
    assert r["facts"]["h1"]["_lcm_runner_venv_from"].strip() == f"bundle {tar.name} (built here)"

    # the next install (a new node, a reinstall) finds the bundle, so every host unpacks it and nobody runs
    # pip; this one is damaged: refused on every host before its venv is touched
    data = bytearray(tar.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tar.write_bytes(bytes(data))
    again = _run(tmp_path, str(bundles))
    assert _how(again) == {h: "unpack" for h in HOSTS}
    assert all(PIP not in again["ran"][h] for h in HOSTS)
    assert again["rc"] != 0 and set(again["failed"]) == set(HOSTS)
    assert all(f"venv bundle {tar}: sha256 " in msg and "damaged" in msg for msg in again["failed"].values())
    assert _imports(again["venv"])  # the venv in place is untouched


def test_a_failed_builder_leaves_the_other_to_pip_and_a_node_without_the_storage_uses_pip(
    tmp_path: Path, bundles: Path
) -> None:
    bad = tmp_path / "bad-home" / "requirements"
    bad.mkdir(parents=True)
    (bad / "node.lock").write_text("this is not a requirement !!\n")  # pip fails at once, offline
    (bad / "megatron.lock").write_text("idna==3.10\n")
    homes = {"h0": tmp_path / "home", "h1": tmp_path / "bad-home", "h2": tmp_path / "home"}
    # h0 comes first in play order but does not see the storage: it is not the builder, it uses pip
    r = _run(tmp_path, str(bundles), homes, mounts={"h0": str(tmp_path / "not-mounted")})
    assert set(r["failed"]) == {"h1"}
    assert _how(r)["h0"] == "pip" and PIP in r["ran"]["h0"]
    assert r["facts"]["h0"]["_lcm_runner_venv_from"].strip() == "pip"
    assert _how(r)["h2"] == "unpack"
    assert PIP in r["ran"]["h2"] and UNPACK not in r["ran"]["h2"]
    assert r["facts"]["h2"]["_lcm_runner_venv_from"].strip() == "pip (no bundle appeared)"
    assert list(bundles.glob("venv-*.tar")) == []
    assert _imports(r["venv"])
