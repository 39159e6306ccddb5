"""The user's entry points: :func:`compile`, :func:`plan` and :class:`ParallelModule`.

    pm = autopar.compile(model, mesh, example_inputs=(x,), loss_fn=F.cross_entropy,
                         example_target=y)
    loss = pm.step(x, target=y)          # forward + backward over the whole batch
    optimizer.step()                     # any torch.optim optimizer over pm.parameters()

    # keyword inputs; a model that computes its own loss from labels= needs no loss_fn
    pm = autopar.compile(hf_model, mesh, example_kwargs={"input_ids": ids, "attention_mask": mask,
                                                         "labels": labels})
    loss = pm.step(input_ids=ids, attention_mask=mask, labels=labels)

Every rank passes the same global batch; each takes its share (of every positional and
keyword tensor, along its first dimension: :mod:`autopar.inputs`). The flow is that of
``docs/architecture.md``: capture at the global batch → analysis → plan; then, per rank,
capture at the local batch → analysis → tensor-parallel and data-parallel rewrites →
a GraphModule over a module tree holding this rank's parameter shards.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn

from autopar.capture import MODEL_PREFIX, CaptureError, capture, wrap_model
from autopar.drawing import regions_dot
from autopar.inputs import CallLayout
from autopar.ir import CAPTURE, TensorSpec
from autopar.kernels import model_device, resolve_fusion
from autopar.passes.analysis import analyse
from autopar.passes.cube3d import cube3d_pass, planned_cube_shards
from autopar.passes.data_parallel import LOSS_REDUCTION, data_parallel_pass
from autopar.passes.fusion import FUSION, fusion_pass
from autopar.passes.manager import PassRunner, graph_code, pass_disabled
from autopar.passes.recompute import recompute_pass
from autopar.passes.subgraph_parallel import csub_branch_program, subgraph_parallel_pass
from autopar.passes.tensor3d import planned_grid3d_shards, tensor3d_pass
from autopar.passes.tensor_parallel import PARAM_SHARDS, ParamShard, planned_param_shards, tensor_parallel_pass
from autopar.planning.hardware import Hardware, get_hardware
from autopar.planning.plan import Plan
from autopar.planning.planner import PlanError, Strategy, plan_graph
from autopar.runtime import groups as G
from autopar.runtime import health
from autopar.runtime import rng
from autopar.runtime import tensor3d as T3
from autopar.runtime.grad_sync import GradientBuckets
from autopar.runtime.shards import gather_full, local_shard
from autopar.runtime.target_count import TARGET_COUNT, use_target_count

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
    :class:`autopar.planning.planner.Progress` told of every configuration priced.
    ``example_kwargs``: keyword inputs, as for :func:`compile`.
    """
    CallLayout.of(example_inputs, example_kwargs)  # the example's keyword inputs are usable
    gm = _global_graph(model, example_inputs, loss_fn, example_target, example_kwargs)
    plan_ = plan_graph(gm, world_size, _hardware(hardware, memory_limit), strategy, progress=progress)
    _attach_artifacts(plan_, gm, model, example_inputs, loss_fn, example_target, example_kwargs)
    return plan_


def _hardware(hardware, memory_limit: float | None) -> Hardware:
    hw = get_hardware(hardware)
    if memory_limit is None:
        return hw
    if not memory_limit > 0:
        raise ValueError(f"memory_limit={memory_limit!r}: give the bytes per device a plan may use (> 0)")
    import dataclasses
    return dataclasses.replace(hw, memory_bytes=float(memory_limit))


