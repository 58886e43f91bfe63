"""Grafana dashboards as code (grafana_foundation_sdk builders), one module per dashboard.

`scripts/gen-dashboards` writes roles/grafana/files/dashboards/<uid>.json (the Grafana role provisions
every JSON there) and docs/dashboards.md; `--check` fails when the committed files are stale. Each panel
carries its Expect (common.py): where its series come from, which the tests read from here.
"""

from __future__ import annotations

from . import fabric, gpu_health, slurm, storage, training
from .common import Dashboard, Expect, Panel, Row, Target, panels_by_id, render

DASHBOARDS: tuple[Dashboard, ...] = (
    gpu_health.DASHBOARD,
    fabric.DASHBOARD,
    training.DASHBOARD,
    storage.DASHBOARD,
    slurm.DASHBOARD,
)

__all__ = ["DASHBOARDS", "Dashboard", "Expect", "Panel", "Row", "Target", "panels_by_id", "render"]
