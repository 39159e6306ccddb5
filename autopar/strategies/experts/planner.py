"""Planning expert parallelism: the family that spreads routed experts over the data ranks.

Expert parallelism rides on a plan of another family: data × tensor (data parallelism,
Megatron) or a pipeline, the registered family it asks for by name
(:meth:`~autopar.strategies.family.PlanContext.peer`). For an expert degree ``P``
(dividing the data degree and every MoE layer's expert count) the data ranks form expert
groups of ``P`` consecutive ranks; each MoE region (:mod:`autopar.passes.analysis.experts`)
chooses between

* ``"experts"``: its experts spread over the group (``E/P`` per rank), the tokens
  dispatched and combined by all-to-all (:mod:`.collectives`), the experts Megatron-split
  over the tensor group inside when the plan has one, their gradients reduced over the
  ``d/P`` ranks holding the same experts;
* what the base plan does with its experts' chain (replicated over the data ranks, or
  Megatron-split over the tensor group),

whichever is cheaper (:mod:`.cost`'s terms, uniform routing assumed), or as pinned
(``{"regions": {"kind:experts": {"experts": P}}}`` or ``"replicate"``), or every MoE
region under a forced ``{"data": d, "experts": P}``.

* ``candidates``: under a forced expert degree, the base family's configurations with it
  (every data × tensor mesh whose data degree ``P`` divides when no degree is given);
  nothing under ``"auto"``, where
* ``follow_ups`` offers every data and Megatron configuration priced (feasible, with or
  without ZeRO, or too big: the experts' memory shrinks ``P``-fold) at every expert
  degree that divides its data degree and the expert counts, and the 3 fastest pipelines
  (feasible first, then too big) at their layout (``{"pipeline": 2, "data": 2,
  "experts": 2}`` forces one): their stages are priced by the pipeline family without
  ZeRO, its microbatch count chosen with the experts' saving counted, the all-to-alls
  added on the critical path.
* ``price``: the base family's region table on the whole batch (before its memory
  levers: a base too big for memory is priced all the same), then each MoE region's
  choice (every region when the base does not fit): its experts' chain re-priced
  (compute over ``d·t``, Megatron's f and g inside when ``t > 1``), the all-to-alls (4
  per layer per step, :func:`autopar.cost.model.all_to_all_time`), the data-parallel
  gradient all-reduce less the experts' weights, which are all-reduced over their
  replicas instead, and the memory less ``(1 − 1/P)`` of the experts' weights; then the
  memory levers (microbatches, recomputation; ZeRO is not run with expert parallelism)
  weighed on that, as for the base families (:func:`autopar.strategies.shared.levers.weigh`).
* ``to_plan``: the base plan, its MoE regions' rows added (placement, predicted rows per
  rank, all-to-all bytes and seconds), their chains' rows marked ``"experts"`` (so
  Megatron leaves them to this family), ``plan.experts = P``.

The compile hooks cut the experts' weights (:class:`.layout.ExpertShard`), send their
gradients to ``expert_replica`` (:func:`.layout.place`) and rewrite each rank's MoE
regions (:func:`.rewrite.expert_parallel_regions_pass`).
"""
from __future__ import annotations

import dataclasses
import math

from autopar.cost import model as cost_model
from autopar.grid import MeshAxis
from autopar.ir import regions as graph_regions
from autopar.planning.model import ModelFacts
from autopar.planning.forms import experts_form
from autopar.planning.plan import Cost, Plan, RegionChoice, _in_stage
from autopar.planning.strategy import Pin, PlanError, Strategy, divisors
from autopar.strategies.experts.collectives import ExpertsRankRuntime
from autopar.strategies.experts.cost import LayerFigures, experts_data_comm, layer_figures
from autopar.strategies.experts.layout import ExpertShard, place as place_experts, place_modules
from autopar.strategies.experts.rewrite import expert_parallel_regions_pass, expert_shards, expert_weights
from autopar.strategies.family import (SPLIT, CompileHooks, PlanContext, Priced, RankBuild, RankPass, RegionTable,
                                       fastest_in_full, rejected, too_big)
from autopar.strategies.shared.mesh import price_mesh, sequence_choice
from autopar.strategies.shared import levers
from autopar.strategies.shared.batch_norms import batch_norms

BASES = ("data", "megatron")  # the families whose configurations "auto" weighs with experts
PIPELINES_AT = 3  # and the fastest pipelines: weighing every layout would multiply the pipeline search


