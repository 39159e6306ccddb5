"""The interface between the planner and a parallelism family.

A *family* is one way of splitting a model over ranks: pure data parallelism, Megatron's
data × tensor, D&SP/cSub's branches on sub-grids, AxoNN's 3D/4D grid, Bian's cube, PTD-P's
pipeline. Each lives in its package under ``autopar/strategies/`` (rewrite pass, cost
formulas, collectives) and tells the planner, through the methods of
:class:`Family`, what it can do with one model on one world of ranks:

``regions(model)``
    The regions of the graph the family can split (D&SP: the multi-branch regions; 3D
    and cube: attention and linear chains; pipeline: the repeated blocks it cuts
    between). Pure; a family that finds none offers nothing.

``candidates(ctx)``
    The configurations the family offers on ``ctx.world`` ranks, each a
    :class:`~autopar.planning.strategy.Strategy` with every degree filled in, in a fixed
    order (the plan must not depend on hash seeds). Under a forced strategy
    (``ctx.forced``) a family offers that one configuration if it is its own
    (:meth:`Strategy.kind`), after checking it (raising :class:`PlanError` that names the
    argument), and nothing otherwise. A configuration rejected without pricing (say, the
    world is no ``p³ × d`` for the cube) may come back as an infeasible :class:`Priced`:
    the search lists those first in the configurations weighed.

``price(ctx, candidate)``
    A :class:`Priced`: the predicted step time of the configuration and its parts
    (compute, communication by group), memory per rank, and whether it is feasible, with
    the reason when not (the batch does not divide, nothing can be split, it needs more
    memory than ``ctx.hw`` has). The formulas are the papers': ring collectives
    ``all-gather (G−1)·m/β``, ``reduce-scatter (G−1)/G·m/β``, ``all-reduce
    2(G−1)/G·m/β`` (axonn eqs 1-3) with each group's bandwidth by its placement (axonn
    eq 10); Megatron's f and g all-reduces (megatron §2.3); the 3D layer's collectives
    (axonn eqs 4-9) and the cube's (bian Algorithms 1-8); D&SP's segmented messages
    (super eqs 3-7); the pipeline's bubble ``(p−1)/(v·m)`` and point-to-point volume
    (megatron §2.2, §4.1); compute from FLOPs (megatron appendix). A forced configuration
    that cannot run raises :class:`PlanError` instead of coming back infeasible.

``follow_ups(ctx, weighed)`` (optional, none by default)
    Configurations derived from what every family's candidates priced at: a second
    round of the search (the pipeline's mixed stages at its fastest layouts).

``step_floor(ctx, candidate)`` (optional, 0 by default)
    A lower bound on the configuration's step, known before it is priced: the search
    prices in ascending order of it, so the best step so far (``ctx.best_s``) is found
    early, and the family may cut a configuration whose bound exceeds it (the pipeline's
    layouts, :mod:`autopar.strategies.pipeline.bound`).

``fallbacks(ctx)`` (optional, none by default)
    Configurations priced only when every other one was refused: replication, the
    last resort of ``"auto"`` (:mod:`autopar.strategies.replicate.planner`).

``to_plan(ctx, priced)``
    The :class:`~autopar.planning.plan.Plan` of a priced configuration, with its region
    table (a family that priced identical blocks once for the search prices the winner
    region by region here). The search fills in ``candidates`` and ``forced``.

The compiler asks the families of a plan four more things for each rank (they have
defaults in :class:`CompileHooks`, so a family that does not touch a rank's program
leaves them alone):

``planned_shards(plan, gm)``
    The cut of each parameter the family splits (by the captured graph's names):
    Megatron's ``ParamShard``, the 3D grid's and the cube's ``Grid3DShard``.

``rank_passes(plan, build)``
    The :class:`RankPass` es the family adds to a rank's program, each in a named stage
    of :data:`PASS_STAGES` and after the passes it names (:func:`order_passes`: D&SP's
    branches, then the split of the regions, ZeRO's reads, the random draws,
    recomputation, the data-parallel pass).

``recompute_regions(plan)``
    The regions whose activations are recomputed in backward under ``recompute``.

``place(builder, build)``
    Refine the parameter layout (:mod:`autopar.strategies.placement`): where the
    family's parameters live and how their gradients are reduced.

A family whose configurations hold or ride on another family's (a pipeline of mixed
stages, expert and context parallelism on the data, Megatron and pipeline families'
configurations) reaches that family through :meth:`PlanContext.peer`, by name, never by
importing its package; what two families share lives in :mod:`autopar.strategies.shared`.

The planner (:mod:`autopar.driver.search`) enumerates: for each family of
:data:`autopar.strategies.registry.FAMILIES`, its candidates; it prices each, and takes
the fastest feasible one (ties to the earlier). Adding a family is adding a package with
a ``planner.py`` whose family object goes into that registry.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.grid import MeshAxis
from autopar.ir import CAPTURE
from autopar.planning.model import ModelFacts
from autopar.planning.plan import Cost, MeshCandidate, Plan, RegionChoice
from autopar.planning.strategy import Strategy
from autopar.runtime.family_runtime import RankRuntime

log = logging.getLogger("autopar.planning")


@dataclass(frozen=True)
class PlanContext:
    """What every family is asked about: one model on one world of ranks."""

    model: ModelFacts
    world: int
    hw: Hardware
    forced: Strategy | None  # None: "auto", the search weighs every family
    name: str                # the model's name in the plan
    levers: Strategy | None = None  # the memory levers forced (microbatches, zero, recompute), any family
    # the fastest feasible step priced so far ([seconds], the planner keeps it): a
    # configuration slower than it without memory levers cannot win with them (they only
    # cost time), so its levers are not weighed
    best_s: list = field(default_factory=lambda: [math.inf])
    # every registered family (the search hands it :data:`autopar.strategies.registry.FAMILIES`),
    # for a family that composes another's to ask by name (:meth:`peer`)
    peers: tuple = field(default=(), repr=False, compare=False)

    def peer(self, name: str) -> "Family":
        """The registered family called ``name``. A family whose configurations hold or
        ride on another's (a pipeline whose stages are mixed plans, expert and context
        parallelism on data, Megatron and pipeline configurations) asks for that family
        here and calls its methods: families are peers, none imports another's package."""
        for family in self.peers:
            if family.name == name:
                return family
        raise LookupError(f"no family named {name!r} among this context's peers "
                          f"{[f.name for f in self.peers]}: the search gives a context every registered family")


