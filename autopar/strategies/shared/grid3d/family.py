"""What the 3D families share as families: AxoNN's grids
(:mod:`autopar.strategies.tensor3d.planner`) and Bian's cube
(:mod:`autopar.strategies.cube.planner`) price their grids alike
(:mod:`.pricing`), weigh the same memory levers, split a plan's regions with their rank
pass and place the gradients alike (:mod:`.layout`); :class:`Grid3DFamily` is that
common part, each family its grids, form and pass."""
from __future__ import annotations

from autopar.grid import Grid3D, MeshAxis
from autopar.ir import regions as ir_regions
from autopar.planning.model import ModelFacts
from autopar.planning.plan import Plan
from autopar.planning.strategy import Strategy
from autopar.strategies.family import (SPLIT, CompileHooks, PlanContext, Priced, RankBuild, RankPass, RegionTable,
                                       mesh_plan, rejected, too_big)
from autopar.strategies.shared import levers
from autopar.strategies.shared.batch_norms import batch_norms
from autopar.strategies.shared.grid3d.layout import place as place_grid3d
from autopar.strategies.shared.grid3d.pricing import (SPLIT_KINDS, Form3D, cache_settings, data_comm_3d,
                                                      price_grid)
from autopar.strategies.shared.grid3d.rewrite import planned_grid3d_shards


class Grid3DFamily(CompileHooks):
    """A family on the ``Gx × Gy × Gz × Gdata`` grids of the world (AxoNN's,
    :class:`autopar.strategies.tensor3d.planner.Tensor3D`; Bian's cube,
    :class:`autopar.strategies.cube.planner.Cube`): its regions priced by
    :func:`~autopar.strategies.shared.grid3d.pricing.price_grid` in its :attr:`form3d`,
    its plans split by its rank pass (:meth:`pass_fn`), their gradients placed by
    :mod:`.layout`. A family names its grids (``candidates``), its form and its pass."""

    name: str              # as plans name the family
    priced_late = True  # after the other families: the best so far spares weighing its levers
    form3d: Form3D         # its layer, as the pricing sees it
    plan_form: str         # Plan.form of its plans
    region_strategy: str   # RegionChoice.strategy of its split regions

    def _mine(self, plan: Plan) -> bool:
        """A plan on this family's grid, or a mixed plan with 3D regions (AxoNN's form only)."""
        if plan.mixed:
            return bool(plan.tensor_grid) and self.plan_form == ""
        return plan.grid is not None and plan.form == self.plan_form

    def planned_shards(self, plan: Plan, gm) -> dict:
        if not self._mine(plan):
            return {}
        return self.shards_of(gm, regions=plan.regions_with(self.region_strategy), grid=plan.region_grid)

    def shards_of(self, gm, *, regions, grid) -> dict:
        return planned_grid3d_shards(gm, regions=regions, grid=grid)

    def rank_passes(self, plan: Plan, build: RankBuild) -> list[RankPass]:
        if not self._mine(plan):
            return []
        return [RankPass(SPLIT, self.region_strategy, self.pass_fn(),
                         {"regions": plan.regions_with(self.region_strategy, build.stage),
                          "grid": plan.region_grid, "rank": build.rank, **self.pass_options(plan)})]

    def pass_options(self, plan: Plan) -> dict:
        """A mixed plan's 3D regions split their rows over z themselves."""
        return {"rows_over_z": True} if plan.mixed else {}

    def pass_fn(self):
        """The rank pass that splits the plan's regions with the family's layer."""
        raise NotImplementedError

    def recompute_regions(self, plan: Plan) -> list[str]:
        return plan.regions_with(self.region_strategy) if self._mine(plan) else []

    def place(self, builder, build: RankBuild) -> None:
        if self._mine(builder.plan):
            place_grid3d(builder, build.deferred_reduce_scatter)

    def regions(self, model: ModelFacts) -> list:
        return [r for r in model.regions if r.kind in SPLIT_KINDS]

    def price(self, ctx: PlanContext, config: Strategy) -> Priced:
        model, grid, form = ctx.model, config.grid, self.form3d
        mesh = {MeshAxis.DATA: grid.data, MeshAxis.Z: grid.z, MeshAxis.Y: grid.y, MeshAxis.X: grid.x}
        if model.batch % (grid.z * grid.data):
            return rejected(self.name, config, mesh, f"batch {model.batch} not divisible by Gz x Gdata = "
                            f"{grid.z * grid.data}", form=form.form)
        split_all = False
        table = price_grid(model, ctx.hw, grid, form, ctx.forced is not None, split_all, materialize=False)
        if not any(c.strategy == form.strategy for c in table.regions):
            # as for Megatron: a grid that splits nothing only repeats work; price
            # splitting every region it divides
            split_all = True
            table = price_grid(model, ctx.hw, grid, form, False, split_all, materialize=False)
        if not any(c.strategy == form.strategy for c in table.regions):
            why = next((c.reason for c in table.regions if c.kind in SPLIT_KINDS), "no region")
            return rejected(self.name, config, mesh, f"no region split over the grid: {why}", form=form.form)
        table, config = self.with_levers(ctx, config, table, form, split_all)
        figures = dict(step_s=table.step_s, memory_bytes=table.total.memory_bytes, comm_s=dict(table.total.comm_s),
                       form=form.form)
        why = too_big(table.total.memory_bytes, ctx.hw, table.note)
        if why is not None:
            return rejected(self.name, config, mesh, why, **figures)
        return Priced(self.name, config, mesh, feasible=True, table=table, detail=split_all, **figures)

    def with_levers(self, ctx: PlanContext, config: Strategy, table: RegionTable, form: Form3D, split_all: bool,
                    materialize: bool = False) -> tuple[RegionTable, Strategy]:
        """The grid with the memory levers it runs with (:func:`autopar.strategies.shared.levers.weigh`):
        accumulation re-priced on a grid whose data axis takes the microbatches, full
        recomputation with the all-gather cache bounded (:func:`~.pricing.cache_settings`); no ZeRO
        (the 3D shards are split over z already)."""
        model, hw, grid = ctx.model, ctx.hw, config.grid
        forced = ctx.forced is not None and not split_all
        blocks = len(ir_regions(model.gm, "block"))

        def at(m: int):
            return price_grid(model, hw, Grid3D(grid.x, grid.y, grid.z, grid.data * m), form, forced, split_all,
                              materialize=materialize)

        def data_comm(one, zero, m, compute):
            return data_comm_3d(grid, one.param_elems, one.shard_elems, compute, hw)

        def again(mode, one):
            return cache_settings(one, blocks, grid.z) if mode == "full" else levers.megatron_again(mode, one)

        space = levers.LeverSpace(rows=model.batch // (grid.z * grid.data), data=grid.data, split=grid.x * grid.y,
                                  at=at, data_comm=data_comm, zero_stages=(0,), again=again,
                                  accumulate=not batch_norms(model), fixed_axes=(MeshAxis.Z,))
        return levers.weigh(ctx, config, table, space)

    def to_plan(self, ctx: PlanContext, priced: Priced) -> Plan:
        """The search priced each class of regions once; the winner gets its own table
        (with the levers the search chose)."""
        forced = ctx.forced is not None and not priced.detail
        table = price_grid(ctx.model, ctx.hw, priced.config.grid, self.form3d, forced, priced.detail)
        if priced.config.microbatches or priced.config.recompute:
            table, _ = self.with_levers(levers.chosen_levers(ctx, priced.config), priced.config, table, self.form3d,
                                        priced.detail, materialize=True)
        return mesh_plan(ctx, priced, table)
