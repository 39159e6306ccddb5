"""Megatron sequence parallelism's collectives (Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models", 2022, §4.2.2 and Figure 5): between the
tensor-parallel regions each rank of the tensor group holds its chunk of the tokens, so
Megatron's g (the row linear's all-reduce) becomes a reduce-scatter, ḡ, and the column
linear's f (identity forward, all-reduce backward) an all-gather whose backward
reduce-scatters, g. A ring all-reduce is a reduce-scatter followed by an all-gather, so
the volume is the one f and g move.

Graph-callable, like :mod:`autopar.runtime.collectives`: tensors, ints and a group name.

What a column linear reads, g's gathered input, autograd keeps for the weight gradient:
the whole ``[tokens, hidden]`` on every rank, which would undo the split's saving. So,
as Megatron-LM does (Korthikanti et al. §4.2.2: "we store the sequence parallel input
and perform an extra all-gather in the backward pass"), :func:`keep_split_inputs` keeps
each rank's chunk instead and gathers it again when backward reads it
(``saved_tensors_hooks``, as ZeRO-3 keeps its gathered parameters,
:mod:`autopar.strategies.data.zero`).
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Optional

import torch
import torch.fx
from torch.distributed import ProcessGroup

from autopar._torch_compat import all_gather_flat, enclosing_saved_tensors_hooks, reduce_scatter_flat
from autopar.runtime.collectives import gather_rows
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
        # not a view made inside the Function: the model may add to it in place (Falcon's
        # residual ``+=``), which autograd forbids on such views
        return out if dim == 0 else out.movedim(0, dim).clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        moved = grad.movedim(ctx.dim, 0).contiguous()
        out = moved.new_empty((moved.shape[0] * size_of(ctx.group), *moved.shape[1:]))
        all_gather_flat(out, moved, group=ctx.group)
        return out.movedim(0, ctx.dim), None, None


class _Held:
    """A gathered input's source: this rank's chunk (tokens first, as gathered) and its
    group; ``full``: the gather made again while backward reads it, dropped once every
    saved view of it was read."""

    __slots__ = ("local", "group", "full", "pending")

    def __init__(self, local: torch.Tensor, group):
        self.local, self.group, self.full, self.pending = local, group, None, 0

    def gathered(self) -> torch.Tensor:
        if self.full is None:
            out = self.local.new_empty((self.local.shape[0] * size_of(self.group), *self.local.shape[1:]))
            all_gather_flat(out, self.local, group=self.group)
            self.full = out
        return self.full


# the storage of each gathered input alive -> (the gathered tensor, weakly; its source)
_GATHERED: dict[int, tuple[weakref.ref, _Held]] = {}


def _remember(out: torch.Tensor, local: torch.Tensor, group) -> None:
    ptr = out.untyped_storage().data_ptr()
    _GATHERED[ptr] = (weakref.ref(out), _Held(local, group))
    weakref.finalize(out, _GATHERED.pop, ptr, None)   # before its storage can be reused


class _Saved:
    """A saved view of a gathered input, kept as its source (:class:`_Held`) and the view's
    geometry; ``note``: free for an observer (a memory benchmark's accounting)."""

    __slots__ = ("held", "shape", "stride", "offset", "note")

    def __init__(self, held: _Held, t: torch.Tensor):
        self.held, self.shape, self.stride, self.offset, self.note = held, tuple(t.shape), t.stride(), \
            t.storage_offset(), None

    def restore(self) -> torch.Tensor:
        held = self.held
        view = held.gathered().as_strided(self.shape, self.stride, self.offset)
        held.pending -= 1
        if held.pending <= 0:
            held.full = None
        return view


def _match(t: torch.Tensor) -> _Saved | None:
    """``t`` kept as its source when it is (a view of) a gathered input alive, else None."""
    entry = _GATHERED.get(t.untyped_storage().data_ptr()) if t.numel() else None
    if entry is None or entry[0]() is None or entry[0]().dtype != t.dtype:
        return None
    entry[1].pending += 1
    return _Saved(entry[1], t)


@contextlib.contextmanager
def keep_split_inputs():
    """While a program runs forward: a gathered input (or a view of it) autograd keeps
    for backward is kept as this rank's chunk and gathered again when backward reads it
    (module docstring); each gather again serves every saved view of one input. Other
    saved tensors go to the hooks active around this context (ZeRO-3's notes of its
    gathered parameters), as if this one were not there."""
    outer = enclosing_saved_tensors_hooks()
    outer_pack, outer_unpack = outer if outer is not None else (None, None)

    def pack(t: torch.Tensor):
        saved = _match(t)
        if saved is not None:
            return saved
        return outer_pack(t) if outer_pack is not None else t

    def unpack(packed):
        if isinstance(packed, _Saved):
            return packed.restore()
        return outer_unpack(packed) if outer_unpack is not None else packed

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


def reduce_scatter_to_sequence_region(x: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    """Megatron-SP ḡ: the sum over ``group`` of ``x``, this rank's equal chunk of ``dim``
    forward; all-gather of the gradient backward (:class:`_ReduceScatterToSequence`)."""
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return x
    return _ReduceScatterToSequence.apply(x, dim % x.dim(), process_group)


def gather_from_sequence_region(x: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    """Megatron-SP g: every rank's chunk of ``x`` along ``dim`` in rank order forward; the
    sum of the gradients over ``group``, this rank's chunk, backward (Korthikanti et al.
    §4.2.2: the entry of a column-parallel linear whose input is split over the tokens;
    each rank's gradient for the gathered input is a partial sum over its columns).
    :func:`autopar.runtime.collectives.gather_rows` along ``dim``; the gathered tensor is
    remembered for :func:`keep_split_inputs`."""
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return x
    dim = dim % x.dim()
    moved = x.movedim(dim, 0).contiguous()
    out = gather_rows(moved, group)
    _remember(out, moved.detach(), process_group)
    return out.movedim(0, dim)


GRAPH_FUNCTIONS = (reduce_scatter_to_sequence_region, gather_from_sequence_region)
"""The graph-callable collectives of this module (kept leaves when a program is traced again)."""

for _fn in GRAPH_FUNCTIONS:
    torch.fx.wrap(_fn.__name__)
