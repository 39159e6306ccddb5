"""Capturing a model that holds meta tensors (built under ``torch.device("meta")``):
shapes only. :func:`autopar.trace.capture.capture` runs such a model on meta examples
(:func:`to_meta`), with any tensor that holds storage swapped for a meta one meanwhile
(:func:`all_on_meta`), and gives the graph back the examples' device (:func:`on_device`).
"""
from __future__ import annotations

import contextlib

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils._pytree import tree_leaves, tree_map_only

META = torch.device("meta")


def holds_meta(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` is on the meta device (a model built
    under ``torch.device("meta")``: shapes without storage)."""
    return any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers()))


def to_meta(value):
    """``value`` (examples of any structure) with every tensor replaced by a meta tensor of
    its shape, strides and dtype (``requires_grad`` kept)."""
    def meta(x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "meta":
            return x
        out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=META)
        return out.requires_grad_(x.requires_grad) if x.is_floating_point() or x.is_complex() else out
    return tree_map_only(torch.Tensor, meta, value)


def examples_device(value) -> torch.device:
    """The device the examples' tensors are on (the first that is not meta), else the CPU."""
    for leaf in tree_leaves(value):
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
            return leaf.device
    return torch.device("cpu")


@contextlib.contextmanager
def all_on_meta(model: nn.Module):
    """Every parameter and buffer of ``model`` that holds storage replaced by a meta
    tensor of its shape while the block runs, and put back after: a model that is
    partly on the meta device (parameters on meta, buffers built for real, as
    ``accelerate.init_empty_weights`` makes them) is captured as shapes alone, and its
    buffers are not touched (a batch norm in training mode would count the run)."""
    swapped = []
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, t in list(store.items()):
                if t is None or t.device.type == "meta":
                    continue
                stand_in = torch.empty_like(t, device=META)
                if isinstance(t, nn.Parameter):
                    stand_in = nn.Parameter(stand_in, requires_grad=t.requires_grad)
                swapped.append((store, name, t))
                store[name] = stand_in
    try:
        yield
    finally:
        for store, name, t in swapped:
            store[name] = t


def on_device(gm: fx.GraphModule, device: torch.device) -> fx.GraphModule:
    """A graph captured on the meta device made to run on ``device``: torch.export bakes
    the devices an operation was given (``aten.arange(..., device=x.device)``) into its
    node's arguments, so every ``meta`` there becomes ``device``. A tensor constant the
    trace computed from the meta weights (no value) cannot run anywhere: refused, named."""
    def moved(value):
        if isinstance(value, torch.device) and value.type == "meta":
            return device
        if isinstance(value, (tuple, list)):
            return type(value)(moved(v) for v in value)
        if isinstance(value, dict):
            return {k: moved(v) for k, v in value.items()}
        return value

    for node in gm.graph.nodes:
        node.args, node.kwargs = moved(node.args), moved(node.kwargs)
    params = {id(t) for t in (*gm.parameters(), *gm.buffers())}
    for name, value in vars(gm).items():
        if isinstance(value, torch.Tensor) and value.device.type == "meta" and id(value) not in params:
            raise ValueError(f"the captured graph of {type(gm).__name__} holds a constant {name} computed from the "
                               f"model's weights while they are on the meta device; build the model for real, or "
                               f"compute that value inside forward")
    gm.recompile()
    return gm
