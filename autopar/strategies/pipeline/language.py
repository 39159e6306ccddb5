"""PTD-P's declaration to the generic layers (:mod:`autopar.planning.declared`): the keys
``pipeline``, ``schedule``, ``chunks``, ``scatter_gather`` (with ``data``, ``tensor``, an
``x × y × 1`` grid and region pins), the ``pipeline`` axis and its tied-weight groups;
in the explanation its rank layout's note, its section (:mod:`.text`) and its
configurations; in the report its timeline."""
from __future__ import annotations

from autopar.grid import Grid3D, GroupSpec, MeshAxis
from autopar.planning.declared import Language
from autopar.planning.explain import PLACES, mesh_text
from autopar.planning.schedules import SCHEDULES, ScheduleError, check_chunks
from autopar.planning.strategy import PlanError, Strategy, parse_pins
from autopar.runtime.groups import tied_group_name
from autopar.strategies.pipeline.text import pipeline_text
from autopar.strategies.shared.forms import mixed_form

PIPELINE_KEYS = ("schedule", "chunks", "scatter_gather")
"""The keys that set up a pipeline beside ``pipeline`` itself."""


class PipelineLanguage(Language):
    name = "pipeline"
    kind = "pipeline"
    built_in = True
    precedence = 70
    keys = ("pipeline", *PIPELINE_KEYS)
    trigger = frozenset({"pipeline"})
    aliases = ("ptd-p",)
    axes = (MeshAxis.PIPELINE,)
    absent = "the model has no repeated blocks to cut between stages, or a strategy was forced"
    colours = (("pipeline", "#888888"),)

    def stray(self, strategy: dict) -> str | None:
        stray = set(strategy) & set(PIPELINE_KEYS)
        if not stray:
            return None
        return f"strategy: {sorted(stray)} set up a pipeline; add 'pipeline': p (the number of pipeline ranks)"

    def parse(self, strategy: dict) -> Strategy:
        """``{"pipeline": p, "microbatches": m, "schedule": "1f1b", "chunks": v, "data": d,
        "tensor": t, "scatter_gather": True}``: PTD-P (megatron §2-§4), Megatron inside
        the stages; with ``"regions": {PATTERN: SPEC}`` the stages' regions pinned as in
        a mixed plan, the rest chosen per region; with ``"x", "y", "z": 1`` the tensor
        group of every stage an ``x × y × 1`` 3D grid (the 3D regions split on it)."""
        unknown = set(strategy) - {"pipeline", "data", "tensor", "regions", "x", "y", "z"} - set(PIPELINE_KEYS)
        if unknown:
            raise PlanError(f"strategy: a pipeline combines with 'data', 'tensor', a 3D grid 'x', 'y', 'z' and "
                            f"region pins 'regions' in this version, not {sorted(unknown)}; drop them")
        name = strategy.get("schedule")
        p = int(strategy["pipeline"])
        v = int(strategy.get("chunks", 2 if name in ("interleaved", "interleaved-zb", "zbv") else 1))
        m = strategy.get("microbatches")
        if p < 2 or v < 1 or (m is not None and int(m) < 1):
            raise PlanError(f"strategy: pipeline={p}, chunks={v}, microbatches={m}: a pipeline needs at least 2 "
                            f"ranks, and chunks and microbatches at least 1")
        if name is not None and name not in SCHEDULES:
            raise PlanError(f"strategy: unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}, or leave "
                            f"it out for the planner to choose")
        try:
            if name is not None:
                check_chunks(name, v)
        except ScheduleError as e:
            raise PlanError(f"strategy: {e}") from None
        pins, grid = parse_pins(strategy["regions"]) if "regions" in strategy else ((), None)
        if grid is not None and grid.z != 1:
            raise PlanError(f"strategy['regions']: the pinned 3D grid {grid.x}x{grid.y}x{grid.z} splits its regions' "
                            f"rows over z, which pipeline stages do not in this version (their rows are split over "
                            f"data only); pin {{'tensor3d': {{'x': gx, 'y': gy}}}} (z = 1)")
        tensor = strategy.get("tensor")
        if set(strategy) & {"x", "y", "z"}:
            x, y, z = (int(strategy.get(a, 1)) for a in ("x", "y", "z"))
            if z != 1 or x < 1 or y < 1 or x * y < 2:
                raise PlanError(f"strategy: a 3D grid inside pipeline stages is x × y × 1 with x·y ≥ 2 (the rows "
                                f"are split over data only) in this version, got x={x}, y={y}, z={z}")
            if grid is not None and (grid.x, grid.y) != (x, y):
                raise PlanError(f"strategy: the grid x={x}, y={y} and the pinned 3D grid {grid.x}x{grid.y}x1 differ")
            if tensor is not None and int(tensor) != x * y:
                raise PlanError(f"strategy: tensor={tensor} is not the 3D grid's x·y = {x * y}; drop 'tensor'")
            grid, tensor = Grid3D(x, y, 1), x * y
        if grid is not None and tensor is None:
            tensor = grid.x * grid.y
        return Strategy(strategy.get("data"), None if tensor is None else int(tensor), pipeline=p, chunks=v,
                        microbatches=None if m is None else int(m), schedule=name,
                        scatter_gather=bool(strategy.get("scatter_gather", True)), grid=grid,
                        mixed=bool(pins) or grid is not None, regions=pins)

    def is_kind(self, strategy) -> bool:
        return strategy.pipeline > 1

    def owns(self, candidate) -> bool:
        return candidate.form.startswith(self.name)

    def refine_groups(self, plan, specs: dict, tied: tuple) -> dict:
        """``pipeline``, and a ``tied:<positions>`` group per set of pipeline positions in
        ``tied`` that share a weight."""
        if not plan.pipeline:
            return specs
        pipeline = MeshAxis.PIPELINE
        return {**specs, pipeline: GroupSpec((pipeline,)), MeshAxis.SEGMENT: None, MeshAxis.SUBGRID: None,
                **{tied_group_name(p): GroupSpec((pipeline,), (pipeline, tuple(p)))
                   for p in sorted({tuple(sorted(h)) for h in tied if len(h) > 1})}}

    def form(self, plan) -> str | None:
        if not plan.pipeline:
            return None
        v = plan.pipeline["chunks"]
        return (f"pipeline {plan.pipeline['schedule']}" + (f" v={v}" if v > 1 else "")
                + (f", {mixed_form(plan.tensor_grid, plan.tensor_subgrids)}" if plan.mixed else ""))

    def rank_note(self, plan) -> str | None:
        return ", pipeline outermost" if plan.pipeline else None

    def sections(self, plan) -> list[tuple[int, list[str]]]:
        return [(PLACES["pipeline"], ["", *pipeline_text(plan)])] if plan.pipeline else []

    def candidate_text(self, candidate) -> str | None:
        if not candidate.form.startswith(self.name):
            return None
        return (mesh_text(candidate.mesh) + f", {candidate.form}"
                + (f", {candidate.reason}" if candidate.feasible and candidate.reason else ""))

    def report(self, plan) -> str:
        return f"<h2>Pipeline timeline</h2>{plan.timeline().svg()}" if plan.pipeline else ""


LANGUAGE = PipelineLanguage()
