"""`python -m lcm_runner ...` = `lcm-runner ...`."""

from __future__ import annotations

import sys

from lcm_runner.cli import main

if __name__ == "__main__":
    sys.exit(main())
