"""Pricing the memory levers of a configuration without a pipeline (docs/memory.md):
gradient accumulation over ``m`` microbatches, ZeRO's stage ``s`` over the data ranks,
activation recomputation (none, selective, full) and, under full recomputation of 3D
layers, how many layers' all-gathered weights the cache keeps (axonn §IV-D).

:func:`weigh` is shared by the families: each describes its configuration as a
:class:`LeverSpace` (its table at one microbatch, its data group's communication, the
ZeRO stages it offers, what recomputing costs it), and each lever setting is priced
from the family's own formulas at one microbatch's rows. For a data × tensor
configuration (:func:`autopar.strategies.shared.mesh.price_mesh`):

* **accumulation** (Megatron eq. 1: ``m = B / (d·b)`` microbatches of ``b`` rows): the
  compute and the tensor group's all-reduces are ``m`` times one microbatch's (kernels
  on fewer rows run less efficiently: ``matmul_time``'s efficiency curve and each
  launch's fixed cost are counted once per microbatch); the activations kept are one
  microbatch's; the data all-reduce runs once, overlapping only the last microbatch's
  backward;
* **ZeRO** (Rajbhandari et al. §5, with this runtime's schedule,
  :mod:`autopar.strategies.data.zero`): with ``P`` parameter elements on the rank (its
  tensor part), fp32 parameters, gradients and AdamW's two moments take ``4P + 4P +
  8P`` bytes; ZeRO-1 divides the moments by ``d``, ZeRO-2 the gradients too (with
  accumulation the full gradients stay: they accumulate over the microbatches before
  the reduce-scatter), ZeRO-3 the parameters too, keeping the two largest units
  gathered (layers, :func:`~autopar.runtime.layout.zero_unit`: the one in use and the
  prefetched one). Time: ZeRO-1 and ZeRO-2
  reduce-scatter the gradients (half an all-reduce's volume, overlapped with the last
  microbatch's backward); both all-gather the updated shards before the next step (exposed). ZeRO-3
  all-gathers every parameter in forward (prefetched: only what exceeds the forward
  compute is exposed), and again in backward and reduce-scatters its gradient (both
  synchronous in this runtime: exposed), per microbatch.

The 3D family re-prices its grid at one microbatch (its data all-reduce in two parts,
the replica group's and the 3D shards' over data) and offers recomputation with a
bounded all-gather cache: under full recomputation a block's saved tensors go, and the
cache keeps the gathered weights of the first ``k`` layers (``k`` from all down to
none); the others are gathered again over z when backward recomputes them. Mixed plans
re-price their programme at one microbatch; D&SP plans scale their table by ``1/m``
(the sub-grid assignment is the batch's, so it is not priced again).

:func:`weigh` keeps the fastest setting (or the forced one) that fits in memory, or
when none fits the one needing the least (:func:`best_levers`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.grid import MeshAxis
from autopar.ir import regions, tensor_spec
from autopar.planning.model import GRADIENT_BUCKET_BYTES, exposed_data_comm
from autopar.planning.plan import Cost
from autopar.planning.strategy import PlanError, Strategy, divisors
from autopar.strategies.family import RegionTable

PARAM_BYTES, GRAD_BYTES, STATE_BYTES = 4, 4, 8


@dataclass(frozen=True)
class LeverFigures:
    """One lever setting priced: ``m`` microbatches, ZeRO stage ``zero``, recomputation
    ``recompute`` ("none", "selective", "full"); compute and communication by group
    (seconds per step), bytes per rank."""

    m: int
    zero: int
    compute_s: float
    comm_s: dict
    memory_bytes: float
    activation_bytes: float
    recompute: str = "none"
    gather_cache: Optional[int] = None  # 3D layers whose gathered weights are cached (None: all)

    @property
    def step_s(self) -> float:
        return self.compute_s + sum(self.comm_s.values())


def recompute_figures(model, hw: Hardware, rows: float, tensor: int, activations: float, compute: float
                      ) -> dict[str, tuple[float, float]]:
    """``mode -> (activation bytes, compute seconds)`` of one microbatch of ``rows`` per
    data rank whose activations without recomputation are ``activations`` and compute
    ``compute``: ``"full"`` keeps each block's input and, while one block recomputes,
    its activations, and runs the blocks' forward again (megatron §3.5); ``"selective"``
    drops the attention cores' activations and runs their forward again (Korthikanti et
    al.). Both scale the model's unsplit figures by the share of the blocks (cores) in
    them, so a tensor split's own division carries over."""
    out = {"none": (activations, compute)}
    for mode, (share, kept, again, per_block) in _recompute_terms(model, hw, rows, tensor).items():
        out[mode] = (activations * (1 - share) + kept + activations * share * per_block, compute + again)
    return out


