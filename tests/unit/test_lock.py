"""lcm-runner lock update: real files hashed, version moves by template, unmatched files refused."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml

from lcm_runner.lock import LockError, load_lock, main, match_file, release_lock, render_artifacts, update

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    p = tmp_path / "versions.lock.yml"
    shutil.copy(ROOT / "versions.lock.yml", p)
    return p


def test_repo_lock_shape() -> None:
    lock = load_lock(ROOT / "versions.lock.yml")
    arts = lock["artifacts"]
    want = {
        "nvidia_driver",
        "fabric_manager",
        "doca_ofed",
        "nccl",
        "enroot",
        "enroot_caps",
        "enroot_src",
        "pyxis",
        "dcgm",
        "dcgm_exporter",
    }
    assert want | {"prometheus", "node_exporter", "grafana"} <= set(arts)
    for name, a in arts.items():
        assert {"version", "url", "filename", "sha256"} <= set(a), name
        assert a["url"].startswith("https://"), name
        assert a["sha256"] is None or len(a["sha256"]) == 64, name
    # the roles read lcm_lock.packages: the template that picks the host's release from lcm_lock.releases
    assert "lcm_lock.releases[ansible_facts['distribution_release']" in lock["packages"]
    assert set(lock["releases"]) == {"bookworm", "trixie"}
    for release in ("bookworm", "trixie"):
        assert all(isinstance(v, str) for v in lock["releases"][release]["packages"].values()), release


def test_every_release_pins_the_same_packages() -> None:
    """A role installs the same names on either release: a package pinned for one only would fail the
    other's converge halfway."""
    rel = load_lock(ROOT / "versions.lock.yml")["releases"]
    assert set(rel["bookworm"]["packages"]) == set(rel["trixie"]["packages"])
    bookworm = release_lock(load_lock(ROOT / "versions.lock.yml"), "bookworm")
    trixie = release_lock(load_lock(ROOT / "versions.lock.yml"), "trixie")
    assert bookworm["packages"]["slurmd"].startswith("22.05.") and "+deb12" in bookworm["packages"]["slurmd"]
    assert trixie["packages"]["slurmd"].startswith("24.11.") and "+deb13" in trixie["packages"]["slurmd"]
    assert "releases" not in trixie and trixie["artifacts"] == bookworm["artifacts"]
    with pytest.raises(LockError, match=r"lcm_lock\.releases\.sid\.packages: missing"):
        release_lock(load_lock(ROOT / "versions.lock.yml"), "sid")


def test_update_locks_existing_version(lock: Path, tmp_path: Path) -> None:
    d = tmp_path / "dl"
    d.mkdir()
    (d / "enroot_4.1.2-1_amd64.deb").write_bytes(b"enroot deb bytes")
    before = lock.read_text()
    (change,) = update(lock, d)
    assert change.name == "enroot" and change.old_sha256 is None
    assert change.old_version == change.new_version == "4.1.2"
    got = load_lock(lock)["artifacts"]["enroot"]
    assert got["sha256"] == hashlib.sha256(b"enroot deb bytes").hexdigest()
    assert got["version"] == "4.1.2"
    assert got["url"] == "https://github.com/NVIDIA/enroot/releases/download/v4.1.2/enroot_4.1.2-1_amd64.deb"
    # the other entries are untouched: enroot_caps stays unlocked, the source tarball keeps its sha256
    arts, repo = load_lock(lock)["artifacts"], load_lock(ROOT / "versions.lock.yml")["artifacts"]
    assert arts["enroot_caps"] == repo["enroot_caps"] and arts["enroot_caps"]["sha256"] is None
    assert arts["enroot_src"] == repo["enroot_src"]
    # everything above the artifacts block is byte-identical (comments kept)
    head = before[: before.index("  artifacts:")]
    assert lock.read_text().startswith(head)
    assert load_lock(lock)["releases"] == load_lock(ROOT / "versions.lock.yml")["releases"]


