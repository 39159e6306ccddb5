"""torchtitan's Qwen 3 (``torchtitan.models.qwen3``, release 0.3.0), its "debugmodel"
flavour cut to a few small layers: a fused grouped-query Q/K/V projection, RMSNorm of
each query and key head (``qk_norm``), a rotary embedding in cosines and sines
(``CosSinRoPE``), SwiGLU feed-forward layers, and the embedding tied to the head.

Installed as torchtitan's Llama 3 is (``make peers``; :mod:`examples.peers.torchtitan_llama`);
its inner attention set to torchtitan's ``ScaledDotProductAttention`` on the CPU."""
from __future__ import annotations

import torch

from examples.peers.torchtitan_llama import available, compare_job

__all__ = ["available", "qwen3", "qwen3_job"]


def qwen3(layers: int = 2, dim: int = 128, heads: int = 4, kv_heads: int = 2, head_dim: int = 32,
          max_seq_len: int = 64) -> torch.nn.Module:
    """torchtitan's debug Qwen 3 (vocabulary 2048, tied embedding) with ``layers`` layers of
    ``heads`` heads of ``head_dim`` over ``kv_heads`` key/value heads, built by torchtitan's
    own configuration, seeded."""
    from torchtitan.models.common import CosSinRoPE
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.qwen3 import _build_qwen3_layers, _debugmodel
    config = _debugmodel("flex")
    config.dim = dim
    config.norm.normalized_shape = dim
    config.tok_embeddings.embedding_dim = dim
    config.lm_head.in_features = dim
    config.layers = _build_qwen3_layers(
        fuse_qkv=True, n_layers=layers, dim=dim, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
        hidden_dim=2 * dim, attn_backend="flex",
        rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=max_seq_len, theta=1000000.0))
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    torch.manual_seed(0)
    return config.build()


def qwen3_job(strategies: list) -> list[dict]:
    """On every rank: torchtitan's Qwen 3 under each strategy in float64 against one
    process (:func:`examples.peers.torchtitan_llama.compare_job`)."""
    return compare_job("qwen3", lambda _: qwen3(), [(strategy, None) for strategy in strategies])
