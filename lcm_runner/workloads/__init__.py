"""Workloads: the trainers the stages run (lcm's own, or a user's Megatron-LM)."""