def _attach_artifacts(plan_: Plan, gm: fx.GraphModule, model, example_inputs, loss_fn, example_target,
                      example_kwargs=None) -> None:
    """Let ``plan_.save`` write rank graphs and the region drawing, built only when saved."""
    def build(max_ranks: int):
        graphs = {}
        for rank in range(min(plan_.world_size, max_ranks)):
            if plan_.pipeline:
                from autopar.pipelined import pipeline_rank_code
                graphs[rank] = pipeline_rank_code(model, plan_, rank, example_inputs, loss_fn, example_target,
                                                  example_kwargs=example_kwargs)
                continue
            rank_gm = rank_graph(model, plan_, rank, example_inputs, loss_fn, example_target,
                                 example_kwargs=example_kwargs)
            graphs[rank] = rank_graph_code(rank_gm, plan_, rank)
        strategies = {r.region: r.strategy + (f" (tensor {plan_.degree('tensor')})" if r.strategy == "megatron" else "")
                      for r in plan_.regions}
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
    :func:`autopar.pipelined.stage_graphs` and ``pipeline_rank_code``."""
    if plan_.pipeline:
        raise PlanError("rank_graph: a pipeline plan gives each rank one program per stage; use "
                        "autopar.pipelined.stage_graphs (or pipeline_rank_code for their code)")
    layout = CallLayout.of(example_inputs, example_kwargs)
    flat = layout.flatten(tuple(example_inputs), dict(example_kwargs or {}), "rank_graph()")
    inputs, target = _local_batch(plan_.batch_parts(), plan_.batch_chunk(rank), flat, example_target)
    args, kwargs = layout.unflatten(inputs)
    gm = capture(model, args, loss_fn if target is not None else None, target, example_kwargs=kwargs,
                 model_loss="if_present" if loss_fn is None else None)
    return _rewrite(gm, plan_, rank, _batch_of(inputs), fusion=plan_.fusion if fusion is None else fusion)


def _batch_of(inputs: tuple) -> int | None:
    """The batch size: the first dimension of the first tensor input."""
    return next((x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0), None)


def _local_batch(data: int, index: int, inputs: tuple, target: Any):
    """Chunk ``index`` of ``data`` of a global batch: every tensor whose first dimension is
    the batch (that of the first tensor input) is split along it; others are replicated."""
    if data == 1:
        return inputs, target
    batch = _batch_of(inputs)
    if batch is not None and batch % data:
        raise PlanError(f"input 0: batch {batch} is not divisible by the data degree {data}; give a batch that is a "
                        f"multiple of {data}")

    def take(x):
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch:
            return x.chunk(data, 0)[index]
        return x

    return tuple(take(x) for x in inputs), (take(target) if target is not None else None)


def _rewrite(gm: fx.GraphModule, plan_: Plan, rank: int, local_batch: int | None = None,
             recompute: bool = False, fusion: bool = False) -> fx.GraphModule:
    """Rank ``rank``'s program from a graph captured at its local batch. A training graph
    (captured with its loss) keeps its loss local: ``ParallelModule.step`` reduces the
    reported value over the data ranks while backward runs. In D&SP-cSub the ranks off
    sub-grid 0 get a program of their branches only (``csub_branch_program``)."""
    coords = plan_.rank_coordinates(rank)
    parts = plan_.batch_parts()
    if local_batch is None:
        local_batch = plan_.global_batch // parts
    with_loss = gm.meta[CAPTURE].with_loss
    dsp_regions = plan_.dsp_regions()
    subgrid = plan_.subgrid_coordinates(rank)[0]
    if plan_.grid is not None:
        # one 3D form per plan: AxoNN's layers (tensor3d) or Bian's cube (cube3d)
        cube = plan_.form == "cube"
        split = plan_.regions_with("cube3d" if cube else "tensor3d")
        passes = [
            ("analysis", analyse, {"label": f"rank{rank}_analysis"}),
            ("cube3d", cube3d_pass, {"regions": split, "grid": plan_.grid, "rank": rank}) if cube else
            ("tensor3d", tensor3d_pass, {"regions": split, "grid": plan_.grid, "rank": rank}),
            *([("recompute", recompute_pass, {"regions": split})] if recompute else []),
            ("data_parallel", data_parallel_pass, {"degree": parts, "local_batch": local_batch, "group": "replica",
                                                    "reduce_scalars": not with_loss}),
        ]
    elif plan_.csub and subgrid != 0:
        passes = [("analysis", analyse, {"label": f"rank{rank}_analysis"}),
                  ("csub_branches", csub_branch_program, {"dsp_regions": dsp_regions, "subgrid": subgrid})]
    else:
        subgraph = [("subgraph_parallel", subgraph_parallel_pass, {"dsp_regions": dsp_regions, "subgrid": subgrid,
                                                                   "csub": plan_.csub})]
        passes = [
            ("analysis", analyse, {"label": f"rank{rank}_analysis"}),
            *(subgraph if dsp_regions else []),
            ("tensor_parallel", tensor_parallel_pass, {"megatron_regions": plan_.regions_with("megatron"),
                                                        "degree": plan_.degree("tensor"), "rank": coords["tensor"]}),
            *([("recompute", recompute_pass, {"regions": plan_.regions_with("megatron")})] if recompute else []),
            ("data_parallel", data_parallel_pass, {"degree": parts, "local_batch": local_batch,
                                                    "reduce_scalars": not with_loss}),
        ]
    if fusion:
        passes.append(("fusion", fusion_pass, {}))
    runner = PassRunner(passes)
    gm = runner.run(gm, label=f"rank{rank}")
    gm.meta["autopar.passes_run"] = [r.name for r in runner.records]
    return gm


def rank_graph_code(gm: fx.GraphModule, plan_: Plan, rank: int) -> str:
    coords = ", ".join(f"{k}={v}" for k, v in plan_.rank_coordinates(rank).items() if k in plan_.mesh)
    if plan_.subgrids > 1:
        s, p = plan_.subgrid_coordinates(rank)
        coords += f"; sub-grid {s}, position {p}, batch chunk {plan_.batch_chunk(rank)}"
    passes = " -> ".join(gm.meta.get("autopar.passes_run", []))
    header = f"rank {rank} of {plan_.world_size} ({coords}); built by passes: {passes}"
    return with_kernels(graph_code(gm, header=header), gm)


def with_kernels(code: str, gm: fx.GraphModule) -> str:
    """``code`` followed by the fusion pass's report and the source of every kernel it generated."""
    report = gm.meta.get(FUSION)
    if report is None:
        return code
    out = code + "\n" + "\n".join(f"# {line}" for line in report.summary().splitlines()) + "\n"
    for kernel in report.kernels:
        out += "\n\n" + kernel.source
    return out