@dataclass
class RegionTable:
    """A configuration's region choices (the last row: the nodes outside regions), its
    total cost per rank and predicted step seconds."""

    regions: list[RegionChoice]
    total: Cost
    step_s: float
    param_elems: float = 0.0        # parameter elements on the rank (its tensor parts)
    activation_bytes: float = 0.0   # bytes saved for backward on the rank
    largest_params: float = 0.0     # the two largest ZeRO-3 units' elements (ZeRO-3 holds them gathered)
    gathered_bytes: float = 0.0     # of the activations: the 3D layers' all-gathered weights kept for backward
    gather_cache: int | None = None  # under recomputation, the 3D layers whose gathered weights are cached
    note: str = ""                  # why its memory levers were not weighed (said when it does not fit)
    sequence: bool = False          # priced with Megatron-SP (docs/sequence.md)


@dataclass(frozen=True)
class Priced:
    """One configuration, priced (or rejected): what the list of configurations weighed
    shows (:meth:`candidate`) and what its family needs to make the plan.

    ``step_s`` is the predicted step: compute plus the communication ``comm_s`` by
    group (tensor, x, y, z, pipeline — point-to-point and bubble —, data); a pipeline's
    is its schedule's (megatron §2.2), which ``comm_s`` splits the same way.
    ``table`` is the region table the search priced (for the 3D forms: one
    representative per class of identical regions); ``detail`` is what else the family
    keeps for :meth:`Family.to_plan` (the pipeline's figures, the 3D pricing mode)."""

    family: str
    config: Strategy
    mesh: dict[str, int]
    step_s: float | None = None
    memory_bytes: float | None = None
    feasible: bool = False
    reason: str = ""
    comm_s: dict[str, float] = field(default_factory=dict)
    form: str = ""  # "cube", "pipeline <schedule>[ v=..]" or ""
    table: RegionTable | None = None
    detail: object = None
    listed: bool = True  # False: the same plan as another family's configuration (not listed twice)
    bound_s: float | None = None  # cut by its family's lower bound (not priced in full): that bound

    def candidate(self) -> MeshCandidate:
        """The row of the configurations weighed (:attr:`Plan.candidates`)."""
        c = self.config
        layout = {"subgrids": c.subgrids, "topology_aware": c.topology_aware, "csub": c.csub} if c.subgrids > 1 else {}
        return MeshCandidate(dict(self.mesh), self.step_s, self.memory_bytes, self.feasible, self.reason,
                             comm_s=dict(self.comm_s), form=self.form, **layout)