def _recompute_terms(model, hw: Hardware, rows: float, tensor: int) -> dict[str, tuple]:
    """Per mode, what :func:`recompute_figures` scales (memoised per model, rows and
    split): the share of the activations dropped, bytes kept besides (the blocks'
    inputs), seconds run again, and the share of the dropped ones held while one block
    recomputes."""
    memo = model.memo("levers.recompute")
    key = (rows, tensor, hw)
    if key in memo:
        return memo[key]
    nodes = [n.name for n in model.gm.graph.nodes]
    scale = 1.0 / (model.batch / rows) if model.batch else 1.0
    whole = model.activation_bytes(nodes, scale) or 1.0
    out = {}
    blocks = regions(model.gm, "block")
    if blocks:
        in_blocks = sum(model.activation_bytes(b.nodes, scale) for b in blocks)
        inputs = 0.0
        for b in blocks:
            inside = set(b.nodes)
            first = next((model.table[n] for n in b.nodes if model.table[n].op in
                          ("call_function", "call_method", "call_module")), None)
            args = [a for a in (first.all_input_nodes if first is not None else ())
                    if a.name not in inside and a.op not in ("get_attr", "placeholder")]
            inputs += sum(float(s.nbytes) * scale for a in args if (s := tensor_spec(a)) is not None)
        again = sum(model.seconds(b.nodes, hw, scale / tensor) for b in blocks) / 3
        out["full"] = (in_blocks / whole, inputs, again, 1.0 / len(blocks))
    cores = [n for r in regions(model.gm, "attention") for n in r.details.get("core", ())]
    if cores:
        again = model.seconds(cores, hw, scale / tensor) / 3
        out["selective"] = (model.activation_bytes(cores, scale) / whole, 0.0, again, 0.0)
    memo[key] = out
    return out


def state_bytes(params: float, data: int, zero: int, m: int, largest: float = 0.0) -> float:
    """Parameters, gradients and optimizer state per rank under ZeRO stage ``zero`` over
    ``data`` ranks (module docstring); ``largest``: the two largest ZeRO-3 units' elements
    (ZeRO-3 holds them gathered)."""
    return sum(state_parts(params, data, zero, m, largest).values())


def state_parts(params: float, data: int, zero: int, m: int, largest: float = 0.0) -> dict[str, float]:
    """:func:`state_bytes` by part: ``parameters`` (their shards under ZeRO-3),
    ``gathered`` (ZeRO-3's two largest units held whole: the one in use and the one
    prefetched), ``gradients`` and ``optimizer`` (AdamW's two moments), in bytes."""
    d = data if data > 1 else 1
    return {"parameters": params * PARAM_BYTES / (d if zero >= 3 else 1),
            "gathered": largest * PARAM_BYTES if zero >= 3 else 0.0,
            "gradients": params * GRAD_BYTES / (d if zero >= 2 and (m == 1 or zero >= 3) else 1),
            "optimizer": params * STATE_BYTES / (d if zero >= 1 else 1)}


