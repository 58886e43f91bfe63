"""Shared by every test directory: tests/support (helpers for multi-process trainer runs) on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