def moe_regions(model: ModelFacts) -> list:
    """The model's MoE regions (:mod:`autopar.passes.analysis.experts`) whose experts this
    family's rewrite handles (gated, no biases); found once per model."""
    def find():
        out = []
        for r in graph_regions(model.gm, "experts"):
            try:
                expert_weights(model.gm, r)
            except ValueError:
                continue
            out.append(r)
        return out
    return model.fact("experts.regions", find)


def expert_degrees(model: ModelFacts, data: int) -> list[int]:
    """The expert degrees above 1 that divide ``data`` and every MoE layer's expert count."""
    counts = [r.details["experts"] for r in moe_regions(model)]
    if not counts:
        return []
    g = math.gcd(data, *counts)
    return [p for p in divisors(g) if p > 1]


def _base_family(ctx: PlanContext, config: Strategy):
    """The family whose plan a configuration with experts rides on: the registered one
    (:meth:`~autopar.strategies.family.PlanContext.peer`)."""
    return ctx.peer("pipeline" if config.pipeline > 1 else ("megatron" if (config.tensor or 1) > 1 else "data"))


def _matches(pattern: str, region) -> bool:
    """Whether a region pin's ``pattern`` (a glob over region ids, or ``kind:K``) names ``region``."""
    return Pin(pattern, "replicate").matches(region)


def _pinned(config: Strategy, region) -> int | None:
    """The expert degree a pin gives ``region`` (1: replicate), None when no pin matches."""
    return next((degree for pattern, degree in config.expert_pins if _matches(pattern, region)), None)


def check_forced(model: ModelFacts, config: Strategy, data: int | None) -> None:
    """A forced expert degree: the model has MoE regions, the degree divides each one's
    experts and the data degree; every pin matches a region. A :class:`PlanError` names
    what does not."""
    p = config.experts
    found = graph_regions(model.gm, "experts")
    if not found:
        raise PlanError(f"strategy: experts={p}, but the model has no routed mixture-of-experts layer the analysis "
                        f"can read (a router's topk before a grouped matmul of 3-D expert weights, "
                        f"docs/experts.md); drop 'experts'")
    usable = {r.id for r in moe_regions(model)}
    for r in found:
        if p > 1 and r.details["experts"] % p and _pinned(config, r) != 1:
            raise PlanError(f"region {r.id}: its {r.details['experts']} experts are not divisible by the expert "
                            f"degree {p}; force an expert degree that divides {r.details['experts']}, or pin the "
                            f"region 'replicate'")
        if r.id not in usable and _pinned(config, r) != 1 and p > 1:
            try:
                expert_weights(model.gm, r)
            except ValueError as e:
                raise PlanError(f"region {r.id}: {e}; pin it 'replicate' ({{'regions': {{{r.id!r}: "
                                f"'replicate'}}}}) or drop 'experts'") from None
    for pattern, _ in config.expert_pins:
        if not any(_matches(pattern, r) for r in found):
            raise PlanError(f"strategy['regions'][{pattern!r}]: matches no MoE region; the model's are "
                            f"{[r.id for r in found]}")
    if p > 1 and all(_pinned(config, r) == 1 for r in found):
        raise PlanError(f"strategy: experts={p}, and every MoE region is pinned 'replicate'; drop 'experts' or a pin")
    if data is not None and p > 1 and data % p:
        raise PlanError(f"strategy: experts={p} does not divide the data degree {data}; the expert groups are "
                        f"{p} consecutive data ranks: give a data degree that is a multiple of {p}")


def _mesh_of(config: Strategy) -> dict[str, int]:
    """The mesh of a configuration as given (its degrees, pipeline first when it has one)."""
    mesh = {MeshAxis.DATA: config.data, MeshAxis.TENSOR: config.tensor}
    return {MeshAxis.PIPELINE: config.pipeline, **mesh} if config.pipeline > 1 else mesh


