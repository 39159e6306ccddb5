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

from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.ir import CAPTURE
from autopar.planning.model import ModelFacts, region_sizes, split_factor
from autopar.planning.plan import Cost, Plan, mixed_form
from autopar.planning.strategy import PlanError, Strategy, divisors
from autopar.strategies.family import CompileHooks, PlanContext, Priced, RankBuild, rejected, too_big
from autopar.strategies.megatron.planner import (check_forced_batch, check_forced_sizes, price_mesh, sequence_regather_s,
                                                 sequence_splits, split_cost)
from autopar.strategies.mixed.pins import check_forced_stages
from autopar.strategies.mixed.stages import StagePlans
from autopar.strategies.mixed.structure import tensor_grids, widest_branching
from autopar.strategies.pipeline import cost as pipeline_cost
from autopar.strategies.pipeline import layout as parameter_layout
from autopar.strategies.pipeline.program import PipelineRankRuntime, pipeline_rank_code
from autopar.strategies.pipeline.shape import PipelineShape, pipeline_shape
from autopar.strategies.pipeline.stages import blocks_of
from autopar.strategies.shared import levers
from autopar.strategies.shared.batch_norms import batch_norms, check_batch_norms

log = logging.getLogger("autopar.planning")

MIXED_AT = 3  # "auto" weighs pipelines of mixed stages at this many of the fastest pipeline layouts


