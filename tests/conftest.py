"""Shared by every test directory: tests/support (helpers for multi-process trainer runs, the fault
matrix's rows) on sys.path, and the fault matrix's `matrix` fixture.

The fault matrix (tests/faults): each test injects one fault and records one row (fault | injected how |
detected after | recovered | downtime | steps lost beyond the last checkpoint | good checkpoints lost).
Rows go to $LCM_FAULTS_RESULTS (JSON lines) when it is set: `scripts/faults` sets it and renders
docs/reliability.md's table from it. `-m "not lab and not full"` is the time-boxed subset CI runs.

Only this conftest and tests/unit's, tests/infra's exist: tests/infra's modules import helpers with
`from conftest import ...`, which a conftest.py loaded after theirs (e.g. one in tests/faults) would
shadow when both directories are collected in one run (molecule verify does).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from faultmatrix import Matrix
from labrun import LabRun, run_lab_all


@pytest.fixture(scope="session")
def matrix() -> Matrix:
    out = os.environ.get("LCM_FAULTS_RESULTS")
    return Matrix(Path(out) if out else None)


@pytest.fixture(scope="session")
def lab_run_result() -> LabRun:
    """The lab's `lcm-runner all` run (tests/support/labrun.py), once per session: the stage tests and
    the monitoring tests read the same run."""
    return run_lab_all()
