"""Capturing a model that holds meta tensors (built under ``torch.device("meta")``):
shapes only, on the device the model will run on.

:func:`autopar.trace.capture.capture` runs such a model with every parameter and buffer
swapped for a *fake* tensor (``torch._subclasses.FakeTensor``: a shape, dtype and device
without storage) on the examples' device, and the examples made fake alike
(:class:`ShapesOnly`). Meta tensors would do for the shapes, but not for the device:
models branch on it (Hugging Face's mixture-of-experts layers count tokens per expert
with ``histc`` on floats where ``x.device.type == "cpu"`` and on ints elsewhere), and
``torch.export`` bakes an operation's ``device=`` into its node (``aten.arange(...,
device=...)``). A fake tensor reports the real device, so the graph is the one a model
built there would give. The fakes of a model are made once and kept (the export memo
recognises a later capture of the same model by its tensors' identities).
"""
from __future__ import annotations

import weakref

import torch
import torch.fx as fx
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._pytree import tree_leaves, tree_map_only


def holds_meta(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` is on the meta device (a model built
    under ``torch.device("meta")``: shapes without storage)."""
    return any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers()))


def examples_device(value) -> torch.device:
    """The device the examples' tensors are on (the first that is not meta), else the CPU."""
    for leaf in tree_leaves(value):
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
            return leaf.device
    return torch.device("cpu")


class _Fakes:
    """One model's fake tensors on one device, and the mode that made them."""

    def __init__(self, device: torch.device):
        self.device = device
        # a shape environment: an operation whose output shape depends on values
        # (nonzero, masked selection: a hand-written MoE's routing) gets an unbacked size
        # (autopar.ir.spec_from_value records its upper bound)
        self.mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
        self.of: dict[int, torch.Tensor] = {}  # id of the model's tensor -> its fake

    def fake(self, t: torch.Tensor) -> torch.Tensor:
        """A fake tensor of ``t``'s shape, strides, dtype and ``requires_grad`` on the device."""
        with self.mode:
            out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=self.device)
        if isinstance(t, nn.Parameter):
            return nn.Parameter(out, requires_grad=t.requires_grad)
        return out.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() else out


_FAKES: "weakref.WeakKeyDictionary[nn.Module, _Fakes]" = weakref.WeakKeyDictionary()


class ShapesOnly:
    """While the block runs, every parameter and buffer of ``model`` is a fake tensor on
    ``device`` (the same fake object each time for the same tensor); :meth:`examples`
    makes the examples fake. Put back after. The fake mode is not entered here: a tensor
    the model makes from Python values while it is traced (``torch.tensor([...])`` in
    ``forward``) must be a real constant of the graph; the runs on fake values enter it
    (:func:`autopar.trace.capture.propagate_specs`, ``torch.export``)."""

    def __init__(self, model: nn.Module, device: torch.device):
        fakes = _FAKES.get(model)
        if fakes is None or fakes.device != device:
            fakes = _FAKES[model] = _Fakes(device)
        self.model, self.fakes, self.swapped = model, fakes, []

    def fake_ids(self) -> set[int]:
        """The ids of the fakes standing for the model's parameters and buffers."""
        return {id(f) for f in self.fakes.of.values()}

    def examples(self, value):
        """``value`` (examples of any structure) with every tensor replaced by a fake one
        of its shape, strides and dtype on the device."""
        return tree_map_only(torch.Tensor, self.fakes.fake, value)

    def __enter__(self) -> "ShapesOnly":
        for module in self.model.modules():
            for store in (module._parameters, module._buffers):
                for name, t in list(store.items()):
                    if t is None or isinstance(t, FakeTensor):
                        continue
                    fake = self.fakes.of.get(id(t))
                    if fake is None:
                        fake = self.fakes.of[id(t)] = self.fakes.fake(t)
                    self.swapped.append((store, name, t))
                    store[name] = fake
        return self

    def __exit__(self, *exc) -> None:
        for store, name, t in self.swapped:
            store[name] = t
        self.swapped.clear()


def check_no_fake_constants(gm: fx.GraphModule, model_class: str, allowed: set[int]) -> fx.GraphModule:
    """A tensor the graph holds that is a fake tensor but none of the model's parameters
    and buffers (``allowed``: their fakes' ids) is a constant computed from the model's
    weights while they had no values: it cannot run anywhere, and running it would make
    fake losses silently. Refused, named."""
    for module_name, module in gm.named_modules():
        held = [*module._parameters.items(), *module._buffers.items(),
                *((k, v) for k, v in vars(module).items() if isinstance(v, torch.Tensor))]
        for name, value in held:
            if isinstance(value, FakeTensor) and id(value) not in allowed:
                where = f"{module_name}.{name}" if module_name else name
                raise ValueError(f"the captured graph of {model_class} holds a constant {where} computed from the "
                                 f"model's weights while they had no values (on the meta device); build the model "
                                 f"for real, or compute that value inside forward")
    return gm


__all__ = ["ShapesOnly", "check_no_fake_constants", "examples_device", "holds_meta"]