class ParallelModule(nn.Module):
    """The model on this rank: behaves like the original, numerically.

    ``pm(*inputs, **kwargs)`` returns full outputs; ``pm.step(*inputs, target=...,
    **kwargs)`` runs forward and backward on this rank's share of the batch and leaves
    synchronised gradients on ``pm.parameters()`` (this rank's shards); without a
    ``loss_fn`` it trains on the loss the model's output carries. ``full_state_dict`` /
    ``load_full_state_dict`` use the original model's keys and shapes.
    """

    def __init__(self, model: nn.Module, plan_: Plan, rank: int, group_map: dict, loss_fn: Callable | None,
                 shards: dict[str, ParamShard | T3.Grid3DShard], *, seed: int = 0, overlap: Any = None,
                 recompute: bool = False, fusion: bool = False):
        super().__init__()
        self.plan = plan_
        self.rank = rank
        self._recompute = recompute
        self._fusion = fusion
        self._user_model = [model]  # captured again at new shapes; kept out of the module tree
        self._loss_fn = loss_fn
        self._examples: tuple | None = None  # example_signature of compile's examples
        self._layout = CallLayout()  # compile's: how positional and keyword inputs are laid out
        self._groups = group_map
        self._programs: dict[tuple, fx.GraphModule] = {}
        # a module tree of the same structure as the captured wrapper, holding this rank's shards
        self.root = wrap_model(copy.deepcopy(model), loss_fn, 0)
        coords = plan_.rank_coordinates(rank)
        self._tensor_rank = coords["tensor"]
        self._data, self._chunk = plan_.batch_parts(), plan_.batch_chunk(rank)  # read every step
        # D&SP-cSub: ranks off sub-grid 0 run only their branches; sub-grid 0 shares results
        self._subgrid = plan_.subgrid_coordinates(rank)[0]
        self._branch_only = plan_.csub and self._subgrid != 0
        # dropout streams: sharded values differ over the tensor group (x on a 3D grid),
        # replicated ones are equal on every rank holding the same rows
        self._grid = plan_.grid
        self._coords = coords
        if self._grid is not None:
            # Bian's cube splits the activations inside a region over y (rows) as well
            tensor_rank = coords["x"] + self._grid.x * coords["y"] if plan_.form == "cube" else coords["x"]
            self._random = rng.RandomStates(seed, tensor_rank, self._chunk)
        else:
            self._random = rng.RandomStates(seed, coords["tensor"], coords["data"])
        # 3D layers' overlap state (axonn §IV): prefetched and cached weights, deferred
        # weight-gradient reduce-scatters
        self._t3d = T3.Tensor3DRuntime(T3.Overlap.parse(overlap))
        with G.use_groups(self._groups):
            self._install_shards(shards)

    # ------------------------------------------------------------------ programs
    def _program(self, inputs: tuple, target: Any, loss: bool = False) -> tuple[fx.GraphModule, tuple, Any]:
        """The program for these inputs' shapes and the current mode (built on first use),
        with this rank's share of the inputs and target. ``inputs``: flat (positional, then
        the keyword tensors: ``self._layout``); ``loss``: the training program (the
        ``loss_fn``'s loss, or without one the model's own)."""
        key = (tuple(_signature(x) for x in inputs), _signature(target), loss, self.training)
        local_inputs, local_target = _local_batch(self._data, self._chunk, inputs, target)
        if key not in self._programs:
            check_call_inputs(self._examples, inputs, target, self._layout.names())
            user_model = self._user_model[0]
            was_training = user_model.training
            user_model.train(self.training)  # export bakes the mode (dropout) into the graph
            args, kwargs = self._layout.unflatten(local_inputs)
            try:
                with new_shapes_explained(self._examples, inputs):
                    gm = capture(user_model, args, self._loss_fn if target is not None else None, local_target,
                                 example_kwargs=kwargs, model_loss="required" if loss and self._loss_fn is None else None)
            finally:
                user_model.train(was_training)
            gm = _rewrite(gm, self.plan, self.rank, _batch_of(local_inputs), self._recompute, self._fusion)
            if gm.meta.get(PARAM_SHARDS, {}) != self._shards:
                raise RuntimeError("the rank program splits other parameters than the plan did; this is a bug")
            _copy_missing_attributes(gm, gm.graph, self.root)
            program = fx.GraphModule(_flat_root(self.root, gm.graph), gm.graph, class_name=f"Rank{self.rank}Program")
            for attr in ("_in_spec", "_out_spec"):
                if hasattr(gm, attr):
                    setattr(program, attr, getattr(gm, attr))
            program.meta.update(gm.meta)
            self._programs[key] = program
        return self._programs[key], local_inputs, local_target

    def _install_shards(self, shards: dict[str, ParamShard]) -> None:
        """Replace each split parameter of ``self.root`` by this rank's shard of it."""
        self._shards = dict(shards)
        owners = _parameter_owners(self.root)
        self._full_shapes: dict[int, tuple] = {}
        # resolve every name first: tied parameters appear under several names
        by_param: dict[int, tuple[nn.Parameter, ParamShard]] = {}
        for name, shard in sorted(shards.items()):
            full = self.root.get_parameter(name)
            previous = by_param.setdefault(id(full), (full, shard))[1]
            if previous != shard:
                raise RuntimeError(f"parameter {name} is split two different ways ({previous} and {shard})")
        for full, shard in by_param.values():
            local = nn.Parameter(self._local_part(full.detach(), shard).clone(), requires_grad=full.requires_grad)
            self._full_shapes[id(local)] = tuple(full.shape)
            for module, attr in owners[id(full)]:
                setattr(module, attr, local)
        self._shard_by_id = {id(self.root.get_parameter(name)): shard for name, shard in shards.items()}
        # D&SP: parameters of the branches on this sub-grid are summed over the sub-grid and
        # divided by the number of batch chunks (docs/dsp_design.md); other sub-grids'
        # branches are not run here and take part in no collective. ``_owner``: the
        # sub-grid whose copy of a parameter is current (branches; in cSub also the
        # common layers, on sub-grid 0)
        self._owner: dict[int, int] = {}
        for details in self.plan.dsp_regions().values():
            for branch, names in enumerate(details["branch_params"]):
                for name in names:
                    self._owner[id(self.root.get_parameter(name))] = details["assignment"][branch]
        branch_ids = set(self._owner)
        common = [p for p in self._unique_parameters() if id(p) not in branch_ids]
        if self.plan.csub:
            self._owner.update((id(p), 0) for p in common)
        # averaged over data ranks, as DDP does (ParallelModule.step weights summed losses).
        # On a 3D grid the rows are split over z and data: replicated parameters (biases
        # and norms too) are averaged over both (the "replica" group); the weight shards
        # Ŵ, summed over z by their reduce-scatter, are summed over data and divided by
        # every batch chunk
        self._shard_buckets = None
        if self._grid is not None:
            # (Bian's diagonal vectors too: their reduce over the cube sums the rows of z and
            # the in axis already)
            weights = [p for p in common if isinstance(self._shard_by_id.get(id(p)), T3.Grid3DShard)
                       and (not self._shard_by_id[id(p)].vector or self._shard_by_id[id(p)].cube)]
            chosen = {id(p) for p in weights}
            common = [p for p in common if id(p) not in chosen]
            # with deferred reduce-scatters (axonn §IV-B) Ŵ.grad is written after backward,
            # by the 3D runtime: the data all-reduce of those waits for it (no hooks)
            self._shard_buckets = GradientBuckets(weights, "data", divisor=self.plan.batch_parts(),
                                                  hooks=not (self._t3d.overlap.reduce_scatter and self._grid.z > 1))
        self._buckets = None if self._branch_only else GradientBuckets(common, "replica" if self._grid else "data")
        self._branch_buckets = None
        if branch_ids:
            mine = [p for p in self._unique_parameters() if self._owner.get(id(p)) == self._subgrid
                    and id(p) in branch_ids]
            self._branch_buckets = GradientBuckets(mine, "subgrid", divisor=self.plan.batch_parts())

    def _local_part(self, full: torch.Tensor, shard) -> torch.Tensor:
        if isinstance(shard, T3.Grid3DShard):
            return T3.local_part(full, shard, self._grid, self._coords)
        return local_shard(full, shard, self.plan.degree("tensor"), self._tensor_rank)

    def _unique_parameters(self):
        seen = set()
        for p in self.root.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                yield p

    # ------------------------------------------------------------------ running
    def _target_count(self, program: fx.GraphModule, pieces: list[tuple], group: str) -> torch.Tensor | None:
        """The whole batch's count of counted targets when ``program`` averages its loss
        over them (``TARGET_COUNT``, :mod:`autopar.runtime.target_count`): the count
        program on each of this rank's ``pieces`` (flat graph inputs, target last when
        the program takes one), summed over ``group``, the ranks sharing the batch."""
        counter = program.meta.get(TARGET_COUNT)
        if counter is None:
            return None
        names = program.meta[CAPTURE].input_names
        wanted = [n.name for n in counter.graph.nodes if n.op == "placeholder"]
        count = None
        for piece in pieces:
            by_name = dict(zip(names, piece))
            value = counter(*(by_name[name] for name in wanted))
            count = value if count is None else count + value
        with G.use_groups(self._groups):
            if G.size_of(G.get_group(group)) > 1:
                dist.all_reduce(count, group=G.get_group(group))
        return count

    @health.guarded("forward()")
    def forward(self, *inputs, **kwargs):
        program, local_inputs, _ = self._program(self._layout.flatten(inputs, kwargs, "forward()"), None)
        if self._branch_only:
            count = None
        else:
            count = self._target_count(program, [local_inputs], "replica" if self._grid else "data")
        self._t3d.begin()
        with G.use_groups(self._groups), rng.use_random_states(self._random), T3.use_runtime(self._t3d), \
                use_target_count(count):
            if self._branch_only:
                program.forward()
                return self._from_subgrid_0(None)
            out = program.forward(*local_inputs)  # no hooks: skip nn.Module.__call__
            return self._from_subgrid_0(out) if self.plan.csub else out

    def _from_subgrid_0(self, value):
        """D&SP-cSub: sub-grid 0's ``value`` on every rank of its segment (outputs of any
        structure; a forward-only path, so the pickling of ``broadcast_object_list`` is fine)."""
        segment = G.get_group("segment")
        if segment is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, group=segment, group_src=0)
        return box[0]

    @health.guarded("step()")
    def step(self, *inputs, target: Any = None, **kwargs):
        """Forward and backward over the whole batch; returns the loss of the whole batch.

        The loss is ``loss_fn(model(*inputs, **kwargs), target)``, or without a ``loss_fn``
        the loss the model's output carries (``labels=``: a ``ModelOutput``'s or dict's
        ``loss``, or a scalar the model returns). Each rank's program returns the loss of
        its share. Gradients are averaged over the data ranks, as DDP does, so a loss that
        sums over the batch is back-propagated with weight d (the average of d·∇L_r is
        ∑∇L_r); a mean needs no weight (the mean of equal-sized shards' means is the
        global mean). A mean over the targets a cross-entropy does not ignore is rewritten
        to a sum over the whole batch's count (:mod:`autopar.runtime.target_count`), so
        padding that differs between ranks changes nothing. The reported loss is reduced
        over the data ranks in the last gradient bucket (no collective of its own). Gradients
        accumulate across calls, as in PyTorch: call ``optimizer.zero_grad()`` between steps.
        """
        flat = self._layout.flatten(inputs, kwargs, "step()")
        _check_loss_arguments(self._loss_fn, target)
        program, local_inputs, local_target = self._program(flat, target, loss=True)
        data = self._data
        summed = program.meta.get(LOSS_REDUCTION) == "sum"
        targets = () if local_target is None else (local_target,)
        count = None if self._branch_only else \
            self._target_count(program, [local_inputs + targets], "replica" if self._grid else "data")
        self._t3d.begin()
        with G.use_groups(self._groups), rng.use_random_states(self._random), T3.use_runtime(self._t3d), \
                use_target_count(count):
            if self._branch_only:  # cSub off sub-grid 0: the branches' forward and backward only
                result = program.forward()
                result.backward(torch.zeros_like(result))
                if self._branch_buckets is not None:
                    self._branch_buckets.finish()
                return self._loss_from_subgrid_0(program, None)
            loss = program.forward(*local_inputs, *targets)
            if data > 1:
                self._buckets.carry(loss)
            loss.backward(torch.full_like(loss, data) if summed and data > 1 else None)
            self._t3d.finish()  # deferred reduce-scatters land before any bucket reads Ŵ.grad
            if self._shard_buckets is not None:
                self._shard_buckets.finish()
            if self._branch_buckets is not None:
                self._branch_buckets.finish()
            if data > 1:
                averaged = self._buckets.finish().to(loss.dtype).reshape(loss.shape)
                loss = averaged * data if summed else averaged
            loss = loss.detach()
            return self._loss_from_subgrid_0(program, loss) if self.plan.csub else loss

    def _loss_from_subgrid_0(self, program: fx.GraphModule, loss: torch.Tensor | None) -> torch.Tensor:
        """D&SP-cSub: the whole batch's loss, computed on sub-grid 0, sent over the segment."""
        segment = G.get_group("segment")
        if segment is None:
            return loss
        if loss is None:
            spec = program.meta["autopar.root_output"]
            if not isinstance(spec, TensorSpec):
                raise RuntimeError(f"D&SP-cSub: the loss function returns {spec!r}, not one tensor; step() "
                                   f"needs a tensor loss to send to the other sub-grids")
            loss = torch.empty(spec.shape, dtype=spec.dtype)
        dist.broadcast(loss, group=segment, group_src=0)
        return loss

    # ------------------------------------------------------------------ parameters and state
    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        for name, p in self.root.named_parameters(remove_duplicate=remove_duplicate):
            if name.startswith(MODEL_PREFIX):
                yield prefix + name[len(MODEL_PREFIX):], p

    def parameters(self, recurse: bool = True):
        for _, p in self.named_parameters():
            yield p

    def _norm_groups(self, p: nn.Parameter) -> tuple[str, ...]:
        """The groups over which ``p``'s gradient is split: its squared norm is summed over
        them (a D&SP branch's: over the segment, from the sub-grid that holds it)."""
        if id(p) in self._owner:
            return ("segment",)
        shard = self._shard_of(p)
        if shard is None:
            return ()
        if isinstance(shard, T3.Grid3DShard):
            # a weight shard (and the cube's diagonal vectors) is split over the whole
            # grid; AxoNN's bias blocks only over their out axis
            return (shard.axes[1],) if shard.vector and not shard.cube else ("x", "y", "z")
        return (shard.group,)

    _norm_across: tuple[str, ...] = ()  # groups every key is reduced over besides its own (a pipeline's)

    def _norm_gradient(self, p: nn.Parameter) -> torch.Tensor | None:
        """The gradient this rank counts for ``p`` in :meth:`grad_norm` (None: none)."""
        owned = self._owner.get(id(p))
        if owned is not None and owned != self._subgrid:
            return torch.zeros_like(p.grad)  # another sub-grid holds the current one
        return p.grad.detach()

    def _norm_keys(self) -> list[tuple[str, ...]]:
        """The norm groups of all parameters, the same list on every rank (all ranks hold
        the same parameters' parts)."""
        return sorted({self._norm_groups(p) for p in self._unique_parameters()})

    @health.guarded("grad_norm()")
    def grad_norm(self, norm_type: float = 2.0) -> torch.Tensor:
        """The norm of all gradients as the single-device model would compute it
        (``torch.nn.utils.get_total_norm`` of its parameters): each split parameter's local
        part reduced over the group(s) it is split on, replicated ones counted once. A
        collective: every rank calls it, after ``step`` (gradients synchronised)."""
        inf = norm_type == float("inf")
        if not (inf or norm_type > 0):
            raise ValueError(f"grad_norm: norm_type={norm_type}; use a positive number or inf")
        combine = torch.maximum if inf else torch.add
        partial: dict[tuple[str, ...], torch.Tensor] = {}
        for p in self._unique_parameters():
            if p.grad is None or not p.grad.numel():
                continue
            g = self._norm_gradient(p)
            if g is None:
                continue
            value = (g.abs().max() if inf else g.abs().pow(norm_type).sum()).to(torch.float64)
            key = self._norm_groups(p)
            partial[key] = combine(partial[key], value) if key in partial else value
        op = dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM
        total = torch.zeros((), dtype=torch.float64)
        with G.use_groups(self._groups):
            # every key in a fixed order on every rank
            for key in self._norm_keys():
                value = partial.get(key, torch.zeros((), dtype=torch.float64)).clone()
                for name in (*key, *self._norm_across):
                    group = G.get_group(name)
                    if G.size_of(group) > 1:
                        dist.all_reduce(value, op=op, group=group)
                total = combine(total, value)
        return total if inf else total.pow(1.0 / norm_type)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale every gradient so that :meth:`grad_norm` is at most ``max_norm``, as
        ``torch.nn.utils.clip_grad_norm_`` on the single-device model; returns the norm
        before clipping. A collective, after ``step``."""
        total = self.grad_norm(norm_type)
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for p in self._unique_parameters():
            if p.grad is not None:
                p.grad.mul_(scale.to(p.grad.dtype))
        return total

    def _shard_of(self, value: torch.Tensor) -> ParamShard | None:
        """The split of a parameter of ``self.root`` (tied parameters share one entry)."""
        return self._shard_by_id.get(id(value))

    def _gather(self, named: dict[str, tuple[torch.Tensor | None, nn.Parameter]]) -> dict[str, torch.Tensor | None]:
        """Full tensors by name from ``(local value or None, the parameter it belongs to)``:
        split ones gathered over the tensor group, D&SP branch ones broadcast from their
        sub-grid. A collective: every rank calls it."""
        degree = self.plan.degree("tensor")
        out = {}
        with G.use_groups(self._groups):
            for name, value in named.items():
                tensor, key = value
                owner = self._owner.get(id(key))
                if owner is not None and G.get_group("segment") is not None:
                    # a branch's parameters (and gradients; in cSub also the common layers'
                    # on sub-grid 0) are current only on its sub-grid:
                    # every rank takes part in the broadcast from there, with or without a value
                    local = (tensor if tensor is not None else torch.zeros_like(key)).detach().clone()
                    dist.broadcast(local, group=G.get_group("segment"), group_src=owner)
                    out[name] = local
                    continue
                if tensor is None:
                    out[name] = None
                    continue
                shard = self._shard_of(key)
                if isinstance(shard, T3.Grid3DShard):
                    out[name] = T3.gather_part(tensor.detach(), shard, self._grid, self._full_shapes[id(key)])
                else:
                    out[name] = gather_full(tensor.detach(), shard, degree) if shard else tensor.detach().clone()
        return out

    @health.guarded("full_state_dict()")
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The original model's state dict (keys and full shapes), gathered from all ranks."""
        return self._gather({k: (v, v) for k, v in self.root.model.state_dict(keep_vars=True).items()})

    @health.guarded("full_gradients()")
    def full_gradients(self) -> dict[str, torch.Tensor | None]:
        """Every parameter's gradient at its full shape, by the original model's names."""
        return self._gather({k: (p.grad, p) for k, p in self.root.model.named_parameters(remove_duplicate=False)})

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load a full (original-shaped) state dict, keeping this rank's shard of each tensor."""
        own = self.root.model.state_dict(keep_vars=True)
        missing = sorted(set(own) - set(state_dict))
        if missing:
            raise KeyError(f"load_full_state_dict: missing keys {missing[:5]}{'…' if len(missing) > 5 else ''}")
        degree = self.plan.degree("tensor")
        with torch.no_grad():
            for name, value in own.items():
                shard = self._shard_of(value)
                full = state_dict[name]
                local = self._local_part(full, shard) if shard else full
                if local.shape != value.shape:
                    raise ValueError(f"load_full_state_dict: {name} has shape {list(full.shape)}; the original "
                                     f"model's is {list(gather_full_shape(value, shard, degree))}")
                value.copy_(local)

    @property
    def tensor3d_stats(self) -> dict[str, int]:
        """Where the 3D layers' gathered weights came from since compile (``gathered``,
        ``prefetched``, ``cached`` for recomputation) and how many weight-gradient
        reduce-scatters were ``deferred`` to the end of backward (axonn §IV)."""
        return dict(self._t3d.stats)

    @property
    def tensor3d_runtime(self) -> T3.Tensor3DRuntime:
        """The 3D layers' runtime state: its ``overlap`` switches, ``stats`` and
        ``exposed_s``, the seconds spent blocked in their collectives."""
        return self._t3d

    def rank_graph_code(self) -> str:
        """This rank's most recently built program as readable code."""
        if not self._programs:
            raise RuntimeError("no program built yet: call the model or step() first")
        return rank_graph_code(list(self._programs.values())[-1], self.plan, self.rank)


