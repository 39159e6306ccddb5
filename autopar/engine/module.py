"""The model on one rank: :class:`ParallelModule`, what ``autopar.compile`` returns.

It knows no family. It holds a copy of the user's model's module tree whose parameters
are laid out as the plan's :class:`~autopar.runtime.layout.ParamLayout` says (this rank's
shards, allocated at their own size on the rank's device: :mod:`autopar.engine.materialise`;
an empty tensor for what other pipeline stages hold), the gradient buckets the layout
names, the families' run-time state (one
:class:`~autopar.runtime.family_runtime.RankRuntime` per family, called at fixed points
of each call, which also add the family's attributes such as ``pm.zero_stats``), and a
runner that builds and runs this rank's programs:
:class:`autopar.engine.runner.ProgramRunner` (one program per input signature), or the
runner a family's runtime gives (a pipeline's schedule, microbatch by microbatch). ``grad_norm``,
``full_state_dict``/``load_full_state_dict``, ``full_gradients`` and checkpoints read
the layout.
"""
from __future__ import annotations

import collections
import logging
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from autopar.trace.capture import MODEL_PREFIX, layout_name, wrap_model
from autopar.trace.inputs import CallLayout, check_loss_arguments
from autopar.trace.meta import holds_meta
from autopar.grid import MeshAxis
from autopar.runtime.layout import ParamLayout, group_buckets
from autopar.planning.declared import by_word
from autopar.planning.plan import Plan
from autopar.planning.schedules import rank_of
from autopar.engine.runner import ProgramRunner, RankState
from autopar.runtime.groups import get_group, size_of, use_groups
from autopar.runtime import health
from autopar.runtime import devices, rng, state_hooks
from autopar.engine import materialise, pretrained
from autopar.engine.init_weights import init_weights
from autopar.runtime.family_runtime import RankRuntime, active
from autopar.runtime.grad_sync import GradientBuckets
from autopar.timing import Timings, phase, recording

