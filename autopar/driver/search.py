"""The planner: enumerate the families' configurations, price each, take the fastest that fits.

``plan_graph`` reads an analysed graph once (:class:`autopar.planning.model.ModelFacts`)
and asks every family of :data:`autopar.strategies.registry.FAMILIES` — pure data
parallelism, Megatron's data × tensor, D&SP/cSub, AxoNN's 3D/4D grids, Bian's cube,
PTD-P pipelines — for its candidate configurations on the world, through the
:class:`autopar.strategies.family.Family` protocol. It prices each (progress reported
per configuration), keeps every one in the plan's list of configurations weighed, and
returns the fastest feasible one's plan; ties go to the earlier configuration, so the
same inputs give the same plan. A forced strategy is offered by the one family it
belongs to, which checks it; when nothing is feasible, :class:`PlanError` counts the
rejections by kind and names the configuration closest to fitting.

This module knows no family by name: adding one is adding a package and its entry in
the registry. ``docs/planner.md`` describes what is searched and how it is priced.
"""
from __future__ import annotations

import bisect
import dataclasses
import math

import time
from typing import Any

import torch.fx as fx

from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.heap import held
from autopar.ir import CAPTURE, LOSS_TERMS, RANDOM_SITES, tensor_spec
from autopar.driver.conflicts import batch_conflict, random_conflict
from autopar.driver.breakdown import record as record_breakdown
from autopar.planning.explain import closest_to_fitting, rejections
from autopar.planning.model import ModelFacts
from autopar.planning.plan import MeshCandidate, Plan
from autopar.planning.declared import registered
from autopar.planning.strategy import PlanError, Strategy
from autopar.strategies.family import (Family, PlanContext, Priced, per_step_s, priced_in_full, rejected,
                                       with_per_step)
from autopar.strategies.registry import FAMILIES
from autopar.strategies.shared.batch_norms import check_batch_norms

__all__ = ["PlanError", "Progress", "Strategy", "plan_graph"]


class Progress:
    """Counts the configurations priced and reports, at most every ``every`` seconds once
    a search has run ``after`` seconds, ``report(done, total, elapsed)``."""

    def __init__(self, report, *, after: float = 1.0, every: float = 0.5):
        self.report, self.after, self.every = report, after, every
        self.total = self.done = 0
        self._start = self._last = time.perf_counter()

    def tick(self) -> None:
        self.done += 1
        now = time.perf_counter()
        if now - self._start >= self.after and (now - self._last >= self.every or self.done == self.total):
            self._last = now
            self.report(self.done, self.total, now - self._start)


def plan_graph(gm: fx.GraphModule, world_size: int, hw: Hardware, strategy: Any = "auto",
               *, model_name: str | None = None, progress: Progress | None = None) -> Plan:
    """Plan an analysed graph (captured at the global batch) for ``world_size`` ranks;
    ``progress`` hears of every configuration priced. The objects that exist when it
    starts are held out of the garbage collector's walks (:func:`autopar.heap.held`)."""
    with held():
        return _plan_graph(gm, world_size, hw, strategy, model_name, progress)


def _plan_graph(gm: fx.GraphModule, world_size: int, hw: Hardware, strategy: Any, model_name: str | None,
                progress: Progress | None) -> Plan:
    model = ModelFacts(gm, fusion=hw.fused_kernels)
    forced = Strategy.parse(strategy)
    levers = forced
    if forced is not None and forced.levers_only:  # the levers forced, every family weighed
        forced = None
    capture = gm.meta.get(CAPTURE)
    name = model_name or (capture.model_class if capture else type(gm).__name__)
    # ranks sharing a host's cores each get their share of it (Hardware.on_world)
    # (every registered family its peers: a family composing another asks for it by name)
    ctx = PlanContext(model, world_size, hw.on_world(world_size), forced, name, levers, peers=tuple(FAMILIES))
    plan_ = search(ctx, progress or Progress(lambda *a: None))
    _overheads(ctx, plan_)
    apply_levers(ctx, plan_)
    for family in FAMILIES:   # the plan-wide options each family settles on the winner
        family.finish_plan(ctx, plan_)
    plan_.fusion = hw.fused_kernels
    plan_.flops_per_step = training_flops(model, plan_.recompute)
    plan_.inputs, plan_.param_bytes = made_for(gm)
    return plan_


