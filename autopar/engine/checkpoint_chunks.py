"""The pieces of a full tensor a rank holds, as DCP chunks (:mod:`autopar.engine.checkpoint`).

A parameter's cut (Megatron's blocks, the 3D grid's block and flat z piece, Bian's
diagonal vectors) is applied to ``arange(numel).view(full_shape)``; the global indices
this rank holds are covered by N-D boxes of the full tensor, found from the set of
indices alone (runs along the last dimension, merged dimension by dimension where they
line up), so ranks that hold the same elements describe them with the same boxes. A box
is a strided view of the local tensor when its elements lie at regular steps there
(always, for autopar's layouts); otherwise it is copied out for saving and scattered
back after loading. :class:`ChunkedTensor` hands the chunks to DCP.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch


# ---------------------------------------------------------------------------- boxes of a full tensor
def boxes_of(indices: torch.Tensor, shape: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``(offsets, sizes)`` of the N-D boxes of a tensor of ``shape`` that together hold
    exactly the flat ``indices`` (sorted, distinct), in offset order. The same set of
    indices gives the same boxes, whatever rank or layout it comes from.

    >>> boxes_of(torch.tensor([2, 3, 6, 7, 9]), (3, 4))
    [((0, 2), (2, 2)), ((2, 1), (1, 1))]
    """
    if not shape:
        return [((), ())] if indices.numel() else []
    if indices.numel() == 0:
        return []
    last = shape[-1]
    starts_new = torch.ones(indices.numel(), dtype=torch.bool, device=indices.device)
    starts_new[1:] = (indices[1:] != indices[:-1] + 1) | (indices[1:] % last == 0)
    starts = starts_new.nonzero().flatten()
    lengths = torch.diff(starts, append=torch.tensor([indices.numel()], device=indices.device)).tolist()
    coords, rest = [], indices[starts]
    for size in reversed(shape):
        coords.append(rest % size)
        rest = rest // size
    offsets = torch.stack(coords[::-1], 1).tolist()
    ones = (1,) * (len(shape) - 1)
    boxes = [(tuple(o), ones + (n,)) for o, n in zip(offsets, lengths)]
    for dim in range(len(shape) - 2, -1, -1):
        boxes = _merge_along(boxes, dim)
    return sorted(boxes)


def _merge_along(boxes, dim: int):
    """Join boxes that differ only in their offset along ``dim`` (each of size 1 there)
    and follow each other."""
    lines: dict[tuple, list[int]] = defaultdict(list)
    for offsets, sizes in boxes:
        lines[(offsets[:dim] + offsets[dim + 1:], sizes)].append(offsets[dim])
    out = []
    for (rest, sizes), starts in lines.items():
        starts.sort()
        first = previous = starts[0]
        for start in starts[1:] + [None]:
            if start is not None and start == previous + 1:
                previous = start
                continue
            out.append((rest[:dim] + (first,) + rest[dim:], sizes[:dim] + (previous - first + 1,) + sizes[dim + 1:]))
            first = previous = start
    return out


# ---------------------------------------------------------------------------- a local tensor's chunks
@dataclass
class Chunk:
    """One box of the full tensor held by this rank: ``data`` is a view of the local
    tensor, or a copy with ``scatter`` the storage offsets its elements come from."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    data: torch.Tensor
    scatter: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class Placement:
    """Where one box of the full tensor lies in a local tensor's storage, counted from the
    tensor's storage offset: a strided view (``start``, ``strides``), or, where no view
    fits, the offsets of its elements in row-major order (``memory``)."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    start: int
    strides: Optional[tuple[int, ...]]
    memory: Optional[torch.Tensor] = None


def placements(shape, strides, full_shape: tuple[int, ...], cut: Callable) -> list[Placement]:
    """The boxes held by a local tensor of ``shape`` and ``strides`` that is ``cut(full)``
    for a full tensor of ``full_shape``: the cut applied to ``arange(numel)`` says which
    element of the full tensor each local element is (``-1``: padding, saved nowhere).

    The transient memory is one full tensor's worth of int32 indices (int64 from 2**31
    elements), for the ``arange`` the cut reads; the rest is the local tensor's size: its
    elements' full indices, sorted, and their storage offsets in that order."""
    numel = _numel(full_shape)
    dtype = torch.int32 if numel < 2 ** 31 else torch.long
    index = cut(torch.arange(numel, dtype=dtype, device="cpu").view(full_shape))
    if tuple(index.shape) != tuple(shape):
        raise RuntimeError(f"the cut of a {list(full_shape)} tensor gives {list(index.shape)}, the local tensor is "
                           f"{list(shape)}; this is a bug")
    index, offsets = index.reshape(-1), _element_offsets(shape, strides)
    real = index >= 0  # a padded cut (a padded vocabulary) fills its padding with -1: no element of the full tensor
    index, offsets = index[real], offsets[real]
    order = torch.argsort(index)
    held, memory = index[order].long(), offsets[order]  # full index -> local storage offset, by full index
    del index, offsets, order
    if held.numel() > 1 and bool((held[1:] == held[:-1]).any()):
        raise RuntimeError(f"a local part of a {list(full_shape)} tensor holds an element twice; this is a bug")
    full_strides = _contiguous_strides(full_shape)
    return [_placement(offsets, sizes, memory[torch.searchsorted(held, _box_indices(offsets, sizes, full_strides))]
                       .view(sizes))
            for offsets, sizes in boxes_of(held, tuple(full_shape))]


