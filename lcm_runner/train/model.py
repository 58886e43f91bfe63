"""Model, DDP wrapper and optimizer: megatron-core GPTModel with MoE layers.

- Layer spec: Transformer Engine's when it is importable (`--transformer-impl auto`), else megatron-core's
  local spec. The local spec's layer norms are replaced by `TorchLayerNorm`, which (unlike megatron's
  WrappedTorchNorm) supports sequence parallelism, required by MoE with TP > 1. With `--use-flash-attn`
  the local spec's core attention is `SDPAttention` (attention.py: PyTorch's fused SDPA kernels on CUDA,
  its math path on CPU); with Transformer Engine, TE's fused attention.
- Pipeline parallelism: each stage builds its own layers (megatron numbers them globally, so checkpoints
  reshard across layouts), the embedding on the first stage and the output layer on the last.
- bf16: parameters in bf16 through megatron's Float16Module (GPU only).
- DDP: megatron DistributedDataParallel (grad buffers, `finalize_model_grads` all-reduces them).
- Optimizer: megatron's `get_megatron_optimizer` (Adam, fp32 main params for bf16), or torch AdamW
  stepping on the fp32 `.main_grad` buffers (`--optimizer-impl torch`, the CPU default).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from .args import ArgError, TrainArgs


def have_transformer_engine() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


class TorchLayerNorm:
    """Layer-norm builder for megatron specs: torch.nn.LayerNorm whose weights carry the
    `sequence_parallel` tag, so finalize_model_grads all-reduces their grads over the TP group."""

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, **_unused: Any) -> torch.nn.LayerNorm:  # type: ignore[misc]
        ln = torch.nn.LayerNorm(hidden_size, eps=eps, dtype=config.params_dtype)
        for w in ln.parameters():
            w.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]
        return ln


def resolve_impl(args: TrainArgs, device: str) -> str:
    impl = args.transformer_impl
    if impl == "auto":
        impl = "transformer_engine" if device == "cuda" and have_transformer_engine() else "local"
    if impl == "transformer_engine" and not have_transformer_engine():
        raise ArgError("--transformer-impl transformer_engine: Transformer Engine is not installed")
    if impl == "transformer_engine" and device != "cuda":
        raise ArgError("--transformer-impl transformer_engine needs --device cuda")
    return impl


def attention_kind(args: TrainArgs, impl: str) -> str:
    """What computes attention: `te` (Transformer Engine's fused attention), `sdpa` (SDPAttention) or
    `unfused` (megatron-core's local DotProductAttention)."""
    if impl == "transformer_engine":
        return "te"
    return "sdpa" if args.use_flash_attn else "unfused"


def resolve_optimizer_impl(args: TrainArgs, device: str) -> str:
    if args.optimizer_impl == "megatron" and device != "cuda":
        raise ArgError(
            "--optimizer-impl megatron needs CUDA (megatron's optimizers allocate on 'cuda'); use torch"
        )
    if args.optimizer_impl != "auto":
        if args.optimizer_impl == "torch" and args.bf16:
            raise ArgError("--optimizer-impl torch keeps no fp32 master weights: use megatron with --bf16")
        return args.optimizer_impl
    return "megatron" if device == "cuda" else "torch"


def transformer_config(args: TrainArgs, device: str, initialize: bool = True) -> Any:
    """`initialize=False`: the weights are about to be loaded from a checkpoint, so they are allocated
    where they live (on the GPU) and not drawn: on one H200 the CPU draw of 214M parameters took most of
    the 2.2 s from a restart to the model's start."""
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    moe = args.num_experts is not None
    sequence_parallel = args.sequence_parallel or (moe and args.tp > 1)
    kw: dict[str, Any] = dict(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        ffn_hidden_size=args.ffn_hidden_size or 4 * args.hidden_size,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        add_bias_linear=False,  # with bias, SequentialMLP's in-place `output += bias*probs` breaks autograd
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        expert_model_parallel_size=args.ep,
        expert_tensor_parallel_size=args.expert_tensor_parallel_size,
        sequence_parallel=sequence_parallel,
        # weights drawn from the seeded CPU generator: identical on any device
        use_cpu_initialization=initialize or device != "cuda",
        perform_initialization=initialize,
        bf16=args.bf16,
        params_dtype=torch.bfloat16 if args.bf16 else torch.float32,
        pipeline_dtype=torch.bfloat16 if args.bf16 else torch.float32,
        deterministic_mode=args.deterministic,
    )
    if args.use_flash_attn and resolve_impl(args, device) == "transformer_engine":
        kw["attention_backend"] = AttnBackend.flash
    if moe:
        kw.update(
            num_moe_experts=args.num_experts,
            moe_router_topk=args.moe_router_topk,
            moe_token_dispatcher_type=args.moe_token_dispatcher_type,
            moe_aux_loss_coeff=args.moe_aux_loss_coeff,
            # TE's grouped MLP reads it; the local spec's grouped experts are lcm_runner/train/experts.py
            moe_grouped_gemm=bool(
                args.moe_grouped_gemm and resolve_impl(args, device) == "transformer_engine"
            ),
        )
    return TransformerConfig(**kw)


def layer_spec(args: TrainArgs, impl: str, config: Any) -> Any:
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    if impl == "transformer_engine":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec(
            num_experts=args.num_experts, moe_grouped_gemm=bool(args.moe_grouped_gemm and args.num_experts)
        )
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    spec = get_gpt_layer_local_spec(num_experts=args.num_experts, moe_grouped_gemm=False)
    spec.submodules.input_layernorm = TorchLayerNorm
    spec.submodules.pre_mlp_layernorm = TorchLayerNorm
    if attention_kind(args, impl) == "sdpa":
        from .attention import sdpa_attention_class

        spec.submodules.self_attention.submodules.core_attention = sdpa_attention_class()
    if args.moe_grouped_gemm and args.num_experts:
        from .experts import use_grouped_experts

        use_grouped_experts(spec)
    here = get_num_layers_to_build(config)  # this pipeline stage's layers
    return TransformerBlockSubmodules(layer_specs=[spec] * here, layer_norm=TorchLayerNorm)


@dataclass
class Built:
    gpt: Any  # the GPTModel (owner of the sharded state dict)
    model: Any  # DDP(Float16Module(gpt)) or DDP(gpt): what forward/backward run on
    optimizer: Any  # megatron optimizer or torch.optim.AdamW
    optimizer_impl: str
    transformer_impl: str
    config: Any
    num_params: int
    attention: str = "unfused"  # attention_kind()
    experts: str = ""  # experts_kind(): "" (dense), "sequential", "grouped", "sequential (<why not grouped>)"


def build(args: TrainArgs, device: str, initialize: bool = True) -> Built:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.module import Float16Module

    impl = resolve_impl(args, device)
    opt_impl = resolve_optimizer_impl(args, device)
    from megatron.core import parallel_state as ps

    cfg = transformer_config(args, device, initialize)
    gpt = GPTModel(
        config=cfg,
        transformer_layer_spec=layer_spec(args, impl, cfg),
        vocab_size=args.vocab_size,
        max_sequence_length=args.max_position_embeddings or args.seq_length,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
    )
    if device == "cuda":
        gpt = gpt.cuda(torch.cuda.current_device())
    wrapped = Float16Module(cfg, gpt) if args.bf16 else gpt
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False
    )
    model = DistributedDataParallel(cfg, ddp_cfg, wrapped)
    num_params = sum(p.numel() for p in gpt.parameters())
    if opt_impl == "megatron":
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        ocfg = OptimizerConfig(
            optimizer="adam",
            lr=args.lr,
            weight_decay=args.weight_decay,
            adam_beta1=args.adam_beta1,
            adam_beta2=args.adam_beta2,
            clip_grad=args.clip_grad,
            bf16=args.bf16,
            params_dtype=cfg.params_dtype,
            use_distributed_optimizer=False,
        )
        optimizer = get_megatron_optimizer(ocfg, [model])
    else:
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=args.lr,
            betas=(args.adam_beta1, args.adam_beta2),
            weight_decay=args.weight_decay,
        )
    return Built(
        gpt, model, optimizer, opt_impl, impl, cfg, num_params, attention_kind(args, impl),
        experts_kind(args, impl, cfg, device),
    )  # fmt: skip


def experts_kind(args: TrainArgs, impl: str, config: Any, device: str) -> str:
    """How the local experts run, for the `start` record: megatron's SequentialMLP, or the grouped GEMMs
    of `--moe-grouped-gemm` (with the reason when they cannot run and SequentialMLP's forward does)."""
    if not args.num_experts:
        return ""
    if not args.moe_grouped_gemm:
        return "sequential"
    if impl == "transformer_engine":
        return "grouped (transformer engine)"
    from .experts import why_sequential

    dev = torch.device(device, torch.cuda.current_device()) if device == "cuda" else torch.device(device)
    why = why_sequential(config, args.num_experts // args.ep, dev, config.params_dtype)
    return f"sequential ({why})" if why else "grouped"
