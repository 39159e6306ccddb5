"""Cutting a rank's shard out of a full tensor, and gathering full tensors back.

A :class:`~autopar.strategies.shared.tensor_rewrite.ParamShard` ``(dim, blocks)`` splits ``dim``
into ``blocks`` equal blocks and each block into ``degree`` parts; rank ``r`` holds part
``r`` of every block, side by side. For a fused QKV weight ``[3h, h]`` with blocks=3 and
degree 2, rank 0 holds ``[q[:h/2], k[:h/2], v[:h/2]]`` — the heads it computes — which
is why fused projections are split per head rather than as one block.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from autopar.runtime.groups import get_group


def cut_blocks(full: torch.Tensor, dim: int, blocks: int, parts: int, index: int) -> torch.Tensor:
    """Part ``index`` of ``parts`` of each of ``blocks`` equal blocks of ``dim``, side by
    side (a copy-free view when ``blocks == 1``)."""
    if full.shape[dim] % (blocks * parts):
        raise ValueError(f"dimension {dim} of size {full.shape[dim]} cannot be split into {blocks} block(s) × "
                         f"{parts} ranks")
    pieces = [b.chunk(parts, dim)[index] for b in full.chunk(blocks, dim)]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim)


def gather_blocks(local: torch.Tensor, dim: int, blocks: int, group) -> torch.Tensor:
    """The inverse of :func:`cut_blocks` over ``group`` (a ``ProcessGroup``, None for one
    rank): every rank's part all-gathered and put back block by block."""
    parts = 1 if group is None else dist.get_world_size(group)
    if parts == 1:
        return local.clone()
    pieces = [torch.empty_like(local) for _ in range(parts)]
    dist.all_gather(pieces, local.contiguous(), group=group)
    per_rank = [p.chunk(blocks, dim) for p in pieces]
    return torch.cat([per_rank[r][b] for b in range(blocks) for r in range(parts)], dim)


def local_shard(full: torch.Tensor, shard, degree: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s part of ``full`` under ``shard`` (a copy-free view when possible)."""
    return cut_blocks(full, shard.dim, shard.blocks, degree, rank)


def gather_full(local: torch.Tensor, shard, degree: int) -> torch.Tensor:
    """The full tensor, all-gathered over the shard's group (every rank gets it)."""
    if degree == 1:
        return local.clone()
    return gather_blocks(local, shard.dim, shard.blocks, get_group(shard.group))
