"""What a Megatron-LM checkpoint directory says about itself: which `iter_NNNNNNN` directories are whole.

Megatron-LM core_v0.19.0 writes, for `--ckpt-format torch_dist` (its default) and `fsdp_dtensor`, every
rank's shards (`__<rank>_<n>.distcp`) and the DCP `.metadata`, then `metadata.json` (dist_checkpointing
serialization.save: "metadata.json is written only" once everything else is, as its last finalize step),
then the tracker `latest_checkpointed_iteration.txt` (checkpointing.py, rank 0). A directory without
`metadata.json` is a save that did not finish. The legacy `--ckpt-format torch` writes
`mp_rank_XX[_YYY]/model_optim_rng.pt` per model-parallel rank, each with torch.save (no finish marker:
a file that exists was renamed into place whole by torch.save's zip writer only at its end).
"""

from __future__ import annotations

from pathlib import Path

DIST_CONFIG = "metadata.json"  # megatron/core/dist_checkpointing/core.py CONFIG_FNAME
DCP_METADATA = ".metadata"
LEGACY_MODEL_FILE = "model_optim_rng.pt"


def iter_complete(directory: Path) -> bool:
    """Whether the iteration directory holds a whole checkpoint (see the module's docstring)."""
    if (directory / DIST_CONFIG).is_file():
        return (directory / DCP_METADATA).is_file() or not any(directory.glob("*.distcp"))
    return any(p.is_file() for p in directory.glob(f"mp_rank_*/{LEGACY_MODEL_FILE}"))
