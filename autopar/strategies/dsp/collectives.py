"""Segmented collectives of sub-graph parallelism: D&SP and D&SP-cSub (SUPER §III-B/C, §IV-B/C).

``n`` ranks form ``g`` sub-grids of ``n_g = n / g`` ranks; rank ``(s, p)`` is position
``p`` of sub-grid ``s``. Its *segment* group is the ``g`` ranks at position ``p`` (group
rank = ``s``), its *within* group the ``n_g`` ranks of sub-grid ``s`` (group rank = ``p``).
Every collective here runs on the segment group: one collective per position, all at
once, which is what SUPER §IV-B calls a *segmented* collective.

D&SP: common layers are data parallel over all ``n`` ranks; rank ``(s, p)`` holds batch
chunk ``c = p * g + s`` of ``n`` (:func:`common_batch_chunk`), so gathering the segment's
chunks in ``s`` order gives chunk ``p`` of ``n_g``, the rows position ``p`` of every
sub-grid processes in the branch layers. D&SP-cSub: common layers live on sub-grid 0
only (chunk ``p`` of ``n_g`` on rank ``(0, p)``), the root of each segment.

==========  ==========================  ==================================
join/fork   D&SP                        D&SP-cSub
==========  ==========================  ==================================
split       segmented_all_gather        segmented_broadcast
sum         segmented_reduce_scatter    segmented_reduce
slice       segmented_all_to_all_slice  segmented_scatter
concat      segmented_all_to_all        segmented_gather
==========  ==========================  ==================================

Every function takes the segment group's *name* (:mod:`autopar.runtime.groups`); over a
group of size 1 it is the identity. Batch is dim 0; slices and concatenations are along a
non-batch ``dim`` with per-sub-grid ``widths`` (``widths[s]`` for sub-grid ``s``).

Gloo (torch 2.13) refuses ``all_to_all``, ``all_gather``, ``scatter`` and ``gather`` with
differently shaped tensors ("invalid tensor size at index 1") but accepts
``all_to_all_single`` with uneven split sizes: the all-to-alls exchange flat buffers with
``all_to_all_single``, and scatter/gather pad each flat piece to the largest one.

D&SP-cSub on ranks with ``s != 0``: the input of a broadcast or scatter is a placeholder
with the root's shape (only shape, dtype and device are read; ``torch.empty(()).expand(shape)``
costs no memory); a reduce or gather returns zeros there, whose gradient is ignored (the
root's gradient is broadcast or scattered back). Those ranks must still run ``backward``
through these outputs so that they take part in the backward collectives; an extra
``requires_grad`` anchor makes every cSub result part of the autograd graph on every rank.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.distributed as dist
import torch.fx

from autopar.grid import MeshAxis, RankGrid, subgrid_dims
from autopar.runtime import devices
from autopar.runtime.groups import get_group, rank_in, size_of

ROOT = 0  # the segment rank of sub-grid 0, which holds the common layers in D&SP-cSub


# ---------------------------------------------------------------- rank layout (SUPER §V)


def common_batch_chunk(rank: int, n: int, g: int, topology_aware: bool) -> int:
    """Which of ``n`` equal batch chunks D&SP's common layers give ``rank``: ``p * g + s``."""
    coords = RankGrid(subgrid_dims(n, g, topology_aware)).coordinates(rank)
    return coords[MeshAxis.POSITION] * g + coords[MeshAxis.SUBGRID]


# ---------------------------------------------------------------- communication helpers


def _gather_rows(x: torch.Tensor, group) -> torch.Tensor:
    chunks = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(size_of(group))]
    dist.all_gather(chunks, x.contiguous(), group=group)
    return torch.cat(chunks)


def _reduce_scatter_rows(x: torch.Tensor, group) -> torch.Tensor:
    size = size_of(group)
    if x.shape[0] % size:
        raise ValueError(f"cannot reduce-scatter {x.shape[0]} rows over {size} ranks")
    chunks = [c.contiguous() for c in x.chunk(size)]
    out = torch.empty_like(chunks[0])
    dist.reduce_scatter(out, chunks, group=group)
    return out


def _with_width(shape: Sequence[int], dim: int, width: int, rows: Optional[int] = None) -> list[int]:
    shape = list(shape)
    shape[dim] = width
    if rows is not None:
        shape[0] = rows
    return shape


