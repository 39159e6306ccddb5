"""What a shallow export cannot show (:mod:`autopar.trace.stamping`): the model's own
code around its stack at the whole depth, and layers that read their own index.

The shallow export traces the model with its stack cut to the kept layers, so code of
the model that runs between two later layers (a step after the middle layer, a branch on
the layer's position in the model's loop) or after the stack depending on its depth is
not in it, and stamping would drop or move it. :func:`loop_differs` exports the model
once more at the whole depth with every layer a stub (:class:`_Stub`: its output built
from its first input, in the structure and shapes the layer returned while exporting,
:func:`recorded_outputs`), which costs the code outside the layers only, and compares:
the layers called in order with nothing of the model's between them, and the model's own
operations before and after them those of the stamped graph. :func:`index_read` refuses
a layer whose methods read the attribute holding its own index other than as a call's
argument (``past_key_values.update(k, v, self.layer_idx)`` reads it so): a comparison or
an index by it could change the graph at a depth the export does not trace."""
from __future__ import annotations

import contextlib
import re
from typing import Iterator

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils import _pytree as pytree

from autopar._torch_compat import children_of
from autopar.trace.stacks import COMPUTE_OPS, Stack, layers_replaced


@contextlib.contextmanager
def recorded_outputs(model: nn.Module, stack: Stack) -> Iterator[dict]:
    """Inside, each kept layer's output when it runs: layer index -> (its pytree spec,
    each leaf's shape and dtype, or the leaf itself where it is no tensor)."""
    layers = list(children_of(model.get_submodule(stack.path)).values())[:stack.kept]
    found: dict[int, tuple] = {}

    def hook(index):
        def record(module, args, output):
            leaves, spec = pytree.tree_flatten(output)
            found[index] = (spec, [(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else ("value", x)
                                   for x in leaves])
        return record
    handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


class _Stub(nn.Module):
    """A layer's stand-in: its output in the layer's structure, each tensor a copy of
    the first tensor input where shape and dtype agree, else zeros made from it."""

    def __init__(self, output: tuple):
        super().__init__()
        self.spec, self.leaves = output

    def forward(self, *args, **kwargs):
        first = next(x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor))
        leaves = []
        for leaf in self.leaves:
            if leaf[0] == "value":
                leaves.append(leaf[1])
            elif leaf == (tuple(first.shape), first.dtype):
                leaves.append(first.clone())
            else:
                leaves.append(first.new_zeros(leaf[0], dtype=leaf[1]))
        return pytree.tree_unflatten(leaves, self.spec)


def stubbed(model: nn.Module, stack: Stack, outputs: dict):
    """The model with every layer of its stack a :class:`_Stub` (a later layer's output
    as its template layer's), inside."""
    names = list(children_of(model.get_submodule(stack.path)))
    return layers_replaced(model, stack, {name: _Stub(outputs[index if index < stack.kept else
                                                              stack.template_of(index)])
                                          for index, name in enumerate(names)})


def loop_differs(stubbed_gm: fx.GraphModule, stamped: fx.GraphModule, stack: Stack, path: str) -> str | None:
    """Why the stamped graph is not the model's at the whole depth (None: it is): in the
    export with stub layers (``stubbed_gm``), the layers (under module path ``path``)
    must be called in order, nothing of the model's between them, and the model's own
    operations must be the stamped graph's outside its layers."""
    pattern = re.compile(re.escape(path) + r"\.(\d+)(?=\.|$)")
    order, outside, last_layer = [], [], -1
    for node in stubbed_gm.graph.nodes:
        if node.op not in COMPUTE_OPS:
            continue
        index = _layer_of(node, pattern)
        if index is None:
            if 0 <= last_layer < stack.depth - 1:
                return f"the model runs {node.name} ({node.target}) between its layers {last_layer} and the next"
            outside.append(_what(node))
            continue
        if index < last_layer:
            return f"the model calls layer {index} after layer {last_layer}"
        if index != last_layer:
            order.append(index)
        last_layer = index
    if order != list(range(stack.depth)):
        return f"the model calls its layers as {order[:8]}..., not each once in order"
    mine = [_what(n) for n in stamped.graph.nodes if n.op in COMPUTE_OPS and _layer_of(n, pattern) is None]
    if mine != outside:
        return "the model's own operations at the whole depth differ from those of the shallow export"
    return None


def _layer_of(node: fx.Node, pattern: re.Pattern) -> int | None:
    found = {int(m.group(1)) for path, _ in (node.meta.get("nn_module_stack") or {}).values()
             if (m := pattern.match(path)) is not None}
    return min(found) if found else None


def _what(node: fx.Node) -> tuple:
    return node.op, str(node.target)


__all__ = ["loop_differs", "recorded_outputs", "stubbed"]
