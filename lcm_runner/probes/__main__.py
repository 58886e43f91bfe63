"""`python -m lcm_runner.probes ...` = `lcm-runner probe ...` (without the other subcommands' imports)."""

from __future__ import annotations

import sys

from lcm_runner.probes.cli import main

if __name__ == "__main__":
    sys.exit(main())