def zero_comm(params: float, data: int, tensor: int, zero: int, m: int, compute_one: float,
              hw: Hardware) -> float:
    """The data group's exposed seconds per step under ZeRO (module docstring);
    ``compute_one``: one microbatch's compute seconds (forward + backward)."""
    grad_bytes = params * GRAD_BYTES
    if zero == 0:
        return exposed_data_comm(data, tensor, grad_bytes, compute_one, hw)
    gather = cost_model.all_gather_time(data, grad_bytes / data, hw, stride=tensor)
    if zero <= 2:
        # both stages reduce-scatter the gradients (runtime.grad_sync._ShardedBucket),
        # overlapped with the last microbatch's backward but for the last bucket
        reduce = max(cost_model.reduce_scatter_time(data, grad_bytes, hw, stride=tensor) - compute_one * 2 / 3,
                     cost_model.reduce_scatter_time(data, min(grad_bytes, GRADIENT_BUCKET_BYTES), hw, stride=tensor))
        return reduce + gather
    forward = max(gather - compute_one / 3, 0.0)
    backward = gather + cost_model.reduce_scatter_time(data, grad_bytes, hw, stride=tensor)
    return m * (forward + backward)


def best_levers(options: list[LeverFigures], memory_limit: float) -> LeverFigures:
    """The fastest setting that fits in ``memory_limit`` (ties to the earlier priced),
    else the one needing the least memory."""
    fitting = [o for o in options if o.memory_bytes <= memory_limit]
    if fitting:
        return min(fitting, key=lambda o: o.step_s)
    return min(options, key=lambda o: o.memory_bytes)


@dataclass
class Again:
    """What one recomputation setting costs a family beyond :func:`recompute_figures`:
    its non-data communication per microbatch and activation bytes added (3D layers'
    gathered weights, which the recomputed blocks do not free: the all-gather cache
    keeps them). A bounded cache (3D layers, axonn §IV-D) has ``cache_blocks`` steps:
    caching ``k`` of them adds ``k · block_bytes`` and saves ``k · block_s`` of the z
    communication per microbatch, and while ``k`` is short of all of them the block
    being recomputed holds its own (one more ``block_bytes``); :func:`weigh` keeps the
    most that fit (``layers_per_block`` gives the plan's bound in layers)."""

    comm_s: dict
    extra_bytes: float = 0.0
    cache_blocks: int = 0
    block_bytes: float = 0.0
    block_s: float = 0.0
    layers_per_block: int = 0


def megatron_again(mode: str, one) -> list[Again]:
    """Megatron §3.5: full recomputation runs the forward's ``g`` all-reduces again,
    half of a layer's tensor-group communication (x1.5); selective recomputes the
    attention core, which communicates nothing. 3D regions' gathered weights stay
    (every layer's cached: mixed plans do not bound the cache)."""
    factor = 1.5 if mode == "full" else 1.0
    return [Again({k: v * factor for k, v in one.total.comm_s.items() if k != MeshAxis.DATA}, one.gathered_bytes)]


@dataclass
class LeverSpace:
    """One configuration as :func:`weigh` sees it: ``rows`` per data rank (accumulation
    divides them), the ZeRO group's ``data`` ranks, the ``split`` of one row's compute
    (the tensor degree, Gx·Gy), ``at(m)``: the table of one of ``m`` microbatches,
    ``data_comm(one, zero, m, compute_one)``: the data group's exposed seconds per step,
    ``zero_stages`` offered, ``again(mode, one)``: the settings of a recomputation mode
    (:class:`Again`), ``accumulate``: whether accumulation is allowed (not with batch
    norms), ``fixed_axes``: communication that does not shrink with a microbatch's rows
    (the 3D weights' all-gathers over z), kept whole in :func:`weigh`'s estimates;
    ``row_share``: the share of each row's tokens a rank holds (``1/c`` when the context
    ranks split the sequence), which scales what recomputation keeps and runs again;
    ``recompute_modes``: the recomputation modes weighed when the configuration does not fit."""

    rows: int
    data: int
    split: int
    at: Callable[[int], object]
    data_comm: Callable[[object, int, int, float], float]
    zero_stages: tuple = (0, 1, 2, 3)
    again: Callable[[str, object], list] = megatron_again
    accumulate: bool = True
    fixed_axes: tuple = ()
    row_share: float = 1.0  # of each row's tokens, the share one rank computes (1/c under context parallelism)
    recompute_modes: tuple = ("none", "selective", "full")  # the recomputation modes weighed


