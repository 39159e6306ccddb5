"""The user's entry points: :func:`compile` and :func:`plan` (the module ``compile`` returns
is :class:`autopar.engine.module.ParallelModule`; a rank's program is built in :mod:`autopar.driver.rank_program`).

    pm = autopar.compile(model, mesh, example_inputs=(x,), loss_fn=F.cross_entropy,
                         example_target=y)
    loss = pm.step(x, target=y)          # forward + backward over the whole batch
    optimizer.step()                     # any torch.optim optimizer over pm.parameters()

    # keyword inputs; a model that computes its own loss from labels= needs no loss_fn
    pm = autopar.compile(hf_model, mesh, example_kwargs={"input_ids": ids, "attention_mask": mask,
                                                         "labels": labels})
    loss = pm.step(input_ids=ids, attention_mask=mask, labels=labels)

Every rank passes the same global batch; each takes its share (of every positional and
keyword tensor, along its first dimension: :mod:`autopar.trace.inputs`). The flow is that of
``docs/architecture.md``: capture at the global batch → analysis → plan; then, per rank,
capture at the local batch → analysis → tensor-parallel and data-parallel rewrites →
a GraphModule over a module tree holding this rank's parameter shards.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn

from autopar.trace.capture import ModelLossError, capture
from autopar.passes.analysis.batch_rows.scalars import scalar_constants
from autopar.ir import LOSS_TERMS
from autopar.planning.declared import region_label
from autopar.planning.drawing import regions_dot
from autopar.trace.inputs import CallLayout, example_signature
from autopar.passes.fusion import resolve_fusion
from autopar.engine.module import ParallelModule
from autopar.passes.analysis.analyse import analyse
from autopar.cost.hardware import Hardware
from autopar.planning.plan import Plan
from autopar.planning.reviewed import as_plan
from autopar.driver.search import PlanError, Strategy, plan_graph
from autopar.agreement import (agreed_hardware, agreed_plan, check_same_call_everywhere, check_same_plan_everywhere,
                               resolve_hardware)
from autopar.engine.executable import batch_of, local_batch, rank_graph_code
from autopar.driver.rank_program import planned_shards, rewrite
from autopar.runtime import health
from autopar.engine import materialise
from autopar.timing import Timings, phase, recording
from autopar.strategies.placement import build_layout
from autopar.strategies.registry import FAMILIES

log = logging.getLogger("autopar")


def plan(model: nn.Module, world_size: int, example_inputs: Sequence[Any] = (), loss_fn: Callable | None = None,
         strategy: Any = "auto", *, example_target: Any = None, example_kwargs: dict[str, Any] | None = None,
         hardware: str | Hardware | None = None, memory_limit: float | None = None, progress=None) -> Plan:
    """Plan ``model`` for ``world_size`` ranks without starting any process.

    The model and inputs may live on the meta device: planning reads shapes only, so a
    175B-parameter model plans without its weights. ``memory_limit``: bytes per device
    (default: the hardware's memory); plans that need more are infeasible. The returned
    plan can ``save(dir)`` itself with every rank's rewritten graph (built here, in this
    process: the rewrite needs no process group) and the region drawing. ``progress``: a
    :class:`autopar.driver.search.Progress` told of every configuration priced.
    ``example_kwargs``: keyword inputs, as for :func:`compile`. ``hardware``: a preset
    name, a profile's path or a :class:`Hardware`; None: this machine's calibrated
    profile where ``autopar calibrate`` cached one, else the ``cpu-gloo`` preset, said
    in the plan's header (:mod:`autopar.cost.profiles`).
    """
    CallLayout.of(example_inputs, example_kwargs)  # the example's keyword inputs are usable
    gm = _global_graph(model, example_inputs, loss_fn, example_target, example_kwargs)
    hw, source = resolve_hardware(hardware, memory_limit)
    plan_ = plan_graph(gm, world_size, hw, strategy, progress=progress)
    plan_.hardware_source = source
    _attach_artifacts(plan_, gm, model, example_inputs, loss_fn, example_target, example_kwargs)
    return plan_


def _attach_artifacts(plan_: Plan, gm: fx.GraphModule, model, example_inputs, loss_fn, example_target,
                      example_kwargs=None) -> None:
    """Let ``plan_.save`` write rank graphs and the region drawing, built only when saved."""
    def build(max_ranks: int):
        graphs = {}
        for rank in range(min(plan_.world_size, max_ranks)):
            code = next((c for family in FAMILIES if (c := family.rank_code(
                plan_, model, rank, example_inputs, loss_fn, example_target, example_kwargs, rewrite)) is not None),
                None)
            if code is not None:  # a family that builds the rank's programs itself (a pipeline's stages)
                graphs[rank] = code
                continue
            rank_gm = rank_graph(model, plan_, rank, example_inputs, loss_fn, example_target,
                                 example_kwargs=example_kwargs)
            graphs[rank] = rank_graph_code(rank_gm, plan_, rank)
        strategies = {r.region: region_label(plan_, r) for r in plan_.regions}
        return graphs, regions_dot(gm, strategies, title=f"{plan_.model}: regions and strategies")

    plan_.artifact_source = build


def _global_graph(model, example_inputs, loss_fn, example_target, example_kwargs=None) -> fx.GraphModule:
    """The graph planned on: with ``loss_fn``'s loss when a target is given; without a
    ``loss_fn``, with the model's own loss when its output carries one (``labels=``)."""
    with_loss = loss_fn is not None and example_target is not None
    gm = capture(model, tuple(example_inputs), loss_fn if with_loss else None,
                 example_target if with_loss else None, example_kwargs=example_kwargs,
                 model_loss="if_present" if loss_fn is None else None)
    return analyse(gm)


