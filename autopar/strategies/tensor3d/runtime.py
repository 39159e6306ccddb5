"""AxoNN's 3D tensor-parallel linear layer (Singh et al., Algorithm 1) on a live grid,
with the communication overlaps of axonn §IV.

The grid, rank layout and cost model are :mod:`autopar.strategies.shared.grid3d.cost`;
the parameter parts and the overlaps' switches and state, which Bian's cube layer runs
on too, are :mod:`autopar.strategies.shared.grid3d.runtime`. A layer has an
*in* axis, which splits the contraction dimension ``k`` (its input's columns, the weight's
rows), and an *out* axis, which splits ``n`` (the weight's columns, its output's columns);
rows of activations are split over z (and data). A plain layer has in = y, out = x
(Algorithm 1 as printed); a "transposed" one in = x, out = y, so it reads a plain layer's
output layout without any re-layout (axonn end of §III-B).

On rank ``g_{i,j,k}`` (x = i, y = j, z = k), with PyTorch's ``weight[n, k]``:

* forward (Algorithm 1, lines 2-4): ``W = all-gather_z(Ŵ)``, ``Ô = I × Wᵀ``, ``O =
  all-reduce_in(Ô)`` (+ the bias block, once, after the all-reduce);
* backward (lines 11-12): ``∂I = all-reduce_out(∂O × W)``, ``∂Ŵ = reduce-scatter_z(∂Oᵀ × I)``.

The bias gradient (a sum over rows, which z and data split) is left to the runtime's
gradient buckets, which reduce biases and norm parameters over z and data together
(the ``replica`` group), as every other replicated parameter.

Overlap (axonn §IV, each switch of :class:`~autopar.strategies.shared.grid3d.runtime.Overlap`):
the layer takes ``W`` prefetched or cached for recomputation from the current
:class:`~autopar.strategies.shared.grid3d.runtime.Tensor3DRuntime` (§IV-C, §IV-D), issues
the next layer's all-gather ahead (§IV-C), waits for the input-gradient all-reduce of
line 11 only after the weight-gradient matmul of line 12 (§IV-A) and leaves its
weight-gradient reduce-scatter to the end of backward (§IV-B).
"""
from __future__ import annotations

import time
from typing import Optional

import torch
import torch.distributed as dist

from autopar._torch_compat import reduce_scatter_flat
from autopar.grid import MeshAxis
from autopar.runtime.family_runtime import RankRuntime
from autopar.runtime.groups import get_group, size_of
from autopar.strategies.shared.grid3d.runtime import Overlap, Tensor3DRuntime, current_runtime, use_runtime

AXES = (MeshAxis.X, MeshAxis.Y, MeshAxis.Z, MeshAxis.DATA)