def _exchange(pieces: list[torch.Tensor], shapes: list[list[int]], group) -> list[torch.Tensor]:
    """Send ``pieces[j]`` to segment rank ``j``; receive a tensor of ``shapes[j]`` from each."""
    send = torch.cat([piece.reshape(-1) for piece in pieces])
    counts = [math.prod(shape) for shape in shapes]
    received = send.new_empty(sum(counts))
    dist.all_to_all_single(received, send, counts, [piece.numel() for piece in pieces], group=group)
    return [flat.view(shape) for flat, shape in zip(received.split(counts), shapes)]


def _rows_to_widths(x: torch.Tensor, dim: int, widths: Sequence[int], group) -> torch.Tensor:
    """``[g*R, .., widths[s], ..]`` on segment rank ``s`` -> ``[R, .., sum(widths), ..]``:
    row chunk ``s`` of every sub-grid's tensor, concatenated along ``dim``."""
    size, s = size_of(group), rank_in(group)
    if x.shape[dim] != widths[s] or x.shape[0] % size:
        raise ValueError(
            f"segment rank {s} expects {size}*R rows and width {widths[s]} on dim {dim}, got {tuple(x.shape)}"
        )
    rows = x.shape[0] // size
    shapes = [_with_width(x.shape, dim, w, rows) for w in widths]
    return torch.cat(_exchange(list(x.chunk(size)), shapes, group), dim)


def _widths_to_rows(x: torch.Tensor, dim: int, widths: Sequence[int], group) -> torch.Tensor:
    """``[R, .., sum(widths), ..]`` -> ``[g*R, .., widths[s], ..]`` on segment rank ``s``:
    the inverse of :func:`_rows_to_widths`."""
    if x.shape[dim] != sum(widths):
        raise ValueError(f"expected width {sum(widths)} on dim {dim}, got {tuple(x.shape)}")
    shape = _with_width(x.shape, dim, widths[rank_in(group)])
    return torch.cat(_exchange(list(x.split(list(widths), dim)), [shape] * size_of(group), group))


def _padded_flat(x: torch.Tensor, length: int) -> torch.Tensor:
    return torch.nn.functional.pad(x.reshape(-1), (0, length - x.numel()))


def _scatter_widths(x: torch.Tensor, dim: int, widths: Sequence[int], group) -> torch.Tensor:
    """Root's ``x`` split along ``dim`` into ``widths``; segment rank ``s`` gets piece ``s``."""
    shapes = [_with_width(x.shape, dim, w) for w in widths]
    longest = max(math.prod(shape) for shape in shapes)
    out = x.new_empty(longest)
    pieces = None
    if rank_in(group) == ROOT:  # gloo scatters equal sizes only: pad every flat piece
        pieces = [_padded_flat(piece, longest) for piece in x.split(list(widths), dim)]
    dist.scatter(out, pieces, group=group, group_src=ROOT)
    shape = shapes[rank_in(group)]
    return out[: math.prod(shape)].view(shape)


def _padded_piece(x: torch.Tensor, dim: int, widths: Sequence[int]) -> tuple[list, torch.Tensor]:
    """Each rank's piece shape (``x``'s with ``widths[s]`` along ``dim``) and ``x`` flat,
    padded to the largest piece (gloo gathers equal sizes only)."""
    shapes = [_with_width(x.shape, dim, w) for w in widths]
    return shapes, _padded_flat(x, max(math.prod(shape) for shape in shapes))


def _unpadded_cat(pieces: list[torch.Tensor], shapes: list, dim: int) -> torch.Tensor:
    return torch.cat([p[: math.prod(shape)].view(shape) for p, shape in zip(pieces, shapes)], dim)


def _gather_widths(x: torch.Tensor, dim: int, widths: Sequence[int], group) -> torch.Tensor:
    """Every segment rank's ``x`` concatenated along ``dim`` on the root; zeros elsewhere."""
    shapes, flat = _padded_piece(x, dim, widths)
    is_root = rank_in(group) == ROOT
    pieces = [torch.empty_like(flat) for _ in shapes] if is_root else None
    dist.gather(flat, pieces, group=group, group_dst=ROOT)
    if not is_root:
        return x.new_zeros(_with_width(x.shape, dim, sum(widths)))
    return _unpadded_cat(pieces, shapes, dim)


def _all_gather_widths(x: torch.Tensor, dim: int, widths: Sequence[int], group) -> torch.Tensor:
    """Every group rank's ``x`` concatenated along ``dim`` in group order, on every rank."""
    shapes, flat = _padded_piece(x, dim, widths)
    pieces = [torch.empty_like(flat) for _ in shapes]
    dist.all_gather(pieces, flat, group=group)
    return _unpadded_cat(pieces, shapes, dim)


