"""The model on one rank: :class:`ParallelModule`, what ``autopar.compile`` returns.

It holds a deep copy of the user's model whose split parameters are this rank's shards,
builds a program per input signature (:func:`autopar.program.rewrite` on a capture at the
local batch), runs forward and ``step`` under the plan's process groups and random
states, and syncs gradients in buckets. A pipeline plan's module
(:class:`autopar.strategies.pipeline.program.PipelineModule`) runs its stages through the pipeline executor.
"""

import copy
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn

from autopar._torch_compat import copy_export_specs, own_parameters
from autopar.capture import MODEL_PREFIX, CaptureError, capture, wrap_model
from autopar.inputs import CallLayout
from autopar.ir import CAPTURE, ROOT_OUTPUT, TensorSpec
from autopar.strategies.data.rewrite import LOSS_REDUCTION
from autopar.strategies.megatron.rewrite import PARAM_SHARDS, ParamShard
from autopar.planning.plan import Plan
from autopar.program import batch_of, local_batch, rank_graph_code, rewrite
from autopar.runtime import groups as G
from autopar.runtime import health
from autopar.runtime import rng
from autopar.strategies.tensor3d import runtime as T3
from autopar.runtime.grad_sync import GradientBuckets
from autopar.runtime.shards import gather_full, local_shard
from autopar.runtime.target_count import TARGET_COUNT, use_target_count

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
        local_inputs, local_target = local_batch(self._data, self._chunk, inputs, target)
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
            gm = rewrite(gm, self.plan, self.rank, batch_of(local_inputs), self._recompute, self._fusion)
            if gm.meta.get(PARAM_SHARDS, {}) != self._shards:
                raise RuntimeError("the rank program splits other parameters than the plan did; this is a bug")
            _copy_missing_attributes(gm, gm.graph, self.root)
            program = fx.GraphModule(_flat_root(self.root, gm.graph), gm.graph, class_name=f"Rank{self.rank}Program")
            copy_export_specs(gm, program)
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
            spec = program.meta[ROOT_OUTPUT]
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
        for attr, p in own_parameters(module):
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
