"""torchtitan's Llama 3 (``torchtitan.models.llama3``, release 0.3.0), its "debugmodel"
flavour cut to a few layers: a fused Q/K/V projection viewed ``[B, T, heads, 3, d]``, a
rotary embedding in complex numbers (``ComplexRoPE``: ``view_as_complex``, a product with
a complex table, ``view_as_real``), state-dict hooks that save the fused weight as
``wq``, ``wk``, ``wv``, SwiGLU feed-forward layers and RMSNorm.

torchtitan is installed beside autopar with ``pip install --no-deps torchtitan==0.3.0``
and what its model code imports (``make peers``). Its Llama offers only
flex or varlen attention on the CPU; each layer's inner attention is set to torchtitan's
own ``ScaledDotProductAttention`` here, as its configuration system allows.
"""
from __future__ import annotations

from typing import Callable

import torch

from examples.models import lm_loss

VOCAB = 2048


def available() -> str | None:
    """None where torchtitan is installed, else what to run (its import waits for the job)."""
    import importlib.util
    if importlib.util.find_spec("torchtitan") is None:
        return "torchtitan is not installed; run `make peers`"
    return None


def llama3(layers: int = 2, max_seq_len: int = 64, kv_heads: int | None = None) -> torch.nn.Module:
    """torchtitan's debug Llama 3 (dim 256, 16 heads, vocabulary 2048) with ``layers``
    layers, built by torchtitan's own configuration, seeded. ``kv_heads``: grouped-query
    attention as its larger flavours have it (the fused projection then laid out
    ``[groups, heads per group + 2, d]``)."""
    config = _config(layers, max_seq_len, kv_heads)
    torch.manual_seed(0)
    return config.build()


def _config(layers: int, max_seq_len: int, kv_heads: int | None):
    """The configuration :func:`llama3` builds (torchtitan's ``Llama3Model.Config``)."""
    from torchtitan.models.common import ComplexRoPE, compute_ffn_hidden_dim
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import _build_llama3_layers, _debugmodel
    config = _debugmodel("flex")
    config.layers = _build_llama3_layers(
        fuse_qkv=True, n_layers=layers, dim=256, n_heads=16, n_kv_heads=kv_heads, attn_backend="flex",
        hidden_dim=compute_ffn_hidden_dim(256, multiple_of=256),
        rope=ComplexRoPE.Config(dim=16, max_seq_len=max_seq_len, theta=500000, scaling="llama"))
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return config


def llama3_torchtitan_parallel(layers: int = 2, max_seq_len: int = 64, *, dp_shard: int, tp: int,
                               sequence_parallel: bool = True, kv_heads: int | None = None, compile: bool = False,
                               device: str = "cpu"):
    """The same model (same seed, same weights as :func:`llama3`) parallelised by torchtitan
    itself, as its trainer composes it: the sharding configuration of its tensor-parallel
    plan (``set_llama3_sharding_config``, sequence parallel or not; the head column-split
    over the vocabulary, the loss vocabulary-parallel), then ``parallelize_llama`` on a
    ``ParallelDims`` mesh (``fsdp`` × ``tp``): ``Module.parallelize`` for tensor
    parallelism, ``fully_shard`` per layer and at the root (FSDP2, float32 parameters,
    gradients summed over the data group); with ``compile``, torchtitan's ``torch.compile`` of
    each layer (``CompileConfig(enable=True, components=["model"])``, applied before FSDP
    as its trainer does). ``device``: ``"cpu"`` (gloo) or ``"cuda"`` (the model moved to
    the rank's GPU before it is parallelised). Runs on every rank of a ``dp_shard × tp``
    world. Returns ``(model, parallel_dims)``; :func:`torchtitan_loss` is its loss.

    Settings a CPU run needs: meshes on ``"cpu"`` (torchtitan picks ``"cuda"`` where no
    accelerator is found), the ``"partial_dtensor"`` backend (its default, ``"spmd_types"``,
    fails inside ``fully_shard`` on torch 2.13), and plain sums in FSDP's reductions (gloo
    refuses ``PREMUL_SUM``)."""
    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.llama3.parallelize import parallelize_llama
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config
    parallel_dims_module.device_type = device
    backend = "partial_dtensor"
    dist_utils.set_spmd_backend(backend)
    parallelism = ParallelismConfig(data_parallel_shard_degree=dp_shard, tensor_parallel_degree=tp,
                                    enable_sequence_parallel=sequence_parallel, spmd_backend=backend)
    dims = ParallelDims.from_config(parallelism, dist.get_world_size())
    dims.build_mesh()
    config = _config(layers, max_seq_len, kv_heads)
    set_llama3_sharding_config(config, enable_sp=sequence_parallel)
    torch.manual_seed(0)
    model = config.build().to(device)
    parallelize_llama(model, parallel_dims=dims, training=TrainingConfig(mixed_precision_param="float32"),
                      parallelism=parallelism, compile_config=CompileConfig(enable=compile, components=["model"]),
                      ac_config=None, dump_folder="")
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
    return model, dims


def torchtitan_loss(logits, target: torch.Tensor, global_tokens: int) -> torch.Tensor:
    """torchtitan's training loss on a rank's part of the batch: its cross-entropy (summed;
    vocabulary-parallel when ``logits`` is split over the vocabulary) over the global
    number of tokens, so that the data group's summed gradients are those of the mean."""
    from torchtitan.components.loss import cross_entropy_loss
    return cross_entropy_loss(logits, target) / global_tokens


def peers_job(strategies: list) -> list[dict]:
    """On every rank: torchtitan's Llama 3 under each strategy (or ``(strategy, kv_heads)``)
    in float64 against the single device (:func:`compare_job`)."""
    cases = [case if isinstance(case, tuple) else (case, None) for case in strategies]
    return compare_job("llama3", lambda kv_heads: llama3(kv_heads=kv_heads), cases, option="kv_heads")


def compare_job(name: str, build: Callable, cases: list, option: str = "option") -> list[dict]:
    """On every rank: ``build(value)`` for each ``(strategy, value)`` of ``cases`` in float64
    against the single device (:func:`autopar.testing.compare_with_single_device`), on a
    batch of 4 × 16 tokens of torchtitan's vocabulary, with what the plan split; an error
    is reported in the row (``option``: the value's key there) unless it leaves the process
    group unusable."""
    from autopar.testing import compare_with_single_device, reported_in
    from examples.qkv_layouts import attention_strategies
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (4, 16), generator=generator)
    target = torch.randint(0, VOCAB, (4, 16), generator=generator)
    rows = []
    for strategy, value in cases:
        row: dict = {"strategy": strategy, option: value}
        with reported_in(row, f"torchtitan {name} under {strategy}"):
            report = compare_with_single_device(lambda: build(value), (ids,), target, lm_loss, strategy,
                                                dtype=torch.float64)
            row.update({k: report[k] for k in ("mesh", "strategies", "regions", "output", "loss", "grad", "param")})
            row["attention"] = attention_strategies(report)
        rows.append(row)
    return rows
