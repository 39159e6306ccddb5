"""Running a pipeline schedule on ranks: point-to-point sends between stages, forward and
backward per microbatch in the schedule's order (megatron §2.2, §4.1).

:class:`PipelineExecutor` runs one rank's :mod:`autopar.planning.schedules` order. Each
action is one microbatch through one of the rank's chunks (stage ``c·p + r``):

* ``F``: receive the carried values from the stage before (the hidden state, and
  anything the embedding stage built for every block, such as a mask), run the stage's
  program on them and this microbatch's inputs, send its outputs to the stage after; the
  last stage's output is the microbatch's loss;
* ``B``: receive the gradients of the outputs from the stage after (the last stage
  starts from its loss, weighted by ``loss_scale``: ``1/m`` for a mean), back-propagate,
  send the gradients of the received values to the stage before;
* ``I`` and ``W`` (zero-bubble schedules): ``B`` in two passes
  (:mod:`autopar.strategies.pipeline.backward`): ``I`` receives and back-propagates to
  the received values only, and sends their gradients; ``W``, later, gives the weights
  theirs.

Rank ``r``'s chunk ``c`` is stage ``c·p + r``, or under ZB-V ``r`` and ``2p − 1 − r``
(:func:`autopar.planning.schedules.stage_of`); a value passed between two stages of one
rank (ZB-V's turn) stays on the rank.

Transfers cannot deadlock: every send is asynchronous (``isend``; the step waits for
them all at its end) and only receives block, so a rank waits only for a value some
earlier action of another rank produces — the dependency order that
:func:`autopar.planning.timeline.simulate` checks for every schedule. Every message has
a tag naming its microbatch, stage, direction and value, so a receive can never take
another microbatch's tensor.

Scatter/gather (megatron §4.1): when the ``t`` ranks of a tensor group would each send
the same replicated activation, each sends only its ``1/t`` slice and the receiving
ranks all-gather the slices over their tensor group.

Gradients accumulate over the microbatches in ``param.grad``; the caller synchronises
them over the data ranks (and sums tied weights over their stages' ranks) after the
last backward.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx

from autopar._torch_compat import all_gather_flat, tree_unflatten
from autopar.grid import MeshAxis
from autopar.ir import tensor_spec
from autopar.runtime import devices, groups as G, rng
from autopar.planning.schedules import Action, rank_of, schedule, stage_of
from autopar.strategies.pipeline.backward import WeightPass, input_pass


@dataclass
class StageProgram:
    """One stage's program on this rank and what flows through it."""

    stage: int
    module: fx.GraphModule
    receives: list[tuple[tuple[int, ...], torch.dtype]]  # shapes and dtypes of the carried inputs, in order
    inputs: list[str]          # the graph inputs it reads (names of the whole graph's placeholders)
    last: bool
    out_spec: Any = None       # the last stage of a torch.export capture: how its flat outputs nest

    @staticmethod
    def of(stage: int, module: fx.GraphModule, carried: int, inputs: list[str], last: bool,
           out_spec: Any = None) -> "StageProgram":
        placeholders = [n for n in module.graph.nodes if n.op == "placeholder"][:carried]
        receives = []
        for n in placeholders:
            spec = tensor_spec(n)
            if spec is None:
                raise RuntimeError(f"pipeline: stage {stage} receives {n.name}, which is not a tensor; only tensors "
                                   f"can cross a stage boundary")
            receives.append((tuple(spec.shape), spec.dtype))
        return StageProgram(stage, module, receives, inputs, last, out_spec if last else None)

    def run(self, *args) -> Any:
        out = self.module(*args)
        if self.out_spec is not None:
            out = tree_unflatten(list(out) if isinstance(out, (tuple, list)) else [out], self.out_spec)
        return out


@dataclass
class _InFlight:
    received: list[torch.Tensor]
    outputs: list[torch.Tensor] = field(default_factory=list)
    loss: torch.Tensor | None = None


