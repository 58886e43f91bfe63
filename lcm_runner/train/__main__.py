"""`python -m lcm_runner.train ...` (what torchrun launches).

The main guard matters: dist_checkpointing.save starts a 'spawn' multiprocessing Manager, and a spawned
child re-imports a script's `__main__` (a package's `__main__` module is skipped by multiprocessing, but
keep the guard for copies of this file run as a script). Because a spawned helper never runs this
module, nothing that must happen in the helpers belongs here: the Manager, the resource_tracker and the
forked checkpoint writers are tied to the trainer's lifetime (and kept out of SIGUSR1/SIGTERM) by
lcm_runner.train.procutil.install_checkpoint_results_queue, which the trainer itself calls, under our
forking agent and under stock torchrun alike.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from lcm_runner.train.cli import main

    sys.exit(main())
