"""Planning mixed plans: each region its own family over one tensor group (``docs/mixed_plans.md``).

On ``world = data × tensor`` the ``t`` ranks of a tensor group are one model-parallel
group that every region may use its own way:

* ``replicate``: the region runs whole on every rank of the group;
* ``megatron``: split over the ``t`` ranks (megatron §2.3);
* ``tensor3d``: split over the group viewed as AxoNN's ``Gx × Gy × Gz`` grid
  (axonn §III; one factorisation of ``t`` per plan, the configuration's; with ``Gz > 1``
  the region splits its rows over z, :class:`~.options.RowsOverZ`);
* ``dsp``: a multi-branch region's branches spread over the group, each rank a
  sub-grid (SUPER §III-B with ``g = t``; ``shared.branch_cost.dsp_tensor_cost``), or over ``g < t``
  sub-grids of ``t/g`` ranks whose branches' regions are Megatron-split inside their
  sub-grid (a configuration's ``tensor_subgrids``; groups ``tensor_seg`` and
  ``tensor_sub``).

Every region keeps the rows of its data replica (the batch is split over the data
ranks only) and meets its neighbours with the activation replicated over the group:
Megatron's f and g, the 3D layers' entry cut and exit all-gather over y, D&SP's fork
all-reduce and join all-gather are each region's conversion from and to that layout,
priced inside its own cost. The other boundary layouts are AxoNN's: a 3D region's
last (transposed) layer leaves its output split over y, which a 3D region whose first
layers read it directly takes as it is (axonn end of §III-B), saving both re-layouts;
and on a grid with ``Gz > 1`` the rows split over z, which stay split through the nodes
between two 3D regions (the residual add, the layer norm), saving both row conversions
and ``1 − 1/Gz`` of those nodes' work.
The search is therefore a dynamic programme over the regions in graph order whose
state is the layout the previous region left (replicated, or split over y or its rows
over z by a 3D region): exact for chains of regions; regions on parallel branches of
the region graph are never directly connected, so they meet at the replicated layout
and the programme prices that. A multi-branch region is one step of the programme with two
choices: D&SP (its inner regions run whole on their branch's rank, or Megatron-split
over their sub-grid) or open (its inner regions choose as any other). Identical
repeated blocks are priced once (the option costs are memoised per class of region),
so planning time grows linearly in layers.

A pipeline's stages are mixed plans too (:class:`~.stages.StagePlans`): the same
programme at one microbatch's rows, its choices summed per stage for the pipeline
family's schedule, which asks this family for them (:meth:`Mixed.stage_plans`,
:meth:`Mixed.check_stages`) through :meth:`~autopar.strategies.family.PlanContext.peer`.

Pins (``strategy={"regions": {PATTERN: SPEC}}``, :class:`~autopar.planning.strategy.Pin`)
restrict a region's choices to one; a pin that cannot run raises :class:`PlanError`
naming the region.

The package: this module is the family; :mod:`.options` prices one region's options,
:mod:`.credits` the 3D boundary credits, :mod:`.solver` is the programme,
:mod:`.tables` renders its choice as the region table, :mod:`.pricer` ties them for one
configuration, :mod:`.pins` checks a forced strategy's pins, :mod:`.stages` prices a
pipeline's stages and :mod:`.structure` holds the facts of the model they read.
"""
from __future__ import annotations

import dataclasses

from autopar.cost import model as cost_model
from autopar.grid import Grid3D, MeshAxis
from autopar.planning.model import ModelFacts
from autopar.planning.plan import Plan
from autopar.planning.strategy import PlanError, Strategy, divisors
from autopar.strategies.family import CompileHooks, PlanContext, Priced, RegionTable, mesh_plan, rejected, too_big
from autopar.strategies.shared.forms import mixed_form
from autopar.strategies.shared.mesh import check_forced_batch, judge
from autopar.strategies.mixed.bound import lower_bound
from autopar.strategies.mixed.pins import check_forced_stages, check_pins_name_regions, pinned_subgrids, pins_misfit
from autopar.strategies.mixed.pricer import MixedPricer
from autopar.strategies.mixed.stages import StagePlans
from autopar.strategies.mixed.structure import node_names, pinnable, region_structure
from autopar.strategies.shared import levers
from autopar.strategies.shared.batch_norms import batch_norms
from autopar.strategies.shared.branches import branches_of, widest_branching
from autopar.strategies.shared.grid3d.pricing import tensor_grids