def training_flops(model: ModelFacts, recompute: bool) -> float:
    """The model's training FLOPs per step: its kernels' forward x3 (x4 recomputing)."""
    forward = sum(w.flops for w in model.work.values() if w.is_kernel)
    return float(forward * (4 if recompute else 3))


def made_for(gm: fx.GraphModule) -> tuple[list, float]:
    """What a plan is made for: each graph input's ``[name, shape, dtype]`` (shape and
    dtype None for a non-tensor), sorted by name (keyword inputs in another order are the
    same call), and the parameters' bytes (:mod:`autopar.planning.reviewed`)."""
    inputs = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            spec = tensor_spec(node)
            inputs.append([node.name, None, None] if spec is None else
                          [node.name, list(spec.shape), str(spec.dtype).replace("torch.", "")])
    inputs.sort(key=lambda item: item[0])
    params = sum(p.numel() * p.element_size() for p in gm.parameters())
    return inputs, float(params)


def search(ctx: PlanContext, progress: Progress, families: tuple[Family, ...] = FAMILIES) -> Plan:
    """Every family's configurations priced; the plan of the fastest feasible one."""
    offered = [(family, c) for family in families for c in family.candidates(ctx)]
    # rejected without pricing: listed first; the families a lower bound cuts short are
    # priced after the others (the best so far then bounds them), listed in their place
    weighed: list[tuple[int, Priced]] = [(i - len(offered), c) for i, (_, c) in enumerate(offered)
                                         if isinstance(c, Priced)]
    to_price = sorted(((i, family, c) for i, (family, c) in enumerate(offered) if not isinstance(c, Priced)),
                      key=lambda x: (getattr(x[1], "priced_late", False), _floor(x[1], ctx, x[2]), x[0]))
    progress.total = len(to_price)
    best: tuple[Family, Priced] | None = None
    family_of: dict[int, Family] = {}

    def weigh(triples):
        nonlocal best
        for index, family, config in triples:
            progress.tick()
            priced = family.price(ctx, config)
            if not priced.listed:
                continue
            priced = with_per_step(ctx, priced)
            if registered(family.name):   # a registered family's rows carry its name
                priced = dataclasses.replace(priced, form=family.name)
            why = lever_conflict(ctx, priced) or batch_conflict(ctx, priced) or random_conflict(ctx, priced)
            if why is not None:
                if ctx.forced is not None:
                    raise PlanError(f"strategy: {why}")
                priced = rejected(priced.family, priced.config, priced.mesh, why, form=priced.form)
            weighed.append((index, priced))
            family_of[index] = family
            if priced.feasible and (best is None or priced.step_s < best[1].step_s):
                best = (family, priced)
                ctx.best_s[0] = priced.step_s  # the best so far, which bounds the families priced late

    weigh(to_price)
    # a second round: configurations a family derives from what the first priced
    # (pipelines of mixed stages at the fastest pipeline layouts)
    weighed.sort(key=lambda x: x[0])
    first_round = [p for _, p in weighed]
    follow = [(len(offered) + i, family, c) for i, (family, c) in
              enumerate((family, c) for family in families for c in family.follow_ups(ctx, first_round))]
    progress.total += len(follow)
    weigh(follow)
    if best is None:  # the last resort: replication, when every split was refused
        start = len(offered) + len(follow)
        weigh([(start + i, family, c) for i, (family, c) in
               enumerate((family, c) for family in families for c in family.fallbacks(ctx))])
    weighed.sort(key=lambda x: x[0])
    _price_cut(ctx, weighed, family_of)
    candidates = [p.candidate() for _, p in weighed]
    if best is None:
        if not candidates and ctx.forced is not None:
            raise PlanError(f"strategy: no family offered a configuration of the forced strategy "
                            f"({ctx.forced.kind()}) for {ctx.name} on {ctx.world} ranks")
        raise PlanError(_no_plan_message(ctx.name, ctx.world, candidates))
    best = _winner(weighed, family_of)
    plan_ = best[0].to_plan(ctx, best[1])
    if registered(best[0].name):   # a registered family's plan names it
        plan_.family, plan_.family_options = best[0].name, best[1].config.options()
    plan_.batch_couplings = [c.to_json() for c in ctx.model.batch_couplings]
    plan_.loss_terms = [list(t) for t in ctx.model.gm.meta.get(LOSS_TERMS, [])]
    plan_.random_sites = [dict(site) for site in ctx.model.gm.meta.get(RANDOM_SITES, [])]
    plan_._priced = best  # the winner, for _overheads (not saved)
    fixed = per_step_s(ctx, best[1].mesh, best[1].config)
    plan_.step_s += fixed
    if fixed > ctx.hw.step_overhead_s:  # the targets' count, the batch group's communication
        comm = dict(plan_.total.comm_s)
        comm["data"] = comm.get("data", 0.0) + fixed - ctx.hw.step_overhead_s
        plan_.total = dataclasses.replace(plan_.total, comm_s=comm)
    plan_.step_overhead_s = ctx.hw.step_overhead_s
    record_breakdown(plan_, best[1], max(fixed - ctx.hw.step_overhead_s, 0.0), ctx.model.largest_params,
                     ctx.model.counts_targets)
    plan_.forced = ctx.forced is not None
    plan_.candidates = candidates
    return plan_


