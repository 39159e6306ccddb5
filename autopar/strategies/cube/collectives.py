"""Bian et al.'s load-balanced 3D linear layer on a ``p × p × p`` cube (bian §3.1).

Bian's processor ``(i, j, l)`` maps onto autopar's grid (:mod:`autopar.strategies.shared.grid3d.cost`)
as ``i → z``, ``j → x``, ``l → y`` for a plain layer (in axis y, out axis x), and with x
and y exchanged for a transposed one, so one rank program serves both 3D forms and the
cube is the grid ``Gx = Gy = Gz = p`` (times any data degree). With ``A = [M × N]`` the
input, ``B = [N × K]`` the weight and ``C = AB``, rank ``(x, y, z)`` of a plain layer holds

* ``A_ijl``: rows block ``(z, x)`` (z major) of ``M/p²`` rows, columns block ``y`` of ``N/p``;
* ``B_lji``: the weight block (in block ``y``, out block ``x``), sharded over z: Bian cuts
  the out columns into ``K/p²``; autopar keeps the flat ``1/Gz`` shard ``Ŵ`` of the
  block as AxoNN does (for ``nn.Linear``'s ``[out, in]`` storage that *is* an out
  sub-block; for GPT-2's ``[in, out]`` it is an in sub-block: the same volume);
* ``C_ilj``: rows block ``(z, y)`` of ``M/p²``, columns block ``x`` of ``K/p``: the rows
  split over the in axis instead of the out axis, which is the input layout of the
  transposed layer that follows ("exchange the input and output directions", §3.2).

Nothing is replicated: activations, weights and (diagonally) biases each hold ``1/p³``
(per data replica) on every rank, the balanced storage of §3.1.1.

Forward (Algorithm 1 for GPT-2's ``[in, out]`` weights, Algorithm 3, ``C = ABᵀ``, for
``nn.Linear``'s ``[out, in]``): all-gather A's rows over the out axis, ``W =
all-gather_z(Ŵ)``, local matmul, reduce-scatter the rows over the in axis. Backward
(Algorithms 2 and 4): all-gather ``Ċ``'s rows over the in axis; ``Ȧ = Ċ W``
reduce-scattered over the out axis; ``Ḃ = AᵀĊ`` (the ``AᵀB`` form of Algorithm 5) from
A's rows gathered again over the out axis (Bian's "in y, z, x": A is not kept gathered,
so activation memory stays balanced), reduce-scattered over z.

Vectors (a layer's bias, Algorithms 7-8) are stored diagonally: only ranks whose in and
out coordinates are equal (Bian's ``j = l``) hold a ``K/p²`` piece; the others hold an
empty tensor. Forward: broadcast the piece over the in axis from that rank, all-gather
over z, add to every row. Backward: the rows' sum reduce-scattered over z and reduced
over the in axis onto the holder. (Algorithm 8 as printed reduce-scatters over x only
when ``j = l``; the rows of ``C`` are also split over the in axis, whose partial sums the
reduce adds: without it the gradient would miss ``p − 1`` of every ``p`` row blocks.)

The AxoNN overlaps (:class:`~autopar.strategies.shared.grid3d.runtime.Overlap`) apply unchanged: the
weight all-gather prefetched and cached, the z reduce-scatter of ``Ḃ`` deferred, and the
input-gradient reduce-scatter (the cube's counterpart of §IV-A's all-reduce) issued
asynchronously under the weight-gradient matmul.
"""
from __future__ import annotations

import time
from typing import Optional

import torch
import torch.distributed as dist

from autopar._torch_compat import all_gather_flat, reduce_scatter_flat
from autopar.grid import MeshAxis
from autopar.runtime.groups import get_group, rank_in, size_of
from autopar.strategies.shared.grid3d.runtime import current_runtime, diagonal_block


# ---------------------------------------------------------------------------- row collectives
def _gather_rows(x: torch.Tensor, group, async_op: bool = False):
    """All-gather along dim 0 (row blocks in group order); ``(tensor, work)``."""
    n = size_of(group)
    if n == 1:
        return x, None
    x = x.contiguous()
    out = x.new_empty((x.shape[0] * n, *x.shape[1:]))
    work = all_gather_flat(out, x, group=group, async_op=async_op)
    return out, work


def _reduce_scatter_rows(x: torch.Tensor, group, async_op: bool = False):
    """Sum over ``group`` and keep this rank's block of rows (dim 0); ``(tensor, work)``."""
    n = size_of(group)
    if n == 1:
        return x, None
    if x.shape[0] % n:
        raise ValueError(f"a cube layer's {x.shape[0]} rows do not split over the {n} ranks of its group")
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // n, *x.shape[1:]))
    work = reduce_scatter_flat(out, x, group=group, async_op=async_op)
    return out, work


def _timed(runtime, work) -> None:
    if work is not None:
        start = time.perf_counter()
        work.wait()
        runtime.exposed_s += time.perf_counter() - start


