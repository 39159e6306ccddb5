"""Planning Megatron's ``data × tensor`` (megatron §2.3): the family.

Its configurations are the ``data × tensor`` factorisations with ``tensor > 1``, priced by
:mod:`autopar.strategies.shared.mesh` (each region split over the tensor group or
replicated within it, whichever is cheaper); :meth:`Megatron.finish_plan` settles
Megatron's sequence parallelism (Korthikanti et al. §4.2.2, docs/sequence.md) on the
chosen plan, and the rank passes split the plan's Megatron regions
(:mod:`autopar.strategies.megatron.rewrite`).
"""
from __future__ import annotations

from autopar.grid import MeshAxis
from autopar.passes.manager import pass_disabled
from autopar.planning.plan import Plan
from autopar.planning.strategy import PlanError
from autopar.strategies.family import SPLIT, PlanContext, RankBuild, RankPass
from autopar.strategies.megatron.rewrite import planned_param_shards, tensor_parallel_pass
from autopar.strategies.megatron.runtime import SequenceRankRuntime
from autopar.strategies.shared.mesh import DataTensor, sequence_splits



class Megatron(DataTensor):
    """Megatron's tensor parallelism with data parallelism: ``tensor > 1``. Its rewrite
    (:mod:`autopar.strategies.megatron.rewrite`) runs on every plan without a 3D grid
    (it splits nothing on a tensor degree of 1), inside pipeline stages too."""

    name = "megatron"

    def planned_shards(self, plan: Plan, gm) -> dict:
        if plan.grid is not None or pass_disabled("tensor_parallel"):
            return {}
        shards = {}
        for group, degree, regions in split_groups(plan):
            shards.update(planned_param_shards(gm, megatron_regions=regions, degree=degree, group=group))
        return shards

    def rank_passes(self, plan: Plan, build: RankBuild) -> list[RankPass]:
        if plan.grid is not None or build.branch_only:
            return []
        tensor = plan.rank_coordinates(build.rank)[MeshAxis.TENSOR]
        subgrid, place = plan.tensor_subgrid_coordinates(build.rank)
        out = []
        for group, degree, regions in split_groups(plan, build.stage, subgrid):
            whole = group == MeshAxis.TENSOR
            out.append(RankPass(SPLIT, "tensor_parallel" if whole else "tensor_parallel_subgrid", tensor_parallel_pass,
                                {"megatron_regions": regions, "degree": degree, "rank": tensor if whole else place,
                                 "group": group, "sequence_parallel": plan.sequence_parallel and whole}))
        return out

    def finish_plan(self, ctx: PlanContext, plan: Plan) -> None:
        plan.sequence_parallel = _sequence_parallel(ctx, plan)

    def rank_runtime(self, plan: Plan, rank: int, options: dict) -> SequenceRankRuntime | None:
        """Under sequence parallelism, the hooks that keep the column linears' gathered
        inputs split (:mod:`autopar.strategies.megatron.runtime`)."""
        return SequenceRankRuntime() if plan.sequence_parallel else None

    def recompute_regions(self, plan: Plan) -> list[str]:
        # with D&SP sub-grids, every sub-grid's regions (a rank's program has its own only;
        # the recomputation skips the regions a program lacks)
        return [rid for _, _, regions in split_groups(plan) for rid in regions] if plan.grid is None else []


def _sequence_parallel(ctx: PlanContext, plan_: Plan) -> bool:
    """Whether the plan runs Megatron-SP (docs/sequence.md): as forced, refused where a
    tensor group of more than one rank splits no region Megatron-style or no token
    dimension of their outputs divides at each rank's rows (:func:`sequence_splits`);
    else as its configuration was priced (``plan_.sequence_parallel``: where it does not
    fit without, :func:`price_mesh`). Not in this version: mixed plans (their 3D regions
    read the values between regions whole) and D&SP sub-grids of the tensor group."""
    forced = ctx.levers.sequence_parallel if ctx.levers is not None else None
    t = plan_.degree(MeshAxis.TENSOR)
    rows = plan_.global_batch // max(plan_.batch_parts(), 1) // max(
        plan_.pipeline.get("microbatches", 1) if plan_.pipeline else plan_.microbatches, 1)
    why_not = None
    if t < 2 or not plan_.regions_with("megatron"):
        why_not = "no region is split Megatron-style over a tensor group of more than one rank"
    elif plan_.mixed or plan_.tensor_subgrids or plan_.grid is not None:
        why_not = "sequence parallelism runs with data, tensor, pipeline and expert plans, not mixed or 3D ones"
    elif not sequence_splits(ctx.model, t, rows):
        why_not = (f"no token dimension of the split regions' outputs is divisible by the tensor degree {t} at "
                   f"{rows} rows per rank; give a sequence length (or rows per rank) divisible by {t}")
    if forced and why_not is not None:
        raise PlanError(f"strategy: sequence_parallel=True, but in the plan for {plan_.mesh}: {why_not}; or drop "
                        f"'sequence_parallel'")
    return (why_not is None and plan_.sequence_parallel) if forced is None else forced


def split_groups(plan: Plan, stage: int | None = None, subgrid: int | None = None) -> list[tuple]:
    """``(group, degree, regions)`` of the plan's Megatron regions: over the tensor
    group, then (a mixed plan whose D&SP regions use sub-grids of several tensor ranks)
    those split over a sub-grid's ranks, ``tensor_sub``: every sub-grid's, or with
    ``subgrid`` only that sub-grid's (the other sub-grids' branches are not in its
    ranks' programs)."""
    details = {r.region: r.details for r in plan.regions}
    names = plan.regions_with("megatron", stage)
    out = [(MeshAxis.TENSOR, plan.degree(MeshAxis.TENSOR), [n for n in names if "group" not in details[n]])]
    g = plan.tensor_subgrids
    if g:
        out.append((MeshAxis.TENSOR_SUB, plan.degree(MeshAxis.TENSOR) // g,
                    [n for n in names if details[n].get("group") == MeshAxis.TENSOR_SUB
                     and (subgrid is None or details[n]["subgrid"] == subgrid)]))
    return out


