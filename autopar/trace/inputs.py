"""The model's call as autopar runs it: positional and keyword inputs as one flat tuple.

``compile`` fixes a :class:`CallLayout` from its examples: the number of positional
inputs, then the tensors among the keyword inputs in the example's key order (each one a
graph input, see :class:`autopar.trace.capture.Keywords`), while the other keyword values are
constants of the capture. Every later call is flattened the same way, so the runtime
(batch shares, microbatches, program cache keys) handles one tuple whatever the
spelling of the call::

    >>> layout = CallLayout.of((), {"input_ids": ids, "attention_mask": mask, "use_cache": False})
    >>> layout.flatten((), {"attention_mask": mask, "input_ids": ids, "use_cache": False}, "forward()")
    (ids, mask)

Bad calls raise ``ValueError`` naming the argument: a keyword the example did not have,
one it had that is missing, a constant that differs, or a keyword tensor whose batch
dimension (its first) differs from the other inputs'.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Mapping, Sequence

import torch

from autopar.trace.capture import CaptureError, Keywords
from autopar.trace.exporting import running_exports


@dataclasses.dataclass(frozen=True)
class CallLayout:
    """``positional`` inputs, then ``keywords.tensors``: the order of the graph inputs."""

    positional: int = 0
    keywords: Keywords = Keywords()

    @staticmethod
    def of(example_inputs: Sequence[Any], example_kwargs: Mapping[str, Any] | None) -> "CallLayout":
        layout = CallLayout(len(example_inputs), Keywords.of(example_kwargs, len(example_inputs)))
        layout.flatten(tuple(example_inputs), dict(example_kwargs or {}), "the example")  # its batch dimensions
        return layout

    def names(self) -> list[str]:
        """How messages name each flat input."""
        return [f"input {i}" for i in range(self.positional)] + \
            [f"keyword input {name}" for name in self.keywords.tensors]

    def flatten(self, args: tuple, kwargs: Mapping[str, Any], where: str) -> tuple:
        """``args`` and the tensors of ``kwargs`` in the example's order, after checking the
        call against the example (``where``: the call, for messages)."""
        example = self.keywords
        if not kwargs and not example.tensors and not example.constants:
            # the common call, positional inputs only: every check below is vacuous but the
            # count (no keyword tensor has a batch dimension to compare), so it runs on every
            # step without building the keyword lists and the inputs' names
            if len(args) != self.positional:
                raise ValueError(_count_message(len(args), self.positional))
            return tuple(args)
        unexpected = [k for k in kwargs if k not in example.names]
        if unexpected:
            given = f"the example's keyword inputs are {', '.join(example.names)}" if example.names else \
                "the example had no keyword inputs"
            raise ValueError(f"{where}: keyword argument{'s' if len(unexpected) > 1 else ''} "
                             f"{', '.join(unexpected)} {'were' if len(unexpected) > 1 else 'was'} not in the example "
                             f"({given}). autopar plans for the example's inputs: compile with example_kwargs that "
                             f"hold {'them' if len(unexpected) > 1 else 'it'}")
        missing = [k for k in example.names if k not in kwargs]
        if missing:
            raise ValueError(f"{where}: keyword argument{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                             f"missing; the example had {', '.join(example.names)}, and every call must pass the "
                             f"same keywords (the graph was captured with them)")
        if len(args) != self.positional:
            raise ValueError(_count_message(len(args), self.positional))
        for name, value in example.constants:
            given = kwargs[name]
            if isinstance(given, torch.Tensor):
                raise ValueError(f"{where}: keyword input {name} is a tensor; the example's was {value!r}, a constant "
                                 f"of the capture. Compile with an example that passes a tensor there")
            if not _same_constant(given, value):
                raise ValueError(f"{where}: keyword input {name}={given!r} differs from the example's {value!r}; it "
                                 f"is not a tensor, so it was baked into the captured graph as a constant. Pass "
                                 f"{value!r}, or compile with an example that has {given!r}")
        for name in example.tensors:
            if not isinstance(kwargs[name], torch.Tensor):
                raise ValueError(f"{where}: keyword input {name} is {type(kwargs[name]).__name__}; the example's was "
                                 f"a tensor (a graph input). Pass a tensor")
        flat = tuple(args) + tuple(kwargs[name] for name in example.tensors)
        check_batch_dimensions(flat, self.names, self.positional, where)
        return flat

    def unflatten(self, flat: Sequence[Any]) -> tuple[tuple, dict[str, Any]]:
        """``(positional inputs, keyword inputs)`` of a flat tuple (a rank's share of
        one), the constants put back: what the model is called with."""
        args = tuple(flat[:self.positional])
        kwargs = dict(zip(self.keywords.tensors, flat[self.positional:]))
        kwargs.update(self.keywords.constants)
        return args, kwargs


def _count_message(given: int, positional: int) -> str:
    return (f"the model was called with {given} input(s); it was compiled with {positional} example input(s). "
            f"Pass the same positional inputs as example_inputs and the same keywords as example_kwargs")


def _same_constant(a, b) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot be compared are not the same
        return a is b


def check_batch_dimensions(flat: Sequence[Any], names: Sequence[str] | Callable[[], Sequence[str]], positional: int,
                           where: str) -> None:
    """Every keyword tensor of one dimension or more is split over the data ranks along
    its first dimension, like the batch-major positional inputs: that dimension must be
    the batch (the first dimension of the first tensor input). ``names``: how messages
    name the flat inputs, or a function giving them (called only to raise)."""
    if positional >= len(flat):  # no keyword tensor
        return
    first = next((i for i, x in enumerate(flat) if isinstance(x, torch.Tensor) and x.dim() > 0), None)
    if first is None:
        return
    batch = flat[first].shape[0]
    for i in range(positional, len(flat)):
        x = flat[i]
        if x.dim() > 0 and x.shape[0] != batch:
            names = names() if callable(names) else names
            raise ValueError(f"{where}: {names[i]} has batch dimension {x.shape[0]} (shape {list(x.shape)}), the "
                             f"other inputs {batch} ({names[first]} has shape {list(flat[first].shape)}). Each rank "
                             f"takes its share of every keyword tensor along its first dimension: give it the "
                             f"batch as its first dimension (expand a broadcast one, e.g. x.expand({batch}, ...))")


__all__ = ["CallLayout", "check_batch_dimensions"]


def check_loss_arguments(loss_fn: Callable | None, target: Any) -> None:
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
    return tuple(signature(x) for x in inputs), (None if target is None else signature(target))


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
    checks = [(name, signature(x), want) for name, x, want in zip(names, inputs, examples[0])]
    if target is not None and examples[1] is not None:
        checks.append(("target", signature(target), examples[1]))
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
    with both shapes, so that the error says why the model was captured again. Inside,
    at such shapes, exports run the model (:func:`autopar.trace.exporting.running_exports`):
    shapes the model cannot take (a sequence past its position table) fail the capture."""

    def __init__(self, examples: tuple | None, inputs: tuple):
        self.examples, self.inputs = examples, inputs
        self._running = contextlib.nullcontext()

    def _shapes(self) -> tuple[list, list]:
        got = [list(x.shape) for x in self.inputs if isinstance(x, torch.Tensor)]
        want = [list(w[0]) for w in self.examples[0] if isinstance(w, tuple)]
        return got, want

    def __enter__(self):
        if self.examples is not None and self.examples[0]:
            got, want = self._shapes()
            if got != want:
                self._running = running_exports()
        self._running.__enter__()
        return self

    def __exit__(self, kind, error, tb):
        self._running.__exit__(kind, error, tb)
        if kind is None or not issubclass(kind, CaptureError) or self.examples is None:
            return False
        got, want = self._shapes()
        if got == want:
            return False
        raise CaptureError(f"inputs of shapes {got} differ from the example's {want}: autopar builds each rank's "
                           f"program again for new shapes (the plan is kept), and the model cannot run at these "
                           f"shapes. Call it with shapes it supports, or compile with examples of these shapes.\n"
                           f"{error}") from error


def signature(x):
    return (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__