class ExpertParallel(CompileHooks):
    """Expert parallelism on a data × tensor or pipeline plan (the module docstring)."""

    name = "experts"

    def regions(self, model: ModelFacts) -> list:
        return moe_regions(model)

    # ------------------------------------------------------------------ the search
    def candidates(self, ctx: PlanContext) -> list:
        forced = ctx.forced
        if forced is None or forced.kind() != "experts":
            return []
        base = forced.base()
        check_forced(ctx.model, forced, base.data)
        if base.pipeline > 1 or base.data is not None or base.tensor is not None:
            if base.pipeline <= 1:
                data, tensor = base.resolve(ctx.world)
                base = dataclasses.replace(base, data=data, tensor=tensor)
            base_ctx = dataclasses.replace(ctx, forced=base)
            return [self._wrap(c, forced) for c in _base_family(ctx, base).candidates(base_ctx)]
        # only the expert degree given: every data × tensor mesh it divides
        return [dataclasses.replace(forced, data=ctx.world // t, tensor=t) for t in divisors(ctx.world)
                if (ctx.world // t) % forced.experts == 0]

    @staticmethod
    def _wrap(c, forced: Strategy):
        if isinstance(c, Priced):
            return dataclasses.replace(c, family="experts", config=dataclasses.replace(
                c.config, experts=forced.experts, expert_pins=forced.expert_pins))
        return dataclasses.replace(c, experts=forced.experts, expert_pins=forced.expert_pins)

    def follow_ups(self, ctx: PlanContext, weighed: list[Priced]) -> list[Strategy]:
        """Under ``"auto"`` (or levers and ``"replicate"`` pins alone), every data and
        Megatron configuration priced, feasible (with ZeRO too: expert parallelism weighs
        its own levers, without it) or too big, at each expert degree; and the
        :data:`PIPELINES_AT` fastest pipelines (Megatron inside their stages; feasible
        first, then too big) at their layout, the microbatch count searched again."""
        if ctx.forced is not None or not moe_regions(ctx.model):
            return []
        pins = ctx.levers.expert_pins if ctx.levers is not None else ()

        def sized(p: Priced) -> bool:   # feasible, or rejected for memory alone
            return p.feasible or p.reason.startswith("needs")
        out = []
        for p in weighed:
            if p.family not in BASES or not sized(p):
                continue
            data = p.mesh.get(MeshAxis.DATA, 1)
            for degree in expert_degrees(ctx.model, data):
                out.append(Strategy(data, p.mesh.get(MeshAxis.TENSOR, 1), experts=degree, expert_pins=pins))

        def rank(p: Priced) -> tuple:
            return not p.feasible, p.step_s if p.step_s is not None else math.inf

        def wanted(p: Priced) -> bool:
            return p.family == "pipeline" and sized(p) and not p.config.mixed
        # the layouts the pipeline's bound cut, priced where one could be among the fastest
        weighed = fastest_in_full(ctx, [p for p in weighed if p.family == "pipeline"], ctx.peer("pipeline").price,
                                 wanted, rank, lambda floor: (False, floor), PIPELINES_AT)
        pipelines = sorted((p for p in weighed if wanted(p)), key=rank)
        for p in pipelines[:PIPELINES_AT]:
            data, tensor = p.mesh[MeshAxis.DATA], p.mesh[MeshAxis.TENSOR]
            for degree in expert_degrees(ctx.model, data):
                out.append(dataclasses.replace(p.config, data=data, tensor=tensor, microbatches=None, zero=None,
                                               recompute=None, experts=degree, expert_pins=pins))
        return out

    def price(self, ctx: PlanContext, config: Strategy) -> Priced:
        base_config = config.base()
        family = _base_family(ctx, base_config)
        if ctx.levers is not None and ctx.levers.zero:
            why = "ZeRO with expert parallelism is not in this version (the experts' weights are not row-sharded)"
            if ctx.forced is not None:
                raise PlanError(f"strategy: {why}; drop 'zero' or 'experts'")
            return rejected(self.name, config, _mesh_of(base_config), why, form=experts_form("", config.experts))
        if base_config.pipeline > 1:
            return self._price_pipeline(ctx, config, family)
        return self._price_mesh(ctx, config, family)

    def _choose(self, ctx: PlanContext, config: Strategy, choices: dict, data: int, tensor: int,
                every: str | None = None) -> list[tuple[LayerFigures, bool, str]]:
        """Each MoE region's figures under the degree, whether it takes it, and why;
        ``every``: each region the pins leave takes it, for that reason (a pipeline's
        stages; a base that does not fit in memory)."""
        out = []
        for r in moe_regions(ctx.model):
            pin = _pinned(config, r)
            chains = [choices[c] for c in r.details.get("chains", [r.details["chain"]]) if c in choices]
            if not chains:
                continue
            f = layer_figures(ctx.model, ctx.hw, r, chains, config.experts, data, tensor)
            if r.details["experts"] % config.experts:
                out.append((f, False, f"{r.details['experts']} experts not divisible by {config.experts}"))
            elif pin is not None:
                out.append((f, pin > 1, "pinned"))
            elif ctx.forced is not None or every:
                out.append((f, True, "forced: every MoE region" if ctx.forced is not None else every))
            else:
                out.append((f, f.step_s < f.base_s, "cheapest predicted step time"))
        return out

    def _price_mesh(self, ctx: PlanContext, config: Strategy, family) -> Priced:
        """A data × tensor configuration with expert parallelism: the base's region table
        on the whole batch (before its memory levers), each MoE region's choice, then the
        memory levers weighed on the configuration with its experts spread
        (:func:`autopar.strategies.shared.levers.weigh`, without ZeRO): the base may need
        more memory than the device has, which the experts' ``(1 − 1/P)`` saving and the
        levers may bring within it."""
        model, hw = ctx.model, ctx.hw
        base_config = config.base()
        data, tensor = base_config.data, base_config.tensor
        mesh = {MeshAxis.DATA: data, MeshAxis.TENSOR: tensor}
        form = experts_form("", config.experts)
        if data % config.experts:
            return rejected(self.name, config, mesh, f"expert degree {config.experts} does not divide data {data}",
                            form=form)
        base_ctx = dataclasses.replace(ctx, forced=base_config if ctx.forced is not None else None)
        whole = family.table(base_ctx, base_config)
        if isinstance(whole, Priced):   # the batch does not divide, or nothing splits
            return rejected(self.name, config, mesh, whole.reason, form=form)
        over = too_big(whole.total.memory_bytes, hw)
        picked = self._choose(ctx, config, {c.region: c for c in whole.regions}, data, tensor,
                              every=f"the base {over}: every MoE region expert-parallel" if over else None)
        taken = {f.region for f, take, _ in picked if take}
        if not taken:   # the base configuration's plan again: not listed twice
            return dataclasses.replace(rejected(self.name, config, mesh, "no MoE region is cheaper with expert "
                                                "parallelism", form=form), listed=False)
        split = any(c.strategy == "megatron" for c in whole.regions)

        def at(m: int) -> RegionTable:   # one of m microbatches, its MoE regions expert-parallel
            one = whole if m == 1 else price_mesh(model, hw, data * m, tensor, split,
                                                  sequence=sequence_choice(ctx, tensor, model.batch // (data * m)))
            return self._experts_table(ctx, config, one, taken, data, tensor, m)

        layers = [f for f, take, _ in picked if take]
        space = levers.LeverSpace(
            rows=model.batch // data, data=data, split=tensor, at=at,
            data_comm=lambda one, z, m, compute: experts_data_comm(one.param_elems, layers, data, tensor, compute, hw),
            zero_stages=(0,), accumulate=not batch_norms(model))
        table, levered = levers.weigh(ctx, config, at(1), space)
        figures = dict(step_s=table.step_s, memory_bytes=table.total.memory_bytes, comm_s=dict(table.total.comm_s),
                       form=form)
        why = too_big(table.total.memory_bytes, hw, table.note)
        if why is not None:
            return rejected(self.name, levered, mesh, why, **figures)
        base = Priced(family.name, levered.base(), mesh, table.step_s, table.total.memory_bytes, True,
                      comm_s=dict(table.total.comm_s), table=table)
        return Priced(self.name, levered, mesh, feasible=True, table=table, detail={"base": base, "layers": picked},
                      **figures)

    def _experts_table(self, ctx: PlanContext, config: Strategy, one: RegionTable, taken: set, data: int,
                       tensor: int, m: int) -> RegionTable:
        """``one`` (the base's table of one of ``m`` microbatches) with the MoE regions
        ``taken`` expert-parallel: their chains' compute and communication replaced by
        the layer's, the experts' parameters spread, the data all-reduce re-priced
        (:func:`experts_data_comm`)."""
        choices = {c.region: c for c in one.regions}
        compute, comm = one.total.compute_s, dict(one.total.comm_s)
        params, saved, layers = one.param_elems, 0.0, []
        for r in moe_regions(ctx.model):
            chains = [choices[c] for c in r.details.get("chains", [r.details["chain"]]) if c in choices]
            if r.id not in taken or not chains:
                continue
            f = layer_figures(ctx.model, ctx.hw, r, chains, config.experts, data, tensor, m)
            for old in chains:
                compute -= old.cost.compute_s
                for k, v in old.cost.comm_s.items():
                    comm[k] = comm.get(k, 0.0) - v
            compute += f.compute_s
            comm[MeshAxis.TENSOR] = comm.get(MeshAxis.TENSOR, 0.0) + f.tensor_s
            comm[MeshAxis.EXPERTS] = comm.get(MeshAxis.EXPERTS, 0.0) + f.all_to_all_s
            params += f.params_after - f.params_before
            saved += f.params_before - f.params_after
            layers.append(f)
        comm[MeshAxis.DATA] = experts_data_comm(params, layers, data, tensor, compute, ctx.hw)
        memory = one.total.memory_bytes - cost_model.training_memory(saved, 0)
        return dataclasses.replace(one, total=Cost(compute, comm, memory), step_s=compute + sum(comm.values()),
                                   param_elems=params)

    def _price_pipeline(self, ctx: PlanContext, config: Strategy, family) -> Priced:
        """A pipeline's stages with their MoE regions expert-parallel: the base layout
        priced without ZeRO (which expert parallelism does not run with), its microbatch
        count and recomputation searched with the experts' memory saving counted; the
        base schedule's step plus each layer's all-to-alls, lengthened as the schedule
        lengthens a stage's work (``(m + p − 1)/m`` of a stage's share, megatron §2.2)."""
        model = ctx.model
        base_config = config.base()
        form = experts_form(family.pipeline_label(base_config), config.experts)
        try:
            p, data, tensor, shape, _ = family.pipeline_layout(model, ctx.world, base_config)
        except PlanError as e:
            if ctx.forced is not None:
                raise
            return rejected(self.name, config, family.pipeline_mesh(base_config), str(e), form=form)
        mesh = {MeshAxis.PIPELINE: p, MeshAxis.DATA: data, MeshAxis.TENSOR: tensor}
        if data % config.experts:
            return rejected(self.name, config, mesh, f"expert degree {config.experts} does not divide data {data}",
                            form=form)
        choices = {c.region: c for c in price_mesh(model, ctx.hw, data, tensor, True, shape.keep_whole).regions}
        picked = self._choose(ctx, config, choices, data, tensor, every="in a pipeline stage")
        taken = [f for f, take, _ in picked if take]
        if not taken:   # every region pinned whole: the base pipeline's plan again, not listed twice
            return dataclasses.replace(rejected(self.name, config, mesh, "no MoE region is expert-parallel",
                                                form=form), listed=False)
        saved = cost_model.training_memory(sum(f.params_before - f.params_after for f in taken) / p, 0)
        without_zero = dataclasses.replace(ctx.levers or Strategy(levers_only=True), zero=0)
        base_ctx = dataclasses.replace(ctx, forced=base_config if ctx.forced is not None else None,
                                       levers=without_zero)
        base = family.price(base_ctx, base_config, allowance=saved)
        if not base.feasible:
            memory = base.memory_bytes - saved if base.memory_bytes is not None else None
            why = too_big(memory, ctx.hw) if memory is not None else None
            return rejected(self.name, config, dict(base.mesh), why or base.reason, form=form, memory_bytes=memory)
        n = base.detail
        a2a = sum(f.all_to_all_s + f.tensor_s for f in taken) * (n.m + n.p - 1) / (n.m * n.p)
        comm = dict(base.comm_s)
        comm[MeshAxis.EXPERTS] = a2a
        detail = {"base": base, "layers": picked}
        return Priced(self.name, dataclasses.replace(config, microbatches=n.m), dict(base.mesh),
                      step_s=base.step_s + a2a, memory_bytes=base.memory_bytes - saved, feasible=True, comm_s=comm,
                      form=experts_form(base.form, config.experts), detail=detail, reason=base.reason)

    def to_plan(self, ctx: PlanContext, priced: Priced) -> Plan:
        config = priced.config
        base = priced.detail["base"]
        family = _base_family(ctx, config.base())
        base_ctx = dataclasses.replace(ctx, forced=config.base() if ctx.forced is not None else None)
        if priced.table is not None:   # its rows copied: the base's priced table stays as it was
            table = priced.table
            base = dataclasses.replace(base, table=dataclasses.replace(
                table, regions=[dataclasses.replace(c, cost=dataclasses.replace(c.cost, comm_s=dict(c.cost.comm_s)),
                                                    details=dict(c.details)) for c in table.regions]))
        plan_ = family.to_plan(base_ctx, base)
        plan_.experts = config.experts
        if config.base().pipeline > 1:   # the schedule's step and the all-to-alls (the search adds its fixed cost)
            plan_.step_s += priced.comm_s.get(MeshAxis.EXPERTS, 0.0)
            plan_.total = dataclasses.replace(plan_.total, comm_s=dict(priced.comm_s),
                                              memory_bytes=priced.memory_bytes)
        rows = {c.region: c for c in plan_.regions}
        found = {r.id: r for r in graph_regions(ctx.model.gm, "experts")}
        added = []
        for f, take, reason in priced.detail["layers"]:
            chains = [rows[c] for c in f.chains if c in rows]
            if not chains:
                continue
            stage = chains[0].details.get("stage")
            where = {"stage": stage} if stage is not None else {}
            alternatives = {"experts": f.step_s, chains[0].strategy: f.base_s}
            if take:
                for i, chain in enumerate(chains):   # the layer's figures on its first chain's row
                    chain.strategy = "experts"
                    chain.reason = f"expert parallel ({f.region})"
                    chain.cost = Cost(f.compute_s, {MeshAxis.TENSOR: f.tensor_s} if f.tensor_s else {},
                                      cost_model.training_memory(f.params_after, 0)) if i == 0 else Cost()
                    chain.details = {**where, "layer": f.region}
            groups = config.experts
            region = found[f.region].details
            form = {"form": "module_list", "modules": region["modules"]} if region.get("form") == "module_list" else {}
            details = {**where, **form, "degree": groups if take else 1, "experts": f.experts, "top_k": f.top_k,
                       "experts_per_rank": f.experts // groups if take else f.experts,
                       "placement": ([[e * (f.experts // groups), (e + 1) * (f.experts // groups)]
                                      for e in range(groups)] if take else []),
                       "tokens_per_rank": f.rows if take else 0.0,
                       "all_to_all_bytes": f.all_to_all_bytes if take else 0.0,
                       "all_to_all_s": f.all_to_all_s if take else 0.0,
                       "tensor_inside": take and plan_.degree(MeshAxis.TENSOR) > 1 and not form}
            added.append(RegionChoice(f.region, "experts", "experts" if take else "replicate",
                                      Cost(0.0, {MeshAxis.EXPERTS: f.all_to_all_s} if take else {}, 0.0),
                                      alternatives, reason if take else f"{reason}: the base plan's experts",
                                      details))
        plan_.regions = plan_.regions[:-1] + added + plan_.regions[-1:]
        return plan_

    # ------------------------------------------------------------------ the compile hooks
    @staticmethod
    def _layers(plan: Plan, stage: int | None = None) -> list[str]:
        return [r.region for r in plan.regions if r.kind == "experts" and r.strategy == "experts"
                and _in_stage(r, stage)]

    def planned_shards(self, plan: Plan, gm) -> dict:
        if plan.experts <= 1:
            return {}
        found = {r.id: r for r in graph_regions(gm, "experts")}
        shards = {}
        for rid in self._layers(plan):
            shards.update(expert_shards(gm, found[rid], plan.degree(MeshAxis.TENSOR) > 1))
        return shards

    def rank_passes(self, plan: Plan, build: RankBuild) -> list[RankPass]:
        if plan.experts <= 1 or build.branch_only:
            return []
        layers = self._layers(plan, build.stage)
        if not layers:
            return []
        return [RankPass(SPLIT, "expert_parallel", expert_parallel_regions_pass,
                         {"regions_": layers, "group": MeshAxis.EXPERTS,
                          "tensor": MeshAxis.TENSOR if plan.degree(MeshAxis.TENSOR) > 1 else None,
                          "place": plan.expert_coordinates(build.rank)[1], "degree": plan.experts})]

    def place(self, builder, build: RankBuild) -> None:
        plan = builder.plan
        if plan.experts <= 1:
            return
        weights = [name for name in builder.names() if isinstance(builder.placement(name).cut, ExpertShard)]
        place_experts(builder, weights)
        for r in plan.regions:
            if r.kind == "experts" and r.strategy == "experts" and r.details.get("form") == "module_list":
                place_modules(builder, r.details["modules"], plan.experts)

    def rank_runtime(self, plan: Plan, rank: int, options: dict) -> ExpertsRankRuntime:
        """The experts' load counter (``pm.expert_load()``)."""
        return ExpertsRankRuntime(plan)


__all__ = ["ExpertParallel", "check_forced", "expert_degrees", "moe_regions"]