def weigh(ctx, config, table, space: LeverSpace):
    """The configuration with the memory levers it runs with (module docstring): those
    forced, or, when the whole batch of each data rank does not fit, the fastest setting
    that fits; a configuration that fits runs without (the levers only cost time). The
    region table of ``m`` microbatches reads per step. Returns (table, config).

    With the same recomputation mode and ZeRO stage more microbatches only cost time
    (smaller kernels, less of the data all-reduce hidden): the counts priced are those
    where an estimate says some pair first fits, confirmed by the family's own pricing
    (:meth:`_Weighing.search`). A configuration slower without levers than the best
    feasible one priced so far (``ctx.best_s``) is not weighed: the levers only cost
    time (the data group's exchange aside, which ZeRO may shorten), so it cannot win; its
    table says so (``note``)."""
    forced = ctx.levers
    fixed_m = forced.microbatches if forced is not None and forced.microbatches else None
    fixed_z = forced.zero if forced is not None and forced.zero is not None else None
    fixed_r = forced.recompute if forced is not None and forced.recompute is not None else None
    fits = table.total.memory_bytes <= ctx.hw.memory_bytes
    if fixed_m is None and fixed_z is None and fixed_r is None and fits:
        return table, config
    # the levers cost time except in the data group's exchange (ZeRO's reduce-scatter may
    # expose less than the all-reduce): without it, no slower than the best, it cannot win
    if forced is None and table.step_s - table.total.comm_s.get(MeshAxis.DATA, 0.0) >= ctx.best_s[0]:
        return dataclasses.replace(table, note=f"memory levers not weighed: {table.step_s * 1e3:.3f} ms without "
                                               f"them, the best so far {ctx.best_s[0] * 1e3:.3f} ms"), config
    weighing = _Weighing(ctx, table, space, (fixed_m, fixed_z, fixed_r), fits)
    if not weighing.counts:  # a forced count that does not divide the rows: the planner says so (apply_levers)
        return table, config
    options = weighing.search()
    if not options:
        return table, config
    best = best_levers(options, weighing.limit)
    return _per_step(weighing.tables[best.m], best), dataclasses.replace(
        config, microbatches=best.m if best.m > 1 else None, zero=best.zero or None,
        recompute=None if best.recompute == "none" else best.recompute)


