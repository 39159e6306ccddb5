"""The model on one rank: :class:`ParallelModule`, what ``autopar.compile`` returns.

It knows no family. It holds a deep copy of the user's model whose parameters are laid
out as the plan's :class:`~autopar.layout.ParamLayout` says (this rank's shards; an
empty tensor for what other pipeline stages hold), the gradient buckets the layout
names, the families' run-time state (one
:class:`~autopar.runtime.family_runtime.RankRuntime` per family, called at fixed points
of each call, which also add the family's attributes such as ``pm.zero_stats``), and a
runner that builds and runs this rank's programs:
:class:`autopar.runtime.runner.ProgramRunner` (one program per input signature), or the
runner a family's runtime gives (a pipeline's schedule, microbatch by microbatch). ``grad_norm``,
``full_state_dict``/``load_full_state_dict``, ``full_gradients`` and checkpoints read
the layout.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from autopar._torch_compat import own_parameters
from autopar.trace.capture import MODEL_PREFIX, layout_name, wrap_model
from autopar.trace.inputs import CallLayout, check_loss_arguments
from autopar.layout import ParamLayout, group_buckets
from autopar.planning.plan import Plan
from autopar.runtime.runner import ProgramRunner, RankState
from autopar.runtime.groups import get_group, size_of, use_groups
from autopar.runtime import health
from autopar.runtime import devices, rng
from autopar.runtime.family_runtime import RankRuntime, active
from autopar.runtime.grad_sync import GradientBuckets
from autopar.timing import Timings, phase, recording

log = logging.getLogger("autopar")

FIRST_RUN = "first_step.run"


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
                 shards: dict, *, layout: Callable[[nn.Module, dict], ParamLayout], runtimes: Sequence[RankRuntime],
                 rewrite: Callable, dropout: tuple[int, int, dict], seed: int = 0, recompute: bool | str = False,
                 fusion: bool = False, call: CallLayout | None = None, examples: tuple | None = None,
                 timings: Timings | None = None):
        """Built by :func:`autopar.compile`, which gives what the plan's families decide:
        ``layout(root, options)``, this rank's parameter layout over the module tree
        ``root`` (with the runtimes' ``layout_options``); ``runtimes``, each family's
        :class:`~autopar.runtime.family_runtime.RankRuntime`; ``rewrite``, the rank-program
        rewrite; ``dropout``, the rank's dropout stream coordinates (tensor index, batch
        index, per-group shards); ``timings``, where ``compile`` timed its phases (the
        builds of the rank's programs and the first step's run add theirs)."""
        super().__init__()
        self.plan = plan_
        self.timings = Timings() if timings is None else timings
        self.rank = rank
        self._runtimes = tuple(runtimes)
        # a module tree of the same structure as the captured wrapper, holding this rank's
        # parameters: a copy of the model that shares its parameters until _install gives
        # each its own copy (of this rank's part of it): one copy of the weights, not two
        shared = {id(p): p for p in model.parameters()}
        self.root = wrap_model(copy.deepcopy(model, shared), loss_fn, 0)
        options: dict = {}
        for runtime in self._runtimes:
            options.update(runtime.layout_options())
        layout = layout(self.root, options)
        self.layout: ParamLayout = layout
        parts = self._install()
        running = active(self._runtimes)
        for runtime in running:  # over the installed shards
            runtime.attach(layout, self.root, parts)
        # the parameters each bucket reduces: a family's own tensors where it keeps them
        # (ZeRO-1/2's full parameters, whose gradients go to the shards), every other one
        # as the module tree holds it
        full = {name: p for runtime in running for name, p in runtime.bucket_params().items()}
        bucket_shards = next((s for runtime in running if (s := runtime.bucket_shards()) is not None), None)
        named = [(layout_name(n), full.get(self._first_name(n), p))
                 for n, p in self.root.named_parameters(remove_duplicate=False)]
        with use_groups(group_map):
            buckets = {spec: GradientBuckets(params, spec.group, divisor=spec.divisor, hooks=spec.hooks,
                                             zero=spec.zero, shards=bucket_shards if spec.zero else None,
                                             armed=spec.armed)
                       for spec, params in group_buckets(layout, named)}
        states = rng.RandomStates(seed, *dropout)
        device = devices.rank_device(model.parameters(), examples or ())
        devices.check_backend_device(device)
        self._state = RankState(plan_, rank, self.root, layout, group_map, states, running, buckets, model,
                                loss_fn, call or CallLayout(), examples, recompute, fusion, dict(shards), device,
                                rewrite, self.timings)
        self.runner = next((r for r in (rt.runner(self._state, model) for rt in running) if r is not None), None) \
            or ProgramRunner(self._state)
        # which runtime answers each family attribute (asked at lookup: a deep copy's
        # runtimes are its own)
        self._attribute_owner = {name: i for i, runtime in enumerate(self._runtimes)
                                 for name in runtime.attributes()}

    def _first_name(self, root_name: str) -> str:
        placement = self.layout.get(layout_name(root_name))
        return placement.names[0] if placement is not None else layout_name(root_name)

    def _install(self) -> dict[str, torch.Tensor]:
        """Replace each parameter of ``self.root`` (still the user's) by what this rank holds
        of it: a copy of a whole one, its part of a cut one (under ZeRO, its rows of that
        part), an empty tensor where it holds none (another pipeline stage's). Returns the
        cut parts of the ZeRO-sharded ones."""
        owners = _parameter_owners(self.root)
        parts = {}
        for name, full in list(self.root.named_parameters()):
            placement = self.layout.get(layout_name(name))
            if placement is None or (placement.held and placement.cut is None and placement.zero is None):
                local = copy.deepcopy(full)   # what a copy of the model holds
            elif placement.held:
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
        self._before_call()
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
        self._before_call()
        if FIRST_RUN not in self.timings:
            return self._first_step(flat, target)
        return self.runner.step(flat, target, self.training)

    def _first_step(self, flat: tuple, target: Any):
        """The first step, its run timed (``first_step.run``: without the building of
        its programs, which times itself) and logged."""
        with recording(self.timings, "first_step."), phase("run"):
            loss = self.runner.step(flat, target, self.training)
        log.info("autopar first step on rank %d: run %.2f s (its programs built in %.2f s); %s", self.rank,
                 self.timings[FIRST_RUN], self.timings.total("program."), self.timings.summary("program."))
        return loss

    def _before_call(self) -> None:
        for runtime in self._state.runtimes:
            runtime.before_call()

    def family_runtime(self, family: str) -> RankRuntime | None:
        """The run-time state of ``family`` on this rank (its
        :class:`~autopar.runtime.family_runtime.RankRuntime`, by the family's name:
        ``data`` for ZeRO, ``3d``, ``pipeline``, ``experts``), None if it keeps none."""
        return next((r for r in self._runtimes if r.name == family), None)

    def __getattr__(self, name: str):
        """The attributes the plan's families add (``zero_stats``, ``tensor3d_stats``,
        ``tensor3d_runtime``, ``pipeline_executor``, ``expert_load``: each family's
        :meth:`~autopar.runtime.family_runtime.RankRuntime.attributes`)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            owner = self.__dict__.get("_attribute_owner", {}).get(name)
            if owner is None:
                raise
            return self._runtimes[owner].attributes()[name](self._state)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.__dict__.get("_attribute_owner", {})))

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
        with use_groups(self._state.groups):
            for key in self.layout.norm_keys():  # every key in a fixed order on every rank
                value = partial.get(key, torch.zeros((), dtype=torch.float64, device=self._state.device)).clone()
                for name in key:
                    group = get_group(name)
                    if size_of(group) > 1:
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
        with use_groups(self._state.groups):
            return {k: self.layout.gather(k, v, v) for k, v in self.root.model.state_dict(keep_vars=True).items()}

    @health.guarded("full_gradients()")
    def full_gradients(self) -> dict[str, torch.Tensor | None]:
        """Every parameter's gradient at its full shape, by the original model's names."""
        with use_groups(self._state.groups):
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


