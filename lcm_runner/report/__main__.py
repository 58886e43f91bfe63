import sys

from lcm_runner.report import main

sys.exit(main())
