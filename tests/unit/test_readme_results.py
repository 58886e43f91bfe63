"""README.md's "## Measured" table is generated from committed result files (scripts/gen-readme-results)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from lcm_runner.report import readme

ROOT = Path(__file__).resolve().parents[2]


def _sources() -> list[str]:
    return sorted({s for r in readme.rows(ROOT) for s in r.sources})


def _copy(tmp_path: Path) -> Path:
    """The README and every source file the rows read, under a tmp root."""
    for rel in ["README.md", *_sources()]:
        dst = tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, dst)
    return tmp_path


def test_readme_table_is_what_the_committed_results_give(capsys: pytest.CaptureFixture[str]) -> None:
    rc = readme.main(["--check"])
    assert rc == 0, capsys.readouterr().err


def test_every_row_names_a_committed_source() -> None:
    block = readme.render(ROOT)
    rows = readme.rows(ROOT)
    assert rows and all(r.sources for r in rows)
    for src in _sources():
        assert f"[{src}]({src})" in block
    if shutil.which("git") and (ROOT / ".git").exists():
        r = subprocess.run(
            ["git", "ls-files", "--error-unmatch", *_sources()], cwd=ROOT, capture_output=True, text=True
        )
        assert r.returncode == 0, f"source files not committed: {r.stderr}"


def test_a_changed_result_changes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _copy(tmp_path)
    assert readme.main(["--root", str(root), "--check"]) == 0
    rel = "docs/results/h200-engine/summary.json"
    doc = json.loads((root / rel).read_text())
    doc["g1"]["tokens_per_s_median"] = 70000.0
    (root / rel).write_text(json.dumps(doc))
    assert "70.0 k / 123.3 k" in readme.render(root)
    capsys.readouterr()
    assert readme.main(["--root", str(root), "--check"]) == 1
    err = capsys.readouterr().err
    assert "-| Engine:" in err and "+| Engine:" in err and "70.0 k" in err
    assert "README.md is stale: run scripts/gen-readme-results" in err
    # Writing brings README in line again; only the marked block changes.
    before = (root / "README.md").read_text()
    assert readme.main(["--root", str(root)]) == 0
    after = (root / "README.md").read_text()
    assert "70.0 k / 123.3 k" in after
    head, tail = before.split(readme.BEGIN)[0], before.split(readme.END)[1]
    assert after.startswith(head) and after.endswith(tail)
    assert readme.main(["--root", str(root), "--check"]) == 0


def test_a_changed_fault_stage_changes_its_row(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    rel = "docs/results/lab-slurm/stages/fault.json"
    doc = json.loads((root / rel).read_text())
    doc["metrics"]["trainer_kill"]["downtime_s"] = 1.234
    (root / rel).write_text(json.dumps(doc))
    assert "| 1.23 s / 7.00 s / 12.83 s |" in readme.render(root)


def test_a_missing_source_file_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _copy(tmp_path)
    rel = "docs/results/h200-integrity/checksum-vm-20261201-090720.json"
    (root / rel).unlink()
    with pytest.raises(readme.ResultsError, match=rel.replace(".", r"\.") + ": missing"):
        readme.render(root)
    capsys.readouterr()
    assert readme.main(["--root", str(root), "--check"]) == 2
    assert rel in capsys.readouterr().err


def test_a_value_that_was_not_measured_is_an_error(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    rel = "docs/results/h200x2-stages/run-1/stages/resume.json"
    doc = json.loads((root / rel).read_text())
    doc["metrics"]["resume_s"] = None
    (root / rel).write_text(json.dumps(doc))
    with pytest.raises(readme.ResultsError, match="resume_s is null"):
        readme.render(root)


def test_readme_without_markers_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _copy(tmp_path)
    (root / "README.md").write_text("# no table here\n")
    assert readme.main(["--root", str(root), "--check"]) == 2
    assert "measured:begin" in capsys.readouterr().err


def test_script_check_passes_without_activation() -> None:
    r = subprocess.run(
        [str(ROOT / "scripts" / "gen-readme-results"), "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
