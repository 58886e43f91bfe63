"""`python -m lcm_runner.launch.agent ...` (the sbatch script and the local launcher run it)."""

from lcm_runner.launch.agent.cli import main

raise SystemExit(main())
