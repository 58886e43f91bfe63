"""pyxis role: the plugstack.conf.d entry and the rebuild decision (a new Pyxis or a new Slurm means a
rebuild). Building Pyxis needs its source, which no reachable registry carries: docs/scheduler.md."""

from __future__ import annotations

import hashlib
import re
import tarfile

import yaml
from _role_render import REPO, evaluate, render

from lcm_runner.lock import release_lock

LOCK = release_lock(yaml.safe_load((REPO / "versions.lock.yml").read_text())["lcm_lock"])


def test_plugstack_entry_defaults() -> None:
    text = render("pyxis", "pyxis.conf.j2", {"lcm_lock": LOCK})
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines == [
        "required /usr/local/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis container_scope=job "
        "sbatch_support=1 execute_entrypoint=0 use_enroot_load=0 use_squashfuse=0"
    ]
    assert f"Pyxis {LOCK['artifacts']['pyxis']['version']} built against Slurm" in text


def test_plugstack_entry_options() -> None:
    text = render(
        "pyxis",
        "pyxis.conf.j2",
        {
            "lcm_lock": LOCK,
            "pyxis_required": False,
            "pyxis_prefix": "/opt/pyxis",
            "pyxis_sbatch_support": False,
        },
    )
    assert "optional /opt/pyxis/lib/slurm/spank_pyxis.so " in text
    assert "sbatch_support=0" in text


def test_build_stamp_changes_with_slurm_and_pyxis_versions() -> None:
    stamp = evaluate("pyxis", "_pyxis_stamp", {"lcm_lock": LOCK})
    assert stamp == f"pyxis={LOCK['artifacts']['pyxis']['version']} slurm={LOCK['packages']['libslurm-dev']}"
    newer = yaml.safe_load(yaml.safe_dump(LOCK))
    newer["packages"]["libslurm-dev"] = "23.11.4-1"
    assert evaluate("pyxis", "_pyxis_stamp", {"lcm_lock": newer}) != stamp


def test_every_plugstack_argument_is_one_the_pinned_pyxis_parses() -> None:
    """slurmd refuses to start when a required plugin rejects its arguments (an earlier template wrote
    remap_root=1, which Pyxis 0.24 does not know): the keys the role writes must be the ones config.c
    of the locked source tarball (the offline mirror's, sha256-checked) parses."""
    art = LOCK["artifacts"]["pyxis"]
    tarball = REPO.parent / "shared" / "mirror" / art["filename"]
    assert hashlib.sha256(tarball.read_bytes()).hexdigest() == art["sha256"]
    with tarfile.open(tarball) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/config.c"))
        source = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
    parsed = set(re.findall(r'strncmp\("([a-z_]+)=", av\[i\]', source))
    assert {"runtime_path", "container_scope", "sbatch_support"} <= parsed, parsed
    written = set(evaluate("pyxis", "_pyxis_options", {"lcm_lock": LOCK}))
    assert written and written <= parsed, written - parsed
    text = render("pyxis", "pyxis.conf.j2", {"lcm_lock": LOCK})
    (line,) = [t for t in text.splitlines() if t and not t.startswith("#")]
    assert {arg.split("=")[0] for arg in line.split()[2:]} == written
