"""Checkpoint integrity (checksums written by the writers, verified before a load), the catalog of a
save directory (states, latest, known-good, retention) and `lcm-runner ckpt verify`. No torch here."""
