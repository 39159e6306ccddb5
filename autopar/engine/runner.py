"""Running a rank's programs: the state a rank keeps (:class:`RankState`) and the runner
of plans whose rank runs one program per input signature (:class:`ProgramRunner`). A
family may run a rank otherwise (a pipeline's schedule: its
:class:`~autopar.runtime.family_runtime.RankRuntime` gives the runner); every runner is
driven by :class:`autopar.engine.module.ParallelModule`. Neither knows a family by name:
what a family does at run time it does through its runtime's hooks.

A program is built on first use for each input signature and mode: a capture of the
user's model at this rank's share of the batch, rewritten by the plan's passes
(:func:`autopar.driver.rank_program.rewrite`), over a module tree holding this rank's parameters.
"""
from __future__ import annotations

import contextlib
import warnings
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn

from autopar._torch_compat import copy_export_specs
from autopar.trace.capture import capture
from autopar.trace.inputs import CallLayout, check_call_inputs, new_shapes_explained, signature
from autopar.ir import CAPTURE, LOSS_REDUCTION, PARAM_SHARDS
from autopar.runtime.layout import Bucket, ParamLayout
from autopar.engine.executable import batch_of, executable, local_batch, microbatches, rank_graph_code
from autopar.runtime.groups import get_group, size_of, use_groups
from autopar.planning.strategy import PlanError
from autopar.passes.analysis.batch_rows.scalars import differing_scalars
from autopar.runtime import devices, rng
from autopar.runtime.grad_sync import GradientBuckets
from autopar.runtime._swap import SwapGlobal
from autopar.runtime.family_runtime import RankRuntime
from autopar.timing import Timings, phase, recording
from autopar.runtime.target_count import TARGET_COUNT, PendingCount, use_target_count

log = logging.getLogger("autopar")


