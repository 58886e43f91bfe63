import sys

from lcm_runner.nccl.cli import main

sys.exit(main())