def rank_graph(model: nn.Module, plan_: Plan, rank: int, example_inputs: Sequence[Any] = (),
               loss_fn: Callable | None = None, example_target: Any = None,
               fusion: bool | None = None, *, example_kwargs: dict[str, Any] | None = None) -> fx.GraphModule:
    """Rank ``rank``'s rewritten graph (captured at its local batch), for dumps and tests;
    ``fusion``: run the fusion pass (None: when the plan was priced with fused kernels).
    Without ``loss_fn`` it returns the model's own loss when the output carries one, as
    ``pm.step`` runs it. A pipeline plan's rank runs several programs, one per stage: see
    :func:`autopar.strategies.pipeline.program.stage_graphs` and ``pipeline_rank_code``
    (with ``rewrite=autopar.driver.rank_program.rewrite``)."""
    if plan_.pipeline:
        raise PlanError("rank_graph: a pipeline plan gives each rank one program per stage; use "
                        "autopar.strategies.pipeline.program.stage_graphs (or pipeline_rank_code for their code) "
                        "with rewrite=autopar.driver.rank_program.rewrite")
    layout = CallLayout.of(example_inputs, example_kwargs)
    flat = layout.flatten(tuple(example_inputs), dict(example_kwargs or {}), "rank_graph()")
    inputs, target = local_batch(plan_.batch_parts(), plan_.batch_chunk(rank), flat, example_target)
    args, kwargs = layout.unflatten(inputs)
    gm = capture(model, args, loss_fn if target is not None else None, target, example_kwargs=kwargs,
                 model_loss="if_present" if loss_fn is None else None)
    return rewrite(gm, plan_, rank, batch_of(inputs), fusion=plan_.fusion if fusion is None else fusion)