@dataclass
class RankState:
    """What a rank keeps between calls, shared by the module and its runner: the plan,
    the module tree holding this rank's parameters (``root``), their layout, the named
    process groups, the random draws' state, the families' run-time state (``runtimes``: the
    active :class:`~autopar.runtime.family_runtime.RankRuntime` objects), the gradient
    buckets (by the layout's :class:`~autopar.runtime.layout.Bucket`), how to capture the user's
    model again at new shapes (``user_model``, ``loss_fn``, ``call``: the example's
    :class:`~autopar.trace.inputs.CallLayout`; ``examples``: its signature) and to
    rewrite a capture into this rank's program (``rewrite``:
    :func:`autopar.driver.rank_program.rewrite`, given by the compiler)."""

    plan: Any
    rank: int
    root: nn.Module
    layout: ParamLayout
    groups: dict
    random: rng.RandomStates
    runtimes: tuple[RankRuntime, ...]
    buckets: dict[Bucket, GradientBuckets]
    user_model: nn.Module
    loss_fn: Callable | None
    call: CallLayout = field(default_factory=CallLayout)
    examples: tuple | None = None
    recompute: bool | str = False  # True: the blocks; "selective": the attention cores
    fusion: bool = False
    shards: dict = field(default_factory=dict)
    # where the runtime's own tensors go when no value is at hand (autopar.runtime.devices)
    device: torch.device = devices.CPU
    rewrite: Callable[..., fx.GraphModule] | None = None
    # how long each phase of the way to the first step took (``pm.timings``)
    timings: Timings = field(default_factory=Timings)
    # compiled with batch="local": each call is this rank's rows already, not the global batch
    batch_local: bool = False
    # the numbers of the plan's capture by node (passes/analysis/batch_rows/scalars.py): a
    # rank's capture of the same call holding others reads the batch's size as a number
    scalars: dict | None = None
    # compile(torch_compile=True): each program run under torch.compile (executable.compiled)
    torch_compile: bool = False
    _share_checked: bool = field(default=False, repr=False, compare=False)
    # running()'s context by ``stage`` where every context is a swap of a module global
    # (made on first use; None where some family's context is not)
    _swaps: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        # the loss's bucket and the others, found once: the buckets are fixed at
        # construction, and each lookup by the layout's Bucket (a frozen dataclass) hashes
        # or compares its fields
        spec = self.layout.loss_bucket
        self._loss_bucket = None if spec is None else self.buckets[spec]
        self._other_buckets = [b for s, b in self.buckets.items() if s != spec]

    def share(self, parts: int, chunk: int, inputs: tuple, target: Any) -> tuple[tuple, Any]:
        """This rank's rows of a call (and their targets): chunk ``chunk`` of ``parts`` of
        the global batch, or the call as given where compiled with ``batch="local"``."""
        if self.batch_local:
            if not self._share_checked:  # the first call: a share of the batch the plan was made for?
                self._share_checked = True
                rows = batch_of(inputs)
                if rows is not None and rows * parts != self.plan.global_batch:
                    warnings.warn(f"batch='local': rank {self.rank} was given {rows} rows, and {parts} shares of "
                                  f"{rows} make {rows * parts}, not the {self.plan.global_batch} the plan was made for; "
                                  f"each share's ranks must be given global_batch / pm.data_parallel_size rows "
                                  f"(autopar.data.sampler), not a share of every rank", stacklevel=4)
            return inputs, target
        return local_batch(parts, chunk, inputs, target)

    def check_scalars(self, gm: fx.GraphModule, rows: int | None, local: int | None, training: bool) -> None:
        """Refuse a rank's capture at ``local`` rows, a share of a call of the plan's batch
        (``rows``), whose numbers differ from the plan's capture
        (:mod:`autopar.passes.analysis.batch_rows.scalars`); only a capture in the plan
        capture's mode (``training``) is compared (a model computes other things in eval)."""
        if not self.scalars or rows != self.plan.global_batch or local == rows or \
                training != self.scalars.get("training", True):
            return
        differ = differing_scalars(gm, self.scalars["numbers"])
        if differ:
            raise PlanError(f"the model uses the batch's size as a number: its capture at {local} rows holds other "
                            f"numbers than at the whole batch's {rows} ({'; '.join(differ[:3])}), so a part of the "
                            f"batch would compute something else than the single device (docs/batch_rows.md). "
                            f"Keep the batch whole (tensor, or a pipeline with one microbatch), or compute the value "
                            f"without the batch's size")

    def rewrite_options(self) -> dict:
        """The families' options of this rank's program rewrite (e.g. the parameters ZeRO
        shards, which its pass reads through gathers)."""
        options: dict = {}
        for runtime in self.runtimes:
            options.update(runtime.rewrite_options())
        return options

    def running(self, stage: bool = False):
        """The context a rank program runs in: the plan's groups, the rank's device (for
        the runtime's buffers, :mod:`autopar.runtime.devices`), the dropout streams and
        each family's contexts (``stage``: a pipeline stage's programs)."""
        swaps = self._swaps.get(stage, False)
        if swaps is False:  # first call: can one _Swaps serve every call?
            contexts = self._contexts(stage)
            swaps = self._swaps[stage] = _Swaps(contexts) if all(isinstance(c, SwapGlobal) for c in contexts) \
                else None
        if swaps is not None:
            return swaps
        stack = contextlib.ExitStack()
        for context in self._contexts(stage):
            stack.enter_context(context)
        return stack

    def _contexts(self, stage: bool) -> list:
        contexts = [use_groups(self.groups), devices.use_device(self.device), rng.use_random_states(self.random)]
        for runtime in self.runtimes:
            contexts.extend(runtime.contexts(stage))
        return contexts

    def begin(self, stage: bool = False) -> None:
        """Before a call's programs run, each family's preparation under the plan's
        groups (the 3D layers forget the last step's weights, ZeRO-1/2 gathers the shards
        the optimizer changed: a collective)."""
        if self.runtimes:
            with use_groups(self.groups):
                for runtime in self.runtimes:
                    runtime.begin(stage)

    def after_backward(self) -> None:
        """After each backward of a call (each microbatch's)."""
        for runtime in self.runtimes:
            runtime.after_backward()

    def finish(self) -> None:
        """Once a call's programs are done and its gradients reduced."""
        for runtime in self.runtimes:
            runtime.finish()

    def build(self, inputs: tuple, target: Any, training: bool, make: Callable[[], Any],
              explain_shapes: bool = True) -> Any:
        """``make()`` (a capture of the user's model and its rewrite) for calls shaped like
        ``inputs`` (flat, laid out by ``call``), with the user's model in mode
        ``training`` meanwhile (export bakes the mode, e.g. dropout, into the graph);
        ``explain_shapes``: a capture failure at shapes other than the example's names
        both (not for microbatches, which always differ from the example)."""
        check_call_inputs(self.examples, inputs, target, self.call.names())
        was_training = self.user_model.training
        self.user_model.train(training)
        try:
            with new_shapes_explained(self.examples if explain_shapes else None, inputs):
                return make()
        finally:
            self.user_model.train(was_training)

    @contextlib.contextmanager
    def building(self, what: str):
        """Build a program inside: its phases timed into ``timings`` (``program.*``: what
        the capture, the analysis and the executable module do not take is the rewrite's,
        a pipeline's cut into stages included) and logged, named ``what``."""
        before = Timings(self.timings)
        with recording(self.timings, "program."), phase("rewrite"):
            yield
        log.info("autopar rank %d built %s in %.2f s: %s", self.rank, what,
                 self.timings.total("program.") - before.total("program."),
                 self.timings.summary("program.", since=before))

    def loss_bucket(self) -> GradientBuckets | None:
        """The bucket that carries the step's loss (the layout's ``loss_bucket``)."""
        return self._loss_bucket

    def finish_buckets(self) -> None:
        """Wait for every bucket but the loss's, in the layout's order."""
        for buckets in self._other_buckets:
            buckets.finish()

    def target_count(self, program: fx.GraphModule, pieces: list[tuple], group: str
                     ) -> torch.Tensor | PendingCount | None:
        """The whole batch's count of counted targets when ``program`` averages its loss
        over them (``TARGET_COUNT``, :mod:`autopar.runtime.target_count`): the count
        program on each of this rank's ``pieces`` (flat graph inputs, target last when
        the program takes one), summed over ``group``, the ranks sharing the batch; the
        sum in flight while the forward runs (a :class:`PendingCount` the loss waits for
        where it divides)."""
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
        with use_groups(self.groups):
            if size_of(get_group(group)) > 1:
                return PendingCount(count, dist.all_reduce(count, group=get_group(group), async_op=True))
        return count