def _broadcast(x: torch.Tensor, group) -> torch.Tensor:
    out = x.clone(memory_format=torch.contiguous_format) if rank_in(group) == ROOT else torch.empty(
        x.shape, dtype=x.dtype, device=x.device)
    dist.broadcast(out, group=group, group_src=ROOT)
    return out


def _reduce(x: torch.Tensor, group) -> torch.Tensor:
    out = x.clone(memory_format=torch.contiguous_format)
    dist.reduce(out, group=group, group_dst=ROOT)
    return out if rank_in(group) == ROOT else torch.zeros_like(out)


# ---------------------------------------------------------------- autograd functions


def _call(function, x: torch.Tensor, group: str, *args, anchored: bool = False) -> torch.Tensor:
    """``function.apply`` over the segment group named ``group``; the identity over one rank.

    ``anchored`` (D&SP-cSub) passes an empty tensor that requires grad, so the collective
    is in the autograd graph on every rank, placeholder input or not, and every rank
    joins its backward collective.
    """
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return x
    if anchored:
        anchor = torch.empty(0, device=x.device, requires_grad=torch.is_grad_enabled())
        return function.apply(x, anchor, *args, process_group)
    return function.apply(x, *args, process_group)


# D&SP (SUPER §III-B): common layers data parallel over all n ranks.


