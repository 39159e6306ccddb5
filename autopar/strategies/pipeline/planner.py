"""Planning PTD-P (megatron §2-§4): ``pipeline × data × tensor``, Megatron inside each stage.

A configuration is a pipeline degree ``p`` (stages on ``p`` ranks, ``v`` chunks per rank
with the interleaved schedule), ``data × tensor`` inside, a schedule (GPipe, 1F1B,
interleaved 1F1B), a microbatch count ``m`` and whether the blocks recompute their
activations (megatron §3.5). The graph is cut between repeated blocks, balanced by FLOPs
(:func:`autopar.strategies.pipeline.stages.partition`); what no degree changes (the
cut, the carried bytes, each stage's regions grouped by class) is found once per stage
count (:class:`~autopar.strategies.pipeline.shape.PipelineShape`). Per configuration (:func:`pipeline_numbers`):

    per stage, seconds per microbatch of ``B/(d·m)`` rows: each region priced once per
    class, split Megatron-style where the tensor degree divides (2 all-reduces of its
    boundary, 3 recomputing, megatron §2.3) — a tied embedding/head stays whole —,
    plus the nodes outside regions
  + point-to-point sends of the carried activations: ``m/β + α`` of ``b·s·h``, ``/t``
    plus an all-gather over the tensor group with scatter/gather (megatron §4.1)
  → the step ``m·t + (p−1)·t/v`` of the slowest rank's ``t`` (megatron §2.2,
    :func:`autopar.strategies.pipeline.cost.step_time`), plus the data all-reduce after
    the last microbatch and the tied weights' all-reduce;
    memory per rank: 16 bytes per parameter held plus the activations in flight per
    schedule (:func:`autopar.strategies.pipeline.cost.activation_memory`).

The microbatch count is the given one, or the fastest (every divisor of the per-data-rank
batch; multiples of ``p`` interleaved, megatron eq (1)) that fits without recomputation,
else the fastest that fits recomputing (:func:`search_pipeline`). ``"auto"`` weighs every
``p > 1`` dividing the world with at most as many blocks, every ``data × tensor`` of the
rest, 1F1B and (with ``2p`` blocks) interleaved with ``v = 2`` (:func:`pipeline_options`);
never for a model with batch-normalising batch norms.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import asdict, dataclass

from autopar.cost.hardware import Hardware
from autopar.grid import MeshAxis
from autopar.ir import CAPTURE
from autopar.planning.model import ModelFacts
from autopar.planning.plan import Cost, Plan
from autopar.planning.schedules import SPLIT_BACKWARD, rank_of
from autopar.planning.strategy import PlanError, Strategy, divisors
from autopar.strategies.family import CompileHooks, PlanContext, Priced, RankBuild, fastest_in_full, rejected, too_big
from autopar.strategies.shared.forms import mixed_form
from autopar.strategies.shared.mesh import check_forced_batch, check_forced_sizes, price_mesh, sequence_splits
from autopar.strategies.shared.branches import widest_branching
from autopar.strategies.shared.grid3d.pricing import tensor_grids
from autopar.strategies.pipeline import cost as pipeline_cost
from autopar.strategies.pipeline import layout as parameter_layout
from autopar.strategies.pipeline.bound import cut, step_floor
from autopar.strategies.pipeline.numbers import PipelineLayout, PipelineNumbers, pipeline_numbers, with_zero
from autopar.strategies.pipeline.program import PipelineRankRuntime, pipeline_rank_code
from autopar.strategies.pipeline.shape import PipelineShape, pipeline_shape
from autopar.strategies.pipeline.stages import blocks_of
from autopar.strategies.shared.batch_norms import batch_norms, check_batch_norms

log = logging.getLogger("autopar.planning")

MIXED_AT = 3  # "auto" weighs pipelines of mixed stages at this many of the fastest pipeline layouts


def pipeline_options(model: ModelFacts, world: int) -> list[Strategy]:
    """The pipeline layouts ``"auto"`` weighs: p > 1 dividing the world and at most the
    number of blocks, every data x tensor of the rest, one chunk per rank (1F1B or
    ZB-H1) and, where there are 2p blocks, two (interleaved 1F1B, interleaved zero-bubble
    or ZB-V; :func:`schedules_weighed`)."""
    if batch_norms(model):  # microbatches would normalise over fewer rows
        return []
    blocks = len(blocks_of(model.gm))
    out = []
    for p in divisors(world):
        if p < 2 or p > blocks:
            continue
        for t in divisors(world // p):
            out.append(Strategy(world // p // t, t, pipeline=p))
            if 2 * p <= blocks:
                out.append(Strategy(world // p // t, t, pipeline=p, chunks=2))
    return out


def pipeline_mesh(layout: "Strategy | PipelineNumbers") -> dict[str, int]:
    """The mesh of a pipeline configuration (its degrees resolved) or of its priced figures."""
    if isinstance(layout, Strategy):
        return {MeshAxis.PIPELINE: layout.pipeline, MeshAxis.DATA: layout.data, MeshAxis.TENSOR: layout.tensor}
    return {MeshAxis.PIPELINE: layout.p, MeshAxis.DATA: layout.data, MeshAxis.TENSOR: layout.tensor}


def pipeline_label(option: Strategy, tensor_grid: dict | None = None, schedule: str | None = None) -> str:
    """A configuration's form, as :attr:`Plan.form` reads: its schedule (``schedule``:
    the one priced; else the configuration's, or those it weighs), and for stages of
    mixed plans their form (``tensor_grid``: the grid its 3D regions use, None: the
    configuration's; its D&SP sub-grids)."""
    name = schedule or "/".join(schedules_weighed(option))
    label = f"pipeline {name}" + (f" v={option.chunks}" if option.chunks > 1 else "")
    if option.mixed:
        if tensor_grid is None:
            tensor_grid = {MeshAxis.X: option.grid.x, MeshAxis.Y: option.grid.y} if option.grid is not None else {}
        label += ", " + mixed_form(tensor_grid, option.tensor_subgrids)
    return label


@dataclass(frozen=True)
class PipelineDetails:
    """What a pipeline plan records of its pipeline (``Plan.pipeline``, as a dict: the
    runtime and the plan JSON read it by key)."""

    stages: int
    chunks: int
    microbatches: int
    microbatch_size: int
    schedule: str
    scatter_gather: bool
    recompute: bool
    blocks: list[str]
    assignment: list[int]
    bubble_fraction: float
    bubble_s: float
    stage_s: list[float]
    p2p_bytes: list[float]
    rank_s: list[float]
    in_flight: list[list[int]]
    memory_bytes: list[float]
    memory_bytes_recompute: list[float]
    tied: list[str]
    stage_ranks: list[int] = dataclasses.field(default_factory=list)  # the pipeline rank of each stage
    bubble_rule: str = "(p-1)/(v*m)"   # how the bubble was priced
    passes_s: list[float] = dataclasses.field(default_factory=list)  # the slowest rank's F, I, W per microbatch
    schedules: list[dict] = dataclasses.field(default_factory=list)  # every schedule of its chunks, priced alike


def _degrees(world: int, config: Strategy) -> tuple[int, int, int]:
    """(p, data, tensor) of a pipeline configuration on ``world`` ranks."""
    p = config.pipeline
    if world % p:
        raise PlanError(f"strategy: pipeline={p} does not divide the world of {world} ranks; give a pipeline degree "
                        f"that divides it")
    return (p, *Strategy(config.data, config.tensor).resolve(world // p))


def _check_sizes(model: ModelFacts, config: Strategy, data: int, tensor: int) -> None:
    """The batch over the data ranks, and (not mixed) the split regions over the tensor ranks."""
    if config.mixed:  # each region chooses (or is pinned); one that cannot split stays whole
        check_forced_batch(model, data)
    else:
        check_forced_sizes(model, data, tensor)


def pipeline_degrees(model: ModelFacts, world: int, config: Strategy) -> tuple[int, int, int]:
    """(p, data, tensor) of a pipeline configuration, its sizes checked."""
    p, data, tensor = _degrees(world, config)
    _check_sizes(model, config, data, tensor)
    return p, data, tensor


def pipeline_layout(model: ModelFacts, world: int, config: Strategy) -> tuple[int, int, int, PipelineShape, int]:
    """(p, data, tensor, pipeline shape, local batch) of a pipeline configuration, its sizes checked."""
    p, data, tensor = _degrees(world, config)
    shape = pipeline_shape(model, p * config.chunks)
    _check_sizes(model, config, data, tensor)
    return p, data, tensor, shape, model.batch // data


def _microbatch_counts(model: ModelFacts, config: Strategy, p: int, data: int, local: int,
                       names: tuple[str, ...], row_units: int = 1) -> list[int]:
    """The microbatch counts to weigh: the given one, checked, or every one a schedule of
    ``names`` allows. ``row_units``: each of the ``local`` rows counts as that many (the
    context family prices ``d × c`` as ``d·c`` data ranks, and a data rank's rows, each
    spread over ``c`` context ranks, divide into microbatches: ``local·c`` of them)."""
    v, m = config.chunks, config.microbatches
    local, rows = local * row_units, model.batch // (data // row_units)
    if m is not None:
        if local % m:
            raise PlanError(f"strategy: microbatches={m} does not divide the batch of each data rank "
                            f"({model.batch} / data {data // row_units} = {rows}); give a microbatch count that "
                            f"divides {rows}")
        if not any(pipeline_cost.accepts(name, p, m, v) for name in names):
            rule = (f"a multiple of the pipeline ranks (megatron §2.2.2); microbatches={m} is not a multiple of "
                    f"pipeline={p}" if names[0] == "interleaved" else
                    f"a multiple of its rounds m // p (torch.pipelining's rule); microbatches={m} is not a multiple "
                    f"of {m // p}")
            raise PlanError(f"strategy: the {names[0]} schedule needs the number of microbatches to be {rule}")
        return [m]
    counts = sorted({m for name in names for m in pipeline_cost.microbatch_choices(local, p, v, name)})
    if not counts:
        raise PlanError(f"strategy: the interleaved schedule needs a microbatch count that is a multiple of "
                        f"pipeline={p} and divides the batch of each data rank ({local}); give a batch that "
                        f"is a multiple of {p * data}")
    return counts


def schedules_weighed(config: Strategy) -> tuple[str, ...]:
    """The schedules a configuration weighs: its own, or (none given) those of its
    chunks: 1F1B and ZB-H1 with one, interleaved 1F1B, the interleaved zero-bubble
    schedule and (two chunks) ZB-V with more."""
    if config.schedule is not None:
        return (config.schedule,)
    if config.chunks == 1:
        return ("1f1b", "zb-h1")
    return ("interleaved", "interleaved-zb") + (("zbv",) if config.chunks == 2 else ())


def search_pipeline(model: ModelFacts, world: int, hw: Hardware, config: Strategy, stage_plans=None, *,
                    zero: int | None = None, recompute: bool | None = None, allowance: float = 0.0,
                    sequence: bool | None = False, row_units: int = 1) -> PipelineNumbers:
    """The figures of one pipeline layout at its best schedule and microbatch count: the
    fastest whose memory fits, recomputing the blocks' activations (megatron §3.5) or
    sharding the state over the data ranks (ZeRO-1..3, :func:`with_zero`) only where
    keeping them does not fit; none fitting: the smallest. ``stage_plans(shape,
    tensor)``: a mixed configuration's stage plans (None: Megatron inside the stages);
    ``zero``: a forced ZeRO stage, ``recompute``: forced full recomputation of the
    blocks or none (None: the search's choice for both); ``allowance``: bytes per rank
    another family frees from these figures (expert parallelism's spread experts),
    counted when judging what fits; ``sequence``: Megatron-SP inside the stages
    (:func:`_stage_figures`; None: weighed where a count and mode do not fit without
    ZeRO, before ZeRO and recomputing); ``row_units``: as :func:`_microbatch_counts`.
    The schedules are :func:`schedules_weighed`, priced on one set of stage figures per
    microbatch count."""
    p, data, tensor, shape, local = pipeline_layout(model, world, config)
    inner = stage_plans(shape, tensor) if stage_plans is not None else None
    best = smallest = None
    modes = (False, True) if recompute is None else (recompute,)
    names = schedules_weighed(config)
    for m in _microbatch_counts(model, config, p, data, local, names, row_units):
        splits = (sequence,) if sequence is not None else (False, True) if (
            tensor > 1 and inner is None and sequence_splits(model, tensor, model.batch // (data * m))) else (False,)
        memo: dict = {}
        for mode, sp in ((mode, sp) for mode in modes for sp in splits):
            fitting = None
            weighed = [n for n in names if pipeline_cost.accepts(n, p, m, config.chunks)]
            if config.schedule is None:
                # ZB-V's order is made for at least 2p − 1 microbatches; recomputing, a split
                # backward re-runs each block's forward per weight group in W: weighed only
                # where no other schedule takes this count
                short = [n for n in weighed if not (n == "zbv" and m < 2 * p)]
                weighed = [n for n in short if not (mode and n in SPLIT_BACKWARD)] or short or weighed
            for name in weighed:
                layout = PipelineLayout(p, config.chunks, m, name, data, tensor, config.scatter_gather)
                numbers = pipeline_numbers(model, hw, shape, layout, recompute=mode, inner=inner, sequence=sp,
                                           memo=memo)
                stages = (zero,) if zero is not None else (0, 1, 2, 3) if data > 1 else (0,)
                for z in stages:
                    option = with_zero(numbers, z, hw, model.largest_params)
                    fits = option.memory_bytes - allowance <= hw.memory_bytes
                    if fits and (fitting is None or option.step < fitting.step * (1 - 1e-9)):
                        fitting = option
                    if smallest is None or option.memory_bytes < smallest.memory_bytes * (1 - 1e-9):
                        smallest = option
                    if fits and zero is None and z == 0:
                        break  # what fits without ZeRO runs without it
            if fitting is not None and (best is None or fitting.step < best.step * (1 - 1e-9)):
                best = fitting
            if fitting is not None and fitting.zero == 0:
                break  # SP, recomputing only where neither fits; ZeRO and recomputation are weighed
    if best is None and smallest is None:
        raise PlanError(f"strategy: no schedule of {', '.join(names)} runs pipeline={p} with the microbatch counts "
                        f"weighed; give 'microbatches' or 'schedule'")
    return best or smallest


def pipeline_plan(model: ModelFacts, world: int, hw: Hardware, name: str, n: PipelineNumbers) -> Plan:
    """The plan of one priced pipeline layout: its region table (per step: ``m``
    microbatches of each region), its cost and its pipeline details (the search adds
    the configurations weighed)."""
    shape, p, v, m, data, tensor = n.shape, n.p, n.v, n.m, n.data, n.tensor
    if n.inner is not None:  # each region's own family (its rows carry their stage)
        choices = n.inner.table(data * m).regions
    else:
        choices = price_mesh(model, hw, data * m, tensor, True, shape.keep_whole, n.recompute).regions
        for c in choices[:-1]:
            c.details = {**c.details, "stage": shape.region_stage[c.region]}
    for c in choices[:-1]:  # the table reads per step: m microbatches of each region
        c.cost = Cost(c.cost.compute_s * m, {k: x * m for k, x in c.cost.comm_s.items()}, c.cost.memory_bytes)
        c.alternatives = {k: x * m for k, x in c.alternatives.items()}
    choices[-1].cost = Cost(model.seconds(shape.outside_all, hw, 1 / (data * m)) * m, {},
                            choices[-1].cost.memory_bytes)
    total = Cost((n.rank_s[n.slow] - n.rank_p2p[n.slow] - n.rank_comm[n.slow]) * m, dict(n.comm_s), n.memory_bytes)
    part = shape.part
    split = n.schedule in SPLIT_BACKWARD
    details = PipelineDetails(
        p, v, m, model.batch // (data * m), n.schedule, n.scatter_gather and tensor > 1, n.recompute,
        [r.id for r in part.blocks], list(part.assignment),
        n.bubble / (m * n.rank_s[n.slow]) if split else (p - 1) / (v * m), n.bubble, n.stage_s, n.carried,
        n.rank_s, [pipeline_cost.in_flight(n.schedule, p, m, v, r) for r in range(p)], [mem for mem, _ in n.memory],
        [mem for _, mem in n.memory],
        sorted(k for k, where in shape.param_stages.items() if len({rank_of(n.schedule, p, s) for s in where}) > 1),
        [rank_of(n.schedule, p, s) for s in range(p * v)],
        "simulated F/I/W timeline" if split else "(p-1)/(v*m)", list(n.passes), schedule_rivals(model, hw, n))
    mesh = pipeline_mesh(n)
    log.info("planned %s on %d ranks: %s, %.3f ms", name, world, mesh, n.step * 1e3)
    capture = model.gm.meta.get(CAPTURE)
    plan_ = Plan(model=name, world_size=world, mesh=mesh, hardware=hw.name, global_batch=model.batch,
                 regions=choices, total=total, step_s=n.step,
                 tracer=capture.tracer if capture else "", pipeline=asdict(details), recompute=n.recompute,
                 zero=n.zero, sequence_parallel=n.sequence)
    if n.inner is not None:
        plan_.mixed = True
        plan_.tensor_grid = n.inner.tensor_grid(data * m)
    return plan_


def schedule_rivals(model: ModelFacts, hw: Hardware, n: PipelineNumbers) -> list[dict]:
    """Every schedule of ``n``'s chunks priced at its layout, microbatch count,
    recomputation and ZeRO stage, fastest first: what the plan shows of why the others
    lost (``fits``: within the device's memory)."""
    names = (("gpipe",) if n.v == 1 else ()) + schedules_weighed(Strategy(pipeline=n.p, chunks=n.v))
    out = []
    for name in names:
        if not pipeline_cost.accepts(name, n.p, n.m, n.v):
            continue
        alt = n if name == n.schedule else with_zero(pipeline_numbers(
            model, hw, n.shape, dataclasses.replace(n.layout, schedule=name), recompute=n.recompute, inner=n.inner,
            sequence=n.sequence), n.zero, hw, model.largest_params)
        out.append({"schedule": name, "step_s": alt.step, "bubble_s": alt.bubble, "memory_bytes": alt.memory_bytes,
                    "fits": alt.memory_bytes <= hw.memory_bytes})
    return sorted(out, key=lambda r: r["step_s"])


class Pipeline(CompileHooks):
    """PTD-P: the pipeline family (see the module docstring). Its rank programs are
    the stages, rewritten by :class:`~autopar.strategies.pipeline.program.PipelineRunner`.
    A mixed configuration's stages are the mixed family's plans
    (:meth:`autopar.strategies.mixed.planner.Mixed.stage_plans`), asked for through
    :meth:`~autopar.strategies.family.PlanContext.peer`."""

    name = "pipeline"
    # what a family riding on a pipeline layout reads of it (expert parallelism, PlanContext.peer)
    pipeline_label = staticmethod(pipeline_label)
    pipeline_layout = staticmethod(pipeline_layout)
    pipeline_mesh = staticmethod(pipeline_mesh)

    def place(self, builder, build: RankBuild) -> None:
        if builder.plan.pipeline:
            parameter_layout.place(builder, build.holders or {})

    def parameter_holders(self, plan: Plan, gm) -> dict | None:
        return parameter_layout.parameter_holders(plan, gm) if plan.pipeline else None

    def rank_code(self, plan: Plan, model, rank: int, example_inputs, loss_fn, example_target, example_kwargs,
                  rewrite) -> str | None:
        if not plan.pipeline:
            return None
        return pipeline_rank_code(model, plan, rank, example_inputs, loss_fn, example_target, rewrite=rewrite,
                                  example_kwargs=example_kwargs)

    def rank_runtime(self, plan: Plan, rank: int, options: dict) -> PipelineRankRuntime:
        return PipelineRankRuntime(plan)

    def regions(self, model: ModelFacts) -> list:
        return blocks_of(model.gm)

    def candidates(self, ctx: PlanContext) -> list[Strategy]:
        if ctx.forced is None:
            return pipeline_options(ctx.model, ctx.world)
        if ctx.forced.kind() != "pipeline":
            return []
        check_batch_norms(ctx.model, "a pipeline runs microbatches")
        forced = ctx.forced
        if forced.mixed:  # the stages' pins checked as a mixed plan's, by the mixed family
            _, _, tensor, _, _ = pipeline_layout(ctx.model, ctx.world, forced)
            forced = dataclasses.replace(forced, tensor_subgrids=ctx.peer("mixed").check_stages(ctx, tensor))
        return [forced]

    def price(self, ctx: PlanContext, config: Strategy, allowance: float = 0.0, row_units: int = 1) -> Priced:
        """``allowance``: bytes per rank expert parallelism frees from the figures priced
        here (:func:`search_pipeline`); the memory reported is without it; ``row_units``:
        as :func:`_microbatch_counts`."""
        label = pipeline_label(config)
        if ctx.forced is None:  # what cannot win is not priced (bound.py), once its sizes are checked
            floor = self.step_floor(ctx, config)
            if floor > ctx.best_s[0] * (1 + 1e-9):
                try:
                    pipeline_degrees(ctx.model, ctx.world, config)
                except PlanError as e:
                    return rejected(self.name, config, pipeline_mesh(config), str(e), form=label)
                return cut(self.name, config, pipeline_mesh(config), label, floor, ctx.best_s[0])
        # a mixed configuration: each region its own family inside the stages (the mixed
        # family's plans of them, PlanContext.peer)
        stage_plans = (lambda shape, tensor: ctx.peer("mixed").stage_plans(ctx, shape, tensor, config.grid,
                                                                             config.tensor_subgrids)
                       if config.mixed else None)
        try:
            zero = ctx.levers.zero if ctx.levers is not None and ctx.levers.zero is not None else None
            # a forced "full" prices the blocks recomputed, "none" (and "selective", which a
            # pipeline does not weigh) without; unforced, the search weighs both
            mode = ctx.levers.recompute if ctx.levers is not None else None
            recompute = None if mode is None else mode == "full"
            forced = ctx.levers.sequence_parallel if ctx.levers is not None else None
            sequence = False if config.mixed else forced
            n = search_pipeline(ctx.model, ctx.world, ctx.hw, config, stage_plans, zero=zero, recompute=recompute,
                                allowance=allowance, sequence=sequence, row_units=row_units)
        except PlanError as e:
            if ctx.forced is not None:
                raise
            return rejected(self.name, config, pipeline_mesh(config), str(e), form=label)
        mesh = pipeline_mesh(n)  # a forced configuration's degrees resolved
        label = pipeline_label(config, schedule=n.schedule)
        if n.inner is not None:
            label = pipeline_label(config, n.inner.tensor_grid(n.data * n.m), n.schedule)
            uses = n.inner.uses[n.data * n.m]
            # Megatron inside the stages (weighed there), or a grid no region takes (the same without it)
            if ctx.forced is None and (not uses & {"dsp", "tensor3d"}
                                       or (config.grid is not None and "tensor3d" not in uses)):
                return dataclasses.replace(rejected(self.name, config, mesh, "a single-family plan", form=label),
                                           listed=False)
        figures = dict(step_s=n.step, memory_bytes=n.memory_bytes, comm_s=dict(n.comm_s), form=label)
        why = too_big(n.memory_bytes - allowance, ctx.hw)
        if why is not None and ctx.forced is None:  # a forced layout runs at its smallest
            return rejected(self.name, config, mesh, why, **figures)
        return Priced(self.name, config, mesh, feasible=True, detail=n,
                      reason=f"m={n.m}" + (", recomputing" if n.recompute else ""), **figures)

    def follow_ups(self, ctx: PlanContext, weighed: list[Priced]) -> list[Strategy]:
        """Under ``"auto"``, pipelines of mixed stages (each region its own family,
        ``docs/mixed_plans.md``) at the :data:`MIXED_AT` fastest feasible layouts of
        Megatron inside the stages, at their microbatch count: the tensor group as a 3D
        grid (every ``Gx × Gy = t``, both above 1) and, where a multi-branch region has
        at least ``t`` branches, D&SP over it. Weighing them at every layout would
        multiply the pipeline search (thousands of layouts at 3072 devices)."""
        if ctx.forced is not None:
            return []
        widest = widest_branching(ctx.model)

        def wanted(p: Priced) -> bool:
            return p.family == self.name and p.feasible and not p.config.mixed and p.detail.tensor > 1
        weighed = fastest_in_full(ctx, [p for p in weighed if p.family == self.name and p.config.tensor > 1],
                                 self.price, wanted, lambda p: p.step_s, lambda floor: floor, MIXED_AT)
        mine = sorted((p for p in weighed if wanted(p)), key=lambda p: p.step_s)[:MIXED_AT]
        out = []
        for priced in mine:
            n, c = priced.detail, priced.config
            t = n.tensor
            base = dataclasses.replace(c, data=n.data, tensor=t, microbatches=n.m, schedule=n.schedule, mixed=True)
            grids = ([None] if widest >= t else []) + tensor_grids(ctx.model, t, rows=False)
            out += [dataclasses.replace(base, grid=g) for g in grids]
        return out

    def step_floor(self, ctx: PlanContext, config: Strategy) -> float:
        """:func:`~autopar.strategies.pipeline.bound.step_floor` (0 under a forced strategy)."""
        return 0.0 if ctx.forced is not None else step_floor(ctx.model, ctx.hw, config)

    def to_plan(self, ctx: PlanContext, priced: Priced) -> Plan:
        return pipeline_plan(ctx.model, ctx.world, ctx.hw, ctx.name, priced.detail)