_NO_CONTEXT = contextlib.nullcontext()  # re-entrant and stateless: one serves every call


class _Swaps:
    """Module globals set for a block and restored after it: those the given
    :class:`~autopar.runtime._swap.SwapGlobal` contexts set, in one call each way instead
    of one per context, and made once (an ``ExitStack`` of five contexts made and entered
    on every call costs more than the step's own Python). Re-entrant: the saved values are
    a stack, so one object serves every call of a rank."""

    __slots__ = ("targets", "saved")

    def __init__(self, contexts: list[SwapGlobal]):
        self.targets = tuple((c.namespace, c.name, c.value) for c in contexts)
        self.saved: list[list] = []

    def __enter__(self) -> None:
        saved = []
        for namespace, name, value in self.targets:
            saved.append(namespace[name])
            namespace[name] = value
        self.saved.append(saved)

    def __exit__(self, *exc) -> None:
        for (namespace, name, _), value in zip(self.targets, self.saved.pop()):
            namespace[name] = value


class ProgramRunner:
    """One program per input signature on every rank (every plan without a runner of its
    family's, :meth:`RankRuntime.runner`).

    ``step`` weights a summed loss by the data degree (the average of d·∇L_r is ∑∇L_r)
    and reduces the reported loss in the last gradient bucket. A rank whose program is a
    part that takes no inputs (a runtime's ``partial``: D&SP-cSub's ranks off sub-grid 0)
    runs it forward and backward alone; every rank's outputs and loss are what the
    runtimes say (:meth:`RankRuntime.outputs`, :meth:`RankRuntime.loss`: cSub's sub-grid 0
    shares them over the segment group).
    """

    def __init__(self, state: RankState):
        self.state = state
        plan = state.plan
        self.parts, self.chunk = plan.batch_parts(), plan.batch_chunk(state.rank)
        self.partial = any(r.partial for r in state.runtimes)
        self.programs: dict[tuple, fx.GraphModule] = {}
        # programs not run yet, built at shapes other than the example's: (examples, inputs)
        self.unproven: dict[int, tuple] = {}

    def program(self, inputs: tuple, target: Any, training: bool, loss: bool = False
                ) -> tuple[fx.GraphModule, tuple, Any]:
        """The program for these inputs' shapes and mode (built on first use), with this
        rank's share of the inputs and target. ``loss``: the training program (the
        ``loss_fn``'s loss, or without one the model's own)."""
        local_inputs, local_target = self.state.share(self.parts, self.chunk, inputs, target)
        return self.built(inputs, target, local_inputs, local_target, training, loss), local_inputs, local_target

    def built(self, inputs: tuple, target: Any, local_inputs: tuple, local_target: Any, training: bool,
              loss: bool, explain_shapes: bool = True) -> fx.GraphModule:
        """The program that runs ``local_inputs`` (this rank's share of the call's
        ``inputs``, or one microbatch of it), built on first use for their shapes."""
        state = self.state
        key = (tuple(map(signature, local_inputs)), signature(local_target), loss, training)
        if key not in self.programs:
            with state.building(f"its {'training ' if loss else ''}program"):
                program = self._build(inputs, target, local_inputs, local_target, training, loss, explain_shapes)
            self.programs[key] = program
            if explain_shapes:
                self.unproven[id(program)] = (state.examples, inputs)
        return self.programs[key]

    def first_run(self, program: fx.GraphModule):
        """The context of a program's run: the first call of one built at new shapes has
        any failure explained with both shapes (:class:`~autopar.trace.inputs.new_shapes_explained`)."""
        found = self.unproven.pop(id(program), None) if self.unproven else None
        return _NO_CONTEXT if found is None else new_shapes_explained(*found, any_error=True)

    def _build(self, inputs: tuple, target: Any, local_inputs: tuple, local_target: Any, training: bool,
               loss: bool, explain_shapes: bool) -> fx.GraphModule:
        """A capture at ``local_inputs``'s shapes, rewritten by the plan and made executable."""
        state = self.state
        shown_inputs, shown_target = local_inputs, local_target
        if any(c.get("remedy") == "gather" for c in state.plan.batch_couplings or ()):
            shown_inputs, shown_target = _first_rows(inputs, local_inputs), _first_rows((target,), (local_target,))[0]
        args, kwargs = state.call.unflatten(shown_inputs)
        gm = state.build(inputs, target, training, lambda: capture(
            state.user_model, args, state.loss_fn if target is not None else None, shown_target,
            example_kwargs=kwargs, model_loss="required" if loss and state.loss_fn is None else None),
            explain_shapes=explain_shapes)
        state.check_scalars(gm, batch_of(tuple(inputs)), batch_of(tuple(local_inputs)), training)
        gm = state.rewrite(gm, state.plan, state.rank, batch_of(local_inputs), state.recompute, state.fusion,
                           **state.rewrite_options())
        # every split the program makes is the plan's; a plan's split the program lacks
        # may only be a D&SP branch's that another sub-grid runs (not in this program)
        made = gm.meta.get(PARAM_SHARDS, {})
        elsewhere = set().union(*(r.absent_shards() for r in state.runtimes))
        if any(state.shards.get(name) != shard for name, shard in made.items()) or \
                set(state.shards) - set(made) - elsewhere:
            raise RuntimeError("the rank program splits other parameters than the plan did; this is a bug")
        program = executable(gm, state.root, f"Rank{state.rank}Program", state.torch_compile)
        copy_export_specs(gm, program)
        return program

    def _count(self, program, pieces) -> torch.Tensor | PendingCount | None:
        bucket = self.state.layout.loss_bucket
        if self.partial or bucket is None or TARGET_COUNT not in program.meta:
            return None
        return self.state.target_count(program, pieces, bucket.count_group or bucket.group)

    def rows(self, local_inputs: tuple, first: int = 0, count: int | None = None) -> rng.rows:
        """The context of a program run on this rank's rows ``first .. first + count - 1``
        of its share (``local_inputs``): where the rows sit in the whole batch, for the
        random draws over them (:mod:`autopar.runtime.rng`)."""
        share = batch_of(local_inputs) or 0
        return rng.rows(self.chunk * share + first, share if count is None else count, share * self.parts,
                        self.state.random)

    def forward(self, inputs: tuple, training: bool):
        state = self.state
        program, local_inputs, _ = self.program(inputs, None, training)
        count = self._count(program, [local_inputs])
        state.begin()
        with state.running(), use_target_count(count), self.rows(local_inputs):
            if self.partial:
                program.forward()
                out = None
            else:
                with self.first_run(program):
                    out = program.forward(*local_inputs)  # no hooks: skip nn.Module.__call__
            for runtime in state.runtimes:
                out = runtime.outputs(state, out)
        state.finish()
        return out

    def prepare(self, inputs: tuple, target: Any, training: bool) -> None:
        """Build the program a ``step`` on ``inputs`` runs (the first microbatch's under
        gradient accumulation), without running it: what ``compile`` does with the example,
        so a program that cannot be built fails compile rather than the first step."""
        m = self.state.plan.microbatches
        local_inputs, local_target = self.state.share(self.parts, self.chunk, inputs, target)
        rows = batch_of(local_inputs)
        if m > 1 and rows is not None and rows % m == 0:   # the first microbatch's program
            *local_inputs, local_target = microbatches((*local_inputs, local_target), m, rows)[0]
            local_inputs = tuple(local_inputs)
        self.built(inputs, target, local_inputs, local_target, training, loss=True, explain_shapes=m == 1)

    def step(self, inputs: tuple, target: Any, training: bool) -> torch.Tensor:
        """Forward and backward of this rank's share of the batch, as the plan's
        ``microbatches`` (gradient accumulation: the buckets launch during the last
        microbatch's backward, once); the whole batch's loss."""
        state = self.state
        m = state.plan.microbatches
        local_inputs, local_target = state.share(self.parts, self.chunk, inputs, target)
        pieces = [(local_inputs, local_target)]
        if m > 1:
            rows = batch_of(local_inputs)
            if rows is None or rows % m:
                raise PlanError(f"step(): the batch of each data rank ({rows}) is not divisible by the {m} "
                                f"microbatches of the plan; give a batch that is a multiple of "
                                f"{m * (1 if state.batch_local else self.parts)}, "
                                f"or plan with another 'microbatches'")
            pieces = [(p[:-1], p[-1]) for p in microbatches((*local_inputs, local_target), m, rows)]
        program = self.built(inputs, target, *pieces[0], training, loss=True, explain_shapes=m == 1)
        data = self.parts
        summed = program.meta.get(LOSS_REDUCTION) == "sum"
        # a mean per microbatch: 1/m of each is the share's mean; a sum (or a share of the
        # batch's mean over its counted targets) adds up as it is, and the data average
        # divides by d (the average of d·∇L_r is ∑∇L_r)
        weight = (float(data) if data > 1 else 1.0) if summed else 1.0 / m
        flat = [p_in + (() if p_t is None else (p_t,)) for p_in, p_t in pieces]
        count = self._count(program, flat)
        state.begin()
        with state.running(), use_target_count(count):
            if self.partial:  # a part that takes no inputs: its forward and backward only
                with self.rows(local_inputs):
                    result = program.forward()
                result.backward(torch.zeros_like(result))
                state.finish_buckets()
                return self._loss(program, None)
            carrier = state.loss_bucket()
            total = None
            piece = (batch_of(local_inputs) or 0) // m
            for k, args in enumerate(flat):
                last = k == len(flat) - 1
                for buckets in state.buckets.values():  # launched during the last backward only
                    buckets.enabled = last
                with self.first_run(program), self.rows(local_inputs, k * piece, piece):
                    loss = program.forward(*args)
                    part = loss.detach() if summed or m == 1 else loss.detach() / m  # no division kernel for m = 1
                    total = part if total is None else total + part
                    if last and data > 1:
                        carrier.carry(total)
                    loss.backward(torch.full_like(loss, weight) if weight != 1.0 else None)
                state.after_backward()  # e.g. deferred reduce-scatters land before any bucket reads them
            state.finish_buckets()
            state.finish()
            loss = total
            if data > 1:
                averaged = carrier.finish().to(loss.dtype).reshape(loss.shape)
                loss = averaged * data if summed else averaged
            return self._loss(program, loss)

    def _loss(self, program: fx.GraphModule, loss: torch.Tensor | None) -> torch.Tensor:
        """The step's loss on this rank, as the runtimes give it (:meth:`RankRuntime.loss`)."""
        for runtime in self.state.runtimes:
            loss = runtime.loss(self.state, program, loss)
        return loss

    def code(self) -> str:
        """The most recently built program as readable code."""
        if not self.programs:
            raise RuntimeError("no program built yet: call the model or step() first")
        return rank_graph_code(list(self.programs.values())[-1], self.state.plan, self.state.rank)


def _first_rows(whole: tuple, share: tuple) -> tuple:
    """``share`` (a rank's rows of ``whole``) with the values of the batch's first rows:
    what a rank captures its program with where its rows are scored against every row
    (:mod:`autopar.passes.analysis.batch_rows`). A loss reading targets that index the whole
    batch (the labels of a contrastive loss, ``4..7`` on the second of two ranks) fails on
    the rank's own scores before the rewrite gathers them; the program depends on shapes
    alone, which the first rows share."""
    out = []
    for w, s in zip(whole, share):
        if isinstance(w, torch.Tensor) and isinstance(s, torch.Tensor) and w.dim() > 0 and s.dim() == w.dim() \
                and s.shape[1:] == w.shape[1:] and s.shape[0] < w.shape[0]:
            out.append(w[:s.shape[0]])
        else:
            out.append(s)
    return tuple(out)
