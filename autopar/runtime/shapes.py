"""Shape queries on split values, as the single-device program would see them.

Rank graphs keep sizes with their global meaning (a view's ``C`` is the full hidden
size; the tensor-parallel rewrite divides the entry at the split dimension). A size read
off a split tensor is therefore scaled back up here.
"""
from __future__ import annotations

import torch


def global_size(x: torch.Tensor, split_dim: int, degree: int, dim: int | None = None, rows: int = 1,
                length: int | None = None):
    """``x.size()`` / ``x.size(dim)`` of the full tensor whose rank-local part is ``x``
    (``rows``: the rows, dim 0, are split that many ways as well: Bian's cube;
    ``length``: the split dimension's single-device length, when it is padded)."""
    sizes = list(x.shape)
    sizes[split_dim] = length if length is not None else sizes[split_dim] * degree
    sizes[0] *= rows
    return torch.Size(sizes) if dim is None else sizes[dim]


def blocks_in_order(x: torch.Tensor, dim: int, degree: int, blocks: int) -> torch.Tensor:
    """A block-split value (``Shard(dim, blocks)``) all-gathered in rank order, which
    puts each rank's ``blocks`` pieces side by side (``[q0 k0 v0 | q1 k1 v1]``), put back
    in the single-device order (``[q0 q1 | k0 k1 | v0 v1]``)."""
    if degree == 1 or blocks == 1:
        return x
    dim = dim % x.dim()
    pieces = x.unflatten(dim, (degree, blocks, x.size(dim) // (degree * blocks)))
    return pieces.transpose(dim, dim + 1).flatten(dim, dim + 2)


def padded_part(size: int, degree: int) -> int:
    """Each rank's length of a dimension of ``size`` padded to a multiple of ``degree``
    (a padded vocabulary's rows: ``ceil(size / degree)``)."""
    return -(-size // degree)
