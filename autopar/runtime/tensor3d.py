"""AxoNN's 3D tensor-parallel linear layer (Singh et al., Algorithm 1) on a live grid.

The grid, rank layout and cost model are :mod:`autopar.planning.grid3d`. A layer has an
*in* axis, which splits the contraction dimension ``k`` (its input's columns, the weight's
rows), and an *out* axis, which splits ``n`` (the weight's columns, its output's columns);
rows of activations are split over z. A plain layer has in = y, out = x (Algorithm 1 as
printed); the next, "transposed" one in = x, out = y, so it reads the previous output's
layout without any re-layout (axonn end of §III-B).

On rank ``g_{i,j,k}`` (x = i, y = j, z = k), with PyTorch's ``weight[n, k]``:

* forward (Algorithm 1, lines 2-4): ``W = all-gather_z(Ŵ)``, ``Ô = I × Wᵀ``, ``O =
  all-reduce_in(Ô)`` (+ the bias block, once, after the all-reduce);
* backward (lines 11-12): ``∂I = all-reduce_out(∂O × W)``, ``∂Ŵ = reduce-scatter_z(∂Oᵀ × I)``;
  the bias gradient, a sum over rows that z splits, is all-reduced over z.

``Ŵ`` is this rank's flat ``1/Gz`` shard of its weight block (z-sharding for memory,
axonn §III-B); :func:`weight_shard` and :func:`gather_weight` move between the full
weight and the shards.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from autopar.planning.grid3d import Grid3D
from autopar.runtime.groups import size_of

AXES = ("x", "y", "z", "data")


def make_grid_process_groups(grid: Grid3D) -> dict[str, Optional[dist.ProcessGroup]]:
    """Create every group of every axis (all ranks call this, in the same order) and return
    this rank's ``{"x": pg, "y": pg, "z": pg, "data": pg}``; a group of one is ``None``."""
    if dist.get_world_size() != grid.size:
        raise ValueError(f"a {grid.x}x{grid.y}x{grid.z}x{grid.data} grid needs {grid.size} ranks, the world has "
                         f"{dist.get_world_size()}")
    me = dist.get_rank()
    mine: dict[str, Optional[dist.ProcessGroup]] = {axis: None for axis in AXES}
    for axis in AXES:
        for ranks in grid.groups(axis):
            if len(ranks) > 1:
                group = dist.new_group(ranks, sort_ranks=False)
                if me in ranks:
                    mine[axis] = group
    return mine


def _axes(transposed: bool) -> tuple[str, str]:
    """(in axis, out axis) of a layer."""
    return ("x", "y") if transposed else ("y", "x")


def weight_block(weight: torch.Tensor, grid: Grid3D, coords: dict[str, int], transposed: bool) -> torch.Tensor:
    """The block ``W_{j,i}`` of a full ``weight[n, k]`` this rank's (in, out) coordinates own."""
    in_axis, out_axis = _axes(transposed)
    n, k = weight.shape
    g_in, g_out = getattr(grid, in_axis), getattr(grid, out_axis)
    if n % g_out or k % g_in:
        raise ValueError(f"weight [{n}, {k}]: out features {n} must divide by G{out_axis} = {g_out} and in features "
                         f"{k} by G{in_axis} = {g_in}")
    return weight.chunk(g_out, 0)[coords[out_axis]].chunk(g_in, 1)[coords[in_axis]]


def weight_shard(weight: torch.Tensor, grid: Grid3D, coords: dict[str, int], transposed: bool) -> torch.Tensor:
    """``Ŵ``: this rank's flat ``1/Gz`` shard of its weight block."""
    block = weight_block(weight, grid, coords, transposed)
    if block.numel() % grid.z:
        raise ValueError(f"a weight block of {block.numel()} elements does not split into Gz = {grid.z} shards")
    return block.reshape(-1).chunk(grid.z)[coords["z"]].clone()


def bias_block(bias: torch.Tensor, grid: Grid3D, coords: dict[str, int], transposed: bool) -> torch.Tensor:
    _, out_axis = _axes(transposed)
    return bias.chunk(getattr(grid, out_axis))[coords[out_axis]].clone()


def input_block(x: torch.Tensor, grid: Grid3D, coords: dict[str, int], transposed: bool) -> torch.Tensor:
    """``I_{k,j}`` of a full ``x[m, k]``: rows over z, columns over the layer's in axis."""
    in_axis, _ = _axes(transposed)
    return x.chunk(grid.z, 0)[coords["z"]].chunk(getattr(grid, in_axis), -1)[coords[in_axis]].clone()


class _Linear3D(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_hat, bias, block_shape, groups):
        group_in, group_out, group_z = groups
        w = _all_gather_flat(w_hat, group_z).view(block_shape)       # line 2
        out = x @ w.t()                                                # line 3
        if size_of(group_in) > 1:
            dist.all_reduce(out, group=group_in)                      # line 4
        if bias is not None:
            out = out + bias
        ctx.save_for_backward(x, w)  # line 5: cache I and the gathered W
        ctx.groups, ctx.has_bias = groups, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        group_in, group_out, group_z = ctx.groups
        grad = grad.contiguous()
        grad_x = grad @ w                                              # line 11
        if size_of(group_out) > 1:
            dist.all_reduce(grad_x, group=group_out)
        grad_w = grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])  # line 12
        grad_w_hat = _reduce_scatter_flat(grad_w.reshape(-1), group_z)
        grad_b = None
        if ctx.has_bias:
            grad_b = grad.reshape(-1, grad.shape[-1]).sum(0)
            if size_of(group_z) > 1:  # rows are split over z
                dist.all_reduce(grad_b, group=group_z)
        return grad_x, grad_w_hat, grad_b, None, None


def _all_gather_flat(shard: torch.Tensor, group) -> torch.Tensor:
    if size_of(group) == 1:
        return shard
    out = shard.new_empty(shard.numel() * size_of(group))
    dist.all_gather_into_tensor(out, shard.contiguous(), group=group)
    return out


def _reduce_scatter_flat(flat: torch.Tensor, group) -> torch.Tensor:
    if size_of(group) == 1:
        return flat
    out = flat.new_empty(flat.numel() // size_of(group))
    dist.reduce_scatter_tensor(out, flat.contiguous(), group=group)
    return out


def linear_3d(x: torch.Tensor, w_hat: torch.Tensor, bias: Optional[torch.Tensor], block_shape: tuple[int, int],
              groups: dict, *, transposed: bool = False) -> torch.Tensor:
    """Algorithm 1 for ``x`` (this rank's input block) and ``Ŵ``; ``block_shape`` is the
    ``[n/G_out, k/G_in]`` block the z-shards gather into; ``groups`` the rank's axis groups
    (:func:`make_grid_process_groups`)."""
    in_axis, out_axis = _axes(transposed)
    return _Linear3D.apply(x, w_hat, bias, tuple(block_shape), (groups[in_axis], groups[out_axis], groups["z"]))