def gather_full_shape(local: torch.Tensor, shard: ParamShard | None, degree: int) -> tuple[int, ...]:
    shape = list(local.shape)
    if shard is not None:
        shape[shard.dim] *= degree
    return tuple(shape)


def _check_loss_arguments(loss_fn: Callable | None, target: Any) -> None:
    """``step``'s loss: ``loss_fn`` with a ``target``, or the model's own without either."""
    if loss_fn is not None and target is None:
        raise ValueError("step(): compile was given a loss_fn, which needs the batch's target: call "
                         "pm.step(..., target=y)")
    if loss_fn is None and target is not None:
        raise ValueError("step(): a target was given, but compile was given no loss_fn to compare the output with. "
                         "Pass loss_fn=... (and example_target=...) to autopar.compile, or, for a model that "
                         "computes its own loss, pass its labels as a keyword (labels=...) instead of target=")


def example_signature(inputs: Sequence[Any], target: Any = None) -> tuple:
    """What later calls must keep of the example: each input's (and the target's)
    :func:`_signature`, ``(shape, dtype)`` of a tensor or the type's name otherwise."""
    return tuple(_signature(x) for x in inputs), (None if target is None else _signature(target))


def check_call_inputs(examples: tuple | None, inputs: tuple, target: Any, names: Sequence[str] | None = None) -> None:
    """Inputs at call time may change shape (each rank's program is rebuilt for new
    shapes under the same plan) but not their number, kind, dtype or rank: the plan was
    made for the example's. ``inputs``: flat (positional, then keyword tensors), named
    by ``names`` in messages. Raises ``ValueError`` naming the input otherwise."""
    if examples is None or not examples[0]:
        return
    if len(inputs) != len(examples[0]):
        raise ValueError(f"the model was called with {len(inputs)} input(s); it was compiled with "
                         f"{len(examples[0])} example input(s). Pass the same inputs as example_inputs and "
                         f"example_kwargs")
    names = list(names) if names is not None and len(names) == len(inputs) else \
        [f"input {i}" for i in range(len(inputs))]
    checks = [(name, _signature(x), want) for name, x, want in zip(names, inputs, examples[0])]
    if target is not None and examples[1] is not None:
        checks.append(("target", _signature(target), examples[1]))
    for what, got, want in checks:
        if isinstance(got, str) or isinstance(want, str):  # not a tensor on one side
            if got != want:
                def kind(sig):
                    return "a tensor" if isinstance(sig, tuple) else sig
                raise ValueError(f"{what}: got {kind(got)}, the example was {kind(want)}")
            continue
        (shape, dtype), (example_shape, example_dtype) = got, want
        if dtype != example_dtype:
            raise ValueError(f"{what}: dtype {str(dtype).removeprefix('torch.')} differs from the example's "
                             f"{str(example_dtype).removeprefix('torch.')}; autopar plans for the example's dtypes: "
                             f"convert the input, or compile again with an example of this dtype")
        if len(shape) != len(example_shape):
            raise ValueError(f"{what}: shape {list(shape)} has {len(shape)} dimensions, the example's "
                             f"{list(example_shape)} has {len(example_shape)}; give inputs of the example's rank")


