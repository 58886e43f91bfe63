"""NVRx 0.4.1 (requirements/nvrx-test.lock, in .venv/nvrx-test) on a trainer's PYTHONPATH, for the CPU test
of `--inprocess-restart`.

0.4.1 is the newest NVRx whose wheel runs on Debian 12's glibc 2.36. megatron-core 0.19 asserts NVRx >= 0.6
when it imports its checkpoint strategies as soon as any NVRx is importable, even when nothing of NVRx's
checkpointing is used. The overlay is a regular package `nvidia_resiliency_ext` whose __path__ is the real
0.4.1 package and whose __version__ says 0.6.0 to pass that check. megatron-core then finds 0.4.1 lacks its
async-checkpoint symbols (has_nvrx_async_support() is False) and uses its own writer. What the test runs of
NVRx is its 0.4.1 `inprocess` module, unchanged. The GPU machines run the real 0.7.0.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NVRX_TARGET = REPO / ".venv" / "nvrx-test"
OVERLAY_VERSION = "0.6.0"


def overlay(dest: Path) -> str:
    """Write the overlay under `dest`; returns the PYTHONPATH entries (the overlay, then the 0.4.1 target)."""
    real = NVRX_TARGET / "nvidia_resiliency_ext"
    if not (real / "inprocess" / "wrap.py").is_file():
        raise FileNotFoundError(f"{real}: NVRx 0.4.1 is not installed (scripts/bootstrap installs it)")
    pkg = dest / "nvidia_resiliency_ext"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(
        "# tests/support/nvrx_overlay.py: NVRx 0.4.1, with a version megatron-core 0.19 imports beside\n"
        f"__path__ = [{str(real)!r}]\n"
        f"__version__ = {OVERLAY_VERSION!r}\n"
    )
    return f"{dest}:{NVRX_TARGET}"