@health.guarded("compile()", setup=True)
def compile(model: nn.Module, mesh=None, example_inputs: Sequence[Any] = (), loss_fn: Callable | None = None,
            strategy: Any = "auto", *, example_target: Any = None, example_kwargs: dict[str, Any] | None = None,
            hardware: str | Hardware | None = None, seed: int = 0, overlap: Any = None,
            recompute: bool | str | None = None, memory_limit: float | None = None,
            fusion: bool | None = None, device: str | torch.device | None = None, plan: Any = None,
            replan: bool = False, batch: str = "global", torch_compile: bool = False) -> ParallelModule:
    """Make ``model`` run on the ranks of ``mesh`` (see the module docstring).

    ``example_inputs`` (positional) and ``example_kwargs`` (keyword inputs, e.g. a
    Hugging Face model's ``input_ids``, ``attention_mask``, ``labels``): one global batch,
    called as ``model(*example_inputs, **example_kwargs)``. Tensor keyword inputs are
    graph inputs, split over the data ranks along their first dimension (which must be
    the batch); other keyword values are constants of the capture that every call must
    repeat. Without a ``loss_fn``, ``step`` trains on the loss the model's output carries.

    ``mesh``: a ``DeviceMesh`` (flat, or 2-D with dims named ``data`` and ``tensor``, which
    fixes the degrees) or None for the default process group (or a single process when
    none is initialised). ``strategy``: ``"auto"`` (the planner chooses), ``"data"``,
    ``"tensor"``, degrees ``{"data": d, "tensor": t}``, or AxoNN's 3D/4D grid
    ``{"x": gx, "y": gy, "z": gz, "data": d}``. ``example_target`` lets the
    planner see the loss (e.g. vocab-parallel cross-entropy); without it the loss is
    captured at the first ``step``. ``overlap``: the 3D layers' overlap optimisations
    (axonn §IV; True, False or a dict of :class:`autopar.strategies.shared.grid3d.runtime.Overlap`'s
    fields; all on by default). ``recompute``: recompute each repeated block's activations
    (a model without blocks: each split region's) in backward instead of keeping them
    (activation checkpointing, megatron §3.5; also ``"full"``), ``"selective"`` only the
    attention cores (softmax, dropout, the score matmuls), False / ``"none"`` nothing; None:
    as the plan says (the planner recomputes where keeping them does not fit).
    ``memory_limit``: bytes per device the plan may use (default: the hardware's).
    ``hardware``: as for :func:`plan` (None: this machine's cached calibrated profile, else
    the ``cpu-gloo`` preset).
    ``fusion``: run each rank's pointwise chains and softmax/layer-norm rows as generated
    Triton kernels (docs/fusion.md); None: on when the model is on CUDA and Triton is
    installed; True on the CPU needs ``TRITON_INTERPRET=1`` (for testing).

    ``model`` may be on the meta device (built under ``torch.device("meta")``): planning
    and rewriting read shapes only, each rank allocates only the parts it holds, and
    ``pm.init_weights(seed=...)`` or ``pm.load_pretrained(path)`` gives them values
    before the first call (docs/guide/large_models.md). ``device``: where the rank's
    tensors go (None: the model's device; for a meta model the mesh's device type at
    ``LOCAL_RANK``, else the example inputs'). A model built for real must hold the same
    weights on every rank: compared at ``compile`` (a fingerprint per parameter).

    ``plan``: a reviewed :class:`Plan` (or the directory it was saved in) to run as it
    is, without planning; compile checks it was made for this model, batch, world and
    hardware and raises :class:`~autopar.planning.reviewed.PlanMismatchError` naming
    each difference, or with ``replan=True`` warns and plans afresh
    (:mod:`autopar.planning.reviewed`). ``strategy`` is then not used.

    ``batch``: ``"global"``: every rank passes the same global batch to ``pm(...)`` and
    ``pm.step(...)`` and takes its share; ``"local"``: each rank passes only its share,
    the rows of :attr:`~autopar.engine.module.ParallelModule.data_parallel_rank` of
    ``data_parallel_size`` (:mod:`autopar.data` feeds them), the same on the ranks of one
    share. The example inputs stay the global batch (the plan splits it; they may be on
    the meta device).

    ``torch_compile``: run each rank program under ``torch.compile`` (Inductor: C++ on the
    CPU, Triton on GPUs; static shapes, compiled at a program's first call), autopar's
    collectives and ZeRO's parameter reads between the compiled parts; autopar's own
    ``fusion`` is then off (refused if asked for).

    ``pm.timings`` says how long each phase took (:class:`autopar.timing.Timings`: this
    call's, then every program the rank builds and the first ``step``'s run).
    """
    timings = Timings()
    with recording(timings, "compile."), phase("checks"):
        if batch not in ("global", "local"):
            raise ValueError(f"batch={batch!r}: 'global' (every rank passes the whole batch) or 'local' (each rank "
                             f"passes its share: pm.data_parallel_rank of pm.data_parallel_size)")
        reviewed = None if plan is None else as_plan(plan)
        if torch_compile and fusion:
            raise ValueError("compile(): fusion=True and torch_compile=True: Inductor fuses the chains autopar's "
                             "fusion pass would; give one of them")
        pm = _compiled(CompileRequest(model, mesh, tuple(example_inputs), loss_fn, strategy, example_target,
                                      example_kwargs, hardware, seed, overlap, recompute, memory_limit,
                                      False if torch_compile else fusion, device, reviewed, replan, batch == "local",
                                      torch_compile), timings)
    log.info("autopar compile on rank %d took %.2f s: %s", pm.rank, timings.total("compile."),
             timings.summary("compile."))
    return pm