def test_update_moves_version_by_template(lock: Path, tmp_path: Path) -> None:
    d = tmp_path / "dl"
    d.mkdir()
    (d / "pyxis-0.25.0.tar.gz").write_bytes(b"pyxis source")
    (change,) = update(lock, d)
    assert (change.old_version, change.new_version) == ("0.24.0", "0.25.0")
    assert change.old_sha256 == load_lock(ROOT / "versions.lock.yml")["artifacts"]["pyxis"]["sha256"]
    assert "0.24.0 -> 0.25.0" in str(change) and "(changed)" in str(change)
    got = load_lock(lock)["artifacts"]["pyxis"]
    assert got["version"] == "0.25.0"
    assert got["filename"] == "pyxis-0.25.0.tar.gz"
    assert got["url"] == "https://github.com/NVIDIA/pyxis/archive/refs/tags/v0.25.0.tar.gz"
    assert got["sha256"] == hashlib.sha256(b"pyxis source").hexdigest()
    assert got["note"] == load_lock(ROOT / "versions.lock.yml")["artifacts"]["pyxis"]["note"]


def test_update_moves_the_enroot_source_by_template(lock: Path, tmp_path: Path) -> None:
    d = tmp_path / "dl"
    d.mkdir()
    (d / "enroot-4.2.0.tar.gz").write_bytes(b"enroot source")
    (change,) = update(lock, d)
    assert change.name == "enroot_src" and (change.old_version, change.new_version) == ("4.1.2", "4.2.0")
    got = load_lock(lock)["artifacts"]
    assert got["enroot_src"]["url"] == "https://github.com/NVIDIA/enroot/archive/refs/tags/v4.2.0.tar.gz"
    assert got["enroot_src"]["sha256"] == hashlib.sha256(b"enroot source").hexdigest()
    assert got["enroot"]["version"] == "4.1.2", "the .deb entry moves only with its own file"


def test_unmatched_file_refused_nothing_written(lock: Path, tmp_path: Path) -> None:
    d = tmp_path / "dl"
    d.mkdir()
    (d / "enroot_4.1.2-1_amd64.deb").write_bytes(b"x")
    (d / "random-tool-1.0.tar.gz").write_bytes(b"y")
    before = lock.read_text()
    with pytest.raises(LockError, match=r"random-tool-1\.0\.tar\.gz: matches no artifact"):
        update(lock, d)
    assert lock.read_text() == before


def test_template_does_not_confuse_similar_names() -> None:
    arts = load_lock(ROOT / "versions.lock.yml")["artifacts"]
    assert match_file("enroot+caps_3.5.1-1_amd64.deb", arts) == ("enroot_caps", "3.5.1")
    assert match_file("enroot_3.5.1-1_amd64.deb", arts) == ("enroot", "3.5.1")
    assert match_file("enroot-4.1.3.tar.gz", arts) == ("enroot_src", "4.1.3")
    assert match_file("enroot_4.1.2-1_amd64.deb", arts) == ("enroot", "4.1.2")
    assert match_file("pyxis-0.25.0.tar.gz", arts) == ("pyxis", "0.25.0")
    assert match_file("libnccl-dev_2.29.1-1+cuda13.0_amd64.deb", arts) == ("nccl_dev", "2.29.1-1+cuda13.0")


def test_cli_dry_run_and_exit_codes(lock: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "dl"
    d.mkdir()
    (d / "grafana_11.6.0_amd64.deb").write_bytes(b"g")
    before = lock.read_text()
    assert main(["lock", "update", str(d), "--lock", str(lock), "--dry-run"]) == 0
    assert lock.read_text() == before and "would update 1" in capsys.readouterr().out
    (d / "unknown.bin").write_bytes(b"u")
    assert main(["lock", "update", str(d), "--lock", str(lock)]) == 2
    assert "unknown.bin" in capsys.readouterr().err


def test_rewritten_lock_is_stable(lock: Path, tmp_path: Path) -> None:
    """A second update with the same file changes nothing (canonical format is a fixed point)."""
    d = tmp_path / "dl"
    d.mkdir()
    (d / "prometheus-2.28.1.linux-amd64.tar.gz").write_bytes(b"p")
    update(lock, d)
    once = lock.read_text()
    update(lock, d)
    assert lock.read_text() == once
    assert (
        yaml.safe_load(once)["lcm_lock"]["artifacts"]["prometheus"]["sha256"]
        == hashlib.sha256(b"p").hexdigest()
    )


def test_repo_artifacts_block_is_in_the_canonical_format() -> None:
    """`lock update` re-emits the whole artifacts block: the committed one must already read that way, so an
    update's diff shows only what it locked (notes included: hand-wrapped notes would be re-wrapped)."""
    text = (ROOT / "versions.lock.yml").read_text()
    block = text[text.index("  artifacts:") :]
    assert block == render_artifacts(load_lock(ROOT / "versions.lock.yml")["artifacts"])
