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

import time
from typing import Any

import torch.fx as fx

from autopar.cost.hardware import Hardware
from autopar.ir import CAPTURE
from autopar.planning.explain import closest_to_fitting, rejections
from autopar.planning.model import ModelFacts
from autopar.planning.plan import MeshCandidate, Plan
from autopar.planning.strategy import PlanError, Strategy
from autopar.strategies.family import Family, PlanContext, Priced
from autopar.strategies.registry import FAMILIES

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
    ``progress`` hears of every configuration priced."""
    model = ModelFacts(gm, fusion=hw.fused_kernels)
    forced = Strategy.parse(strategy)
    capture = gm.meta.get(CAPTURE)
    name = model_name or (capture.model_class if capture else type(gm).__name__)
    plan_ = search(PlanContext(model, world_size, hw, forced, name), progress or Progress(lambda *a: None))
    plan_.fusion = hw.fused_kernels
    forward = sum(w.flops for w in model.work.values() if w.is_kernel)
    plan_.flops_per_step = float(forward * (4 if plan_.recompute else 3))
    return plan_


def search(ctx: PlanContext, progress: Progress, families: tuple[Family, ...] = FAMILIES) -> Plan:
    """Every family's configurations priced; the plan of the fastest feasible one."""
    offered = [(family, c) for family in families for c in family.candidates(ctx)]
    weighed = [c for _, c in offered if isinstance(c, Priced)]  # rejected without pricing: listed first
    to_price = [(family, c) for family, c in offered if not isinstance(c, Priced)]
    progress.total = len(to_price)
    best: tuple[Family, Priced] | None = None

    def weigh(pairs):
        nonlocal best
        for family, config in pairs:
            progress.tick()
            priced = family.price(ctx, config)
            if not priced.listed:
                continue
            weighed.append(priced)
            if priced.feasible and (best is None or priced.step_s < best[1].step_s * (1 - 1e-9)):
                best = (family, priced)

    weigh(to_price)
    # a second round: configurations a family derives from what the first priced
    # (pipelines of mixed stages at the fastest pipeline layouts)
    follow = [(family, c) for family in families for c in family.follow_ups(ctx, weighed)]
    progress.total += len(follow)
    weigh(follow)
    candidates = [p.candidate() for p in weighed]
    if best is None:
        raise PlanError(_no_plan_message(ctx.name, ctx.world, candidates))
    plan_ = best[0].to_plan(ctx, best[1])
    plan_.forced = ctx.forced is not None
    plan_.candidates = candidates
    return plan_


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