class _Weighing:
    """The lever settings :func:`weigh` prices for one configuration: the recomputation
    ``modes``, ZeRO ``stages`` and microbatch ``counts`` (forced ones alone; with a table
    that fits, no recomputation and no ZeRO), each count's table (priced once), and the
    options priced so far in the order priced (ties go to the earlier)."""

    def __init__(self, ctx, table, space: LeverSpace, forced: tuple, fits: bool):
        fixed_m, fixed_z, fixed_r = forced
        self.model, self.hw, self.space, self.whole = ctx.model, ctx.hw, space, table
        self.rows, self.limit = space.rows, ctx.hw.memory_bytes
        offered = [z for z in space.zero_stages if z == 0 or space.data > 1]
        # the state alone does not fit, whatever the levers: only the least memory is weighed
        self.hopeless = state_bytes(table.param_elems, space.data, max(offered), 1, table.largest_params) > self.limit
        self.modes = [fixed_r] if fixed_r is not None else (["none"] if fits else list(space.recompute_modes))
        counts = [fixed_m] if fixed_m else ([1] if not space.accumulate or fits else divisors(self.rows))
        self.counts = [m for m in counts if self.rows % m == 0]
        self.stages = [fixed_z] if fixed_z is not None else ([0] + ([z for z in offered if z] if not fits else []))
        self.pairs = {(r, z) for r in self.modes for z in self.stages}
        self.tables = {1: table}
        self.options: list[LeverFigures] = []
        self.fits_at: dict[int, bool] = {}

    def search(self) -> list[LeverFigures]:
        """Every option priced. Each (mode, stage) pair is fastest at the fewest
        microbatches that fit (more only cost time). The search estimates where each pair
        first fits from the whole batch's table read per microbatch (activations scale
        with the rows), then prices every pair for real at each of those counts; where
        none fits there, it bisects for the fewest that fit, up to the most microbatches
        (the least memory; read off the whole batch's table when even the sharded state
        does not fit)."""
        counts = self.counts
        first = self.first_fits()
        if self.hopeless and counts[-1] > 1:
            self.tables[counts[-1]] = scaled(self.whole, counts[-1], fixed=self.space.fixed_axes)
        tried = sorted({counts.index(m) for m in first.values()}) or [len(counts) - 1]
        fitting = [self.exact(i) for i in tried]
        if not any(fitting) and tried[-1] < len(counts) - 1 and self.exact(len(counts) - 1):
            lo, hi = tried[-1], len(counts) - 1  # fits at hi, not at lo: the fewest that fit, by bisection
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if self.exact(mid) else (mid, hi)
        return self.options

    def first_fits(self) -> dict:
        """(mode, stage) -> the fewest microbatches estimated to fit, from the whole
        batch's table read per microbatch (none when the state alone does not fit)."""
        first: dict = {}
        for m in self.counts:
            if self.hopeless or len(first) == len(self.pairs):
                break
            estimate = scaled(self.whole, m, rows=False, fixed=self.space.fixed_axes) if m > 1 else self.whole
            _, fitted = self.price(m, estimate, self.pairs - set(first))
            for pair in fitted:
                first[pair] = m
        return first

    def exact(self, i: int) -> bool:
        """Whether some pair fits at ``counts[i]`` microbatches, priced for real (the
        family's table of one microbatch, once per count); its options are kept."""
        m = self.counts[i]
        if m not in self.fits_at:
            if m not in self.tables:
                try:
                    self.tables[m] = self.space.at(m)
                except PlanError:  # a count the configuration cannot split its rows into
                    self.fits_at[m] = False
                    return False
            found, fitted = self.price(m, self.tables[m], self.pairs)
            self.options.extend(found)
            self.fits_at[m] = bool(fitted)
        return self.fits_at[m]

    def price(self, m: int, one, pairs: set) -> tuple[list, set]:
        """The options of ``m`` microbatches whose table is ``one``, for the (mode,
        stage) ``pairs``, and the pairs that fit."""
        space = self.space
        recomputing = recompute_figures(self.model, self.hw, self.rows / m * space.row_share, space.split,
                                        one.activation_bytes - one.gathered_bytes, one.total.compute_s)
        out, fitted = [], set()
        for r in self.modes:
            if r not in recomputing:
                continue
            act, compute = recomputing[r]
            settings = space.again(r, one) if r != "none" else [Again(
                {k: v for k, v in one.total.comm_s.items() if k != MeshAxis.DATA}, one.gathered_bytes)]
            for z in self.stages:
                if (r, z) not in pairs:
                    continue
                state = state_bytes(one.param_elems, space.data, z, m, one.largest_params)
                pair = _Pair(m, z, r, compute, act, state, space.data_comm(one, z, m, compute))
                for again in settings:
                    option = _setting(pair, again, self.limit)
                    out.append(option)
                    if option.memory_bytes <= self.limit:
                        fitted.add((r, z))
        return out, fitted


@dataclass(frozen=True)
class _Pair:
    """One (recomputation mode, ZeRO stage) pair at ``m`` microbatches, before what the
    mode costs the family (:class:`Again`): per microbatch ``compute`` seconds and ``act``
    bytes kept (:func:`recompute_figures`), the ZeRO stage's ``state`` bytes
    (:func:`state_bytes`) and ``data_s``, the data group's seconds per step."""

    m: int
    zero: int
    mode: str
    compute: float
    act: float
    state: float
    data_s: float


