"""lcm-runner: training stages for lcm-infra clusters."""

__version__ = "0.1.0"
