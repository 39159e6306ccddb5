"""Planning AxoNN's 3D/4D tensor parallelism (axonn §III, §V): the family on every
``Gx × Gy × Gz × Gdata`` of the world.

A grid's regions are priced as the 3D families price them
(:mod:`autopar.strategies.shared.grid3d.pricing`: each region split over the grid or
replicated, AxoNN's layer :data:`~autopar.strategies.shared.grid3d.pricing.AXONN`), its
memory levers weighed and its plans compiled as theirs
(:class:`~autopar.strategies.shared.grid3d.family.Grid3DFamily`); the family offers the
grids and splits a plan's regions with AxoNN's layer (:func:`.rewrite.tensor3d_pass`),
whose overlap state it keeps on each rank (:class:`.runtime.Tensor3DRankRuntime`).
"""
from __future__ import annotations

from autopar.planning.plan import Plan
from autopar.planning.strategy import Strategy
from autopar.strategies.family import PlanContext
from autopar.strategies.shared.grid3d.cost import grids_of
from autopar.strategies.shared.grid3d.family import Grid3DFamily
from autopar.strategies.shared.grid3d.pricing import AXONN, check_forced_grid
from autopar.strategies.tensor3d.rewrite import tensor3d_pass
from autopar.strategies.tensor3d.runtime import Tensor3DRankRuntime


class Tensor3D(Grid3DFamily):
    """AxoNN's 3D/4D family: every ``Gx × Gy × Gz × Gdata`` of the world."""

    name = "tensor3d"
    form3d = AXONN
    plan_form = ""  # Plan.form of its plans
    region_strategy = "tensor3d"  # RegionChoice.strategy of its split regions

    def pass_fn(self):
        return tensor3d_pass

    def rank_runtime(self, plan: Plan, rank: int, options: dict) -> Tensor3DRankRuntime | None:
        """The 3D layers' overlap state (AxoNN §IV), shared by the cube's layers."""
        return Tensor3DRankRuntime(plan, options.get("overlap"))

    def candidates(self, ctx: PlanContext) -> list[Strategy]:
        if ctx.forced is None:
            return [Strategy(g.data, 1, grid=g) for g in grids_of(ctx.world)] if self.regions(ctx.model) else []
        if ctx.forced.kind() != "tensor3d":
            return []
        check_forced_grid(ctx, ctx.forced.grid)
        return [ctx.forced]
