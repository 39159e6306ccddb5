"""Where expert parallelism puts the experts' weights (:mod:`autopar.runtime.layout`).

A routed layer's experts are 3-D weights ``[E, ...]`` (Hugging Face's ``gate_up_proj``
and ``down_proj``), and, when they have biases, 2-D ones ``[E, width]`` (GPT-OSS's
``gate_up_proj_bias`` and ``down_proj_bias``). Under an expert degree ``P`` rank ``e`` of
an expert group (``P`` consecutive data ranks) holds experts ``[e·E/P, (e+1)·E/P)``:
:class:`ExpertShard` cuts dimension 0 over the ``experts`` group, and with tensor
parallelism inside the experts also the inner width over ``tensor`` (the gated
projection per block: gate and up halves, as Megatron's column split, or one
contiguous cut when gate and up columns alternate; its bias alike; the down
projection's input width, as its row split, its bias whole on every tensor rank).
``gather`` all-gathers the tensor parts, then the expert groups' (what
``full_state_dict`` and checkpoints see); the norm sums over both groups.

:func:`place` sends the experts' gradients to the ``expert_replica`` group (the ``d/P``
ranks holding the same experts) divided by the data degree ``d``: every rank's expert
gradient already sums its expert group's tokens (the all-to-all's backward), so the sum
over the replicas, over ``d``, is the gradient of the global batch's mean loss.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from autopar.grid import MeshAxis
from autopar.runtime.shards import gather_full, local_shard
from autopar.strategies.shared.tensor_rewrite import ParamShard


_EXPERTS = ParamShard(0, 1, MeshAxis.EXPERTS)   # the experts' dimension over the expert group


def _replica_bucket(bucket, data: int):
    """``bucket`` reduced over the ranks holding the same experts, over the data degree."""
    return dataclasses.replace(bucket, group=MeshAxis.EXPERT_REPLICA, divisor=data)


@dataclass(frozen=True)
class ExpertShard:
    """The experts' dimension 0 cut over ``experts``; ``inner``: the dimension of the
    experts' inner width cut over ``tensor`` (``blocks`` of it: 2 for a gated
    projection's gate and up), None when the experts are not tensor-split."""

    inner: int | None = None
    blocks: int = 1

    def __str__(self) -> str:
        inner = f", dim {self.inner} over tensor" + (f" in {self.blocks} blocks" if self.blocks > 1 else "") \
            if self.inner is not None else ""
        return f"ExpertShard(dim 0 over experts{inner})"

    def _tensor(self) -> ParamShard | None:
        return None if self.inner is None else ParamShard(self.inner, self.blocks, MeshAxis.TENSOR)

    def local(self, full: torch.Tensor, seat) -> torch.Tensor:
        """This rank's experts (and its tensor part of each)."""
        part = local_shard(full, _EXPERTS, seat.size(MeshAxis.EXPERTS), seat.coords.get(MeshAxis.EXPERTS, 0))
        tensor = self._tensor()
        if tensor is not None and seat.size(MeshAxis.TENSOR) > 1:
            part = local_shard(part, tensor, seat.size(MeshAxis.TENSOR), seat.coords.get(MeshAxis.TENSOR, 0))
        return part

    def gather(self, local: torch.Tensor, seat, full_shape) -> torch.Tensor:
        """Every expert, whole: the tensor parts all-gathered, then the expert groups' (collectives)."""
        tensor = self._tensor()
        if tensor is not None and seat.size(MeshAxis.TENSOR) > 1:
            local = gather_full(local, tensor, seat.size(MeshAxis.TENSOR))
        return gather_full(local, _EXPERTS, seat.size(MeshAxis.EXPERTS))

    def norm_groups(self) -> tuple[str, ...]:
        return (MeshAxis.EXPERTS,) + ((MeshAxis.TENSOR,) if self.inner is not None else ())


def place(builder, weights: list[str]) -> None:
    """The experts' weights (layout names) reduced over ``expert_replica``, over the data degree."""
    data = builder.plan.degree(MeshAxis.DATA)
    for name in weights:
        p = builder.placement(name)
        if p.bucket is not None:
            builder.update(name, bucket=_replica_bucket(p.bucket, data))


def place_modules(builder, modules: list[str], degree: int) -> None:
    """A layer of separate expert modules (``modules``: their paths in the captured
    wrapper, in expert order): expert ``e``'s parameters are held by the rank at place
    ``e // (E/P)`` of each expert group (its home there: ``full_state_dict`` broadcasts
    them from it), reduced over ``expert_replica`` over the data degree, their norm
    summed over the expert group."""
    data, place = builder.plan.degree(MeshAxis.DATA), builder.seat.coords.get(MeshAxis.EXPERTS, 0)
    per_rank = len(modules) // degree
    prefixes = [(builder.module_name(path) + ".", e // per_rank) for e, path in enumerate(modules)]
    for name in builder.names():
        owner = next((o for prefix, o in prefixes if name.startswith(prefix)), None)
        if owner is None:
            continue
        p = builder.placement(name)
        held = p.held and owner == place
        bucket = _replica_bucket(p.bucket, data) if p.bucket is not None and held else None
        builder.update(name, held=held, home=p.home + ((MeshAxis.EXPERTS, owner),), bucket=bucket,
                       norm_groups=tuple(sorted({*p.norm_groups, MeshAxis.EXPERTS})))


__all__ = ["ExpertShard", "place", "place_modules"]
