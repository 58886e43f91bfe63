"""A user's Megatron-LM (`pretrain_gpt.py`, unmodified): what it prints, read into the telemetry."""