PASS_STAGES = ("branches", "split", "zero", "draws", "recompute", "data")
"""The named stages of a rank's passes, in the order they run: D&SP's branches (a rank
keeps its sub-grid's), the split of the regions (Megatron, 3D, cube, experts, context),
ZeRO's reads of sharded parameters, the random ops' plan-independent draws, the
recomputation that outlines the blocks, the data-parallel pass (the batch split, which
reads what every split left)."""
BRANCHES, SPLIT, ZERO, DRAWS, RECOMPUTE, DATA = PASS_STAGES


@dataclass(frozen=True)
class RankPass:
    """A pass of a rank's program: ``fn(gm, **options)`` named ``name``, in the named
    ``phase`` (one of :data:`PASS_STAGES`), after every pass of an earlier stage and
    after the passes ``after`` names (those present; torch.fx's
    ``this_before_that_pass_constraint`` in the other direction).
    :func:`order_passes` orders them."""

    phase: str
    name: str
    fn: object
    options: dict
    after: tuple[str, ...] = ()


def order_passes(passes: list[RankPass]) -> list[RankPass]:
    """``passes`` in an order that keeps every constraint (stage order, then each pass's
    ``after``), otherwise as given (the registry's order): a stable topological sort.
    A pass in no known stage, or constraints that form a circle, are refused naming the
    passes."""
    for p in passes:
        if p.phase not in PASS_STAGES:
            raise ValueError(f"rank pass {p.name!r}: stage {p.phase!r} is none of {PASS_STAGES}")
    rank = {p.phase: PASS_STAGES.index(p.phase) for p in passes}
    names = {p.name for p in passes}
    before = {i: {j for j, q in enumerate(passes) if rank[q.phase] < rank[p.phase] or (q.name in p.after and q.name
              in names and q is not p)} for i, p in enumerate(passes)}
    done: list[int] = []
    while len(done) < len(passes):
        ready = next((i for i in range(len(passes)) if i not in done and before[i] <= set(done)), None)
        if ready is None:
            left = [passes[i].name for i in range(len(passes)) if i not in done]
            raise ValueError(f"rank passes {left}: their 'after' constraints form a circle")
        done.append(ready)
    return [passes[i] for i in done]


@dataclass(frozen=True)
class StageCut:
    """A cut of the captured graph built as a program of its own (a pipeline stage):
    its ``index``, the blocks it holds (``block_nodes``: block id → node names, what
    recomputation recomputes), the whole graph's ``vocab`` regions (the analysis keeps the
    stage's part of them), and ``passes`` (``(name, fn, options)``) run right after the
    analysis."""

    index: int
    block_nodes: dict
    passes: tuple = ()
    vocab: tuple = ()


@dataclass(frozen=True)
class RankBuild:
    """What the families are told when a rank's program and layout are built: the rank,
    the batch of its program, whether the graph carries its loss, whether this rank runs
    only its D&SP branches (cSub off sub-grid 0), under a pipeline the ``stage`` whose
    program is built (a family splits only that stage's regions), and for the layout the
    pipeline's ``holders`` and whether the 3D layers defer their reduce-scatters; under
    ZeRO the parameters the layout shards (``zero_params``: wrapper name → layout name)."""

    rank: int
    local_batch: int = 0
    with_loss: bool = False
    branch_only: bool = False
    stage: int | None = None
    holders: dict | None = None
    deferred_reduce_scatter: bool = False
    zero_params: dict | None = None  # under ZeRO: the sharded parameters' names (strategies/data/zero.py)