# ---------------------------------------------------------------------------- the layer
class _LinearCube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_hat, w, weight_t, groups, runtime):
        group_in, group_out, group_z = groups
        start = time.perf_counter()
        a, _ = _gather_rows(x, group_out)                                   # line 1: A_il
        runtime.exposed_s += time.perf_counter() - start
        partial = a @ (w if weight_t else w.t())                            # line 3: A_il B_lj
        start = time.perf_counter()
        out, _ = _reduce_scatter_rows(partial, group_in)                    # line 4: C_ilj
        runtime.exposed_s += time.perf_counter() - start
        ctx.save_for_backward(x, w)  # A's own block, not A_il: gathered again in backward
        ctx.groups, ctx.weight_t, ctx.runtime, ctx.w_hat = groups, weight_t, runtime, w_hat
        return out

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        group_in, group_out, group_z = ctx.groups
        runtime = ctx.runtime
        overlap = runtime.overlap
        # A_il again, under the input-gradient matmul
        a_work_start = time.perf_counter()
        a, a_work = _gather_rows(x, group_out, async_op=True)
        grad_c, _ = _gather_rows(grad, group_in)                            # Ċ_ij ("in z")
        runtime.exposed_s += time.perf_counter() - a_work_start
        grad_a = grad_c @ (w.t() if ctx.weight_t else w)                    # Algorithm 2 line 1
        start = time.perf_counter()
        grad_x, rs_work = _reduce_scatter_rows(grad_a, group_out, async_op=overlap.all_reduce)
        runtime.exposed_s += time.perf_counter() - start
        _timed(runtime, a_work)
        rows_c, rows_a = grad_c.reshape(-1, grad_c.shape[-1]), a.reshape(-1, a.shape[-1])
        grad_w = rows_a.t() @ rows_c if ctx.weight_t else rows_c.t() @ rows_a   # line 2 (the AᵀB form)
        _timed(runtime, rs_work)  # the input-gradient reduce-scatter ran under that matmul
        flat = grad_w.reshape(-1)
        if size_of(group_z) == 1:
            return grad_x, flat.view_as(ctx.w_hat), None, None, None, None
        shard = flat.new_empty(flat.numel() // size_of(group_z))
        if overlap.reduce_scatter:  # axonn §IV-B: waited on after the whole backward pass
            runtime.defer(ctx.w_hat, reduce_scatter_flat(shard, flat, group=group_z, async_op=True), shard)
            return grad_x, None, None, None, None, None
        start = time.perf_counter()
        reduce_scatter_flat(shard, flat, group=group_z)
        runtime.exposed_s += time.perf_counter() - start
        return grad_x, shard.view_as(ctx.w_hat), None, None, None, None


def linear_cube(x: torch.Tensor, w_hat: torch.Tensor, bias: Optional[torch.Tensor], block: tuple[int, ...],
                in_group: str, out_group: str, weight_t: bool = False, *, prefetch: Optional[torch.Tensor] = None,
                checkpointed: bool = False) -> torch.Tensor:
    """Bian's Algorithm 1/3 for ``x`` (this rank's ``A_ijl``: rows split over ``out_group``
    within the z block, columns over ``in_group``) and ``Ŵ``; returns ``C_ilj`` (rows split
    over ``in_group``, columns over ``out_group``) plus ``bias``, the out block that
    :func:`cube_vector` assembled. Arguments as :func:`~autopar.strategies.tensor3d.runtime.linear_3d`
    (``prefetch``: the next layer's ``Ŵ``, whose all-gather is issued now)."""
    runtime = current_runtime()
    w = runtime.gathered(w_hat, block, checkpointed)                        # line 2: B_lj
    if prefetch is not None and runtime.overlap.all_gather:
        runtime.prefetch(prefetch)
    groups = (get_group(in_group), get_group(out_group), get_group(MeshAxis.Z))
    out = _LinearCube.apply(x, w_hat, w, weight_t, groups, runtime)
    return out if bias is None else out + bias                              # Algorithm 7 line 3


# ---------------------------------------------------------------------------- vectors
class _CubeVector(torch.autograd.Function):
    @staticmethod
    def forward(ctx, b_hat, length, group_in, group_out, group_z):
        holder = rank_in(group_out)  # the in-axis rank whose in coordinate is my out coordinate
        ctx.groups, ctx.holder, ctx.mine = (group_in, group_z), holder, rank_in(group_in) == holder
        return diagonal_block(b_hat.detach(), length, group_in, group_out, group_z)  # Algorithm 7 lines 1-2

    @staticmethod
    def backward(ctx, grad):
        group_in, group_z = ctx.groups
        grad = grad.contiguous()
        piece, _ = _reduce_scatter_rows(grad, group_z)                      # Algorithm 8, over z
        if size_of(group_in) > 1:
            piece = piece.clone()
            dist.reduce(piece, group=group_in, group_dst=ctx.holder)        # and onto the diagonal
        return (piece if ctx.mine else grad.new_empty(0)), None, None, None, None


def cube_vector(b_hat: torch.Tensor, length: int, in_group: str, out_group: str) -> torch.Tensor:
    """The out block (``length`` = ``K/p`` elements) of a diagonally stored vector, from
    this rank's piece ``b_hat`` (``K/p²`` elements on the diagonal ranks, empty elsewhere):
    Algorithm 7 lines 1-2 (backward: Algorithm 8)."""
    return _CubeVector.apply(b_hat, length, get_group(in_group), get_group(out_group), get_group(MeshAxis.Z))


torch.fx.wrap("linear_cube")
torch.fx.wrap("cube_vector")
