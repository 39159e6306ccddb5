"""The predicted figures of one pipeline configuration at one schedule and microbatch
count (megatron §2-§4; Qi et al. 2024 for the zero-bubble schedules): per stage the
compute of its regions and their Megatron all-reduces, per rank its point-to-point
sends and its forward, input-gradient and weight-gradient seconds, the step with its
bubble, the data and tied-weight all-reduces, memory per rank (:func:`pipeline_numbers`),
and ZeRO over the data ranks (:func:`with_zero`). :mod:`autopar.strategies.pipeline.planner`
searches over them."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.grid import MeshAxis
from autopar.planning.model import ModelFacts, region_sizes, split_factor
from autopar.planning.schedules import SPLIT_BACKWARD, rank_of, stages_of
from autopar.strategies.shared.mesh import sequence_regather_s, split_cost
from autopar.strategies.pipeline import cost as pipeline_cost
from autopar.strategies.pipeline.shape import PipelineShape
from autopar.strategies.shared import levers
from autopar.strategies.shared.stage_ends import spread_over_ends

# host seconds of one autograd engine call (a zero-bubble W runs one per weight group), in
# host operations (``Hardware.host_op_s``): about 120 µs against 10 µs per operation on the
# 2-core machine (docs/benchmarks.md §18); 0 where the device hides the host (GPU presets)
ENGINE_CALL_OPS = 12


@dataclass(frozen=True)
class PipelineLayout:
    """One pipeline configuration, resolved, as :func:`pipeline_numbers` prices it: ``p``
    ranks × ``v`` chunks, ``m`` microbatches under ``schedule``, ``data × tensor`` ranks
    inside each stage, and whether the sends are scattered over the tensor group and
    gathered after (``scatter_gather``, megatron §4.1)."""

    p: int
    v: int
    m: int
    schedule: str
    data: int
    tensor: int
    scatter_gather: bool


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
    passes: tuple = ()          # the slowest rank's F, I, W seconds per microbatch (Qi et al. 2024)

    @property
    def layout(self) -> PipelineLayout:
        """The configuration these figures are of."""
        return PipelineLayout(self.p, self.v, self.m, self.schedule, self.data, self.tensor, self.scatter_gather)


def _stage_figures(model: ModelFacts, hw: Hardware, shape: PipelineShape, stages: int, scale: int, tensor: int,
                   recompute: bool, sequence: bool = False) -> tuple[list[float], list[float], list[float]]:
    """Per stage, for one microbatch (the batch's ``1/scale``): forward + backward seconds,
    their tensor-parallel part, and the bytes saved for backward (``sequence``: as
    :func:`~autopar.strategies.shared.mesh.price_mesh` prices Megatron-SP)."""
    stage_s, stage_comm, stage_act = [0.0] * stages, [0.0] * stages, [0.0] * stages
    keys = _pricing_keys(model)
    priced: dict[tuple, tuple[bool, float, float, float]] = {}  # per region pricing alike: its figures
    for s in range(stages):
        split_any = False
        for rep, count in shape.groups[s]:
            key = (keys[rep.id], rep.id in shape.keep_whole)
            if key not in priced:
                priced[key] = _group_figures(model, hw, rep, shape, scale, tensor, recompute, sequence)
            divisible, seconds, comm, act = priced[key]
            if divisible:
                stage_comm[s] += comm * count
                split_any = True
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
        for s, c, m, a in spread_over_ends(model, hw, parts, model.seconds(r.nodes, hw, 1 / (scale * k)),
                                           comm, model.activation_bytes(r.nodes, 1 / (scale * k))):
            stage_s[s] += c + m
            stage_comm[s] += m
            stage_act[s] += a
    return stage_s, stage_comm, stage_act


def _group_figures(model: ModelFacts, hw: Hardware, rep, shape: PipelineShape, scale: int, tensor: int,
                   recompute: bool, sequence: bool) -> tuple[bool, float, float, float]:
    """One region of a stage for one microbatch: whether Megatron splits it, its forward +
    backward seconds, their tensor-parallel part and the bytes it saves for backward."""
    divisible = tensor > 1 and rep.id not in shape.keep_whole and \
        all(size % tensor == 0 for _, size in region_sizes(rep))
    if not divisible:
        return False, model.seconds(rep.nodes, hw, 1 / scale, recompute), 0.0, model.activation_bytes(rep.nodes,
                                                                                                      1 / scale)
    comm = (2 * cost_model.all_reduce_time(tensor, model.boundary[rep.id] / scale, hw)
            * (1.5 if recompute else 1)) + (sequence_regather_s(model, hw, rep, scale, tensor) if sequence else 0.0)
    pad = split_factor(rep, tensor)  # a padded vocabulary's rows
    seconds = model.seconds(rep.nodes, hw, pad / (scale * tensor), recompute) + comm
    return True, seconds, comm, model.activation_bytes(rep.nodes, pad / scale / tensor)


def _pricing_keys(model: ModelFacts) -> dict[str, int]:
    """Per region an id shared by the regions :func:`_group_figures` prices alike: the same
    kernels, boundary bytes, split sizes, vocabulary and bytes saved (once per model)."""
    def keys() -> dict[str, int]:
        ids: dict[tuple, int] = {}
        return {r.id: ids.setdefault((model.signature(r.nodes), model.boundary[r.id], tuple(region_sizes(r)), r.kind,
                                      r.details.get("vocab_size") if r.kind == "vocab" else None,
                                      model.activation_bytes(r.nodes, 1.0)), len(ids))
                for r in model.regions}
    return model.fact("pipeline.pricing_keys", keys)


def stage_figures(model: ModelFacts, hw: Hardware, shape: PipelineShape, scale: int, tensor: int,
                  recompute: bool, sequence: bool) -> tuple[list[float], list[float], list[float]]:
    """:func:`_stage_figures` of ``shape``'s stages, once per shape, scale, tensor degree,
    mode and hardware: every layout of as many stages (``p·v``) and rows per microbatch
    (``B/(d·m)``) has the same stages, whatever its schedule. Read only."""
    memo = model.memo("pipeline.stage_figures")
    key = (len(shape.outside), scale, tensor, recompute, sequence, hw)
    found = memo.get(key)
    if found is None:
        found = memo[key] = _stage_figures(model, hw, shape, len(shape.outside), scale, tensor, recompute, sequence)
    return found


def pipeline_numbers(model: ModelFacts, hw: Hardware, shape: PipelineShape, layout: PipelineLayout, *,
                     recompute: bool = False, inner=None, sequence: bool = False,
                     memo: dict | None = None) -> PipelineNumbers:
    """The predicted figures of ``layout``: ``p`` ranks × ``v`` chunks with ``m`` microbatches of
    ``B/(d·m)`` rows, each stage's regions priced once per class: per-stage seconds per
    microbatch (compute, Megatron all-reduces), point-to-point sends, per-rank seconds,
    the step with its bubble (megatron §2.2; a zero-bubble schedule's from its simulated
    timeline, :func:`_split_step`), the data and tied-weight all-reduces, and memory per
    rank with and without recomputation. ``recompute``: the blocks' forward runs again
    in backward (megatron §3.5) — twice under a zero-bubble schedule, once in ``I`` and
    once in ``W`` — and the memory that counts is the recomputing one. ``inner``: a
    mixed configuration's :class:`~autopar.strategies.mixed.stages.StagePlans` (each
    region its own family), which gives the stages' and ranks' figures instead.
    ``memo``: a dict shared by the schedules weighed at one layout, which then price the
    stages once."""
    p, v, m, schedule = layout.p, layout.v, layout.m, layout.schedule
    data, tensor, scatter_gather = layout.data, layout.tensor, layout.scatter_gather
    # ranks sharing a host's cores: a stage computes only in its turn, on average a
    # fraction v·m / (v·m + p − 1) of the step (the bubble's complement, megatron §2.2),
    # so the ranks computing at once get more of the cores than the whole world would
    hw = hw.while_busy(p * data * tensor * v * m / (v * m + p - 1)) if hw.host_cores and p > 1 else hw
    scale = data * m  # the work of one microbatch on one data rank is the batch's 1/(d·m)
    key = (m, recompute, sequence)
    if inner is not None:
        stage_s, stage_comm, stage_act, rank_params, tied_elems = inner.figures(scale, p, recompute, schedule)
    else:
        memo = {} if memo is None else memo
        if key not in memo:
            memo[key] = stage_figures(model, hw, shape, scale, tensor, recompute, sequence and tensor > 1)
        stage_s, stage_comm, stage_act = memo[key]
        rank_params, tied_elems = shape.rank_params(p, tensor, schedule)
    # the executor's work per stage and microbatch: one forward action, one backward (two
    # when split: I and W)
    stage_s = [x + (3 if schedule in SPLIT_BACKWARD else 2) * hw.pipeline_action_s for x in stage_s]
    carried = [b / scale for b in shape.carried]
    inter_node = data * tensor >= hw.devices_per_node
    priced: dict[float, float] = {}  # the boundaries mostly carry the same bytes: priced once each
    for b in carried:
        if b not in priced:
            priced[b] = (cost_model.point_to_point_time(b / tensor if scatter_gather else b, hw, inter_node=inter_node)
                         + (cost_model.all_gather_time(tensor, b / tensor, hw) if scatter_gather and tensor > 1
                            else 0.0))
    sends = [priced[b] for b in carried]
    split = schedule in SPLIT_BACKWARD
    rank_s, rank_p2p, rank_comm, passes = _rank_figures(shape, layout, stage_s, stage_comm, sends, recompute,
                                                        hw.host_op_s * ENGINE_CALL_OPS)
    if split:
        pipe_step, bubble = _split_step(schedule, p, m, v, rank_s, passes)
    else:
        pipe_step, bubble = pipeline_cost.step_time(rank_s, p, m, v)
    # gradients all-reduced over the data ranks after the last microbatch, tied ones
    # summed over their stages' ranks
    data_s = cost_model.all_reduce_time(data, max(rank_params) * 4, hw, stride=tensor)  # the busiest rank's
    tied_s = cost_model.all_reduce_time(2, tied_elems * 4, hw, stride=data * tensor) if tied_elems else 0.0
    # the memory per rank, both ways, is the same whether the blocks are priced recomputed
    # or not (the bytes saved and carried do not change): found once per schedule
    memory_key = ("memory", schedule, sequence and tensor > 1)
    if inner is not None or memory_key not in memo:
        memory = _memory(schedule, p, m, v, stage_act, carried, rank_params)
        if inner is None:
            memo[memory_key] = memory
    else:
        memory = memo[memory_key]
    slow = max(range(p), key=lambda r: rank_s[r])
    return PipelineNumbers(
        shape, p, v, m, schedule, data, tensor, scatter_gather, pipe_step + data_s + tied_s, bubble, stage_s, carried,
        rank_s, slow, rank_p2p, rank_comm, data_s, tied_s, memory, max(mem[1 if recompute else 0] for mem in memory),
        recompute, {MeshAxis.TENSOR: rank_comm[slow] * m, MeshAxis.PIPELINE: rank_p2p[slow] * m + bubble,
                    MeshAxis.DATA: data_s + tied_s},
        inner, tuple(rank_params), sequence=sequence and tensor > 1, passes=tuple(passes[slow]))


def _memory(schedule: str, p: int, m: int, v: int, stage_act: list[float], carried: list[float],
            rank_params: list[float]) -> list[tuple[float, float]]:
    """Per pipeline rank: bytes keeping the activations, and recomputing the blocks."""
    memory = []
    for r, (mine, _) in enumerate(rank_layout(schedule, p, v)):
        inputs = [carried[s - 1] if s > 0 else 0.0 for s in mine]
        saved = [stage_act[s] for s in mine]
        act = pipeline_cost.activation_memory(schedule, p, m, v, r, saved, inputs)
        act_recompute = pipeline_cost.activation_memory(schedule, p, m, v, r, saved, inputs, True)
        memory.append((cost_model.training_memory(rank_params[r], act),
                       cost_model.training_memory(rank_params[r], act_recompute)))
    return memory


@functools.lru_cache(maxsize=1024)
def rank_layout(schedule: str, p: int, v: int) -> tuple[tuple[tuple[int, ...], tuple[tuple[int, bool, bool], ...]]]:
    """Per pipeline rank under ``schedule``: its stages, chunk by chunk, and for each
    whether it sends its output to another rank and receives its input from another (a
    boundary between two stages of one rank, ZB-V's turn, sends nothing). Read by every
    layout of ``p`` ranks and ``v`` chunks."""
    stages, out = p * v, []
    for r in range(p):
        mine = tuple(stages_of(schedule, p, v, r))
        out.append((mine, tuple((s, s < stages - 1 and rank_of(schedule, p, s + 1) != r,
                                 s > 0 and rank_of(schedule, p, s - 1) != r) for s in mine)))
    return tuple(out)


def _rank_figures(shape: PipelineShape, layout: PipelineLayout, stage_s: list[float], stage_comm: list[float],
                  sends: list[float], recompute: bool, engine_call_s: float) -> tuple[list, list, list, list]:
    """Per pipeline rank of ``layout`` (its schedule, ranks and chunks): seconds per
    microbatch, its point-to-point and tensor-parallel parts, and its ``(F, I, W)``
    seconds (Qi et al. 2024 §2: the stage's FLOP shares, ``PipelineShape.passes``;
    Megatron all-reduces half in F, half in I; sends forward in F, backward in I; split,
    W's host work of one autograd engine call per weight group, ``engine_call_s`` each)."""
    split = layout.schedule in SPLIT_BACKWARD
    rank_s, rank_p2p, rank_comm, passes = [], [], [], []
    for mine, boundaries in rank_layout(layout.schedule, layout.p, layout.v):
        p2p = sum((sends[s] if after else 0.0) + (sends[s - 1] if before else 0.0) for s, after, before in boundaries)
        rank_p2p.append(p2p)
        rank_comm.append(sum(stage_comm[s] for s in mine))
        f = i = w = 0.0
        for s in mine:
            forward, weight = shape.passes[s]
            compute = (stage_s[s] - stage_comm[s]) / (1 + forward if recompute else 1)  # one forward + backward
            f += forward * compute + stage_comm[s] / 2
            # recomputing, W re-runs the block's forward once per weight group (backward.py)
            w += weight * compute + (forward * compute * shape.weight_groups[s] if recompute and split else 0.0) + (
                shape.weight_kernels[s] * engine_call_s if split and s > 0 else 0.0)  # the first: one call
            i += compute * (1 - forward - weight) + (forward * compute if recompute else 0.0) + stage_comm[s] / 2
        passes.append((f + p2p / 2, i + p2p / 2, w))
        rank_s.append(sum(passes[-1]))
    return rank_s, rank_p2p, rank_comm, passes


def _split_step(schedule: str, p: int, m: int, v: int, rank_s: list[float],
                passes: list[tuple[float, float, float]]) -> tuple[float, float]:
    """``(step, bubble)`` seconds of a zero-bubble schedule: ``m`` times the slowest
    rank's microbatch plus the bubble of its ``F``, ``I`` and ``W`` per chunk on the
    simulated timeline (:func:`autopar.strategies.pipeline.cost.split_bubble`)."""
    slow = max(range(p), key=lambda r: rank_s[r])
    f, i, w = (x / v for x in passes[slow])
    bubble = pipeline_cost.split_bubble(schedule, p, m, v, f, i, w)
    return m * rank_s[slow] + bubble, bubble


def with_zero(n: PipelineNumbers, zero: int, hw: Hardware, largest: float = 0.0) -> PipelineNumbers:
    """``n`` with ZeRO's stage ``zero`` over its data ranks (docs/memory.md): each
    rank's parameters, gradients and optimizer state by
    :func:`autopar.strategies.shared.levers.state_bytes` (the gradients accumulate over the
    microbatches, so ZeRO-2 keeps them whole until the reduce-scatter, as ZeRO-1), its data
    communication by :func:`autopar.strategies.shared.levers.zero_comm` after the schedule
    (nothing overlapped: the pipeline's data all-reduce is priced after the schedule);
    ``largest``: the two largest ZeRO-3 units' elements (layers), ZeRO-3 holds them gathered."""
    if not zero or n.data == 1:
        return n
    memory, state = [], {}   # ranks holding as many elements (the middle stages) share their state's bytes
    for params, (keep, again) in zip(n.rank_params, n.memory):
        if params not in state:
            state[params] = (cost_model.training_memory(params, 0.0), levers.state_bytes(params, n.data, zero, n.m,
                                                                                          largest))
        whole, sharded = state[params]
        memory.append((keep - whole + sharded, again - whole + sharded))
    # the busiest rank's: the exchange grows with the elements (one call, not one per rank)
    data_s = levers.zero_comm(max(n.rank_params), n.data, n.tensor, zero, n.m, 0.0, hw)
    step = n.step - n.data_s + data_s
    comm = {**n.comm_s, MeshAxis.DATA: n.comm_s[MeshAxis.DATA] - n.data_s + data_s}
    return dataclasses.replace(n, memory=memory, memory_bytes=max(mem[1 if n.recompute else 0] for mem in memory),
                               data_s=data_s, step=step, comm_s=comm, zero=zero)