MEASURED_STEPS = 50  # the steps measured_step_s takes the median of
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
                 rewrite: Callable, seed: int = 0, recompute: bool | str = False,
                 fusion: bool = False, call: CallLayout | None = None, examples: tuple | None = None,
                 device: torch.device | None = None, twin: nn.Module | None = None,
                 timings: Timings | None = None, batch_local: bool = False, scalars: dict | None = None,
                 torch_compile: bool = False):
        """Built by :func:`autopar.compile`, which gives what the plan's families decide:
        ``layout(root, options)``, this rank's parameter layout over the module tree
        ``root`` (with the runtimes' ``layout_options``); ``runtimes``, each family's
        :class:`~autopar.runtime.family_runtime.RankRuntime`; ``rewrite``, the rank-program
        rewrite; ``seed``: the key of the random ops' draws (:mod:`autopar.runtime.rng`),
        the same on every rank; ``device``: where the rank's tensors go (None: the
        model's, :func:`~autopar.engine.materialise.resolve_device`); ``twin``: the
        model on the meta device that programs are captured from (None: one is made);
        ``timings``, where ``compile`` timed its phases (the builds of the rank's
        programs and the first step's run add theirs); ``scalars``: the numbers of the
        plan's capture, each rank capture at a share of the batch is checked against."""
        super().__init__()
        self.plan = plan_
        self.timings = Timings() if timings is None else timings
        self._step_starts: collections.deque = collections.deque(maxlen=MEASURED_STEPS + 1)
        self.rank = rank
        self._runtimes = tuple(runtimes)
        device = materialise.resolve_device(device, None, model, examples or ())
        devices.check_backend_device(device)
        # a module tree of the same structure as the captured wrapper, holding this rank's
        # parameters: a meta copy of the model (no storage copied), then the rank's parts
        self.root = wrap_model(materialise.meta_twin(model), loss_fn, 0)
        options: dict = {}
        for runtime in self._runtimes:
            options.update(runtime.layout_options())
        layout = layout(self.root, options)
        self.layout: ParamLayout = layout
        parts = materialise.install(self.root.model, layout, model, device)
        # a model built on the meta device has no values until init_weights or a load;
        # the tensors that came with values (buffers built for real) keep them
        self._valued = materialise.valued_names(model)
        self._initialised = not holds_meta(model)
        twin = twin if twin is not None else materialise.meta_twin(model)
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
        states = rng.RandomStates(seed)
        # the user's model is not kept: programs are captured from its meta twin (shapes)
        self._state = RankState(plan_, rank, self.root, layout, group_map, states, running, buckets, twin,
                                loss_fn, call or CallLayout(), examples, recompute, fusion, dict(shards), device,
                                rewrite, self.timings, batch_local, scalars, torch_compile=torch_compile)
        self.runner = next((r for r in (rt.runner(self._state, twin) for rt in running) if r is not None), None) \
            or ProgramRunner(self._state)
        # which runtime answers each family attribute (asked at lookup: a deep copy's
        # runtimes are its own)
        self._attribute_owner = {name: i for i, runtime in enumerate(self._runtimes)
                                 for name in runtime.attributes()}
        if not self._initialised and all(p.device.type != "meta" for p in model.parameters()):
            self._mark_initialised(set())  # weights given, buffers on meta: those from the model's scheme

    def _first_name(self, root_name: str) -> str:
        placement = self.layout.get(layout_name(root_name))
        return placement.names[0] if placement is not None else layout_name(root_name)

    # ------------------------------------------------------------------ running
    @health.guarded("forward()")
    def forward(self, *inputs, **kwargs):
        self._check_initialised("forward()")
        self._before_call()
        self._state.random.next_call()
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
        self._check_initialised("step()")
        flat = self._state.call.flatten(inputs, kwargs, "step()")
        check_loss_arguments(self._state.loss_fn, target)
        self._before_call()
        self._state.random.next_call()
        if FIRST_RUN not in self.timings:
            return self._first_step(flat, target)
        self._step_starts.append(time.perf_counter())
        return self.runner.step(flat, target, self.training)

    @property
    def data_parallel_size(self) -> int:
        """Into how many shares the plan splits the global batch's rows (the data degree;
        times Gz on a 3D grid; a D&SP-cSub sub-grid's ranks): with ``batch="local"`` each
        share is fed by the ranks of :attr:`data_parallel_rank`."""
        return self.plan.batch_parts()

    @property
    def data_parallel_rank(self) -> int:
        """Which share of the global batch's rows this rank trains on (0 ..
        :attr:`data_parallel_size` - 1). The ranks of one share (its tensor, context and
        pipeline ranks) must be given the same rows; :func:`autopar.data.sampler` and
        :func:`autopar.data.shard` feed them so."""
        return self.plan.batch_chunk(self.rank)

    @property
    def reads_inputs(self) -> bool:
        """Whether this rank's programs read the values of the inputs. Without a pipeline,
        every rank. In a pipeline, known once the first call built the rank's stage
        programs: whether a stage of this rank reads a graph input (the first stage the
        ids, the last the labels its loss reads, a middle one any input its blocks read,
        a mask); True before (any tensors of the share's shape will do where False)."""
        reader = getattr(self.runner, "graph_inputs_read", None)
        read = reader() if reader is not None else None
        return True if read is None else bool(read)

    @property
    def reads_target(self) -> bool:
        """Whether this rank's programs read the target's values (a pipeline's last
        stage only; without a pipeline, every rank)."""
        pipeline = self.plan.pipeline
        if not pipeline:
            return True
        p, v = pipeline["stages"], pipeline.get("chunks", 1)
        last = rank_of(pipeline["schedule"], p, p * v - 1)  # as the executor finds the last stage
        return self.plan.rank_coordinates(self.rank).get(MeshAxis.PIPELINE, 0) == last

    @property
    def measured_step_s(self) -> float | None:
        """The median time from one ``step()`` call to the next over the last
        :data:`MEASURED_STEPS` (the whole training iteration: data, step, optimizer), the
        first step's (which builds the programs) left out; None before three steps."""
        starts = list(self._step_starts)  # from the second step on
        gaps = sorted(b - a for a, b in zip(starts, starts[1:]))
        return gaps[len(gaps) // 2] if gaps else None

    def save_plan(self, directory: str, max_ranks: int = 8) -> str:
        """Save the plan as :meth:`Plan.save` does, the measured step
        (:attr:`measured_step_s`) beside the predicted one in ``report.html``."""
        return self.plan.save(directory, max_ranks=max_ranks, measured_step_s=self.measured_step_s)

    def _check_initialised(self, call: str) -> None:
        if not self._initialised:
            raise materialise.NotInitialisedError(
                f"{call}: the model was compiled from the meta device and its weights have no values yet; call "
                f"pm.init_weights(seed=...) (the model's own initialisation) or pm.load_pretrained(path) (a Hugging "
                f"Face safetensors checkpoint or an autopar checkpoint) first, or pm.load_full_state_dict(state)")

    def _mark_initialised(self, loaded: set[str] | None = None) -> None:
        """Entries of the state dict were loaded (``loaded``: their names; None: all of
        them): the module may run. A model compiled from the meta device gets what no
        load gave and no value came with (missing entries, the buffers a state dict does
        not hold: rotary ``inv_freq``) from the model's own initialisation
        (:func:`autopar.engine.init_weights.init_weights`)."""
        if not self._initialised:
            given = set(state_hooks.plain_state(self.root.model)) if loaded is None else set(loaded)
            given |= self._valued
            init_weights(self.root.model, self.layout, 0, self._state.device,
                         keep=lambda name: name not in given, after_load=True)
        self._initialised = True

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Initialise this rank's parameters and buffers with the model's own scheme
        (``reset_parameters`` of ``nn`` layers, a Hugging Face model's ``_init_weights``,
        rotary ``inv_freq`` included), the same full model whatever the plan, world size
        or rank for a given ``seed``: each module is initialised whole from a stream
        seeded by ``seed`` and its path, one module at a time, and the rank keeps its part
        (:func:`autopar.engine.init_weights.init_weights`). No collective; every rank
        calls it. The next call refreshes what families keep from the parameters."""
        init_weights(self.root.model, self.layout, seed, self._state.device)
        self._initialised = True

    def _first_step(self, flat: tuple, target: Any):
        """The first step, its run timed (``first_step.run``: without the building of
        its programs, which times itself) and logged."""
        with recording(self.timings, "first_step."), phase("run", hold=False):  # a training step: not held
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
        ``data`` for ZeRO, ``tensor3d``, ``pipeline``, ``experts``; or another word for
        the family, ``"3d"``), None if it keeps none."""
        declared = by_word(family)
        name = declared.name if declared is not None else family
        return next((r for r in self._runtimes if r.name == name), None)

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
        self._check_initialised("full_state_dict()")
        model = self.root.model
        with use_groups(self._state.groups):
            if not state_hooks.has_save_hooks(model):
                return {k: self.layout.gather(k, v, v) for k, v in model.state_dict(keep_vars=True).items()}
            full = {k: self.layout.gather(k, v, v) for k, v in state_hooks.own_tensors(model).items()}
        with state_hooks.full_tensors_in_place(model, full):   # the model's hooks see whole tensors
            return {k: v.detach() for k, v in model.state_dict().items()}

    @health.guarded("full_gradients()")
    def full_gradients(self) -> dict[str, torch.Tensor | None]:
        """Every parameter's gradient at its full shape, by the original model's names."""
        with use_groups(self._state.groups):
            return {k: self.layout.gather(k, p.grad, p)
                    for k, p in self.root.model.named_parameters(remove_duplicate=False)}

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load a full (original-shaped) state dict, keeping this rank's part of each tensor.
        A model whose modules change a state dict on load (``load_state_dict`` hooks) has
        them run on whole tensors (:mod:`autopar.runtime.state_hooks`); that is a collective."""
        model = self.root.model
        if state_hooks.has_load_hooks(model):
            with use_groups(self._state.groups):
                tensors = state_hooks.own_tensors(model)
                by_id: dict[int, torch.Tensor] = {}   # a tied parameter: one full tensor under each name
                for k, v in tensors.items():
                    gathered = self.layout.gather(k, v, v).clone()
                    by_id.setdefault(id(v), gathered)
                full = {k: by_id[id(v)] for k, v in tensors.items()}
            with state_hooks.full_tensors_in_place(model, full):
                model.load_state_dict(state_dict)
            state_dict, own = full, tensors
        else:
            own = model.state_dict(keep_vars=True)
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
        self._mark_initialised()

    @property
    def process_groups(self) -> dict:
        """The named process groups this rank's programs use (``data``, ``tensor``, ...)."""
        return dict(self._state.groups)

    @property
    def gradient_buckets(self) -> dict:
        """The gradient buckets by the layout's :class:`~autopar.runtime.layout.Bucket`."""
        return dict(self._state.buckets)

    def rank_graph_code(self) -> str:
        """This rank's most recently built program(s) as readable code."""
        return self.runner.code()

    # ------------------------------------------------------------------ Hugging Face checkpoints
    def load_pretrained(self, path, strict: bool = True, key_mapping: dict[str, str] | None = None) -> None:
        """Load a safetensors checkpoint (a ``save_pretrained`` directory, or one file) or an
        autopar DCP checkpoint directory, each rank reading only its part: see
        :func:`autopar.engine.pretrained.load_pretrained`. A collective."""
        pretrained.load_pretrained(self, path, strict=strict, key_mapping=key_mapping)

    def save_pretrained(self, path, max_shard_size: int | str = "5GB") -> None:
        """Write the full state dict as a Hugging Face safetensors checkpoint from rank 0:
        see :func:`autopar.engine.pretrained.save_pretrained`. A collective."""
        self._check_initialised("save_pretrained()")
        pretrained.save_pretrained(self, path, max_shard_size=max_shard_size)