# ---------------------------------------------------------------------------- the layer
class _Linear3D(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_hat, w, bias, weight_t, groups, runtime):
        group_in, group_out, group_z = groups
        out = x @ (w if weight_t else w.t())                          # line 3
        if size_of(group_in) > 1:
            start = time.perf_counter()
            dist.all_reduce(out, group=group_in)                      # line 4
            runtime.exposed_s += time.perf_counter() - start
        if bias is not None:
            out = out + bias
        ctx.save_for_backward(x, w)                                    # line 5: cache I and W
        ctx.groups, ctx.has_bias, ctx.weight_t, ctx.runtime = groups, bias is not None, weight_t, runtime
        ctx.w_hat = w_hat
        return out

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        group_in, group_out, group_z = ctx.groups
        overlap = ctx.runtime.overlap
        grad = grad.contiguous()
        grad_x = grad @ (w.t() if ctx.weight_t else w)                # line 11
        work = None
        runtime = ctx.runtime
        start = time.perf_counter()
        if size_of(group_out) > 1:
            work = dist.all_reduce(grad_x, group=group_out, async_op=overlap.all_reduce)
        runtime.exposed_s += time.perf_counter() - start
        rows_grad, rows_x = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        grad_w = rows_x.t() @ rows_grad if ctx.weight_t else rows_grad.t() @ rows_x  # line 12
        if work is not None and overlap.all_reduce:
            start = time.perf_counter()
            work.wait()  # §IV-A: the all-reduce ran under the weight-gradient matmul
            runtime.exposed_s += time.perf_counter() - start
        grad_b = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
        flat = grad_w.reshape(-1)
        if size_of(group_z) == 1:
            return grad_x, flat.view_as(ctx.w_hat), None, grad_b, None, None, None
        shard = flat.new_empty(flat.numel() // size_of(group_z))
        if overlap.reduce_scatter:  # §IV-B: waited on after the whole backward pass
            work = reduce_scatter_flat(shard, flat, group=group_z, async_op=True)
            ctx.runtime.defer(ctx.w_hat, work, shard)
            return grad_x, None, None, grad_b, None, None, None
        start = time.perf_counter()
        reduce_scatter_flat(shard, flat, group=group_z)
        ctx.runtime.exposed_s += time.perf_counter() - start
        return grad_x, shard.view_as(ctx.w_hat), None, grad_b, None, None, None


def linear_3d(x: torch.Tensor, w_hat: torch.Tensor, bias: Optional[torch.Tensor], block: tuple[int, ...],
              in_group: str, out_group: str, weight_t: bool = False, *, prefetch: Optional[torch.Tensor] = None,
              checkpointed: bool = False) -> torch.Tensor:
    """Algorithm 1 for ``x`` (this rank's input block, columns split over ``in_group``)
    and ``Ŵ``; ``block`` is the weight block's shape (``[n/G_out, k/G_in]``, or ``[k/G_in,
    n/G_out]`` when ``weight_t``: GPT-2's ``Conv1D`` stores ``[k, n]``). Groups are looked
    up by name (``"x"``, ``"y"``, and ``"z"`` for the weight shards). Keyword-only, as the
    rank graph's call passes them (the rewrite and the recompute pass set them by name):
    ``prefetch``, the next layer's ``Ŵ``, whose all-gather is issued now (§IV-C), and
    ``checkpointed``, whether the call runs inside a recomputed region (the gathered ``W``
    is then kept for the second forward, §IV-D)."""
    runtime = current_runtime()
    w = runtime.gathered(w_hat, block, checkpointed)                  # line 2
    if prefetch is not None and runtime.overlap.all_gather:
        runtime.prefetch(prefetch)
    groups = (get_group(in_group), get_group(out_group), get_group(MeshAxis.Z))
    return _Linear3D.apply(x, w_hat, w, bias, weight_t, groups, runtime)


torch.fx.wrap("linear_3d")


class Tensor3DRankRuntime(RankRuntime):
    """The 3D layers on a rank (:class:`~autopar.runtime.family_runtime.RankRuntime`):
    their :class:`Tensor3DRuntime` under ``compile``'s ``overlap`` switches and the plan's
    cache bound, current while a program with 3D regions runs; the weights gathered last
    step forgotten before each call, deferred reduce-scatters landed after each backward.
    Active when the plan has 3D regions. A pipeline's stage programs run without it: their
    3D regions are on ``x × y × 1`` grids (no all-gather over z to overlap, cache or
    defer), which the process's default :class:`Tensor3DRuntime` serves."""

    name = "tensor3d"

    def __init__(self, plan, overlap=None):
        self.runtime = Tensor3DRuntime(Overlap.parse(overlap).with_cache_limit(plan.gather_cache))
        self.active = plan.region_grid is not None

    def layout_options(self) -> dict:
        return {"deferred_reduce_scatter": self.runtime.overlap.reduce_scatter}

    def contexts(self, stage: bool) -> list:
        return [] if stage else [use_runtime(self.runtime)]

    def begin(self, stage: bool) -> None:
        if not stage:
            self.runtime.begin()

    def after_backward(self) -> None:
        self.runtime.finish()  # deferred reduce-scatters land before any bucket reads Ŵ.grad

    def attributes(self) -> dict:
        return {"tensor3d_runtime": lambda state: self.runtime, "tensor3d_stats": lambda state: dict(self.runtime.stats)}
