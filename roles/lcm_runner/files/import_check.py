# Run by roles/lcm_runner (tasks/run.yml) with the venv's python: the trainer's imports must work here.
# On a node without a GPU the project's CPU shim stubs the one triton-only megatron module first.
import importlib.util
import sys

import torch

if not torch.cuda.is_available() and importlib.util.find_spec("triton") is None:
    from lcm_runner.train import cpu_compat

    cpu_compat.stub_triton_kernels()
import megatron.core

import lcm_runner

print(
    f"python {sys.version.split()[0]} torch {torch.__version__} (cuda={torch.cuda.is_available()}) "
    f"megatron-core {megatron.core.__version__} lcm_runner {lcm_runner.__version__}"
)
