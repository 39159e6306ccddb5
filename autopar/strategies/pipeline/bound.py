"""A lower bound on a pipeline layout's step, read before the layout is priced
(docs/planner.md, "Bounds: what cannot win is not priced in full").

For ``p`` ranks × ``v`` chunks over ``d`` data and ``t`` tensor ranks, any schedule,
microbatch count ``m``, recomputation setting and ZeRO stage the search weighs
(:func:`~autopar.strategies.pipeline.planner.search_pipeline`) takes at least:

- **compute**: the step is ``m`` times the slowest rank's seconds per microbatch plus
  the bubble (megatron §2.2; Qi et al. 2024 for the split schedules), and the slowest
  rank takes at least the ranks' mean, i.e. ``1/p`` of every stage's seconds. Each
  kernel's time is affine in its work (``matmul_time``: ``(f + saturation)/rate +
  launch``; ``memory_bound_time``: ``bytes/bandwidth + launch``), so ``m`` microbatches of
  ``1/(d·m)`` of the batch take at least one of ``1/d``. A region costs at least the
  cheaper of replicated and Megatron-split with its two all-reduces (megatron §2.3, the
  ring all-reduce affine in its bytes, axonn eq 3); recomputation and sequence
  parallelism only add.
- **data**: the gradients' exchange over the data ranks of the busiest rank's
  parameters, at least the mean rank's (``1/p`` of the elements, the split regions'
  over ``t``): an all-reduce (no ZeRO), or a reduce-scatter and an all-gather of the
  shards (ZeRO-1..3, :func:`~autopar.strategies.shared.levers.zero_comm`), the cheaper.

Bubbles, point-to-point sends, the executor's per-action cost and tied weights' all-reduce
are left out (each is at least 0). On hardware sharing host cores (CPU ranks, whose
waiting stages free cores: ``Hardware.while_busy``) there is no bound; with collectives
read off a measured table (which need not be affine) the bound keeps compute alone.
"""
from __future__ import annotations

from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.planning.model import ModelFacts, region_sizes, split_factor
from autopar.planning.strategy import Strategy
from autopar.strategies.family import Priced
from autopar.strategies.pipeline.stages import blocks_of
from autopar.strategies.shared.levers import GRAD_BYTES


def step_floor(model: ModelFacts, hw: Hardware, config: Strategy) -> float:
    """Seconds no schedule of ``config`` (a pipeline layout with its degrees resolved,
    not a mixed one) runs a step in (module docstring); 0.0 where none is known."""
    if hw.host_cores or config.mixed or config.data is None or config.tensor is None:
        return 0.0
    p, v, d, t = config.pipeline, config.chunks, config.data, config.tensor
    memo = model.memo("pipeline.step_floor")
    key = (p, v, d, t, hw)
    if key not in memo:
        memo[key] = _floor(model, hw, p, v, d, t)
    return memo[key]


def _floor(model: ModelFacts, hw: Hardware, p: int, v: int, d: int, t: int) -> float:
    if p * v > len(blocks_of(model.gm)):
        return 0.0  # refused when priced, with its reason
    affine = not hw.measured.get("table")
    compute = model.seconds(_outside(model), hw, 1 / d)
    params = model.fact("params", lambda: float(sum(x.numel() for x in model.params.values())))
    for r, count in _classes(model):  # identical regions price alike (ModelFacts.region_class)
        seconds = model.seconds(r.nodes, hw, 1 / d)
        if t > 1 and all(size % t == 0 for _, size in region_sizes(r)):
            split = model.seconds(r.nodes, hw, split_factor(r, t) / (d * t))
            if affine:
                split += 2 * cost_model.all_reduce_time(t, model.boundary[r.id] / d, hw)
            seconds = min(seconds, split)
            params -= count * model.region_param_elems(r.id) * (1 - 1 / t)
        compute += count * seconds
    data = 0.0
    if d > 1 and affine:
        grads = max(params, 0.0) / p * GRAD_BYTES
        data = min(cost_model.all_reduce_time(d, grads, hw, stride=t),
                   cost_model.reduce_scatter_time(d, grads, hw, stride=t)
                   + cost_model.all_gather_time(d, grads / d, hw, stride=t))
    return compute / p + data


def _outside(model: ModelFacts) -> tuple[str, ...]:
    """The computing nodes outside every region: what a pipeline's stages run besides
    their regions, whatever the cut (``PipelineShape.outside_all``: a partition gives
    every node but placeholders, attributes and the output a stage)."""
    def outside() -> tuple[str, ...]:
        inside = {n for r in model.regions for n in r.nodes}
        return tuple(n.name for n in model.gm.graph.nodes
                     if n.op not in ("placeholder", "get_attr", "output") and n.name not in inside)
    return model.fact("pipeline.outside", outside)


def _classes(model: ModelFacts) -> list[tuple[object, int]]:
    """One region of each class of identical regions, and how many there are."""
    def classes() -> list[tuple[object, int]]:
        found: dict[int, list] = {}
        for r in model.regions:
            found.setdefault(model.region_class[r.id], [r, 0])[1] += 1
        return [(r, n) for r, n in found.values()]
    return model.fact("pipeline.region_classes", classes)


CUT = "cannot win"  # the reason a layout the bound cut is listed with


def cut(family: str, config: Strategy, mesh: dict, form: str, floor: float, best: float) -> Priced:
    """The listed row of a layout whose bound ``floor`` exceeds the best step so far."""
    why = (f"{CUT}: at least {floor * 1e3:.3f} ms by its compute and gradient exchange alone "
           f"(a lower bound), the best so far {best * 1e3:.3f} ms")
    return Priced(family, config, mesh, feasible=False, reason=why, form=form, bound_s=floor)
