"""`python -m lcm_runner.metrics train|slurm ...` = `lcm-runner metrics ...` (without the other
subcommands' imports)."""

from __future__ import annotations

import sys

from lcm_runner.metrics.cli import main

if __name__ == "__main__":
    sys.exit(main())