class CompileHooks:
    """The compiler's side of a family, doing nothing (a family overrides what it does),
    and the search's second round (:meth:`follow_ups`)."""

    # priced after the other families' configurations, so that the best step found so far
    # (``PlanContext.best_s``) can cut its own pricing short with a lower bound
    priced_late = False

    def follow_ups(self, ctx: PlanContext, weighed: list[Priced]) -> list[Strategy]:
        """Configurations to price after every family's candidates were priced
        (``weighed``), derived from them: none by default."""
        return []

    def step_floor(self, ctx: PlanContext, config: Strategy) -> float:
        """Seconds ``config``'s step takes at least, known before it is priced (0: no
        bound). The search prices each round's configurations in ascending order of it
        (after the families ``priced_late``), so that the best step so far is found early
        and a family can cut a configuration whose bound exceeds it."""
        return 0.0

    def fallbacks(self, ctx: PlanContext) -> list[Strategy]:
        """Configurations priced only when no other configuration is feasible (replication
        under ``"auto"``): none by default."""
        return []

    def finish_plan(self, ctx: PlanContext, plan: Plan) -> None:
        """Settle the plan-wide options this family owns once the search chose ``plan``
        (its levers applied), or refuse them with a ``PlanError``."""

    def planned_shards(self, plan: Plan, gm) -> dict:
        return {}

    def rank_passes(self, plan: Plan, build: RankBuild) -> list[RankPass]:
        return []

    def recompute_regions(self, plan: Plan) -> list[str]:
        return []

    def place(self, builder, build: RankBuild) -> None:
        return None

    def parameter_holders(self, plan: Plan, gm) -> dict | None:
        """Where the family places parameters on some ranks only (a pipeline's stages),
        the positions that hold each; None when every rank holds its part of each."""
        return None

    def rank_code(self, plan: Plan, model, rank: int, example_inputs, loss_fn, example_target,
                  example_kwargs, rewrite) -> str | None:
        """The readable code of rank ``rank``'s programs where the family builds them
        itself (a pipeline's stage programs, each rewritten by ``rewrite``:
        :func:`autopar.driver.rank_program.rewrite`); None: the one rank program."""
        return None

    def rank_runtime(self, plan: Plan, rank: int, options: dict) -> RankRuntime | None:
        """What the family keeps on rank ``rank`` while it runs
        (:class:`~autopar.runtime.family_runtime.RankRuntime`), or None; ``options``:
        ``compile``'s run-time options (``overlap``)."""
        return None


class Family(Protocol):
    """A parallelism family, as the planner sees it (see the module docstring)."""

    name: str  # as ``Plan.why_not`` names it: data, megatron, dsp, tensor3d, cube, pipeline

    def regions(self, model: ModelFacts) -> list: ...

    def candidates(self, ctx: PlanContext) -> list[Strategy | Priced]: ...

    def price(self, ctx: PlanContext, candidate: Strategy) -> Priced: ...

    def to_plan(self, ctx: PlanContext, priced: Priced) -> Plan: ...

    def follow_ups(self, ctx: PlanContext, weighed: list[Priced]) -> list[Strategy]: ...

    def step_floor(self, ctx: PlanContext, config: Strategy) -> float: ...

    def fallbacks(self, ctx: PlanContext) -> list[Strategy]: ...

    def finish_plan(self, ctx: PlanContext, plan: Plan) -> None: ...

    def planned_shards(self, plan: Plan, gm) -> dict: ...

    def rank_passes(self, plan: Plan, build: RankBuild) -> list[RankPass]: ...

    def recompute_regions(self, plan: Plan) -> list[str]: ...

    def place(self, builder, build: RankBuild) -> None: ...

    def parameter_holders(self, plan: Plan, gm) -> dict | None: ...

    def rank_code(self, plan: Plan, model, rank: int, example_inputs, loss_fn, example_target,
                  example_kwargs, rewrite) -> str | None: ...

    def rank_runtime(self, plan: Plan, rank: int, options: dict) -> RankRuntime | None: ...


def rejected(family: str, config: Strategy, mesh: dict[str, int], reason: str, **figures) -> Priced:
    """An infeasible configuration and why (``figures``: the step, memory, communication
    and form it was priced at, if it was)."""
    return Priced(family, config, mesh, feasible=False, reason=reason, **figures)


def too_big(memory_bytes: float, hw: Hardware, note: str = "") -> str | None:
    """Why ``memory_bytes`` per rank does not fit the device, or None when it does;
    ``note``: why the memory levers were not weighed (:attr:`RegionTable.note`)."""
    if memory_bytes > hw.memory_bytes:
        return f"needs {_size(memory_bytes)} per rank, device has {_size(hw.memory_bytes)}" + (
            f" ({note})" if note else "")
    return None