def _floor(family: Family, ctx: PlanContext, config) -> float:
    """The family's lower bound on ``config``'s step (0 where it has none)."""
    bound = getattr(family, "step_floor", None)
    return bound(ctx, config) if bound is not None else 0.0


SHOWN = 5  # the fastest configurations explain.top lists by default


def _price_cut(ctx: PlanContext, weighed: list, family_of: dict) -> None:
    """The configurations a family's bound cut, priced in full (in place in ``weighed``)
    wherever one could be among the :data:`SHOWN` fastest of all or be its family's
    fastest: what ``explain``'s ``top`` and ``why_not`` read is then the search's without
    the cut. None of them can win (each bound exceeded the best so far)."""
    cut = sorted((k for k, (_, p) in enumerate(weighed) if p.bound_s is not None), key=lambda k: weighed[k][1].bound_s)
    if not cut:
        return
    steps = sorted(p.step_s for _, p in weighed if p.feasible)   # kept current as rows are priced
    family_best: dict[str, float] = {}
    for _, p in weighed:
        if p.feasible:
            family_best[p.family] = min(family_best.get(p.family, math.inf), p.step_s)
    for k in cut:
        index, row = weighed[k]
        shown = steps[SHOWN - 1] if len(steps) >= SHOWN else math.inf
        if row.bound_s > max(shown, family_best.get(row.family, math.inf)) * (1 + 1e-9):
            continue
        again = priced_in_full(ctx, family_of[index].price, row.config)
        weighed[k] = (index, again)
        if again.feasible:
            bisect.insort(steps, again.step_s)
            family_best[row.family] = min(family_best.get(row.family, math.inf), again.step_s)


def _winner(weighed: list, family_of: dict) -> tuple[Family, Priced]:
    """The fastest feasible configuration in the order they are listed: each one faster
    than the one before by more than 1e-9 of its step takes its place (a tie goes to the
    configuration listed first, whatever order they were priced in)."""
    best = None
    for index, priced in weighed:
        if priced.feasible and (best is None or priced.step_s < best[1].step_s * (1 - 1e-9)):
            best = (family_of[index], priced)
    return best


def _overheads(ctx: PlanContext, plan_: Plan) -> None:
    """The host overheads' part of the plan's prediction (the hardware's overhead terms,
    docs/planner.md "Overheads"): the winning configuration priced again with those terms
    at 0 (:meth:`Hardware.without_overheads`); each region's ``cost.overhead_s`` is its
    compute and communication less the re-priced region's, the plan's ``overhead_s`` its
    step less the re-priced step (the runner's fixed cost included). Left at 0 where the
    hardware has no overhead terms, and where the re-pricing chose differently (levers
    weighed again), which is said in the plan's ``overhead_s`` staying 0."""
    best = getattr(plan_, "_priced", None)
    bare = ctx.hw.without_overheads()
    if best is None or bare == ctx.hw:
        return
    family, priced = best
    bare_ctx = dataclasses.replace(ctx, hw=bare, best_s=[math.inf])
    again = family.price(bare_ctx, priced.config)
    if not again.feasible or again.mesh != priced.mesh:
        return
    plan0 = family.to_plan(bare_ctx, again)
    plan0.step_s += per_step_s(bare_ctx, again.mesh, again.config)
    same = (plan0.microbatches, plan0.zero, plan0.recompute, plan0.selective_recompute, plan0.pipeline.get(
        "microbatches")) == (plan_.microbatches, plan_.zero, plan_.recompute, plan_.selective_recompute,
                            plan_.pipeline.get("microbatches"))
    if not same or [r.region for r in plan0.regions] != [r.region for r in plan_.regions]:
        return
    for r, r0 in zip(plan_.regions, plan0.regions):
        seconds, bare_s = r.cost.compute_s + r.cost.total_comm_s, r0.cost.compute_s + r0.cost.total_comm_s
        r.cost.overhead_s = max(0.0, seconds - bare_s)
    plan_.total.overhead_s = sum(r.cost.overhead_s for r in plan_.regions)
    plan_.overhead_s = max(0.0, plan_.step_s - plan0.step_s)


