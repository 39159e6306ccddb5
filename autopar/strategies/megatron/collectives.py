"""Megatron sequence parallelism's collectives (Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models", 2022, §4.2.2 and Figure 5): between the
tensor-parallel regions each rank of the tensor group holds its chunk of the tokens, so
Megatron's g (the row linear's all-reduce) becomes a reduce-scatter, ḡ, and the column
linear's f (identity forward, all-reduce backward) an all-gather whose backward
reduce-scatters, g. A ring all-reduce is a reduce-scatter followed by an all-gather, so
the volume is the one f and g move.

Graph-callable, like :mod:`autopar.runtime.collectives`: tensors, ints and a group name.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.fx
from torch.distributed import ProcessGroup

from autopar._torch_compat import all_gather_flat, reduce_scatter_flat
from autopar.runtime.groups import get_group, size_of


class _ReduceScatterToSequence(torch.autograd.Function):
    """ḡ: reduce-scatter along ``dim`` in forward (the sum over the group,
    each rank keeping its equal chunk of ``dim``), all-gather of the gradient along ``dim``
    in backward (Korthikanti et al. 2022, §4.2.2 and Figure 5: the exit of a row-parallel
    linear when the layers between tensor-parallel regions run split over the sequence)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, group: Optional[ProcessGroup]) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        size = size_of(group)
        if x.shape[dim] % size:
            raise ValueError(f"cannot reduce-scatter dim {dim} of size {x.shape[dim]} over {size} ranks")
        moved = x.movedim(dim, 0).contiguous()
        out = moved.new_empty((moved.shape[0] // size, *moved.shape[1:]))
        reduce_scatter_flat(out, moved, group=group)
        return out.movedim(0, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        moved = grad.movedim(ctx.dim, 0).contiguous()
        out = moved.new_empty((moved.shape[0] * size_of(ctx.group), *moved.shape[1:]))
        all_gather_flat(out, moved, group=ctx.group)
        return out.movedim(0, ctx.dim), None, None


class _GatherFromSequence(torch.autograd.Function):
    """g: all-gather along ``dim`` in forward, reduce-scatter of the gradient
    along ``dim`` in backward (Korthikanti et al. 2022, §4.2.2): the entry of a
    column-parallel linear whose input is split over the sequence; each rank's gradient
    for the gathered input is a partial sum over its columns, so the backward sums them
    and keeps this rank's chunk. Same volume as Megatron's f (an all-reduce) in backward,
    and the forward all-gather replaces f's identity."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, group: Optional[ProcessGroup]) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        moved = x.movedim(dim, 0).contiguous()
        out = moved.new_empty((moved.shape[0] * size_of(group), *moved.shape[1:]))
        all_gather_flat(out, moved, group=group)
        return out.movedim(0, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        moved = grad.movedim(ctx.dim, 0).contiguous()
        out = moved.new_empty((moved.shape[0] // size_of(ctx.group), *moved.shape[1:]))
        reduce_scatter_flat(out, moved, group=ctx.group)
        return out.movedim(0, ctx.dim), None, None


def reduce_scatter_to_sequence_region(x: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    """Megatron-SP ḡ: the sum over ``group`` of ``x``, this rank's equal chunk of ``dim``
    forward; all-gather of the gradient backward (:class:`_ReduceScatterToSequence`)."""
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return x
    return _ReduceScatterToSequence.apply(x, dim % x.dim(), process_group)


def gather_from_sequence_region(x: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    """Megatron-SP g: every rank's chunk of ``x`` along ``dim`` in rank order forward; the
    sum of the gradients over ``group``, this rank's chunk, backward
    (:class:`_GatherFromSequence`)."""
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return x
    return _GatherFromSequence.apply(x, dim % x.dim(), process_group)


GRAPH_FUNCTIONS = (reduce_scatter_to_sequence_region, gather_from_sequence_region)
"""The graph-callable collectives of this module (kept leaves when a program is traced again)."""

for _fn in GRAPH_FUNCTIONS:
    torch.fx.wrap(_fn.__name__)
