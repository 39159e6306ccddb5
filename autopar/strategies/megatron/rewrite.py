"""Rewrite pass: Megatron tensor parallelism on one rank's graph (megatron §2.3).

:func:`tensor_parallel_pass` splits the regions the plan gives Megatron with
:class:`MegatronRewriter`: the tensor-parallel rewriter the 3D layers and the cube build
on too (:class:`autopar.strategies.shared.tensor_rewrite.TensorRewriter`: the column and
row linears with f and g, vocabulary-parallel embeddings, LM head and cross-entropy,
padded vocabularies, the layouts carried through every other node), with Megatron-SP's
collectives (:mod:`.collectives`, Korthikanti et al. §4.2.2) where the plan runs the
values between the regions split over the tokens
(:mod:`autopar.strategies.shared.sequence_split`).

The pass records ``gm.meta[PARAM_SHARDS]``: parameter name →
:class:`~autopar.strategies.shared.tensor_rewrite.ParamShard`, from which the runtime
cuts each rank's shard out of the user's full weights.
"""
from __future__ import annotations

import torch.fx as fx

from autopar.grid import MeshAxis
from autopar.ir import PARAM_SHARDS
from autopar.strategies.megatron.collectives import gather_from_sequence_region, reduce_scatter_to_sequence_region
from autopar.strategies.shared.tensor_rewrite import ParamShard, TensorRewriter


class MegatronRewriter(TensorRewriter):
    """The tensor rewriter with Megatron-SP's collectives (:mod:`.collectives`): g, the
    all-gather of the tokens before a column linear, and ḡ, the row linear's
    reduce-scatter."""

    SEQUENCE_GATHER = staticmethod(gather_from_sequence_region)
    SEQUENCE_REDUCE_SCATTER = staticmethod(reduce_scatter_to_sequence_region)


def tensor_parallel_pass(gm: fx.GraphModule, *, megatron_regions: list[str], degree: int, rank: int,
                         group: str = MeshAxis.TENSOR, sequence_parallel: bool = False) -> fx.GraphModule:
    """Rewrite ``gm`` into tensor-parallel rank ``rank`` of ``degree`` (see module docstring).

    ``megatron_regions`` are the ids of the regions the plan splits. With ``degree == 1``
    the graph is returned unchanged (and no parameter is split). ``sequence_parallel``:
    the values between the regions run split over the sequence (Megatron-SP,
    :meth:`~autopar.strategies.shared.tensor_rewrite.TensorRewriter._rewrite_row`).
    """
    gm.meta.setdefault(PARAM_SHARDS, {})  # a mixed plan's other split passes record theirs too
    if degree == 1 or not megatron_regions:
        return gm
    rewriter = MegatronRewriter(gm, set(megatron_regions), degree, rank, group, sequence_parallel)
    gm.meta[PARAM_SHARDS].update(rewriter.shards)
    rewriter.run()
    gm.graph.lint()
    gm.recompile()
    return gm


def planned_param_shards(gm: fx.GraphModule, *, megatron_regions: list[str], degree: int,
                         group: str = MeshAxis.TENSOR) -> dict[str, ParamShard]:
    """The parameter splits :func:`tensor_parallel_pass` makes on any capture of this
    model (they depend on the regions, not on shapes or the rank), without touching
    ``gm``: the runtime cuts shards with them before any rank program exists."""
    if degree == 1 or not megatron_regions:
        return {}
    return dict(MegatronRewriter(gm, set(megatron_regions), degree, 0, group).shards)