def pipeline_options(model: ModelFacts, world: int) -> list[Strategy]:
    """The pipeline layouts ``"auto"`` weighs: p > 1 dividing the world and at most the
    number of blocks, every data x tensor of the rest, 1F1B, and interleaved with v = 2
    where there are 2p blocks."""
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
                out.append(Strategy(world // p // t, t, pipeline=p, chunks=2, schedule="interleaved"))
    return out


def pipeline_mesh(layout: "Strategy | PipelineNumbers") -> dict[str, int]:
    """The mesh of a pipeline configuration (its degrees resolved) or of its priced figures."""
    if isinstance(layout, Strategy):
        return {"pipeline": layout.pipeline, "data": layout.data, "tensor": layout.tensor}
    return {"pipeline": layout.p, "data": layout.data, "tensor": layout.tensor}


def pipeline_label(option: Strategy, tensor_grid: dict | None = None) -> str:
    """A configuration's form, as :attr:`Plan.form` reads: its schedule, and for stages
    of mixed plans their form (``tensor_grid``: the grid its 3D regions use, None: the
    configuration's; its D&SP sub-grids)."""
    label = f"pipeline {option.schedule}" + (f" v={option.chunks}" if option.chunks > 1 else "")
    if option.mixed:
        if tensor_grid is None:
            tensor_grid = {"x": option.grid.x, "y": option.grid.y} if option.grid is not None else {}
        label += ", " + mixed_form(tensor_grid, option.tensor_subgrids)
    return label


@dataclass(frozen=True)
class PipelineNumbers:
    """The predicted figures of one pipeline layout at one microbatch count
    (:func:`pipeline_numbers`)."""

    shape: PipelineShape
    p: int
    v: int
    m: int
    schedule: str
    data: int
    tensor: int
    scatter_gather: bool
    step: float                 # the step: the pipeline's, the data and the tied all-reduces
    bubble: float               # seconds of the bubble (megatron §2.2)
    stage_s: list[float]        # forward + backward seconds of one microbatch per stage
    carried: list[float]        # bytes sent after each stage per microbatch
    rank_s: list[float]         # seconds per microbatch per pipeline rank (its stages and sends)
    slow: int                   # the slowest rank
    rank_p2p: list[float]       # its point-to-point part
    rank_comm: list[float]      # its tensor-parallel part
    data_s: float               # the data all-reduce after the last microbatch
    tied_s: float               # the tied weights' all-reduce
    memory: list[tuple[float, float]]  # per rank: bytes keeping the activations, and recomputing
    memory_bytes: float         # the most of any rank, as the layout runs (recomputing or not)
    recompute: bool
    comm_s: dict[str, float]    # by group: tensor, pipeline (point-to-point and bubble), data
    inner: object = None        # a mixed configuration's stage plans (mixed.stages.StagePlans)
    rank_params: tuple = ()     # parameter elements per pipeline rank
    zero: int = 0               # ZeRO's stage over the data ranks (docs/memory.md)
    sequence: bool = False      # Megatron-SP inside the stages (docs/sequence.md)


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


def pipeline_layout(model: ModelFacts, world: int, config: Strategy) -> tuple[int, int, int, PipelineShape, int]:
    """(p, data, tensor, pipeline shape, local batch) of a pipeline configuration, its sizes checked."""
    p, v = config.pipeline, config.chunks
    if world % p:
        raise PlanError(f"strategy: pipeline={p} does not divide the world of {world} ranks; give a pipeline degree "
                        f"that divides it")
    data, tensor = Strategy(config.data, config.tensor).resolve(world // p)
    shape = pipeline_shape(model, p * v)
    if config.mixed:  # each region chooses (or is pinned); one that cannot split stays whole
        check_forced_batch(model, data)
    else:
        check_forced_sizes(model, data, tensor)
    return p, data, tensor, shape, model.batch // data


def _microbatch_counts(model: ModelFacts, config: Strategy, p: int, data: int, local: int) -> list[int]:
    """The microbatch counts to weigh: the given one, checked, or every one the schedule allows."""
    v, schedule, m = config.chunks, config.schedule, config.microbatches
    if m is not None:
        if local % m:
            raise PlanError(f"strategy: microbatches={m} does not divide the batch of each data rank "
                            f"({model.batch} / data {data} = {local}); give a microbatch count that divides {local}")
        if schedule == "interleaved" and v > 1 and m % p:
            raise PlanError(f"strategy: the interleaved schedule needs the number of microbatches to be a multiple "
                            f"of the pipeline ranks (megatron §2.2.2); microbatches={m} is not a multiple of "
                            f"pipeline={p}")
        return [m]
    counts = pipeline_cost.microbatch_choices(local, p, v, schedule)
    if not counts:
        raise PlanError(f"strategy: the interleaved schedule needs a microbatch count that is a multiple of "
                        f"pipeline={p} and divides the batch of each data rank ({local}); give a batch that "
                        f"is a multiple of {p * data}")
    return counts


def search_pipeline(model: ModelFacts, world: int, hw: Hardware, config: Strategy, stage_plans=None,
                    zero: int | None = None, recompute: bool | None = None, allowance: float = 0.0,
                    sequence: bool | None = False) -> PipelineNumbers:
    """The figures of one pipeline layout at its best microbatch count: the fastest
    whose memory fits, recomputing the blocks' activations (megatron §3.5) or sharding
    the state over the data ranks (ZeRO-1..3, :func:`with_zero`) only where keeping
    them does not fit; none fitting: the smallest. ``stage_plans(shape, tensor)``: a
    mixed configuration's stage plans (None: Megatron inside the stages); ``zero``: a
    forced ZeRO stage, ``recompute``: forced full recomputation of the blocks or none
    (None: the search's choice for both); ``allowance``: bytes per rank another family
    frees from these figures (expert parallelism's spread experts), counted when judging
    what fits; ``sequence``: Megatron-SP inside the stages (:func:`_stage_figures`; None:
    weighed where a count and mode do not fit without ZeRO, before ZeRO and recomputing)."""
    p, data, tensor, shape, local = pipeline_layout(model, world, config)
    inner = stage_plans(shape, tensor) if stage_plans is not None else None
    best = smallest = None
    modes = (False, True) if recompute is None else (recompute,)
    for m in _microbatch_counts(model, config, p, data, local):
        splits = (sequence,) if sequence is not None else (False, True) if (
            tensor > 1 and inner is None and sequence_splits(model, tensor, model.batch // (data * m))) else (False,)
        for mode, sp in ((mode, sp) for mode in modes for sp in splits):
            numbers = pipeline_numbers(model, hw, shape, p, config.chunks, m, config.schedule, data, tensor,
                                       config.scatter_gather, mode, inner, sp)
            stages = (zero,) if zero is not None else (0, 1, 2, 3) if data > 1 else (0,)
            fitting = None
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
    return best or smallest


def _stage_figures(model: ModelFacts, hw: Hardware, shape: PipelineShape, stages: int, scale: int, tensor: int,
                   recompute: bool, sequence: bool = False) -> tuple[list[float], list[float], list[float]]:
    """Per stage, for one microbatch (the batch's ``1/scale``): forward + backward seconds,
    their tensor-parallel part, and the bytes saved for backward (``sequence``: as
    :func:`~autopar.strategies.megatron.planner.price_mesh` prices Megatron-SP)."""
    stage_s, stage_comm, stage_act = [0.0] * stages, [0.0] * stages, [0.0] * stages
    for s in range(stages):
        split_any = False
        for rep, count in shape.groups[s]:
            divisible = tensor > 1 and rep.id not in shape.keep_whole and \
                all(size % tensor == 0 for _, size in region_sizes(rep))
            if divisible:
                comm = (2 * cost_model.all_reduce_time(tensor, model.boundary[rep.id] / scale, hw)
                        * (1.5 if recompute else 1)) + (sequence_regather_s(model, hw, rep, scale, tensor)
                                                       if sequence else 0.0)
                pad = split_factor(rep, tensor)  # a padded vocabulary's rows
                seconds = model.seconds(rep.nodes, hw, pad / (scale * tensor), recompute) + comm
                act = model.activation_bytes(rep.nodes, pad / scale / tensor)
                stage_comm[s] += comm * count
                split_any = True
            else:
                seconds = model.seconds(rep.nodes, hw, 1 / scale, recompute)
                act = model.activation_bytes(rep.nodes, 1 / scale)
            stage_s[s] += seconds * count
            stage_act[s] += act * count
        stage_s[s] += model.seconds(shape.outside[s], hw, 1 / scale)  # the runtime recomputes blocks only
        between = tensor if sequence and split_any else 1
        stage_act[s] += model.activation_bytes(shape.outside[s], 1 / scale / between)
    for r, parts in shape.spanning:
        divisible = tensor > 1 and r.id not in shape.keep_whole and \
            all(size % tensor == 0 for _, size in region_sizes(r))
        # Megatron's vocab split: each end its nodes over t, the region's all-reduces shared by its ends
        k = tensor / split_factor(r, tensor) if divisible else 1  # a padded vocabulary: V'/t rows per rank
        comm = split_cost(model, hw, r, scale, tensor).total_comm_s if divisible else 0.0
        for s, c, m, a in pipeline_cost.spread_over_ends(model, hw, parts, model.seconds(r.nodes, hw, 1 / (scale * k)),
                                                         comm, model.activation_bytes(r.nodes, 1 / (scale * k))):
            stage_s[s] += c + m
            stage_comm[s] += m
            stage_act[s] += a
    return stage_s, stage_comm, stage_act


def pipeline_numbers(model: ModelFacts, hw: Hardware, shape: PipelineShape, p: int, v: int, m: int, schedule: str,
                     data: int, tensor: int, scatter_gather: bool, recompute: bool = False, inner=None,
                     sequence: bool = False) -> PipelineNumbers:
    """The predicted figures of ``p`` ranks × ``v`` chunks with ``m`` microbatches of
    ``B/(d·m)`` rows, each stage's regions priced once per class: per-stage seconds per
    microbatch (compute, Megatron all-reduces), point-to-point sends, per-rank seconds,
    the step with its bubble (megatron §2.2), the data and tied-weight all-reduces, and
    memory per rank with and without recomputation. ``recompute``: the blocks' forward
    runs twice (megatron §3.5) and the memory that counts is the recomputing one.
    ``inner``: a mixed configuration's :class:`~autopar.strategies.mixed.stages.StagePlans`
    (each region its own family), which gives the stages' and ranks' figures instead."""
    stages = p * v
    # ranks sharing a host's cores: a stage computes only in its turn, on average a
    # fraction v·m / (v·m + p − 1) of the step (the bubble's complement, megatron §2.2),
    # so the ranks computing at once get more of the cores than the whole world would
    hw = hw.while_busy(p * data * tensor * v * m / (v * m + p - 1)) if hw.host_cores and p > 1 else hw
    scale = data * m  # the work of one microbatch on one data rank is the batch's 1/(d·m)
    if inner is not None:
        stage_s, stage_comm, stage_act, rank_params, tied_elems = inner.figures(scale, p, recompute)
    else:
        stage_s, stage_comm, stage_act = _stage_figures(model, hw, shape, stages, scale, tensor, recompute,
                                                        sequence and tensor > 1)
        rank_params, tied_elems = shape.rank_params(p, tensor)
    # the executor's work per stage and microbatch: one forward action, one backward
    stage_s = [s + 2 * hw.pipeline_action_s for s in stage_s]
    carried = [b / scale for b in shape.carried]
    inter_node = data * tensor >= hw.devices_per_node
    sends = [cost_model.point_to_point_time(b / tensor if scatter_gather else b, hw, inter_node=inter_node)
             + (cost_model.all_gather_time(tensor, b / tensor, hw) if scatter_gather and tensor > 1 else 0.0)
             for b in carried]
    rank_s, rank_p2p, rank_comm = [], [], []
    for r in range(p):
        mine = [c * p + r for c in range(v)]
        p2p = sum((sends[s] if s < stages - 1 else 0.0) + (sends[s - 1] if s > 0 else 0.0) for s in mine)
        rank_p2p.append(p2p)
        rank_comm.append(sum(stage_comm[s] for s in mine))
        rank_s.append(sum(stage_s[s] for s in mine) + p2p)
    pipe_step, bubble = pipeline_cost.step_time(rank_s, p, m, v)
    # gradients all-reduced over the data ranks after the last microbatch, tied ones
    # summed over their stages' ranks
    data_s = max(cost_model.all_reduce_time(data, e * 4, hw, stride=tensor) for e in rank_params)
    tied_s = cost_model.all_reduce_time(2, tied_elems * 4, hw, stride=data * tensor) if tied_elems else 0.0
    memory = []
    for r in range(p):
        mine = [c * p + r for c in range(v)]
        inputs = [carried[s - 1] if s > 0 else 0.0 for s in mine]
        saved = [stage_act[s] for s in mine]
        act = pipeline_cost.activation_memory(schedule, p, m, v, r, saved, inputs)
        act_recompute = pipeline_cost.activation_memory(schedule, p, m, v, r, saved, inputs, True)
        memory.append((cost_model.training_memory(rank_params[r], act),
                       cost_model.training_memory(rank_params[r], act_recompute)))
    slow = max(range(p), key=lambda r: rank_s[r])
    return PipelineNumbers(
        shape, p, v, m, schedule, data, tensor, scatter_gather, pipe_step + data_s + tied_s, bubble, stage_s, carried,
        rank_s, slow, rank_p2p, rank_comm, data_s, tied_s, memory, max(mem[1 if recompute else 0] for mem in memory),
        recompute, {"tensor": rank_comm[slow] * m, "pipeline": rank_p2p[slow] * m + bubble, "data": data_s + tied_s},
        inner, tuple(rank_params), sequence=sequence and tensor > 1)


def with_zero(n: PipelineNumbers, zero: int, hw: Hardware, largest: float = 0.0) -> PipelineNumbers:
    """``n`` with ZeRO's stage ``zero`` over its data ranks (docs/memory.md): each
    rank's parameters, gradients and optimizer state by
    :func:`autopar.strategies.shared.levers.state_bytes` (the gradients accumulate over the
    microbatches, so ZeRO-2 keeps them whole until the reduce-scatter, as ZeRO-1), its data
    communication by :func:`autopar.strategies.shared.levers.zero_comm` after the schedule
    (nothing overlapped: the pipeline's data all-reduce is priced after the schedule);
    ``largest``: the two largest parameters' elements, ZeRO-3 holds them gathered."""
    if not zero or n.data == 1:
        return n
    memory = []
    for params, (keep, again) in zip(n.rank_params, n.memory):
        whole = cost_model.training_memory(params, 0.0)
        sharded = levers.state_bytes(params, n.data, zero, n.m, largest)
        memory.append((keep - whole + sharded, again - whole + sharded))
    data_s = max(levers.zero_comm(e, n.data, n.tensor, zero, n.m, 0.0, hw) for e in n.rank_params)
    step = n.step - n.data_s + data_s
    comm = {**n.comm_s, "data": n.comm_s["data"] - n.data_s + data_s}
    return dataclasses.replace(n, memory=memory, memory_bytes=max(mem[1 if n.recompute else 0] for mem in memory),
                               data_s=data_s, step=step, comm_s=comm, zero=zero)


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
    details = PipelineDetails(
        p, v, m, model.batch // (data * m), n.schedule, n.scatter_gather and tensor > 1, n.recompute,
        [r.id for r in part.blocks], list(part.assignment), (p - 1) / (v * m), n.bubble, n.stage_s, n.carried,
        n.rank_s, [pipeline_cost.in_flight(n.schedule, p, m, v, r) for r in range(p)], [mem for mem, _ in n.memory],
        [mem for _, mem in n.memory],
        sorted(k for k, where in shape.param_stages.items() if len({s % p for s in where}) > 1))
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


class Pipeline(CompileHooks):
    """PTD-P: the pipeline family (see the module docstring). Its rank programs are
    the stages, rewritten by :class:`~autopar.strategies.pipeline.program.PipelineRunner`."""

    name = "pipeline"

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
        if forced.mixed:  # the stages' pins checked as a mixed plan's
            _, _, tensor, _, _ = pipeline_layout(ctx.model, ctx.world, forced)
            forced = dataclasses.replace(forced, tensor_subgrids=check_forced_stages(ctx, tensor))
        return [forced]

    def price(self, ctx: PlanContext, config: Strategy, allowance: float = 0.0) -> Priced:
        """``allowance``: bytes per rank expert parallelism frees from the figures priced
        here (:func:`search_pipeline`); the memory reported is without it."""
        label = pipeline_label(config)
        # a mixed configuration: each region its own family inside the stages
        stage_plans = (lambda shape, tensor: StagePlans(ctx, shape, tensor, config.grid, config.tensor_subgrids)
                       if config.mixed else None)
        try:
            zero = ctx.levers.zero if ctx.levers is not None and ctx.levers.zero is not None else None
            # a forced "full" prices the blocks recomputed, "none" (and "selective", which a
            # pipeline does not weigh) without; unforced, the search weighs both
            mode = ctx.levers.recompute if ctx.levers is not None else None
            recompute = None if mode is None else mode == "full"
            forced = ctx.levers.sequence_parallel if ctx.levers is not None else None
            sequence = False if config.mixed else forced
            n = search_pipeline(ctx.model, ctx.world, ctx.hw, config, stage_plans, zero, recompute, allowance,
                                sequence=sequence)
        except PlanError as e:
            if ctx.forced is not None:
                raise
            return rejected(self.name, config, pipeline_mesh(config), str(e), form=label)
        mesh = pipeline_mesh(n)  # a forced configuration's degrees resolved
        if n.inner is not None:
            label = pipeline_label(config, n.inner.tensor_grid(n.data * n.m))
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
        mine = sorted((p for p in weighed if p.family == self.name and p.feasible and not p.config.mixed
                       and p.detail.tensor > 1), key=lambda p: p.step_s)[:MIXED_AT]
        out = []
        for priced in mine:
            n, c = priced.detail, priced.config
            t = n.tensor
            base = dataclasses.replace(c, data=n.data, tensor=t, microbatches=n.m, mixed=True)
            grids = ([None] if widest >= t else []) + tensor_grids(ctx.model, t, rows=False)
            out += [dataclasses.replace(base, grid=g) for g in grids]
        return out

    def to_plan(self, ctx: PlanContext, priced: Priced) -> Plan:
        return pipeline_plan(ctx.model, ctx.world, ctx.hw, ctx.name, priced.detail)
