"""The fault matrix: each test injects one fault and records one row (fault | injected how | detected
after | recovered | downtime | steps lost beyond the last checkpoint | good checkpoints lost).

Rows go to $LCM_FAULTS_RESULTS (JSON lines) when it is set: `scripts/faults` sets it and renders
docs/reliability.md from it. `-m "not full"` is the time-boxed subset CI runs; `full` cases (many faults
in one job, the lab's node deaths) run with the whole matrix.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from faultmatrix import Matrix


@pytest.fixture(scope="session")
def matrix() -> Matrix:
    out = os.environ.get("LCM_FAULTS_RESULTS")
    return Matrix(Path(out) if out else None)
