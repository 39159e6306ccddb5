"""Shape queries on split values, as the single-device program would see them.

Rank graphs keep sizes with their global meaning (a view's ``C`` is the full hidden
size; the tensor-parallel rewrite divides the entry at the split dimension). A size read
off a split tensor is therefore scaled back up here.
"""
from __future__ import annotations

import torch


def global_size(x: torch.Tensor, split_dim: int, degree: int, dim: int | None = None, rows: int = 1):
    """``x.size()`` / ``x.size(dim)`` of the full tensor whose rank-local part is ``x``
    (``rows``: the rows, dim 0, are split that many ways as well: Bian's cube)."""
    sizes = list(x.shape)
    sizes[split_dim] *= degree
    sizes[0] *= rows
    return torch.Size(sizes) if dim is None else sizes[dim]