class Mixed(CompileHooks):
    """Mixed plans: per region replicate, Megatron, a 3D grid of the tensor group, or
    D&SP over it (see the module docstring). Its plans run through the other families'
    passes (each splits the regions the plan gives it) and layouts."""

    name = "mixed"
    priced_late = True  # after the other families: the best so far bounds its configurations (.bound)

    def regions(self, model: ModelFacts) -> list:
        return pinnable(model)

    def _grids(self, ctx: PlanContext, data: int, t: int) -> list[Grid3D | None]:
        """The tensor group's 3D layouts a configuration may take: none, and every
        ``Gx × Gy = t`` with both above 1 (a pinned grid: that one)."""
        pinned = ctx.forced.grid if ctx.forced is not None else None
        if pinned is not None:  # its x·y·z is t (pins_misfit)
            return [Grid3D(pinned.x, pinned.y, pinned.z, data)]
        return [None] + tensor_grids(ctx.model, t, data)

    def candidates(self, ctx: PlanContext) -> list[Strategy]:
        model, world, forced = ctx.model, ctx.world, ctx.forced
        if forced is not None and forced.kind() != "mixed":
            return []
        if forced is None:
            widest = widest_branching(model)
            out = []
            for t in divisors(world):
                if t == 1:
                    continue
                for grid in self._grids(ctx, world // t, t):
                    # without a 3D grid and a multi-branch region wide enough this is Megatron's plan
                    if grid is None and widest < t:
                        continue
                    out.append(Strategy(world // t, t, grid=grid, mixed=True))
                # D&SP over g sub-grids of t/g ranks, the branches Megatron-split inside
                out += [Strategy(world // t, t, mixed=True, tensor_subgrids=g) for g in divisors(t)
                        if 1 < g < t and widest >= g]
            return out
        check_pins_name_regions(ctx)
        fixed = forced.data is not None or forced.tensor is not None
        if fixed:
            meshes = [forced.resolve(world)]
            check_forced_batch(model, meshes[0][0])
            if meshes[0][1] == 1:
                raise PlanError("strategy: region pins split regions over the tensor group; give a tensor degree "
                                "above 1 (or leave the degrees to the planner)")
        else:
            meshes = [(world // t, t) for t in divisors(world) if t > 1]
        out = []
        for data, t in meshes:
            why = pins_misfit(forced, t)
            if why is not None:
                if fixed:
                    raise PlanError(why)
                continue
            grids = self._grids(ctx, data, t)
            if any(p.family == "tensor3d" for p in forced.regions) and forced.grid is None:
                grids = [g for g in grids if g is not None]
            sub = pinned_subgrids(forced, t)
            if sub:
                grids = [None]  # sub-grids of several ranks: no 3D grid beside them (pins_misfit)
            out += [Strategy(data, t, grid=g, mixed=True, regions=forced.regions, tensor_subgrids=sub)
                    for g in grids]
        if not out:
            raise PlanError(f"strategy['regions']: no mesh of {world} ranks takes these pins "
                            f"({', '.join(p.pattern + ': ' + p.describe() for p in forced.regions)})")
        return out

    def price(self, ctx: PlanContext, config: Strategy) -> Priced:
        model, data, t, grid = ctx.model, config.data, config.tensor, config.grid
        mesh = {MeshAxis.DATA: data, MeshAxis.TENSOR: t}
        form = mixed_form(grid_dict(grid), config.tensor_subgrids)
        if model.batch % data:  # a forced data degree was checked by candidates
            return rejected(self.name, config, mesh, f"batch {model.batch} not divisible by data degree {data}",
                            form=form)
        try:
            pricer = MixedPricer(ctx, data, t, grid, subgrids=config.tensor_subgrids)
            if ctx.forced is None:
                # not listed: the same mesh's single-family plans are, with their memory
                floor = memory_floor(model, data, t)
                why = ("at least " + too_big(floor, ctx.hw) if too_big(floor, ctx.hw) is not None else
                       None if pricer.can_mix() else "a single-family plan")
                if why is not None:
                    return dataclasses.replace(rejected(self.name, config, mesh, why, form=form), listed=False)
                floor_s = lower_bound(pricer.options) if ctx.levers is None else None
                if floor_s is not None and floor_s > ctx.best_s[0] * (1 + 1e-9):  # it cannot win (.bound)
                    why = (f"at least {floor_s * 1e3:.3f} ms by its regions' cheapest options, the best so far "
                           f"{ctx.best_s[0] * 1e3:.3f} ms")
                    return dataclasses.replace(rejected(self.name, config, mesh, why, form=form), listed=False)
            table = pricer.table(materialize=False)
        except PlanError as e:
            if ctx.forced is not None and ctx.forced.tensor is not None:
                raise
            return rejected(self.name, config, mesh, str(e), form=form)
        uses = pricer.uses
        # another family's plan, or the same mesh's without a grid: weighed there
        # D&SP over sub-grids splits its branches with Megatron: two families when it is used
        single = "dsp" not in uses if config.tensor_subgrids else len(uses - {"replicate"}) < 2
        if ctx.forced is None and (single or (grid is not None and "tensor3d" not in uses)):
            return dataclasses.replace(rejected(self.name, config, mesh, "a single-family plan", form=form),
                                       listed=False)
        table, config = self.with_levers(ctx, config, table)
        priced = judge(self.name, ctx, config, mesh, table)
        return dataclasses.replace(priced, form=form)

    def with_levers(self, ctx: PlanContext, config: Strategy, table: RegionTable, materialize: bool = False
                    ) -> tuple[RegionTable, Strategy]:
        """The mixed mesh with the memory levers it runs with
        (:func:`autopar.strategies.shared.levers.weigh`): each microbatch count's
        programme priced again at one microbatch's rows; ZeRO over the data ranks."""
        data, t, hw = config.data, config.tensor, ctx.hw

        def at(m: int) -> RegionTable:
            grid = config.grid
            if grid is not None:
                grid = Grid3D(grid.x, grid.y, grid.z, grid.data * m)
            return MixedPricer(ctx, data * m, t, grid, subgrids=config.tensor_subgrids).table(materialize=materialize)

        space = levers.LeverSpace(
            rows=ctx.model.batch // data, data=data, split=t, at=at,
            data_comm=lambda one, z, m, compute: levers.zero_comm(one.param_elems, data, t, z, m, compute, hw),
            accumulate=not batch_norms(ctx.model))
        return levers.weigh(ctx, config, table, space)

    def to_plan(self, ctx: PlanContext, priced: Priced) -> Plan:
        c = priced.config
        table = MixedPricer(ctx, c.data, c.tensor, c.grid, subgrids=c.tensor_subgrids).table()
        if c.microbatches or c.recompute or c.zero:  # the winner's table with the levers the search chose
            table, _ = self.with_levers(levers.chosen_levers(ctx, c), c, table, materialize=True)
        plan_ = mesh_plan(ctx, priced, table)
        grid = c.grid
        plan_.mixed = True
        plan_.tensor_grid = grid_dict(grid) if plan_.regions_with("tensor3d") else {}
        return plan_

    # ------------------------------------------------------------------ a pipeline's stages
    def stage_plans(self, ctx: PlanContext, shape, tensor: int, grid: Grid3D | None,
                    subgrids: int = 0) -> StagePlans:
        """A pipeline's stages (``shape``: its
        :class:`~autopar.strategies.pipeline.shape.PipelineShape`) as mixed plans on a
        tensor group of ``tensor`` ranks (:class:`.stages.StagePlans`): what the pipeline
        family prices a mixed configuration's stages with."""
        return StagePlans(ctx, shape, tensor, grid, subgrids)

    def check_stages(self, ctx: PlanContext, tensor: int) -> int:
        """A pipeline forced with region pins or a grid inside its stages, on a tensor
        group of ``tensor`` ranks: the pins' checks (:func:`.pins.check_forced_stages`);
        the D&SP sub-grid count they ask for."""
        return check_forced_stages(ctx, tensor)


def memory_floor(model: ModelFacts, data: int, t: int) -> float:
    """Bytes every mixed plan on ``data × t`` holds at least (the search skips the
    programme above the device's memory): each region outside the multi-branch ones
    keeps at least ``1/t`` of its parameters and of its data replica's saved activations,
    whatever its family (Megatron and 3D ``1/t``, replicated all)."""
    def base():
        forked = {n for _, fj, _ in region_structure(model)[1] for n in fj.nodes}
        in_branches = {name for names in _branch_params(model) for name in names}
        params = sum(p.numel() for name, p in model.params.items() if name not in in_branches)
        return params, model.activation_bytes([n for n in node_names(model) if n not in forked], 1.0)
    params, act = model.fact("mixed.floor", base)
    return cost_model.training_memory(params / t, act / (data * t))


def _branch_params(model: ModelFacts) -> list:
    """The parameter names of every multi-branch region's branches."""
    return [names for _, fj, _ in region_structure(model)[1] for names in branches_of(model, fj).params]


def grid_dict(grid: Grid3D | None) -> dict:
    """A plan's ``tensor_grid`` for ``grid``: its x and y, and z where above 1."""
    if grid is None:
        return {}
    return {MeshAxis.X: grid.x, MeshAxis.Y: grid.y, **({MeshAxis.Z: grid.z} if grid.z > 1 else {})}
