"""The model's call as autopar runs it: positional and keyword inputs as one flat tuple.

``compile`` fixes a :class:`CallLayout` from its examples: the number of positional
inputs, then the tensors among the keyword inputs in the example's key order (each one a
graph input, see :class:`autopar.capture.Keywords`), while the other keyword values are
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

import dataclasses
from typing import Any, Mapping, Sequence

import torch

from autopar.capture import Keywords


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
            raise ValueError(f"the model was called with {len(args)} input(s); it was compiled with "
                             f"{self.positional} example input(s). Pass the same positional inputs as example_inputs "
                             f"and the same keywords as example_kwargs")
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
        check_batch_dimensions(flat, self.names(), self.positional, where)
        return flat

    def unflatten(self, flat: Sequence[Any]) -> tuple[tuple, dict[str, Any]]:
        """``(positional inputs, keyword inputs)`` of a flat tuple (a rank's share of
        one), the constants put back: what the model is called with."""
        args = tuple(flat[:self.positional])
        kwargs = dict(zip(self.keywords.tensors, flat[self.positional:]))
        kwargs.update(self.keywords.constants)
        return args, kwargs


def _same_constant(a, b) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot be compared are not the same
        return a is b


def check_batch_dimensions(flat: Sequence[Any], names: Sequence[str], positional: int, where: str) -> None:
    """Every keyword tensor of one dimension or more is split over the data ranks along
    its first dimension, like the batch-major positional inputs: that dimension must be
    the batch (the first dimension of the first tensor input)."""
    first = next((i for i, x in enumerate(flat) if isinstance(x, torch.Tensor) and x.dim() > 0), None)
    if first is None:
        return
    batch = flat[first].shape[0]
    for i in range(positional, len(flat)):
        x = flat[i]
        if x.dim() > 0 and x.shape[0] != batch:
            raise ValueError(f"{where}: {names[i]} has batch dimension {x.shape[0]} (shape {list(x.shape)}), the "
                             f"other inputs {batch} ({names[first]} has shape {list(flat[first].shape)}). Each rank "
                             f"takes its share of every keyword tensor along its first dimension: give it the "
                             f"batch as its first dimension (expand a broadcast one, e.g. x.expand({batch}, ...))")


__all__ = ["CallLayout", "check_batch_dimensions"]