def lever_conflict(ctx: PlanContext, priced: Priced) -> str | None:
    """Why the forced levers cannot ride on a configuration (None: they can): ZeRO needs
    data ranks to shard over, in one group of equal programs; sequence parallelism a
    tensor group of Megatron regions."""
    levers = ctx.levers
    if levers is not None and levers.sequence_parallel and (
            priced.mesh.get("tensor", 1) < 2 or priced.config.mixed or priced.config.grid is not None):
        return (f"sequence_parallel=True runs over a tensor group of data, tensor, pipeline and expert plans, "
                f"and {priced.mesh} {'is a mixed or 3D plan' if priced.mesh.get('tensor', 1) > 1 else 'has none'}")
    if levers is not None and levers.sequence_parallel and getattr(priced.table, "sequence", None) is False:
        t = priced.mesh.get("tensor", 1)
        return (f"sequence_parallel=True: no token dimension of the split regions' outputs is divisible by the tensor "
                f"degree {t} at the rows of each rank of {priced.mesh}; give a sequence length (or rows per rank) "
                f"divisible by {t}, or drop 'sequence_parallel'")
    if levers is None or not levers.zero:
        return None
    mesh, c = priced.mesh, priced.config
    if mesh.get("data", 1) * mesh.get("context", 1) < 2:
        return (f"zero={levers.zero} shards over the data ranks (and the context ranks), and {mesh} has "
                f"{mesh.get('data', 1)}; give 'data': d with d > 1, or drop 'zero'")
    if c.subgrids > 1 or (c.grid is not None and not c.mixed):   # (the cube's grid too)
        return (f"zero={levers.zero} with D&SP sub-grids or a whole-model 3D grid is not in this version (their "
                f"data groups do not run equal programs); use zero with data, tensor, mixed or pipeline plans")
    return None


def apply_levers(ctx: PlanContext, plan_: Plan) -> None:
    """The forced memory levers on the plan (docs/memory.md), checked against it: the
    microbatches must divide each data rank's rows, ZeRO needs data ranks to shard over."""
    levers = ctx.levers
    if levers is None:
        return
    if levers.microbatches is not None and not plan_.pipeline:
        m, parts = levers.microbatches, plan_.batch_parts()
        rows = ctx.model.batch // parts if parts else 0
        if rows % m:
            raise PlanError(f"strategy: microbatches={m} does not divide the {rows} rows of each data rank (batch "
                            f"{ctx.model.batch} over {parts} data ranks); give a number of microbatches that "
                            f"divides {rows}, or a batch that is a multiple of {m * parts}")
        if m > 1:
            check_batch_norms(ctx.model, f"microbatches={m} accumulates gradients over parts of the batch")
        plan_.microbatches = m
    if levers.zero:
        plan_.zero = levers.zero
    if levers.recompute is not None:
        plan_.recompute = levers.recompute == "full"
        plan_.selective_recompute = levers.recompute == "selective"


def _no_plan_message(name: str, world: int, candidates: list[MeshCandidate]) -> str:
    """Why nothing fits, short enough to read with thousands of candidates: the reasons
    counted, the configuration closest to fitting, and what to change."""
    if len(candidates) <= 8:
        reasons = "; ".join(f"{c.mesh}: {c.reason}" for c in candidates)
        return f"no feasible plan for {name} on {world} ranks: {reasons}"
    closest = closest_to_fitting(candidates)
    near = f"; the closest: {closest.mesh}{' ' + closest.form if closest.form else ''} {closest.reason}" \
        if closest is not None else ""
    return (f"no feasible plan for {name} on {world} ranks: all {len(candidates)} configurations rejected: "
            f"{rejections(candidates)}{near}. Give more ranks, a device with more memory (memory_limit / "
            f"--memory-limit), or a smaller batch")