def _placement(offsets, sizes, memory: torch.Tensor) -> Placement:
    """A view when ``memory`` (the box's elements' storage offsets) is affine in the box's
    coordinates with non-negative steps, else the offsets themselves."""
    start = int(memory.reshape(-1)[0])
    steps = []
    for d, size in enumerate(sizes):
        unit = [0] * len(sizes)
        unit[d] = 1
        steps.append(int(memory[tuple(unit)]) - start if size > 1 else 1)
    if all(step >= 0 for step in steps) and torch.equal(_element_offsets(sizes, steps) + start, memory.reshape(-1)):
        return Placement(tuple(offsets), tuple(sizes), start, tuple(steps))
    return Placement(tuple(offsets), tuple(sizes), start, None, memory.reshape(-1))


def local_chunks(local: torch.Tensor, full_shape: tuple[int, ...], cut: Optional[Callable] = None,
                 cache: Optional[dict] = None, key: Any = None) -> list[Chunk]:
    """The chunks of ``local``, which is ``cut(full)`` for a full tensor of ``full_shape``
    (``cut`` None: ``local`` is the whole tensor). ``cache``: placements by ``key`` (the
    cut's identity) and layout, shared by tensors cut alike (a parameter and its
    optimizer state)."""
    local = local.detach()
    if cut is None:
        if tuple(local.shape) != tuple(full_shape):
            raise RuntimeError(f"a whole tensor of shape {list(local.shape)} stands for {list(full_shape)}; "
                               f"this is a bug")
        return [Chunk((0,) * len(full_shape), tuple(full_shape), local)]
    if local.numel() == 0:
        return []
    layout = (key, tuple(full_shape), tuple(local.shape), local.stride())
    found = cache.get(layout) if cache is not None and key is not None else None
    if found is None:
        found = placements(local.shape, local.stride(), full_shape, cut)
        if cache is not None and key is not None:
            cache[layout] = found
    base = local.storage_offset()
    return [Chunk(p.offsets, p.sizes, local.as_strided(p.sizes, p.strides, base + p.start)) if p.strides is not None
            else Chunk(p.offsets, p.sizes, _storage(local)[p.memory + base].view(p.sizes), p.memory + base)
            for p in found]


def _box_indices(offsets, sizes, strides) -> torch.Tensor:
    """The flat indices of a box's elements in a full tensor of ``strides``, row-major."""
    return _element_offsets(sizes, strides) + sum(o * s for o, s in zip(offsets, strides))


def _element_offsets(shape, strides) -> torch.Tensor:
    """``sum(i_d · strides[d])`` for every index of ``shape``, row-major, flat."""
    offsets = torch.zeros((), dtype=torch.long, device="cpu")
    for d, (size, stride) in enumerate(zip(shape, strides)):
        view = [1] * len(shape)
        view[d] = size
        offsets = offsets + (torch.arange(size, device="cpu") * stride).view(view)
    return offsets.expand(tuple(shape)).reshape(-1)


def _numel(shape) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def _storage(t: torch.Tensor) -> torch.Tensor:
    """All of ``t``'s storage as a flat tensor of its dtype."""
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)


def _contiguous_strides(shape) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def scatter_back(chunks: list[Chunk], local: torch.Tensor) -> None:
    """Write the chunks that are copies into ``local`` (views already are there)."""
    for chunk in chunks:
        if chunk.scatter is not None:
            _storage(local.detach())[chunk.scatter] = chunk.data.reshape(-1).to(local.dtype)


class ChunkedTensor(torch.Tensor):
    """What DCP sees of a tensor: its full shape and dtype, and this rank's chunks through
    DCP's checkpointable hooks (``__create_write_items__`` to save, ``__create_chunk_list__``
    and ``__get_tensor_shard__`` to load), as ``DTensor`` and torch's ``LocalShardsWrapper``
    do. It holds no data of its own: any operation on it is an error."""

    @staticmethod
    def __new__(cls, full_shape, dtype: torch.dtype, device, chunks: list[Chunk]):
        # torch's constructor of data-less tensor subclasses (DTensor's too)
        self = torch.Tensor._make_wrapper_subclass(cls, torch.Size(full_shape), dtype=dtype, device=device)
        self.chunks = chunks
        return self

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"{func}: an autopar ChunkedTensor only hands its chunks to "
                                  f"torch.distributed.checkpoint")

    def __repr__(self) -> str:
        return f"ChunkedTensor({list(self.shape)}, {self.dtype}, chunks={[(c.offsets, c.sizes) for c in self.chunks]})"

    def __create_write_items__(self, fqn: str, obj: Any) -> list:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
        return [WriteItem(index=MetadataIndex(fqn, c.offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(
                              chunk=ChunkStorageMetadata(offsets=torch.Size(c.offsets), sizes=torch.Size(c.sizes)),
                              properties=TensorProperties.create_from_tensor(c.data), size=self.shape))
                for c in self.chunks]

    def __create_chunk_list__(self) -> list:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
        return [ChunkStorageMetadata(offsets=torch.Size(c.offsets), sizes=torch.Size(c.sizes)) for c in self.chunks]

    def __get_tensor_shard__(self, index) -> torch.Tensor:
        hint = index.index
        if hint is not None and hint < len(self.chunks) and torch.Size(self.chunks[hint].offsets) == index.offset:
            return self.chunks[hint].data
        for chunk in self.chunks:
            if torch.Size(chunk.offsets) == index.offset:
                return chunk.data
        raise ValueError(f"{index.fqn}: this rank holds no chunk at offset {list(index.offset)}")
