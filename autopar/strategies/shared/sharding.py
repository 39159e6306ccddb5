"""Layouts of values over the tensor-parallel group, and how ops carry them.

A value in a rank graph is either replicated over the tensor group (``None``) or
split along one dimension: :class:`Shard` ``(dim, blocks)``. ``blocks > 1`` describes a
fused projection whose output is ``blocks`` logical tensors side by side (Q, K and V),
each split separately, so rank ``r`` holds ``[q_r, k_r, v_r]``.

The rules here answer, for one node and the layouts of its inputs, what layout its
output has and which literal arguments must change (a view's ``12`` heads become
``12 // t``). They are pure: :mod:`autopar.strategies.shared.tensor_rewrite` applies them.

Example: ``view(x, [2, 16, -1, 16])`` with ``x: float32[2, 16, 64]`` split as
``Shard(2)`` over 4 ranks maps to ``Shard(2)`` with the shape unchanged (``-1``), while
``view(y, [-1, 64])`` with ``y: float32[2, 16, 64]`` split as ``Shard(2)`` maps to
``Shard(1)`` and the shape ``[-1, 16]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence


@dataclass(frozen=True)
class Shard:
    """Split along ``dim`` into ``tensor degree`` parts (per block when ``blocks > 1``).

    ``size``: a padded split (the logits of a padded vocabulary, see
    :class:`~autopar.strategies.shared.tensor_rewrite.ParamShard`): ``dim`` is ``size`` long
    in the single-device program, each rank holds ``ceil(size / t)`` of it and the last
    ranks' tails are padding. Only data movement that keeps the dimension whole carries
    such a split (:meth:`~autopar.strategies.shared.propagation.LayoutPropagator.propagate`);
    its gather drops the padding."""

    dim: int
    blocks: int = 1
    size: int | None = None

    def __str__(self) -> str:
        text = f"Shard({self.dim}" + (f", blocks={self.blocks}" if self.blocks != 1 else "")
        return text + (f", padded from {self.size})" if self.size is not None else ")")

    def local_size(self, degree: int) -> int | None:
        """A padded split's length on each rank (None: not padded)."""
        return None if self.size is None else -(-self.size // degree)


Layout = Any  # Shard | None (replicated) | tuple of layouts (multi-output nodes)


def normalize_dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def reshape_groups(in_shape: Sequence[int], out_shape: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pair up runs of input and output dims whose sizes multiply to the same number."""
    groups = []
    i = j = 0
    while i < len(in_shape) or j < len(out_shape):
        gi, gj = [], []
        pi = pj = 1
        while True:
            if pi == pj and gi and gj:
                break
            if (pi <= pj or j >= len(out_shape)) and i < len(in_shape):
                pi *= in_shape[i]
                gi.append(i)
                i += 1
            elif j < len(out_shape):
                pj *= out_shape[j]
                gj.append(j)
                j += 1
            else:
                break
        # absorb trailing size-1 dims into the current group
        while i < len(in_shape) and in_shape[i] == 1 and (j >= len(out_shape) or out_shape[j] != 1):
            gi.append(i)
            i += 1
        while j < len(out_shape) and out_shape[j] == 1 and (i >= len(in_shape) or in_shape[i] != 1):
            gj.append(j)
            j += 1
        groups.append((gi, gj))
    return groups


def map_reshape(in_shape: Sequence[int], out_shape: Sequence[int], shard: Shard, degree: int) -> Shard | None:
    """Where a split dimension lands after a reshape, or None when the split would have
    to cross an output dimension (e.g. splitting the inner factor of a merged dim).

    The split of input dim ``s`` (size ``N = blocks·t·r``) survives when some output dim
    ``o`` of the same group starts at the same flattened offset times ``blocks`` (the
    blocks were peeled off into outer output dims) or at the same offset with room for
    ``blocks·t`` (the blocks stay inside ``o``), and its size is divisible accordingly.

    ``o`` may also start earlier, merging ``outer`` whole input rows in front of ``s``:
    ``[T, B, H·d] -> [T, B·H, d]`` (how ``torch.export`` spells ``nn.MultiheadAttention``'s
    heads). Each of those rows is then a block of its own, so ``Shard(2)`` becomes
    ``Shard(1, blocks=B)``: rank r holds heads ``r·H/t ..`` of every batch element.
    """
    s = shard.dim
    for gi, gj in reshape_groups(in_shape, out_shape):
        if s not in gi:
            continue
        prefix_in = math.prod(in_shape[k] for k in gi if k < s)
        prefix_out = 1
        for o in gj:
            size = out_shape[o]
            if size > 1:
                # (a dim holding only the block index, ``unflatten(-1, [3, E])``'s 3, is
                # not where the split lives, even when a degree of 1 divides it)
                if prefix_out == prefix_in and size % (shard.blocks * degree) == 0 and size > shard.blocks:
                    return Shard(o, shard.blocks)
                if shard.blocks > 1 and prefix_out == prefix_in * shard.blocks and size % degree == 0:
                    return Shard(o, 1)
                outer = prefix_in // prefix_out
                if prefix_in % prefix_out == 0 and outer > 1 and size % outer == 0 \
                        and (size // outer) % (shard.blocks * degree) == 0:
                    return Shard(o, outer * shard.blocks)
            prefix_out *= size
        return None
    return None


def map_permute(perm: Sequence[int], shard: Shard) -> Shard:
    return replace(shard, dim=list(perm).index(shard.dim))


def map_transpose(d0: int, d1: int, ndim: int, shard: Shard) -> Shard:
    d0, d1 = normalize_dim(d0, ndim), normalize_dim(d1, ndim)
    dim = d1 if shard.dim == d0 else d0 if shard.dim == d1 else shard.dim
    return replace(shard, dim=dim)


def broadcast_dim(shard: Shard, out_ndim: int, in_ndim: int) -> int:
    """The output dim an input's dim maps to under right-aligned broadcasting."""
    return shard.dim + (out_ndim - in_ndim)


def operand_dim_for(out_dim: int, out_ndim: int, operand_shape: Sequence[int]) -> int | None:
    """The operand's dim aligned with ``out_dim`` under broadcasting (None if absent)."""
    d = out_dim - (out_ndim - len(operand_shape))
    return d if d >= 0 else None


def scale_literal(value: Any, degree: int, blocks: int = 1) -> Any:
    """A literal size at a split dim, as seen by one rank (``-1`` stays ``-1``)."""
    if isinstance(value, int) and value != -1:
        if value % degree:
            raise ValueError(f"size {value} is not divisible by the tensor degree {degree}")
        return value // degree
    return value
