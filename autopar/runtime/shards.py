"""Cutting a rank's shard out of a full tensor, and gathering full tensors back.

A :class:`~autopar.passes.tensor_parallel.ParamShard` ``(dim, blocks)`` splits ``dim``
into ``blocks`` equal blocks and each block into ``degree`` parts; rank ``r`` holds part
``r`` of every block, side by side. For a fused QKV weight ``[3h, h]`` with blocks=3 and
degree 2, rank 0 holds ``[q[:h/2], k[:h/2], v[:h/2]]`` — the heads it computes — which
is why fused projections are split per head rather than as one block.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from autopar.runtime.groups import get_group


def local_shard(full: torch.Tensor, shard, degree: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s part of ``full`` under ``shard`` (a copy-free view when possible)."""
    if full.shape[shard.dim] % (shard.blocks * degree):
        raise ValueError(f"dimension {shard.dim} of size {full.shape[shard.dim]} cannot be split into "
                         f"{shard.blocks} block(s) × {degree} ranks")
    blocks = full.chunk(shard.blocks, shard.dim)
    parts = [b.chunk(degree, shard.dim)[rank] for b in blocks]
    return parts[0] if len(parts) == 1 else torch.cat(parts, shard.dim)


def gather_full(local: torch.Tensor, shard, degree: int) -> torch.Tensor:
    """The full tensor, all-gathered over the shard's group (every rank gets it)."""
    group = get_group(shard.group)
    if degree == 1 or group is None:
        return local.clone()
    pieces = [torch.empty_like(local) for _ in range(degree)]
    dist.all_gather(pieces, local.contiguous(), group=group)
    per_rank_blocks = [p.chunk(shard.blocks, shard.dim) for p in pieces]
    out = []
    for b in range(shard.blocks):
        out.extend(per_rank_blocks[r][b] for r in range(degree))
    return torch.cat(out, shard.dim)
