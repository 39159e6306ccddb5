"""The model on one rank: :class:`ParallelModule`, what ``autopar.compile`` returns.

It knows no family. It holds a deep copy of the user's model whose parameters are laid
out as the plan's :class:`~autopar.layout.ParamLayout` says (this rank's shards; an
empty tensor for what other pipeline stages hold), the gradient buckets the layout
names, and a runner that builds and runs this rank's programs:
:class:`autopar.runtime.runner.ProgramRunner` (one program per input signature: data, Megatron,
D&SP, AxoNN 3D, Bian's cube) or :class:`autopar.strategies.pipeline.program.PipelineRunner`
(the stages of a PTD-P plan, microbatch by microbatch). ``grad_norm``,
``full_state_dict``/``load_full_state_dict``, ``full_gradients`` and checkpoints read
the layout.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from autopar._torch_compat import own_parameters
from autopar.trace.capture import MODEL_PREFIX, wrap_model
from autopar.trace.inputs import CallLayout, check_loss_arguments
from autopar.layout import ParamLayout, group_buckets
from autopar.planning.plan import Plan
from autopar.runtime.runner import ProgramRunner, RankState
from autopar.runtime import groups as G
from autopar.runtime import health
from autopar.runtime import devices, rng
from autopar.runtime.grad_sync import GradientBuckets
from autopar.strategies.data.zero import ZeroState
from autopar.strategies.pipeline.program import PipelineRunner
from autopar.strategies.placement import build_layout, dropout_coordinates, dropout_shards, layout_name
from autopar.strategies.tensor3d import runtime as T3


class ParallelModule(nn.Module):
    """The model on this rank: behaves like the original, numerically.

    ``pm(*inputs, **kwargs)`` returns full outputs; ``pm.step(*inputs, target=...,
    **kwargs)`` runs forward and backward on this rank's share of the batch and leaves
    synchronised gradients on ``pm.parameters()`` (this rank's shards); without a
    ``loss_fn`` it trains on the loss the model's output carries. ``full_state_dict`` /
    ``load_full_state_dict`` use the original model's keys and shapes. ``pm.layout``
    says how every parameter is cut and where it lives.
    """

    def __init__(self, model: nn.Module, plan_: Plan, rank: int, group_map: dict, loss_fn: Callable | None,
                 shards: dict, *, seed: int = 0, overlap: Any = None, recompute: bool | str = False, fusion: bool = False,
                 holders: dict | None = None, call: CallLayout | None = None, examples: tuple | None = None):
        super().__init__()
        self.plan = plan_
        self.rank = rank
        # a module tree of the same structure as the captured wrapper, holding this rank's parameters
        self.root = wrap_model(copy.deepcopy(model), loss_fn, 0)
        # 3D layers' overlap state (axonn §IV): prefetched and cached weights, deferred
        # weight-gradient reduce-scatters
        runtime = T3.Tensor3DRuntime(T3.Overlap.parse(overlap).with_cache_limit(plan_.gather_cache))
        layout = build_layout(plan_, rank, self.root, shards, holders=holders,
                              deferred_reduce_scatter=runtime.overlap.reduce_scatter)
        self.layout: ParamLayout = layout
        parts = self._install()
        zero = ZeroState(layout, self.root) if plan_.zero else None  # over the installed shards
        if zero is not None:
            zero.init_full(parts)
        # the parameters each bucket reduces: ZeRO-1/2's full parameters (their gradients
        # go to the shards), every other one as the module tree holds it
        full = zero.persistent_params() if zero is not None else {}
        named = [(layout_name(n), full.get(self._first_name(n), p))
                 for n, p in self.root.named_parameters(remove_duplicate=False)]
        with G.use_groups(group_map):
            buckets = {spec: GradientBuckets(params, spec.group, divisor=spec.divisor, hooks=spec.hooks,
                                             zero=spec.zero, shards=zero.bucket_shards() if spec.zero else None,
                                             armed=spec.armed)
                       for spec, params in group_buckets(layout, named)}
        states = rng.RandomStates(seed, *dropout_coordinates(plan_, rank), dropout_shards(plan_, rank))
        device = devices.rank_device(model.parameters(), examples or ())
        devices.check_backend_device(device)
        self._state = RankState(plan_, rank, self.root, layout, group_map, states, runtime, buckets, model,
                                loss_fn, call or CallLayout(), examples, recompute, fusion, dict(shards), zero, device)
        self.runner = PipelineRunner(self._state, model) if plan_.pipeline else ProgramRunner(self._state)

    def _first_name(self, root_name: str) -> str:
        placement = self.layout.get(layout_name(root_name))
        return placement.names[0] if placement is not None else layout_name(root_name)

    def _install(self) -> dict[str, torch.Tensor]:
        """Replace each parameter of ``self.root`` by what this rank holds of it: its part
        of a cut one (under ZeRO, its rows of that part), an empty tensor where it holds
        none (another pipeline stage's). Returns the cut parts of the ZeRO-sharded ones."""
        owners = _parameter_owners(self.root)
        parts = {}
        for name, full in list(self.root.named_parameters()):
            placement = self.layout.get(layout_name(name))
            if placement is None or (placement.held and placement.cut is None and placement.zero is None):
                continue
            if placement.held:
                part = full.detach() if placement.cut is None else placement.cut.local(full.detach(), self.layout.seat)
                if placement.zero is not None:
                    parts[placement.names[0]] = part
                    part = placement.zero.local(part)
                local = nn.Parameter(part.clone(), requires_grad=full.requires_grad)
            else:
                local = nn.Parameter(torch.empty(0, dtype=full.dtype, device=full.device), requires_grad=False)
            for module, attr in owners[id(full)]:
                setattr(module, attr, local)
        return parts

    # ------------------------------------------------------------------ running
    @health.guarded("forward()")
    def forward(self, *inputs, **kwargs):
        self._reset_expert_load()
        return self.runner.forward(self._state.call.flatten(inputs, kwargs, "forward()"), self.training)

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
        over the data ranks in the last gradient bucket (no collective of its own). A
        pipeline plan runs the batch as its microbatches in the schedule's order and
        synchronises the gradients after the last. Gradients accumulate across calls, as
        in PyTorch: call ``optimizer.zero_grad()`` between steps.
        """
        flat = self._state.call.flatten(inputs, kwargs, "step()")
        check_loss_arguments(self._state.loss_fn, target)
        self._reset_expert_load()
        return self.runner.step(flat, target, self.training)

    def _expert_layers(self) -> list[str]:
        return [r.region for r in self.plan.regions if r.kind == "experts" and r.strategy == "experts"]

    def _reset_expert_load(self) -> None:
        if self.plan.experts > 1:
            from autopar.strategies.experts.collectives import reset_load
            reset_load(self._expert_layers())

    def expert_load(self) -> dict[str, list[int]]:
        """Under expert parallelism, the rows each MoE layer's experts processed in the last
        forward or step on each rank of this rank's expert group (all-gathered: a
        collective, every rank calls it), by region id; also written into the plan's
        region details (``measured_tokens_per_rank``), which ``explain()`` shows beside the
        uniform routing's prediction. {} without expert parallelism."""
        if self.plan.experts <= 1:
            return {}
        import torch.distributed as dist
        from autopar.strategies.experts.collectives import LOAD
        # the layers this rank's programs ran (a pipeline rank: its stages'; the same on
        # every rank of its expert group, which sits at one pipeline position)
        layers = [layer for layer in self._expert_layers() if layer in LOAD]
        group = self._state.groups.get("experts")
        mine = torch.tensor([LOAD.get(layer, 0) for layer in layers], dtype=torch.long, device=self._state.device)
        parts = [torch.empty_like(mine) for _ in range(self.plan.experts)]
        dist.all_gather(parts, mine, group=group)
        out = {layer: [int(p[i]) for p in parts] for i, layer in enumerate(layers)}
        for r in self.plan.regions:
            if r.region in out:
                r.details["measured_tokens_per_rank"] = out[r.region]
        return out

    # ------------------------------------------------------------------ parameters and state
    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """This rank's parameters by the original model's names (none it does not hold)."""
        for name, p in self.root.named_parameters(remove_duplicate=remove_duplicate):
            placement = self.layout.get(layout_name(name))
            if name.startswith(MODEL_PREFIX) and (placement is None or placement.held):
                yield prefix + name[len(MODEL_PREFIX):], p

    def parameters(self, recurse: bool = True):
        for _, p in self.named_parameters():
            yield p

    def _held(self):
        """``(layout name, parameter)`` of every parameter this rank holds, each once."""
        for name, p in self.root.named_parameters():
            placement = self.layout.get(layout_name(name))
            if placement is None or placement.held:
                yield layout_name(name), p

    @health.guarded("grad_norm()")
    def grad_norm(self, norm_type: float = 2.0) -> torch.Tensor:
        """The norm of all gradients as the single-device model would compute it
        (``torch.nn.utils.get_total_norm`` of its parameters): each parameter counted
        where its copy is current, its part reduced over the groups its norm is summed
        over (the layout's ``norm_groups``). A collective: every rank calls it, after
        ``step`` (gradients synchronised)."""
        inf = norm_type == float("inf")
        if not (inf or norm_type > 0):
            raise ValueError(f"grad_norm: norm_type={norm_type}; use a positive number or inf")
        combine = torch.maximum if inf else torch.add
        partial: dict[tuple[str, ...], torch.Tensor] = {}
        for name, p in self._held():
            placement = self.layout.get(name)
            if p.grad is None or not p.grad.numel() or (placement is not None and not self.layout.at_home(placement)):
                continue
            g = p.grad.detach()
            value = (g.abs().max() if inf else g.abs().pow(norm_type).sum()).to(torch.float64)
            key = placement.norm_groups if placement is not None else ()
            partial[key] = combine(partial[key], value) if key in partial else value
        op = dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM
        total = torch.zeros((), dtype=torch.float64, device=self._state.device)
        with G.use_groups(self._state.groups):
            for key in self.layout.norm_keys():  # every key in a fixed order on every rank
                value = partial.get(key, torch.zeros((), dtype=torch.float64, device=self._state.device)).clone()
                for name in key:
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
        for _, p in self._held():
            if p.grad is not None:
                p.grad.mul_(scale.to(p.grad.dtype))
        return total

    @health.guarded("full_state_dict()")
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The original model's state dict (keys and full shapes), gathered from all ranks."""
        with G.use_groups(self._state.groups):
            return {k: self.layout.gather(k, v, v) for k, v in self.root.model.state_dict(keep_vars=True).items()}

    @health.guarded("full_gradients()")
    def full_gradients(self) -> dict[str, torch.Tensor | None]:
        """Every parameter's gradient at its full shape, by the original model's names."""
        with G.use_groups(self._state.groups):
            return {k: self.layout.gather(k, p.grad, p)
                    for k, p in self.root.model.named_parameters(remove_duplicate=False)}

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load a full (original-shaped) state dict, keeping this rank's part of each tensor."""
        own = self.root.model.state_dict(keep_vars=True)
        missing = sorted(set(own) - set(state_dict))
        if missing:
            raise KeyError(f"load_full_state_dict: missing keys {missing[:5]}{'…' if len(missing) > 5 else ''}")
        with torch.no_grad():
            for name, value in own.items():
                placement = self.layout.get(name)
                if placement is not None and not placement.held:
                    continue  # another pipeline stage's
                full = state_dict[name]
                local = self.layout.local_part(name, full)
                if local.shape != value.shape:
                    shape = placement.full_shape if placement is not None else tuple(value.shape)
                    raise ValueError(f"load_full_state_dict: {name} has shape {list(full.shape)}; the original "
                                     f"model's is {list(shape)}")
                value.copy_(local)

    @property
    def tensor3d_stats(self) -> dict[str, int]:
        """Where the 3D layers' gathered weights came from since compile (``gathered``,
        ``prefetched``, ``cached`` for recomputation) and how many weight-gradient
        reduce-scatters were ``deferred`` to the end of backward (axonn §IV)."""
        return dict(self._state.runtime.stats)

    @property
    def tensor3d_runtime(self) -> T3.Tensor3DRuntime:
        """The 3D layers' runtime state: its ``overlap`` switches, ``stats`` and
        ``exposed_s``, the seconds spent blocked in their collectives."""
        return self._state.runtime

    @property
    def zero_stats(self) -> dict[str, int] | None:
        """Under ZeRO-3, how the full parameters were read since compile: ``gathered``
        when needed, ``prefetched`` while the one before computed, ``regathered`` for
        backward (docs/memory.md); None without ZeRO."""
        return None if self._state.zero is None else dict(self._state.zero.stats)

    @property
    def pipeline_executor(self):
        """A pipeline plan's schedule runner: its ``trace``, ``executed`` order, ``span``
        and transfer ``stats`` of the last step."""
        executor = getattr(self.runner, "executor", None)
        if executor is None:
            raise AttributeError("pipeline_executor: this plan has no pipeline")
        return executor

    @property
    def process_groups(self) -> dict:
        """The named process groups this rank's programs use (``data``, ``tensor``, ...)."""
        return dict(self._state.groups)

    @property
    def gradient_buckets(self) -> dict:
        """The gradient buckets by the layout's :class:`~autopar.layout.Bucket`."""
        return dict(self._state.buckets)

    def rank_graph_code(self) -> str:
        """This rank's most recently built program(s) as readable code."""
        return self.runner.code()


def _parameter_owners(root: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    owners: dict[int, list] = {}
    for module in root.modules():
        for attr, p in own_parameters(module):
            if p is not None:
                owners.setdefault(id(p), []).append((module, attr))
    return owners


