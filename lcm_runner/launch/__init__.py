"""Launchers: the per-node agent, the local (torchrun-style) and Slurm launchers."""