@dataclasses.dataclass(frozen=True)
class CompileRequest:
    """What :func:`compile` was asked for, its arguments checked (``reviewed``: the plan
    given to run, or None; ``batch_local``: ``batch="local"``)."""

    model: nn.Module
    mesh: Any
    example_inputs: tuple
    loss_fn: Callable | None
    strategy: Any
    example_target: Any
    example_kwargs: dict | None
    hardware: Any
    seed: int
    overlap: Any
    recompute: Any
    memory_limit: float | None
    fusion: bool | None
    device: Any
    reviewed: Plan | None
    replan: bool
    batch_local: bool
    torch_compile: bool


def _compiled(request: CompileRequest, timings: Timings) -> ParallelModule:
    """``compile``'s work as its recipe, each phase timed into ``timings`` (the rest is
    ``checks``): the call checked the same on every rank → the model captured at the
    global batch (a meta twin: shapes only) → the plan, agreed by every rank → the
    rank's process groups → the rank's module (its programs built by the registered
    families' passes, :mod:`autopar.driver.rank_program`) → its training program."""
    call = _checked_call(request)
    twin, gm = _captured(request)
    health.barrier("compile(): captured", request.mesh)  # a rank whose capture failed stops the others
    with phase("planning"):
        plan_ = _agreed_plan(request, call, twin, gm)
        recompute = _recompute_mode(request.recompute, plan_)
    health.barrier("compile(): planned", request.mesh)  # a rank whose planning failed stops the others here
    with phase("groups"):
        # where a family holds parameters on some ranks only (a pipeline's stages): which hold each
        holders = next((h for family in FAMILIES if (h := family.parameter_holders(plan_, gm)) is not None), None)
        group_map = _make_groups(plan_, request.mesh, call.world, holders)
    check_same_plan_everywhere(plan_, group_map)
    if call.world > 1 and dist.is_initialized() and call.world == dist.get_world_size():
        with phase("same model"):  # after the plan: a rank given another model fails alone first
            materialise.check_same_model(request.model)
    log.info("autopar plan on rank %d:\n%s", call.rank, plan_.explain())
    with phase("module"):
        pm = _rank_module(request, call, _Planned(twin, gm, plan_, holders, group_map, recompute), timings)
    if not request.batch_local:   # (with batch="local" the examples are the global batch, not a rank's share)
        _build_training_program(pm, call.flat_examples, request.example_target if request.loss_fn is not None else None)
    health.barrier("compile(): programs built", request.mesh)  # a rank whose program failed (its stages only) stops the others
    return pm


@dataclasses.dataclass(frozen=True)
class _Call:
    """The call as every rank checked it: the inputs' layout and flat examples, the
    device and fusion resolved, the world and this rank, the strategy (a 2-D mesh's
    degrees folded in; ``given_strategy`` as the user wrote it) and the hardware agreed."""

    layout: CallLayout
    flat_examples: tuple
    device: Any
    fusion: Any
    world: int
    rank: int
    given_strategy: Any
    strategy: Any
    hardware: Hardware
    hardware_source: str


@dataclasses.dataclass(frozen=True)
class _Planned:
    """What the rank's module is built from: the model's meta twin and its global graph,
    the plan, the positions holding each parameter (a pipeline's; else None), this
    rank's process groups and what it recomputes (``compile``'s ``recompute`` resolved)."""

    twin: nn.Module
    gm: fx.GraphModule
    plan: Plan
    holders: dict | None
    groups: dict
    recompute: bool | str


def _checked_call(request: CompileRequest) -> _Call:
    """The same call on every rank (inputs, strategy, hardware), its dtypes trainable;
    before capture. With neither ``hardware=`` nor a cached profile this machine is
    measured on the ranks first (:mod:`autopar.cost.first_use`), its cases compiled and
    priced by ``compile`` and ``plan``."""
    layout = CallLayout.of(request.example_inputs, request.example_kwargs)
    flat_examples = layout.flatten(tuple(request.example_inputs), dict(request.example_kwargs or {}), "the example")
    device = materialise.resolve_device(request.device, request.mesh, request.model, flat_examples)
    fusion = resolve_fusion(request.fusion, device)   # (a bad fusion= fails before any collective)
    world, rank = _world(request.mesh)
    check_same_call_everywhere(world, request.mesh, request.strategy, flat_examples, request.example_target,
                               request.hardware, layout)
    check_dtypes(request.model)
    strategy = _strategy_from_mesh(request.mesh, request.strategy)
    hw, source = agreed_hardware(request.hardware, request.memory_limit, world, request.mesh,
                                 measure_with=(compile, plan))
    return _Call(layout, flat_examples, device, fusion, world, rank,
                 request.strategy, strategy, hw, source)


