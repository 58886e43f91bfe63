"""`python -m lcm_runner.train ...` (what torchrun launches).

dist_checkpointing.save starts a 'spawn' multiprocessing Manager, which re-imports this module as
`__mp_main__`: the guard below keeps that child from training, and the child asks the kernel to kill
it when its parent dies, so a SIGKILLed worker leaves no orphaned Manager (or resource_tracker, whose
pipe then closes) behind.
"""

from __future__ import annotations

import sys

if __name__ == "__mp_main__":  # the Manager child of a worker
    from lcm_runner.train.procutil import die_with_parent

    die_with_parent()

if __name__ == "__main__":
    from lcm_runner.train.cli import main

    sys.exit(main())