class new_shapes_explained:
    """Re-raise a capture failure at call-time shapes that differ from the example's
    with both shapes, so that the error says why the model was captured again."""

    def __init__(self, examples: tuple | None, inputs: tuple):
        self.examples, self.inputs = examples, inputs

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if kind is None or not issubclass(kind, CaptureError) or self.examples is None:
            return False
        got = [list(x.shape) for x in self.inputs if isinstance(x, torch.Tensor)]
        want = [list(w[0]) for w in self.examples[0] if isinstance(w, tuple)]
        if got == want:
            return False
        raise CaptureError(f"inputs of shapes {got} differ from the example's {want}: autopar builds each rank's "
                           f"program again for new shapes (the plan is kept), and the model cannot run at these "
                           f"shapes. Call it with shapes it supports, or compile with examples of these shapes.\n"
                           f"{error}") from error


def _signature(x):
    return (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__


def _parameter_owners(root: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    owners: dict[int, list] = {}
    for module in root.modules():
        for attr, p in module._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((module, attr))
    return owners


def _copy_missing_attributes(src: fx.GraphModule, graph: fx.Graph, dst: nn.Module) -> None:
    """Give ``dst`` the constants a captured graph reads that the model lacks (export lifts
    tensor constants onto the captured module as ``_tensor_constant0`` and the like)."""
    for node in graph.nodes:
        if node.op != "get_attr":
            continue
        try:
            _getattr_path(dst, node.target)
        except AttributeError:
            owner_path, _, attr = node.target.rpartition(".")
            owner = _getattr_path(dst, owner_path) if owner_path else dst
            value = _getattr_path(src, node.target)
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                owner.register_buffer(attr, value, persistent=False)
            else:
                setattr(owner, attr, value)


def _flat_root(root: nn.Module, graph: fx.Graph) -> nn.Module:
    """A module giving every module, parameter and constant the graph reaches one flat
    name, so the executed program does ``self.model_body_0(x)`` instead of walking
    ``getattr(self.model.body, "0")`` on every call. The objects are ``root``'s own
    (parameters are shared, not copied); the names in the graph are rewritten to match.
    Dumped rank graphs keep the hierarchical names."""
    flat = nn.Module()
    names: dict[int, str] = {}  # object -> its flat name
    for node in graph.nodes:
        if node.op not in ("call_module", "get_attr"):
            continue
        value = _getattr_path(root, node.target)
        if id(value) not in names:
            alias = base = node.target.replace(".", "_")
            suffix = 0
            while hasattr(flat, alias):  # two paths that flatten to one name
                suffix += 1
                alias = f"{base}_{suffix}"
            if isinstance(value, (nn.Module, nn.Parameter)):
                setattr(flat, alias, value)
            else:
                flat.__dict__[alias] = value  # a buffer or constant, shared by reference
            names[id(value)] = alias
        node.target = names[id(value)]
    return flat


def _getattr_path(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@health.guarded("compile()", setup=True)
def compile(model: nn.Module, mesh=None, example_inputs: Sequence[Any] = (), loss_fn: Callable | None = None,
            strategy: Any = "auto", *, example_target: Any = None, example_kwargs: dict[str, Any] | None = None,
            hardware: str | Hardware | None = None, seed: int = 0, overlap: Any = None,
            recompute: bool | None = None, memory_limit: float | None = None,
            fusion: bool | None = None) -> ParallelModule:
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
    (axonn §IV; True, False or a dict of :class:`autopar.runtime.tensor3d.Overlap`'s
    fields; all on by default). ``recompute``: recompute each split region's activations
    in backward instead of keeping them (activation checkpointing, megatron §3.5); None:
    as the plan says (the planner recomputes where keeping them does not fit).
    ``memory_limit``: bytes per device the plan may use (default: the hardware's).
    ``fusion``: run each rank's pointwise chains and softmax/layer-norm rows as generated
    Triton kernels (docs/fusion.md); None: on when the model is on CUDA and Triton is
    installed; True on the CPU needs ``TRITON_INTERPRET=1`` (for testing).
    """
    layout = CallLayout.of(example_inputs, example_kwargs)
    flat_examples = layout.flatten(tuple(example_inputs), dict(example_kwargs or {}), "the example")
    fusion = resolve_fusion(fusion, model_device(model, flat_examples))
    world, rank = _world(mesh)
    _check_same_call_everywhere(world, mesh, strategy, flat_examples, example_target, hardware, layout)
    check_dtypes(model)
    strategy = _strategy_from_mesh(mesh, strategy)
    gm = _global_graph(model, example_inputs, loss_fn, example_target, example_kwargs)
    plan_ = plan_graph(gm, world, _hardware(hardware, memory_limit), strategy)
    _attach_artifacts(plan_, gm, model, example_inputs, loss_fn, example_target, example_kwargs)
    if recompute is None:
        recompute = plan_.recompute
    health.barrier("compile(): planned", mesh)  # a rank whose planning failed stops the others here
    if plan_.pipeline:
        pm = _compile_pipeline(model, plan_, gm, mesh, world, rank, loss_fn, seed, recompute, fusion)
        pm._examples = example_signature(flat_examples, example_target)
        pm._layout = layout
        return pm
    group_map = _make_groups(plan_, mesh, world)
    _check_same_plan_everywhere(plan_, group_map)
    log.info("autopar plan on rank %d:\n%s", rank, plan_.explain())
    if plan_.form == "cube":
        shards = planned_cube_shards(gm, regions=plan_.regions_with("cube3d"), grid=plan_.grid)
    elif plan_.grid is not None:
        shards = planned_grid3d_shards(gm, regions=plan_.regions_with("tensor3d"), grid=plan_.grid)
    else:
        shards = {} if pass_disabled("tensor_parallel") else planned_param_shards(
            gm, megatron_regions=plan_.regions_with("megatron"), degree=plan_.degree("tensor"))
    pm = ParallelModule(model, plan_, rank, group_map, loss_fn, shards, seed=seed, overlap=overlap,
                        recompute=recompute, fusion=fusion)
    pm._examples = example_signature(flat_examples, example_target)
    pm._layout = layout
    return pm


def _compile_pipeline(model, plan_: Plan, gm: fx.GraphModule, mesh, world: int, rank: int, loss_fn, seed: int,
                      recompute: bool, fusion: bool = False):
    """A PTD-P plan's module: groups pipeline × data × tensor, tied-weight groups, and the
    pipeline positions that hold each parameter (from the cut of the global graph)."""
    from torch.distributed.device_mesh import DeviceMesh

    from autopar.passes.pipeline_stages import parameter_stages, partition
    from autopar.pipelined import PipelineModule, make_tied_groups
    pp = plan_.pipeline
    p = pp["stages"]
    part = partition(gm, p * pp["chunks"], pp["assignment"])
    # by parameter object: a weight tied under two names (embedding and head modules) is
    # held by the positions that read either
    by_object: dict[int, set[int]] = {}
    read = parameter_stages(gm, part)
    for name, stages in read.items():
        by_object.setdefault(id(gm.get_parameter(name)), set()).update(s % p for s in stages)
    holders = {name: by_object[id(gm.get_parameter(name))] for name in read}
    if world == 1:
        raise PlanError("a pipeline plan needs a process group of its world size; launch the ranks first")
    if mesh is not None and mesh.ndim != 1:
        raise ValueError("mesh: a pipeline plan takes a flat mesh (autopar lays out pipeline x data x tensor)")
    members = mesh.mesh.flatten().tolist() if mesh is not None else list(range(world))
    grid = torch.tensor(members).view(p, plan_.degree("data"), plan_.degree("tensor"))
    device = mesh.device_type if mesh is not None else ("cuda" if dist.get_backend() == "nccl" else "cpu")
    group_map = G.groups_from_mesh(DeviceMesh(device, grid, mesh_dim_names=("pipeline", "data", "tensor")))
    group_map.update({"segment": None, "subgrid": None})
    group_map.update(make_tied_groups(plan_, grid, holders.values()))
    _check_same_plan_everywhere(plan_, group_map)
    log.info("autopar plan on rank %d:\n%s", rank, plan_.explain())
    shards = {} if pass_disabled("tensor_parallel") else planned_param_shards(
        gm, megatron_regions=plan_.regions_with("megatron"), degree=plan_.degree("tensor"))
    return PipelineModule(model, plan_, rank, group_map, loss_fn, shards, holders=holders, seed=seed,
                          recompute=recompute, fusion=fusion)


def _subgrid_groups(plan_: Plan, world: int) -> dict:
    """D&SP's groups: the data group in batch-chunk order (so gathered outputs come out in
    batch order; in cSub, the rank's sub-grid), the segment groups and the sub-grids
    (SUPER §IV-B, §V)."""
    from autopar.runtime.subgraph_collectives import make_subgrid_process_groups
    made = make_subgrid_process_groups(world, plan_.subgrids, plan_.topology_aware)
    if plan_.csub:  # the common layers are data parallel inside sub-grid 0 (position order)
        data = made["within"]
    else:
        data = dist.new_group(sorted(range(world), key=plan_.batch_chunk), sort_ranks=False)
    return {"data": data, "tensor": None, "segment": made["segment"], "subgrid": made["within"]}


def _strategy_from_mesh(mesh, strategy):
    """A 2-D mesh named ("data", "tensor") fixes the degrees; other meshes must be flat."""
    if mesh is None or mesh.ndim == 1:
        return strategy
    names = tuple(mesh.mesh_dim_names or ())
    if mesh.ndim != 2 or set(names) != {"data", "tensor"}:
        raise ValueError(f"mesh: dims {names or mesh.ndim} are not understood; pass a flat mesh (autopar factors "
                         f"it) or a 2-D mesh named ('data', 'tensor')")
    degrees = {"data": mesh.size(names.index("data")), "tensor": mesh.size(names.index("tensor"))}
    forced = Strategy.parse(strategy)
    if forced is not None and {"data": forced.data, "tensor": forced.tensor} != degrees:
        raise ValueError(f"mesh: its degrees {degrees} contradict strategy={strategy!r}; drop one of them")
    return degrees


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


def _mesh_text(mesh) -> str:
    if mesh is None:
        return f"None (the default group of {dist.get_world_size()} ranks)"
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    shape = " x ".join(f"{n}={mesh.size(i)}" for i, n in enumerate(names))
    return f"DeviceMesh {shape} over ranks {mesh.mesh.flatten().tolist()}"


def _gather_from_ranks(value, group) -> dict[int, Any]:
    """Every rank's ``value`` by global rank (an object all-gather over ``group``, None:
    the default group): what the consistency checks of ``compile`` compare."""
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, value, group=group)
    ranks = dist.get_process_group_ranks(group) if group is not None else range(len(everyone))
    return dict(zip(ranks, everyone))


def _check_same_call_everywhere(world: int, mesh, strategy, example_inputs, example_target, hardware,
                                layout: CallLayout | None = None) -> None:
    """Before any group is made: every rank must call compile with the same mesh,
    strategy, hardware and example shapes. One all-gather over the default group (when
    the mesh spans it); on a difference every rank raises the same error, naming which
    ranks passed what, instead of building mismatched groups that would hang."""
    if world == 1 or not dist.is_initialized() or world != dist.get_world_size():
        return
    inputs, target = example_signature(example_inputs, example_target)
    mine = {"mesh": _mesh_text(mesh), "strategy": repr(strategy), "hardware": repr(hardware),
            "example inputs": repr([x[0] if isinstance(x, tuple) else x for x in inputs]),
            "example keyword inputs": repr((layout.keywords.tensors, layout.keywords.constants) if layout else ())}
    everyone = _gather_from_ranks(mine, None)
    for field in mine:
        values: dict[str, list[int]] = {}
        for r, theirs in everyone.items():
            values.setdefault(theirs[field], []).append(r)
        if len(values) > 1:
            said = "; ".join(f"rank{'s' if len(ranks) > 1 else ''} {ranks if len(ranks) > 1 else ranks[0]}: {value}"
                             for value, ranks in values.items())
            raise PlanError(f"compile(): the ranks were given different {field}: {said}. Call compile with the "
                            f"same mesh, strategy, hardware and example inputs on every rank")


def _check_same_plan_everywhere(plan_: Plan, group_map: dict) -> None:
    """Every rank must run the same plan; equal within each data group and each tensor
    group means equal everywhere on the mesh."""
    text = plan_.to_json()
    for name in ("data", "tensor", "segment", "replica", "x", "y", "pipeline"):
        group = group_map.get(name)
        if group is None or G.size_of(group) == 1:
            continue
        bad = [r for r, theirs in _gather_from_ranks(text, group).items() if theirs != text]
        if bad:
            raise PlanError(f"ranks {bad} planned differently from rank {dist.get_rank()} (different model, inputs "
                            f"or autopar version); give every rank the same model, example inputs and strategy")


def _make_groups(plan_: Plan, mesh, world: int) -> dict:
    if world == 1:
        return {"data": None, "tensor": None, "segment": None, "subgrid": None}
    if plan_.subgrids > 1:
        return _subgrid_groups(plan_, world)
    if plan_.grid is not None:
        if mesh is not None and mesh.ndim != 1:
            raise ValueError("mesh: a 3D grid plan takes a flat mesh (autopar lays the grid out itself)")
        return {**T3.make_grid_process_groups(plan_.grid), "tensor": None, "segment": None, "subgrid": None}
    from torch.distributed.device_mesh import DeviceMesh
    device = mesh.device_type if mesh is not None else ("cuda" if dist.get_backend() == "nccl" else "cpu")
    data, tensor = plan_.degree("data"), plan_.degree("tensor")
    # rank = data_index * tensor + tensor_index over the mesh's ranks in order, so the
    # ranks of a tensor group are adjacent (inside a node); a user's 2-D mesh keeps its own
    ranks = torch.arange(world)
    grid = _data_major(mesh).view(data, tensor) if mesh is not None else ranks.view(data, tensor)
    two_d = DeviceMesh(device, grid, mesh_dim_names=("data", "tensor"))
    return G.groups_from_mesh(two_d)