def _captured(request: CompileRequest) -> tuple[nn.Module, fx.GraphModule]:
    """The model's meta twin and its graph at the global batch: captures read shapes
    only (the rank's programs are captured from the twin too, so the export memo serves
    them)."""
    twin = materialise.meta_twin(request.model)
    return twin, _global_graph(twin, request.example_inputs, request.loss_fn, request.example_target,
                               request.example_kwargs)


def _agreed_plan(request: CompileRequest, call: _Call, twin: nn.Module, gm: fx.GraphModule) -> Plan:
    """The plan every rank runs (the reviewed one given, or the search's, agreed over the
    ranks), its artifacts attached, checked against ``batch="local"``."""
    plan_ = agreed_plan((request.reviewed, request.replan), gm, call.world, call.hardware, call.strategy,
                        request.hardware, call.hardware_source, given_strategy=call.given_strategy,
                        degrees=_mesh_degrees(request.mesh))
    _attach_artifacts(plan_, gm, twin, request.example_inputs, request.loss_fn, request.example_target,
                      request.example_kwargs)
    if request.batch_local:
        _check_local_batch(plan_)
    return plan_


def _rank_module(request: CompileRequest, call: _Call, planned: _Planned, timings: Timings) -> ParallelModule:
    """This rank's :class:`ParallelModule`: its parameter shards and layout, the families'
    run-time parts for the plan, and the rewrite that builds each of its programs."""
    plan_, rank, holders = planned.plan, call.rank, planned.holders
    shards = planned_shards(plan_, planned.gm)
    return ParallelModule(
        request.model, plan_, rank, planned.groups, request.loss_fn, shards,
        layout=lambda root, options: build_layout(plan_, rank, root, shards, holders=holders, **options),
        runtimes=[runtime for family in FAMILIES
                  if (runtime := family.rank_runtime(plan_, rank, {"overlap": request.overlap})) is not None],
        rewrite=rewrite, seed=request.seed, recompute=planned.recompute, fusion=call.fusion,
        call=call.layout, examples=example_signature(call.flat_examples, request.example_target), device=call.device,
        twin=planned.twin, timings=timings, batch_local=request.batch_local, torch_compile=request.torch_compile,
        scalars={"numbers": scalar_constants(planned.gm, planned.gm.meta.get(LOSS_TERMS)),
                 "training": planned.twin.training})


def _build_training_program(pm: ParallelModule, flat_examples: tuple, target) -> None:
    """The program the first ``step`` on the example runs, built now: a plan whose rank
    program cannot be built fails ``compile``, naming why, not the first step. A model
    that computes no loss of its own (``step`` is not for it) is left to its first call."""
    try:
        pm.runner.prepare(flat_examples, target, pm.training)
    except ModelLossError:
        return
    except Exception as error:   # noqa: BLE001 - said as the plan's failure, the cause chained
        raise PlanError(f"compile(): this rank's program for the plan ({pm.plan.form or pm.plan.mesh}) could not be "
                        f"built from the example inputs: {type(error).__name__}: {error}") from error


def _check_local_batch(plan_: Plan) -> None:
    """``batch="local"`` needs a plan whose ranks compute from their own rows: where the
    rows of the batch meet and the plan gathers them (a contrastive loss), a rank's
    program is built from the global batch's first rows, which a local share lacks."""
    gathered = [c for c in plan_.batch_couplings or () if c.get("remedy") == "gather"]
    if gathered:
        raise PlanError(f"batch='local': rows of the batch meet at {gathered[0].get('node', '?')} and the plan gathers "
                        f"them there; pass the global batch on every rank (batch='global')")


def _recompute_mode(recompute, plan_: Plan) -> bool | str:
    """``compile``'s ``recompute``: True / "full" (the blocks), "selective" (the attention
    cores), False / "none"; None: as the plan says."""
    if recompute is None:
        return "selective" if plan_.selective_recompute else plan_.recompute
    if recompute in (True, "full"):
        return True
    if recompute in (False, "none"):
        return False
    if recompute == "selective":
        return "selective"
    raise ValueError(f"recompute={recompute!r}: use True or 'full' (the blocks), 'selective' (the attention cores), "
                     f"False or 'none', or None (as the plan says)")


