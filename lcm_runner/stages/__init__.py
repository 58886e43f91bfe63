"""The training stages (baseline, resume, fault, nccl-profile, all): each drives a launcher, follows the
trainer's telemetry, prints progress and ends with a one-line verdict in <run_dir>/stages/<stage>.json."""