class _SegmentedAllGather(torch.autograd.Function):
    """All-gather of batch chunks in forward, reduce-scatter (sum) in backward (SUPER §IV-B)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_rows(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_rows(grad, ctx.group), None


class _SegmentedReduceScatter(torch.autograd.Function):
    """Reduce-scatter (sum) along the batch in forward, all-gather in backward (SUPER §IV-B)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_rows(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_rows(grad, ctx.group), None


class _SegmentedAllToAll(torch.autograd.Function):
    """All-to-all from batch rows to widths in forward, widths to rows in backward (SUPER §IV-C)."""

    @staticmethod
    def forward(ctx, x, dim, widths, group):
        ctx.dim, ctx.widths, ctx.group = dim, widths, group
        return _rows_to_widths(x, dim, widths, group)

    @staticmethod
    def backward(ctx, grad):
        return _widths_to_rows(grad, ctx.dim, ctx.widths, ctx.group), None, None, None


class _SegmentedAllToAllSlice(torch.autograd.Function):
    """All-to-all from widths to batch rows in forward, rows to widths in backward (SUPER §IV-C)."""

    @staticmethod
    def forward(ctx, x, dim, widths, group):
        ctx.dim, ctx.widths, ctx.group = dim, widths, group
        return _widths_to_rows(x, dim, widths, group)

    @staticmethod
    def backward(ctx, grad):
        return _rows_to_widths(grad, ctx.dim, ctx.widths, ctx.group), None, None, None


def segmented_all_gather(x: torch.Tensor, group: str) -> torch.Tensor:
    """D&SP split: all-gather over the segment group in forward (rank ``(s, p)``'s batch
    chunk ``p*g+s`` of ``n`` -> chunk ``p`` of ``n_g``), reduce-scatter (sum) of the
    gradient in backward: a split's gradient is the sum over its branches (SUPER §IV-B, Fig. 9)."""
    return _call(_SegmentedAllGather, x, group)


def segmented_reduce_scatter(x: torch.Tensor, group: str) -> torch.Tensor:
    """D&SP sum join: reduce-scatter (sum over sub-grids) along the batch in forward, segment
    rank ``s`` keeping row chunk ``s``; all-gather of the gradient in backward (SUPER §IV-B)."""
    return _call(_SegmentedReduceScatter, x, group)


def segmented_all_to_all(x: torch.Tensor, dim: int, widths: Sequence[int], group: str) -> torch.Tensor:
    """D&SP concat join: all-to-all in forward, from this sub-grid's branch output for chunk
    ``p`` of ``n_g`` (width ``widths[s]`` on ``dim``) to its row chunk ``s`` with every
    sub-grid's output concatenated on ``dim`` in ``s`` order; the conjugate all-to-all in
    backward (SUPER §IV-C)."""
    return _call(_SegmentedAllToAll, x, group, dim % x.dim(), list(widths))


def segmented_all_to_all_slice(x: torch.Tensor, dim: int, widths: Sequence[int], group: str) -> torch.Tensor:
    """D&SP slice fork: all-to-all in forward, from a common-layer chunk (full width on
    ``dim``) to chunk ``p`` of ``n_g`` cut to sub-grid ``s``'s piece ``widths[s]``; the
    conjugate all-to-all in backward (SUPER §IV-C, Fig. 10)."""
    return _call(_SegmentedAllToAllSlice, x, group, dim % x.dim(), list(widths))


# D&SP-cSub (SUPER §III-C): common layers on sub-grid 0, the root of every segment.


class _SegmentedBroadcast(torch.autograd.Function):
    """Broadcast from sub-grid 0 in forward, reduce (sum) to sub-grid 0 in backward (SUPER §IV-B)."""

    @staticmethod
    def forward(ctx, x, anchor, group):
        ctx.group = group
        return _broadcast(x, group)

    @staticmethod
    def backward(ctx, grad):
        grad = _reduce(grad, ctx.group)
        return (grad if rank_in(ctx.group) == ROOT else None), None, None


class _SegmentedReduce(torch.autograd.Function):
    """Reduce (sum) to sub-grid 0 in forward, broadcast from sub-grid 0 in backward (SUPER §IV-B)."""

    @staticmethod
    def forward(ctx, x, anchor, group):
        ctx.group = group
        return _reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _broadcast(grad, ctx.group), None, None


class _SegmentedScatter(torch.autograd.Function):
    """Scatter of width pieces from sub-grid 0 in forward, gather to it in backward (SUPER §IV-C)."""

    @staticmethod
    def forward(ctx, x, anchor, dim, widths, group):
        ctx.dim, ctx.widths, ctx.group = dim, widths, group
        return _scatter_widths(x, dim, widths, group)

    @staticmethod
    def backward(ctx, grad):
        grad = _gather_widths(grad, ctx.dim, ctx.widths, ctx.group)
        return (grad if rank_in(ctx.group) == ROOT else None), None, None, None, None


class _SegmentedGather(torch.autograd.Function):
    """Gather of width pieces to sub-grid 0 in forward, scatter from it in backward (SUPER §IV-C)."""

    @staticmethod
    def forward(ctx, x, anchor, dim, widths, group):
        ctx.dim, ctx.widths, ctx.group = dim, widths, group
        return _gather_widths(x, dim, widths, group)

    @staticmethod
    def backward(ctx, grad):
        return _scatter_widths(grad, ctx.dim, ctx.widths, ctx.group), None, None, None, None


# Branches over the tensor group of a mixed plan (docs/mixed_plans.md): the fork and join
# values are replicated over the group; each rank runs its own branches on all rows.


class _BranchAllGather(torch.autograd.Function):
    """Each rank's branch outputs concatenated along ``dim`` in group order on every rank
    forward; backward, each rank keeps the gradient of its own columns (the gradient of
    a value replicated over the group is the same on every rank)."""

    @staticmethod
    def forward(ctx, x, dim, widths, group):
        ctx.dim, ctx.widths, ctx.rank = dim, list(widths), rank_in(group)
        return _all_gather_widths(x.contiguous(), dim, widths, group)

    @staticmethod
    def backward(ctx, grad):
        start = sum(ctx.widths[: ctx.rank])
        return grad.narrow(ctx.dim, start, ctx.widths[ctx.rank]).contiguous(), None, None, None


def branch_all_gather(x: torch.Tensor, dim: int, widths: Sequence[int], group: str) -> torch.Tensor:
    """The concat join of branches spread over ``group``: rank ``s`` gives ``widths[s]``
    columns along ``dim``; every rank gets them all, in group order."""
    return _call(_BranchAllGather, x, group, dim, list(widths))


def segmented_broadcast(x: torch.Tensor, group: str) -> torch.Tensor:
    """D&SP-cSub split: broadcast from sub-grid 0 in forward (``x`` elsewhere is a placeholder
    of the root's shape), reduce (sum) of the gradient to sub-grid 0 in backward (no
    gradient for the placeholders) (SUPER §III-C, §IV-B)."""
    return _call(_SegmentedBroadcast, x, group, anchored=True)


def segmented_reduce(x: torch.Tensor, group: str) -> torch.Tensor:
    """D&SP-cSub sum join: reduce (sum) to sub-grid 0 in forward (zeros elsewhere), broadcast
    of sub-grid 0's gradient in backward (SUPER §III-C, §IV-B)."""
    return _call(_SegmentedReduce, x, group, anchored=True)


def segmented_scatter(x: torch.Tensor, dim: int, widths: Sequence[int], group: str) -> torch.Tensor:
    """D&SP-cSub slice fork: scatter of sub-grid 0's ``x`` cut on ``dim`` into ``widths`` in
    forward (``x`` elsewhere is a placeholder of the root's shape), gather of the gradient
    pieces to sub-grid 0 in backward (SUPER §IV-C, Fig. 10)."""
    return _call(_SegmentedScatter, x, group, dim % x.dim(), list(widths), anchored=True)


def segmented_gather(x: torch.Tensor, dim: int, widths: Sequence[int], group: str) -> torch.Tensor:
    """D&SP-cSub concat join: every sub-grid's piece (``widths[s]`` on ``dim``) gathered and
    concatenated on sub-grid 0 in forward (zeros elsewhere), scatter of sub-grid 0's
    gradient in backward (SUPER §IV-C)."""
    return _call(_SegmentedGather, x, group, dim % x.dim(), list(widths), anchored=True)


# D&SP-cSub on ranks off sub-grid 0: inputs of branches that come from the common layers.


class _After(torch.autograd.Function):
    """An empty tensor of a given shape whose autograd graph leads back to ``previous``:
    on the ranks off sub-grid 0, region ``r``'s fork placeholder depends on region
    ``r-1``'s join result, so one ``backward`` from the last join reaches every region's
    backward collectives, last region first, the order sub-grid 0 runs them in."""

    @staticmethod
    def forward(ctx, previous, shape, dtype):
        ctx.shape, ctx.dtype, ctx.device = previous.shape, previous.dtype, previous.device
        return torch.empty(shape, dtype=dtype, device=previous.device)

    @staticmethod
    def backward(ctx, grad):
        return torch.zeros(ctx.shape, dtype=ctx.dtype, device=ctx.device), None, None


def csub_placeholder(shape: Sequence[int], dtype: torch.dtype, after: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The stand-in, on a rank off sub-grid 0, for a common-layer value it receives by
    broadcast or scatter (only its shape and dtype are read); chained ``after`` the
    previous region's join result so that backward visits the regions in order."""
    if after is None or not after.requires_grad:
        return torch.empty(list(shape), dtype=dtype, device=devices.current())
    return _After.apply(after, list(shape), dtype)


_SCALAR_TYPES = {0: float, 1: int, 2: bool}


def segment_share(value, group: str, like: Optional[tuple] = None):
    """Forward-only broadcast from sub-grid 0 over the segment group of a value the branches
    read but do not differentiate (a mask, a scale): sub-grid 0 passes ``value`` and gets it
    back; the others pass ``None`` and ``like`` — ``("tensor", shape, dtype)`` or
    ``("scalar",)`` — and get sub-grid 0's value. Python scalars keep their type."""
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return value
    root = rank_in(process_group) == ROOT
    if root:
        like = ("tensor", list(value.shape), value.dtype) if isinstance(value, torch.Tensor) else ("scalar",)
    if like[0] == "scalar":
        code = (2 if isinstance(value, bool) else 1 if isinstance(value, int) else 0) if root else 0
        buffer = torch.tensor([float(value), code] if root else [0.0, 0.0], dtype=torch.float64,
                              device=devices.current())
        dist.broadcast(buffer, group=process_group, group_src=ROOT)
        return value if root else _SCALAR_TYPES[int(buffer[1])](buffer[0].item())
    _, shape, dtype = like
    wire = torch.uint8 if dtype == torch.bool else dtype  # gloo has no bool reductions; send bytes
    buffer = value.detach().to(wire).contiguous() if root else torch.empty(list(shape), dtype=wire,
                                                                             device=devices.current())
    dist.broadcast(buffer, group=process_group, group_src=ROOT)
    return value if root else buffer.to(dtype)


def segment_gather_rows(value: torch.Tensor, group: str) -> torch.Tensor:
    """Forward-only D&SP counterpart of :func:`segment_share` for a value that carries the
    batch (an attention mask ``[B, 1, T, T]``): the segment's rows gathered like the
    split's (:func:`segmented_all_gather`), with no gradient."""
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return value
    wire = torch.uint8 if value.dtype == torch.bool else value.dtype
    return _gather_rows(value.detach().to(wire), process_group).to(value.dtype)


GRAPH_FUNCTIONS = (
    segmented_all_gather,
    segmented_reduce_scatter,
    segmented_all_to_all,
    segmented_all_to_all_slice,
    segmented_broadcast,
    segmented_reduce,
    segmented_scatter,
    segmented_gather,
    csub_placeholder,
    segment_share,
    segment_gather_rows,
    branch_all_gather,
)
"""The graph-callable segmented collectives (leaves for ``fx.Tracer(autowrap_functions=...)``)."""

for _fn in GRAPH_FUNCTIONS:
    torch.fx.wrap(_fn.__name__)