def _setting(pair: _Pair, again: Again, limit: float) -> LeverFigures:
    """One setting priced: ``pair`` (``m`` microbatches of ``compute`` seconds and ``act``
    bytes kept, ZeRO stage ``zero`` with its ``state`` bytes and ``data_s`` of the data
    group, recomputation ``mode``) with what the mode costs the family (``again``); under
    a bounded all-gather cache, the most blocks' gathered weights that fit in ``limit``."""
    m, act, state = pair.m, pair.act, pair.state
    k, bound, held = 0, None, 0.0
    if again.cache_blocks:  # the most blocks' gathered weights that fit
        n, size = again.cache_blocks, again.block_bytes
        free = limit - state - act - again.extra_bytes
        # all cached; else k cached and the block being recomputed its own
        k = n if n * size <= free else int(min(n - 1, max(0.0, free / size - 1)))
        bound = None if k == n else k * again.layers_per_block
        held = (k + (0 if k == n else 1)) * size
    comm = {key: v * m for key, v in again.comm_s.items()}
    if again.cache_blocks:
        comm[MeshAxis.Z] = comm.get(MeshAxis.Z, 0.0) - k * again.block_s * m
    comm[MeshAxis.DATA] = pair.data_s
    kept = act + again.extra_bytes + held
    return LeverFigures(m, pair.zero, pair.compute * m, comm, state + kept, kept, pair.mode, bound)


def _per_step(one, best: LeverFigures) -> RegionTable:
    """The region table of the setting ``best``, read per step: ``m`` microbatches of
    each region of ``one`` (one microbatch's table), the totals ``best``'s."""
    rows = []
    for c in one.regions:
        rows.append(dataclasses.replace(c, cost=Cost(c.cost.compute_s * best.m,
                                                     {k: x * best.m for k, x in c.cost.comm_s.items()},
                                                     c.cost.memory_bytes),
                                        alternatives={k: x * best.m for k, x in c.alternatives.items()}))
    total = Cost(best.compute_s, dict(best.comm_s), best.memory_bytes)
    return RegionTable(rows, total, best.step_s, one.param_elems, best.activation_bytes, one.largest_params,
                       gather_cache=best.gather_cache, sequence=one.sequence)


def chosen_levers(ctx, config):
    """``ctx`` with the levers the search chose for ``config`` forced, all of them (one
    microbatch and no ZeRO included): a family prices its winner's full table again
    with them."""
    levers = Strategy(microbatches=config.microbatches or 1, zero=config.zero or 0,
                      recompute=config.recompute or "none", levers_only=True)
    return dataclasses.replace(ctx, levers=levers)


def scaled(table, m: int, rows: bool = True, fixed: tuple = ()):
    """``table`` read for one of ``m`` microbatches without pricing it again: compute,
    communication (but the ``fixed`` groups') and activations (but the 3D layers'
    gathered weights) divided by ``m`` (D&SP, whose sub-grid assignment is the whole
    batch's; :func:`weigh`'s estimates, ``rows=False``: the totals only, the region rows
    left as they are)."""
    def per(comm: dict) -> dict:
        return {k: v if k in fixed else v / m for k, v in comm.items()}
    total = Cost(table.total.compute_s / m, per(table.total.comm_s), table.total.memory_bytes)
    regions = table.regions
    if rows:
        regions = [dataclasses.replace(c, cost=Cost(c.cost.compute_s / m, per(c.cost.comm_s), c.cost.memory_bytes),
                                       alternatives={k: v / m for k, v in c.alternatives.items()}) for c in regions]
    return dataclasses.replace(table, regions=regions, total=total, step_s=table.step_s / m,
                               activation_bytes=(table.activation_bytes - table.gathered_bytes) / m
                               + table.gathered_bytes)