def _strategy_from_mesh(mesh, strategy):
    """A 2-D mesh named ("data", "tensor") fixes the degrees (a strategy dict keeps its
    other keys: memory levers, region pins, experts); other meshes must be flat."""
    if mesh is None or mesh.ndim == 1:
        return strategy
    names = tuple(mesh.mesh_dim_names or ())
    if mesh.ndim != 2 or set(names) != {"data", "tensor"}:
        raise ValueError(f"mesh: dims {names or mesh.ndim} are not understood; pass a flat mesh (autopar factors "
                         f"it) or a 2-D mesh named ('data', 'tensor')")
    degrees = {"data": mesh.size(names.index("data")), "tensor": mesh.size(names.index("tensor"))}
    forced = Strategy.parse(strategy)
    if forced is None:
        return degrees
    if not forced.levers_only and {"data": forced.data, "tensor": forced.tensor} != degrees:
        raise ValueError(f"mesh: its degrees {degrees} contradict strategy={strategy!r}; drop one of them")
    # the strategy's other keys (memory levers, region pins, experts) apply on the mesh's degrees
    return {**strategy, **degrees} if isinstance(strategy, dict) else degrees


def _mesh_degrees(mesh) -> dict | None:
    """A 2-D mesh's ``data`` and ``tensor`` degrees (None for a flat mesh or none)."""
    if mesh is None or mesh.ndim == 1 or set(mesh.mesh_dim_names or ()) != {"data", "tensor"}:
        return None
    names = tuple(mesh.mesh_dim_names)
    return {"data": mesh.size(names.index("data")), "tensor": mesh.size(names.index("tensor"))}


def _data_major(mesh) -> torch.Tensor:
    """The mesh's ranks with the data dimension outermost (rank index = data·t + tensor)."""
    if mesh.ndim == 2 and mesh.mesh_dim_names[0] != "data":
        return mesh.mesh.t().contiguous()
    return mesh.mesh


def _world(mesh) -> tuple[int, int]:
    """(ranks taking part, this rank's index among them)."""
    if mesh is not None:
        grid = _data_major(mesh)
        members = grid.flatten().tolist()
        if dist.get_rank() not in members:
            raise ValueError(f"rank {dist.get_rank()} is not in the mesh {members}; call compile only on its ranks")
        return len(members), members.index(dist.get_rank())
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


TRAINABLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)
"""Dtypes of trainable parameters: gradients are averaged with all-reduce and rank
programs sum partial results, which these support on gloo and NCCL."""


def check_dtypes(model: nn.Module) -> None:
    """Trainable parameters must be of a dtype in :data:`TRAINABLE_DTYPES`; name the
    first that is not (float8 and quantised weights are trained through a higher
    precision master copy, which is what autopar should be given)."""
    for name, p in model.named_parameters():
        if p.requires_grad and p.dtype not in TRAINABLE_DTYPES:
            kinds = ", ".join(str(d).removeprefix("torch.") for d in TRAINABLE_DTYPES)
            raise PlanError(f"parameter {name} is {str(p.dtype).removeprefix('torch.')}: autopar averages gradients "
                            f"and sums partial results with collectives, which it does only for {kinds}. Keep the "
                            f"trainable weights in one of those (a master copy for float8 or quantised training), or "
                            f"set requires_grad=False on {name}")


def _make_groups(plan_: Plan, mesh, world: int, holders: dict | None = None) -> dict:
    """This rank's process groups of the plan (``Plan.group_specs`` on ``Plan.rank_grid``
    over the mesh's ranks: a user's 2-D mesh keeps its own order, data-major). With
    ``holders`` (a pipeline's: the positions that hold each parameter) also the groups of
    the parameters several positions hold (tied weights)."""
    if holders is not None:
        if world == 1:
            raise PlanError("a pipeline plan needs a process group of its world size; launch the ranks first")
        if mesh is not None and mesh.ndim != 1:
            raise ValueError("mesh: a pipeline plan takes a flat mesh (autopar lays out pipeline x data x tensor)")
        members = mesh.mesh.flatten().tolist() if mesh is not None else list(range(world))
        return plan_.rank_grid(members).process_groups(plan_.group_specs(holders.values()), dist.get_rank(),
                                                       mesh.device_type if mesh is not None else None)
    if world == 1:
        return {"data": None, "tensor": None, "segment": None, "subgrid": None}
    if mesh is not None and mesh.ndim != 1 and plan_.grid is not None:
        raise ValueError("mesh: a 3D grid plan takes a flat mesh (autopar lays the grid out itself)")
    members = _data_major(mesh).flatten().tolist() if mesh is not None else list(range(world))
    return plan_.rank_grid(members).process_groups(plan_.group_specs(), dist.get_rank(),
                                                   mesh.device_type if mesh is not None else None)