def _wire(x: torch.Tensor) -> torch.Tensor:
    """What goes on the wire: gloo sends no bool, so masks travel as bytes."""
    return x.to(torch.uint8) if x.dtype == torch.bool else x


class PipelineExecutor:
    """One rank's part of a pipeline: ``p`` pipeline ranks, ``v`` chunks, ``position``
    this rank's place; ``peers[k]`` is the global rank at pipeline position ``k`` with
    this rank's data and tensor coordinates."""

    def __init__(self, p: int, v: int, position: int, peers: list[int], schedule_name: str,
                 scatter_gather: bool = True):
        self.p, self.v, self.position = p, v, position
        self.stages = p * v
        self.peers = peers
        self.schedule_name = schedule_name
        self.scatter_gather = scatter_gather
        self._sends: list[tuple[Any, torch.Tensor]] = []
        self.stats = {"sent": 0, "received": 0, "sent_bytes": 0}
        # the last step: (action, start, end) as run and the seconds spent blocked in receives
        self.trace: list[tuple[Action, float, float]] = []
        self.waited_s = 0.0
        # track_memory: count the bytes autograd saves for backward per microbatch in flight
        # (parameters excluded) and keep the step's peak in peak_saved_bytes
        self.track_memory = False
        # called with the parameters whose gradient the next action makes final (the
        # runner arms their gradient buckets there)
        self.before_last_backward = None
        # the rows of the batch the step's microbatches hold: (first row of microbatch 0,
        # rows per microbatch, rows of the whole batch), for the random draws over them
        # (autopar.runtime.rng); the runner sets it before each call
        self.rows = (0, 0, 0)
        self.peak_saved_bytes = 0
        self._saved: dict[tuple[int, int], dict[int, int]] = {}
        self._local: dict[int, torch.Tensor] = {}  # values passed between two stages of this rank, by tag
        self._me = dist.get_rank() if dist.is_initialized() else None

    # ------------------------------------------------------------------ transport
    def _rank_of(self, stage: int) -> int:
        return self.peers[rank_of(self.schedule_name, self.p, stage)]

    def stage(self, chunk: int) -> int:
        """The stage of this rank's ``chunk``."""
        return stage_of(self.schedule_name, self.p, self.position, chunk)

    def _tag(self, microbatch: int, stage: int, backward: bool, index: int) -> int:
        return ((microbatch * self.stages + stage) * 2 + int(backward)) * 64 + index

    def _slice(self, flat: torch.Tensor) -> tuple[torch.Tensor, bool]:
        t = G.group_size(MeshAxis.TENSOR)
        if not self.scatter_gather or t == 1 or flat.numel() % t:
            return flat, False
        return flat.chunk(t)[G.group_rank(MeshAxis.TENSOR)], True

    def _send(self, x: torch.Tensor, stage: int, microbatch: int, backward: bool, index: int) -> None:
        dst = self._rank_of(stage)
        tag = self._tag(microbatch, stage, backward, index)
        if dst == self._me:  # the next stage is this rank's too
            self._local[tag] = x.detach().clone()
            return
        flat = _wire(x.detach()).contiguous().reshape(-1)
        part, _ = self._slice(flat)
        wire = devices.wire_device(part.device)
        part = part.clone() if wire == part.device else part.to(wire)  # kept until the send completes
        work = dist.isend(part, dst, tag=tag)
        self._sends.append((work, part))
        self.stats["sent"] += 1
        self.stats["sent_bytes"] += part.numel() * part.element_size()

    def _recv(self, shape, dtype, stage_from: int, stage_to: int, microbatch: int, backward: bool,
              index: int) -> torch.Tensor:
        local = self._local.pop(self._tag(microbatch, stage_to, backward, index), None)
        if local is not None:
            return local
        if self._rank_of(stage_from) == self._me:
            raise RuntimeError(f"pipeline: stage {stage_to} waits for microbatch {microbatch} from stage {stage_from} on "
                               f"this rank, which has not produced it; the schedule's order is wrong (a bug)")
        wire = torch.uint8 if dtype == torch.bool else dtype
        device = devices.current()  # the rank's: the values the stage runs on
        flat = torch.empty(int(torch.Size(shape).numel()), dtype=wire, device=device)
        part, sliced = self._slice(flat)
        buffer = torch.empty(part.shape, dtype=wire, device=devices.wire_device(device))
        start = time.perf_counter()
        dist.recv(buffer, self._rank_of(stage_from), tag=self._tag(microbatch, stage_to, backward, index))
        self.waited_s += time.perf_counter() - start
        buffer = buffer.to(device)
        self.stats["received"] += 1
        if sliced:
            all_gather_flat(flat, buffer, group=G.get_group(MeshAxis.TENSOR))
        else:
            flat = buffer
        out = flat.view(shape)
        return out.bool() if dtype == torch.bool else out

    def finish_sends(self) -> None:
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()

    # ------------------------------------------------------------------ running
    def train(self, programs: dict[int, StageProgram], microbatches: list[dict[str, Any]],
              loss_scale: float) -> list[torch.Tensor]:
        """Run this rank's schedule over ``microbatches`` (each: graph input name → value);
        returns the losses of the microbatches on the last stage (else [])."""
        m = len(microbatches)
        state: dict[tuple[int, int], _InFlight] = {}
        losses: dict[int, torch.Tensor] = {}
        self.trace, self.waited_s = [], 0.0
        self.peak_saved_bytes, self._saved = 0, {}
        actions = list(schedule(self.schedule_name, self.p, m, self.position, self.v))
        arm = self._arming(actions, programs)
        weights: dict[tuple[int, int], WeightPass] = {}  # I done, W to run
        self._local.clear()
        for index, action in enumerate(actions):
            start = time.perf_counter()
            stage = self.stage(action.chunk)
            program = programs[stage]
            key = (action.microbatch, stage)
            if action.kind == "F":
                with self._counting(key, program):
                    state[key] = self._forward(program, action, microbatches[action.microbatch])
                if program.last:
                    losses[action.microbatch] = state[key].loss.detach()
            else:
                if index in arm and self.before_last_backward is not None:
                    self.before_last_backward(arm[index])
                if action.kind == "W":
                    weights.pop(key).run()
                elif action.kind == "I":
                    weights[key] = self._backward(program, action, state.pop(key), loss_scale, True)
                else:
                    self._backward(program, action, state.pop(key), loss_scale)
                if action.kind != "I":
                    self._saved.pop(key, None)
            self.trace.append((action, start, time.perf_counter()))
        self.finish_sends()
        return [losses[i] for i in sorted(losses)]

    def _arming(self, actions: list[Action], programs: dict[int, StageProgram]) -> dict[int, list]:
        """Action index → the parameters whose gradient is final after it: each
        parameter's last ``B`` or ``W`` over all of this rank's chunks (a weight two of
        its stages read — ZB-V's tied embedding and head on rank 0 — is final only after
        the later chunk's last pass)."""
        last: dict[int, tuple[int, torch.nn.Parameter]] = {}
        for index, action in enumerate(actions):
            if action.kind in "BW":
                for param in programs[self.stage(action.chunk)].module.parameters():
                    last[id(param)] = (index, param)
        out: dict[int, list] = {}
        for index, param in last.values():
            out.setdefault(index, []).append(param)
        return out

    @contextlib.contextmanager
    def _counting(self, key: tuple[int, int], program: StageProgram):
        if not self.track_memory:
            yield
            return
        params = {p.untyped_storage().data_ptr() for p in program.module.parameters()}
        held = self._saved.setdefault(key, {})

        def pack(t: torch.Tensor):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                held[ptr] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        live = sum(sum(h.values()) for h in self._saved.values())
        self.peak_saved_bytes = max(self.peak_saved_bytes, live)

    @property
    def executed(self) -> str:
        """The last step's actions in the order this rank ran them (``F0 F1 B0.1 ...``)."""
        return " ".join(str(action) for action, _, _ in self.trace)

    @property
    def span(self) -> tuple[float, float, float]:
        """The last step on this rank: ``(first action's start, last action's end, busy
        seconds)`` on ``time.perf_counter``'s clock (one clock for every process of the
        machine), busy being the time in actions less the time blocked in receives.
        :func:`autopar.testing.measured_bubbles` puts the ranks' spans together."""
        busy = sum(end - start for _, start, end in self.trace) - self.waited_s
        return self.trace[0][1], self.trace[-1][2], busy

    def _run_stage(self, program: StageProgram, microbatch: int, inputs: dict[str, Any],
                   track_grad: bool) -> tuple[list[torch.Tensor], Any]:
        """Receive the carried values (floating ones made leaves that require grad when
        ``track_grad``), run the stage, send its outputs on (a list) unless it is the last
        stage (whose output is returned as the program gives it)."""
        stage = program.stage
        received = []
        for i, (shape, dtype) in enumerate(program.receives):
            x = self._recv(shape, dtype, stage - 1, stage, microbatch, False, i)
            if track_grad and x.is_floating_point():
                x.requires_grad_(True)
            received.append(x)
        first, count, total = self.rows
        with rng.rows(first + microbatch * count, count, total):
            out = program.run(*received, *(inputs[name] for name in program.inputs))
        if not program.last:
            out = list(out) if isinstance(out, (tuple, list)) else [out]
            for i, y in enumerate(out):
                self._send(y, stage + 1, microbatch, False, i)
        return received, out

    def _forward(self, program: StageProgram, action: Action, inputs: dict[str, Any]) -> _InFlight:
        received, out = self._run_stage(program, action.microbatch, inputs, True)
        if not program.last:
            return _InFlight(received, outputs=out)
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            raise RuntimeError(f"pipeline: the last stage returns {type(out).__name__}, not a scalar loss; "
                               f"pipelined training needs a loss_fn that returns one")
        return _InFlight(received, loss=out)

    def _backward(self, program: StageProgram, action: Action, flight: _InFlight, loss_scale: float,
                  split: bool = False) -> WeightPass | None:
        """``B``, or with ``split`` ``I`` (returning what ``W`` needs)."""
        stage, mb = program.stage, action.microbatch
        if program.last:
            tensors, grads = [flight.loss], [torch.full_like(flight.loss, loss_scale)]
        else:
            tensors, grads = [], []
            for i, y in enumerate(flight.outputs):
                if not y.is_floating_point():
                    continue
                g = self._recv(tuple(y.shape), y.dtype, stage + 1, stage, mb, True, i)
                if y.requires_grad:
                    tensors.append(y)
                    grads.append(g)
        weights = WeightPass() if split else None
        if split and tensors:
            leaves = [x for x in flight.received if x.is_floating_point()]
            weights = input_pass(tensors, grads, leaves)
        elif tensors:
            torch.autograd.backward(tensors, grads)
        flight.outputs, flight.loss = [], None  # the graph above the weights' passes can go
        if stage > 0:
            for i, x in enumerate(flight.received):
                if x.is_floating_point():
                    self._send(x.grad if x.grad is not None else torch.zeros_like(x), stage - 1, mb, True, i)
        return weights

    def forward_only(self, programs: dict[int, StageProgram], inputs: dict[str, Any]) -> Any:
        """One pass of the whole batch through this rank's chunks in order, no gradients;
        returns the last stage's output there (None elsewhere)."""
        result = None
        for stage in sorted(programs):
            program = programs[stage]
            _, out = self._run_stage(program, 0, inputs, False)
            if program.last:
                result = out
        self.finish_sends()
        return result