def _size(nbytes: float) -> str:
    """Bytes as GiB with one decimal, or MiB below 1 GiB (so 41 MiB is not "0.0 GiB")."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def mesh_plan(ctx: PlanContext, priced: Priced, table: RegionTable) -> Plan:
    """The plan of a configuration without a pipeline: its mesh, D&SP layout, region
    table and cost."""
    c = priced.config
    log.info("planned %s on %d ranks: %s, %.3f ms", ctx.name, ctx.world, priced.mesh, table.step_s * 1e3)
    capture = ctx.model.gm.meta.get(CAPTURE)
    return Plan(model=ctx.name, world_size=ctx.world, mesh=priced.mesh, hardware=ctx.hw.name,
                global_batch=ctx.model.batch, regions=table.regions, total=table.total, step_s=table.step_s,
                tracer=capture.tracer if capture else "", subgrids=c.subgrids, topology_aware=c.topology_aware,
                csub=c.csub, microbatches=c.microbatches or 1, zero=c.zero or 0, recompute=c.recompute == "full",
                sequence_parallel=table.sequence,
                selective_recompute=c.recompute == "selective",
                gather_cache=table.gather_cache if c.recompute == "full" else None)


def per_step_s(ctx: PlanContext, mesh: dict, config) -> float:
    """What every step of a configuration pays besides its regions and schedule: the
    runner's fixed cost (``Hardware.step_overhead_s``) and, where the batch is split over
    ``parts`` ranks: the all-reduce of the count where the loss averages over counted
    targets (:mod:`autopar.runtime.target_count`, 8 bytes), and the exact remedies where
    rows of the batch meet (:mod:`autopar.passes.analysis.batch_rows`): a pairwise score's
    operands all-gathered forward and their gradients reduce-scattered backward (axonn
    eqs 1-2), a batch statistic all-reduced forward and backward (axonn eq 3)."""
    parts = mesh.get(MeshAxis.DATA, 1) * mesh.get(MeshAxis.Z, 1)
    if getattr(config, "csub", False) and getattr(config, "subgrids", 1) > 1:
        parts //= config.subgrids
    count = cost_model.all_reduce_time(parts, 8, ctx.hw) if parts > 1 and ctx.model.counts_targets else 0.0
    if parts > 1:
        for c in ctx.model.batch_couplings:
            if c.remedy == "gather":
                count += cost_model.all_gather_time(parts, c.nbytes / parts, ctx.hw) + \
                    cost_model.reduce_scatter_time(parts, c.nbytes, ctx.hw)
            elif c.remedy == "all_reduce":
                count += 2 * cost_model.all_reduce_time(parts, c.nbytes, ctx.hw)
    return ctx.hw.step_overhead_s + count


def with_per_step(ctx: PlanContext, priced: Priced) -> Priced:
    """``priced`` with what the search adds to every configuration's step
    (:func:`per_step_s`: the runner's fixed cost, every plan), as it lists it."""
    if priced.step_s is None:
        return priced
    fixed = per_step_s(ctx, priced.mesh, priced.config)
    return dataclasses.replace(priced, step_s=priced.step_s + fixed) if fixed else priced


def priced_in_full(ctx: PlanContext, price, config: Strategy) -> Priced:
    """``config`` priced by ``price`` with no bound cutting it (the best so far taken as
    infinite), as a search without the cut would have listed it (:func:`with_per_step`)."""
    return with_per_step(ctx, price(dataclasses.replace(ctx, best_s=[math.inf]), config))


def fastest_in_full(ctx: PlanContext, weighed: list[Priced], price: Callable[[PlanContext, Strategy], Priced],
                    wanted: Callable[[Priced], bool], key: Callable[[Priced], Any], best_key: Callable[[float], Any],
                    count: int) -> list[Priced]:
    """``weighed`` with the layouts a family's lower bound cut (the pipeline's,
    :mod:`autopar.strategies.pipeline.bound`) priced in full (by ``price``, no bound:
    :func:`priced_in_full`) wherever one could be among the first ``count`` rows
    ``wanted`` by ``key`` (``best_key(floor)``: the least key a layout of that bound can
    have): a second round that picks the fastest layouts (mixed stages, spread experts)
    picks the same ones as a search without the bound."""
    rows = list(weighed)
    cuts = sorted((i for i, p in enumerate(rows) if p.bound_s is not None), key=lambda i: rows[i].bound_s)
    for i in cuts:
        top = sorted(key(p) for p in rows if wanted(p))[:count]
        if len(top) == count and best_key(rows[i].bound_s) > top[-1]:
            break  # this and every later bound: past the first ``count``
        rows[i] = priced_in_full(ctx, price, rows[i].config)
    return rows
