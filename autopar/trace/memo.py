"""The export memo: which earlier ``torch.export`` of a model serves a new capture.

:func:`autopar.trace.capture.capture` describes each call as a :class:`CaptureCall` (the
model's state as :func:`_model_state` reads it, the loss, the tracer, and the inputs as
:func:`_signature` sees them) and asks :data:`EXPORTS` for an earlier exported program
that serves it; a call no earlier one serves is exported and kept. Building a module
from a kept program is the capture's business (``autopar.trace.exporting.unlifted``).
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import torch
import torch.nn as nn

from autopar._torch_compat import forward_hooks
from autopar.ir import CaptureInfo

_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device)


def _plain_attributes(obj) -> tuple:
    """The plain values (numbers, strings, flags) among ``obj``'s attributes."""
    return tuple((k, v) for k, v in vars(obj).items() if isinstance(v, _PLAIN))


def _model_state(model: nn.Module) -> tuple:
    """What a capture of ``model`` depends on besides its inputs: every submodule (its
    class, identity, training flag, hooks, plain attributes and its Hugging Face config's
    plain values), every parameter and buffer object under its name, and the grad and
    autocast modes. Parameter *values* are not in it: the graph reads them as inputs."""
    modules = []
    for name, m in model.named_modules(remove_duplicate=False):
        config = vars(m).get("config")
        modules.append((name, type(m), id(m), _plain_attributes(m), forward_hooks(m), id(vars(m).get("forward")),
                        _plain_attributes(config) if config is not None and hasattr(config, "__dict__") else ()))
    tensors = tuple((name, id(t)) for name, t in model.named_parameters(remove_duplicate=False)) + \
        tuple((name, id(t)) for name, t in model.named_buffers(remove_duplicate=False))
    return (tuple(modules), tensors, torch.is_grad_enabled(), torch.is_autocast_enabled())


def _signature(value):
    """What a capture sees of an input: a tensor's shape, strides, dtype, device, layout
    and grad flag (``torch.export`` traces fake tensors, so a graph cannot depend on the
    values: a branch on one is refused while tracing); any other value as it is (ints and
    flags are constants of the graph)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype, value.device, value.layout,
                value.requires_grad)
    if isinstance(value, (tuple, list)):
        return type(value)(_signature(v) for v in value)
    return value


def _same_value(a, b) -> bool:
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - a value that cannot be compared is not the same
        return a is b


@dataclasses.dataclass
class CaptureCall:
    """One ``capture`` call, as the export memo compares calls."""

    model: nn.Module | None
    state: tuple
    loss_fn: Any
    tracer: str
    model_loss: str | None
    values: tuple  # positional inputs, keyword names and values, target (as _signature has them)

    @staticmethod
    def of(model, example_inputs: tuple, loss_fn, example_target, tracer: str, example_kwargs: dict,
           model_loss: str | None) -> "CaptureCall":
        return CaptureCall(model, _model_state(model), loss_fn, tracer, model_loss,
                           _signature((example_inputs, tuple(example_kwargs), tuple(example_kwargs.values()),
                                       example_target)))

    def served_by(self, earlier: "CaptureCall", with_loss: bool) -> bool:
        """Whether ``earlier``'s graph is this call's: same model state, loss function,
        tracer and inputs (:func:`_signature`); a graph of the model's own loss serves both
        ``model_loss`` ``"required"`` and ``"if_present"``."""
        if self.model_loss != earlier.model_loss:
            if not (with_loss and {self.model_loss, earlier.model_loss} == {"required", "if_present"}):
                return False
        return (self.loss_fn is earlier.loss_fn and self.tracer == earlier.tracer and self.state == earlier.state
                and _same_value(self.values, earlier.values))


class ExportMemo:
    """The last few ``torch.export`` results of each live model, so that a capture that
    repeats an earlier one (same model state, same input shapes and constants, same loss)
    costs a fresh module of the exported program instead of a trace.

    ``compile`` captures the global batch to plan on and the first ``step`` captures the
    rank's share of it: when a rank sees the whole batch (no data parallelism: a tensor
    or pipeline plan) the two are the same call, as are the captures of a second
    ``compile`` of the same model. ``torch.export`` is most of what compiling costs on a
    CPU (about 0.5 s for a two-layer GPT-2, several seconds on a busy machine), and every
    rank pays it; a replay costs about a tenth. Input *values* need not be compared:
    ``torch.export`` traces fake tensors, so a graph cannot depend on them (a branch on
    one is refused). Entries go with their model (weakly keyed); each replay builds its
    own module from the exported program, so a rewrite of one never touches another.
    Only exports are kept: ``symbolic_trace`` is cheap.
    """

    def __init__(self, per_model: int = 4):
        self.per_model = per_model
        self._entries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.hits = 0

    def find(self, call: CaptureCall) -> tuple[torch.export.ExportedProgram, CaptureInfo] | None:
        """The exported program and capture info of an earlier capture that serves
        ``call`` (None if none does); the caller builds a fresh module of it."""
        for earlier, ep, info in self._entries.get(call.model, ()):
            if call.served_by(earlier, info.with_loss):
                self.hits += 1
                return ep, info
        return None

    def keep(self, call: CaptureCall, ep: torch.export.ExportedProgram, info: CaptureInfo) -> None:
        model = call.model
        kept = dataclasses.replace(call, model=None)  # the key holds the model, weakly
        entries = [(kept, ep, info)] + list(self._entries.get(model, ()))
        self._entries[model] = entries[:self.per_model]


EXPORTS = ExportMemo()
"""The memo every :func:`autopar.trace.capture.capture` consults."""


__all__ = ["EXPORTS", "CaptureCall", "ExportMemo"]
