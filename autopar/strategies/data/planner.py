"""Planning pure data parallelism: ``data = world``, every region replicated.

This family is Megatron's ``data × tensor`` at ``tensor = 1``
(:class:`autopar.strategies.shared.mesh.DataTensor`): the same pricing — compute
over ``world`` batch shards plus the exposed gradient all-reduce (axonn eq 3), memory
16 bytes per parameter plus the activations — offered as its own family so that
``Plan.why_not("data")`` and a forced ``"data"`` name it. It is infeasible only when the
world does not divide the batch or the model does not fit one device's memory.
Batch norms that normalise over the batch are exact here: the data pass synchronises
them over the data ranks (:mod:`autopar.strategies.shared.batch_norms`).
"""
from __future__ import annotations

from autopar.planning.model import ModelFacts
from autopar.planning.plan import Plan
from autopar.strategies.data.rewrite import data_parallel_pass
from autopar.strategies.data.zero import zero_pass
from autopar.strategies.data.zero_runtime import ZeroRuntime
from autopar.strategies.family import DATA, ZERO, RankBuild, RankPass
from autopar.strategies.shared.mesh import DataTensor


class DataParallel(DataTensor):
    """Pure data parallelism: the ``tensor = 1`` configuration of ``data × tensor``."""

    name = "data"

    def offers(self, tensor: int) -> bool:
        return tensor == 1

    def regions(self, model: ModelFacts) -> list:
        return []  # it splits the batch, no region

    def rank_runtime(self, plan: Plan, rank: int, options: dict) -> ZeroRuntime:
        """ZeRO's shards and gathers (docs/memory.md)."""
        return ZeroRuntime(plan)

    def rank_passes(self, plan: Plan, build: RankBuild) -> list[RankPass]:
        """Every plan's last split: the batch over ``plan.batch_group()`` (outputs
        gathered, a training graph's loss left local for ``step`` to reduce). In a
        pipeline only the last stage's outputs are the model's (the others' carried
        values stay local, the next stage's input), its loss a share of the batch's over
        the microbatches; with gradient accumulation too. Under ZeRO, first the reads of
        the sharded parameters (:func:`autopar.strategies.data.zero.zero_pass`)."""
        if build.branch_only:
            return []
        zero = [RankPass(ZERO, "zero", zero_pass, {"params": build.zero_params})] \
            if plan.zero and build.zero_params else []
        options = {"degree": plan.batch_parts(), "local_batch": build.local_batch, "group": plan.batch_group(),
                   "reduce_scalars": not build.with_loss, "couplings": plan.batch_couplings,
                   "loss_terms": plan.loss_terms}
        if build.stage is not None:
            pp = plan.pipeline
            if build.stage != pp["stages"] * pp["chunks"] - 1:
                return zero
            options["microbatches"] = pp["microbatches"]
        else:
            options["microbatches"] = plan.microbatches  # gradient accumulation (docs/memory.md)
        return zero + [RankPass(DATA, "data_parallel", data_parallel_pass, options)]
