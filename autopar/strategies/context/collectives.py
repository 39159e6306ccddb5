"""Context parallelism's collectives: the sequence split over the ``context`` group.

Every rank of a context group holds the same rows of the batch and a share of their
tokens. With the sequence cut into ``2c`` equal chunks, rank ``r`` of ``c`` holds chunks
``r`` and ``2c−1−r`` (:func:`positions`): under a causal mask the early chunks see few
keys and the late ones many, so each rank gets one of each and the ranks do equal work
(the load balance of Megatron-LM's context parallelism and torchtitan's
``_RoundRobinLoadBalancer``). A sequence that ``2c`` does not divide but ``c`` does is
cut into ``c`` contiguous chunks (not balanced); one ``c`` does not divide is refused at
compile (docs/context.md).

A value split this way is described by ``(dim, inner)``: its dimension ``dim`` holds
``outer × seq × inner`` elements, the sequence factor in the middle (``[batch, seq,
hidden]`` at ``dim=1``; a flattened ``[batch·seq]`` at ``dim=0``; ``inner > 1`` where the
sequence was flattened with what follows it). The collectives here move such values
between the split and the whole sequence, each differentiable so that every rank's
gradients keep one rule (docs/context.md, "Gradients"): summed over the context group,
the gradient of anything equals ``c`` times the single device's, which the gradient
buckets' average over ``data × context`` turns into the data ranks' average.

* :func:`take_tokens`: a value every rank holds whole → this rank's tokens (no
  communication; backward: the gradient of this rank's tokens in place, zeros elsewhere).
* :func:`gather_tokens`: this rank's tokens → the whole sequence in order (all-gather;
  backward: reduce-scatter of the sum).
* :func:`context_sum`: a partial sum over this rank's tokens → the sum over the sequence
  (all-reduce both ways).
* :func:`positions`: the global positions a rank holds.
"""
from __future__ import annotations

import functools

import torch
import torch.fx

from autopar.runtime.collectives import _all_reduce, gather_rows
from autopar.runtime.groups import get_group, rank_in, size_of


@functools.lru_cache(maxsize=256)
def _positions(seq: int, c: int, r: int, balanced: bool) -> tuple[int, ...]:
    if balanced:
        chunk = seq // (2 * c)
        return tuple(range(r * chunk, (r + 1) * chunk)) + tuple(range((2 * c - 1 - r) * chunk, (2 * c - r) * chunk))
    chunk = seq // c
    return tuple(range(r * chunk, (r + 1) * chunk))


def positions(seq: int, c: int, r: int, balanced: bool) -> list[int]:
    """The sequence positions rank ``r`` of ``c`` holds, in its local order: chunks ``r``
    and ``2c−1−r`` of ``2c`` when ``balanced``, else chunk ``r`` of ``c``."""
    return list(_positions(seq, c, r, balanced))


def balanced_split(seq: int, c: int) -> bool:
    """Whether a sequence of ``seq`` tokens is split load-balanced over ``c`` ranks (``2c``
    divides it); raises ``ValueError`` when ``c`` does not divide it at all."""
    if seq % c:
        raise ValueError(f"a sequence of {seq} tokens is not divisible by the context degree {c}; pad the inputs "
                         f"to a multiple of {2 * c} tokens (load-balanced) or choose a context degree dividing {seq}")
    return seq % (2 * c) == 0


def _order(seq: int, c: int, balanced: bool) -> list[int]:
    """Where each position of the ranks' chunks concatenated in rank order goes: the
    permutation that puts a gathered sequence back in order."""
    held = [p for r in range(c) for p in _positions(seq, c, r, balanced)]
    inverse = [0] * seq
    for i, p in enumerate(held):
        inverse[p] = i
    return inverse


def _split_view(x: torch.Tensor, dim: int, inner: int, seq: int) -> torch.Tensor:
    """``x`` with dimension ``dim`` (``outer × seq × inner`` elements, ``seq`` possibly
    this rank's share) as three dimensions ``[outer, seq, inner]``."""
    size = x.shape[dim]
    outer = size // (seq * inner)
    return x.reshape(*x.shape[:dim], outer, seq, inner, *x.shape[dim + 1:])


def take_tokens(x: torch.Tensor, dim: int, inner: int, seq: int, group: str, balanced: bool) -> torch.Tensor:
    """This rank's tokens of ``x``, which holds the whole sequence in dimension ``dim``
    (``outer × seq × inner``; a dimension of size 1 broadcasts and is kept as it is)."""
    pg = get_group(group)
    c = size_of(pg)
    if c == 1 or x.shape[dim] == 1:
        return x
    index = torch.tensor(_positions(seq, c, rank_in(pg), balanced), dtype=torch.long, device=x.device)
    y = _split_view(x, dim, inner, seq).index_select(dim + 1, index)
    return y.reshape(*x.shape[:dim], x.shape[dim] // c, *x.shape[dim + 1:])


def gather_tokens(x: torch.Tensor, dim: int, inner: int, seq: int, group: str, balanced: bool) -> torch.Tensor:
    """The whole sequence of ``x`` (this rank's ``seq/c`` tokens in dimension ``dim``) in
    order on every rank: an all-gather (backward: the ranks' gradients summed, each
    keeping its own tokens'), then the chunks put back in sequence order."""
    pg = get_group(group)
    c = size_of(pg)
    if c == 1:
        return x
    local = seq // c
    y = _split_view(x, dim, inner, local).movedim(dim + 1, 0)      # [seq/c, ..., outer, inner, ...]
    whole = gather_rows(y.contiguous(), group)                      # [seq (rank order), ...]
    index = torch.tensor(_order(seq, c, balanced), dtype=torch.long, device=x.device)
    whole = whole.index_select(0, index).movedim(0, dim + 1)
    return whole.reshape(*x.shape[:dim], x.shape[dim] * c, *x.shape[dim + 1:])


class _ContextSum(torch.autograd.Function):
    """All-reduce (sum) forward and backward: a sum over the sequence from each rank's
    sum over its tokens; in backward the ranks' gradients of the sum are summed (each
    rank's tokens feed every rank's copy of it)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_reduce(grad, ctx.group), None


def context_sum(x: torch.Tensor, group: str) -> torch.Tensor:
    """The sum over the context group of each rank's partial sum ``x`` (:class:`_ContextSum`)."""
    pg = get_group(group)
    if size_of(pg) == 1:
        return x
    return _ContextSum.apply(x, pg)


def context_count(x: torch.Tensor, group: str) -> torch.Tensor:
    """The sum over the context group of a count (no gradient)."""
    return _all_reduce(x.detach(), get_group(group))


torch.fx.wrap("take_tokens")
torch.fx.wrap("gather_tokens")
torch.fx.wrap("context_sum")
torch.fx.wrap("context_count")
