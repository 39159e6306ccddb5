"""Rewrite pass: data parallelism at the graph's outputs.

Each rank's graph is captured at its local batch (global batch / data degree), so the
body needs no change: the batch split happens when ``ParallelModule`` slices the inputs.
What the rank graph must do is return what the single-device model returns: outputs
whose first dimension is the local batch are all-gathered over the data group
(``all_gather_batch``), and scalar outputs are reduced over it the way a loss reduces
over the batch: averaged for a mean (the default when the reduction cannot be read off
the graph), summed for a sum. A training graph keeps its loss local instead — backward
starts from each rank's own loss, as in DDP — and records the reduction for the runtime,
which reduces the reported value while backward runs.

Example: the output ``return model_2`` of an MLP on 2 data ranks becomes
``all_gather_batch = all_gather_batch(model_2, 'data'); return all_gather_batch``.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from autopar._torch_compat import argument_names
from autopar.ir import TensorSpec
from autopar.passes import ops
from autopar.runtime import collectives as C


class DataParallelError(ValueError):
    pass


_REDUCTION_ENUM = {0: "none", 1: "mean", 2: "sum"}  # aten's loss reduction argument
_SUM = {torch.sum} | ops._targets("sum")
_MEAN = {torch.mean} | ops._targets("mean")


def loss_reduction(node: fx.Node) -> str:
    """How the scalar ``node`` reduces over the batch: ``"sum"`` or ``"mean"`` (the
    assumption when it cannot be read off the graph: losses are means by default)."""
    if node.op == "call_method" and node.target in ("sum", "mean"):
        return node.target
    if node.op == "call_function":
        if node.target in _SUM:
            return "sum"
        if node.target in _MEAN:
            return "mean"
        reduction = node.kwargs.get("reduction")
        names = argument_names(node.target)
        if reduction is None and "reduction" in names:
            if names.index("reduction") < len(node.args):
                reduction = node.args[names.index("reduction")]
        if reduction is None and node.target is C.vocab_parallel_cross_entropy and len(node.args) > 5:
            reduction = node.args[5]
        if isinstance(reduction, int):
            reduction = _REDUCTION_ENUM.get(reduction)
        if reduction == "sum":
            return "sum"
    if node.op == "call_module":
        reduction = getattr(node.graph.owning_module.get_submodule(node.target), "reduction", None)
        if reduction == "sum":
            return "sum"
    return "mean"


LOSS_REDUCTION = "autopar.loss_reduction"
"""``gm.meta[LOSS_REDUCTION]``: ``"mean"`` or ``"sum"``, how a training graph's loss reduces
over the batch (the runtime weights its backward to match)."""


def data_parallel_pass(gm: fx.GraphModule, *, degree: int, local_batch: int, group: str = "data",
                       reduce_scalars: bool = True) -> fx.GraphModule:
    """Gather batch-major outputs over the data group; reduce scalar outputs over it
    (``reduce_scalars``), or leave a training graph's loss local and record how it
    reduces under :data:`LOSS_REDUCTION`."""
    if degree == 1:
        return gm
    output = next(n for n in gm.graph.nodes if n.op == "output")
    for value in list(output.all_input_nodes):
        spec = value.meta.get("autopar.spec")
        if not isinstance(spec, TensorSpec):
            continue
        with gm.graph.inserting_before(output):
            if spec.shape and spec.shape[0] == local_batch:
                new = gm.graph.call_function(C.all_gather_batch, (value, group))
            elif not spec.shape:
                reduction = loss_reduction(value)
                if not reduce_scalars:
                    gm.meta[LOSS_REDUCTION] = reduction
                    continue
                reduce = C.sum_over_group if reduction == "sum" else C.average_over_group
                new = gm.graph.call_function(reduce, (value, group))
            else:
                raise DataParallelError(
                    f"output {value.format_node()} has shape {list(spec.shape)}, whose first dimension is not the "
                    f"batch ({local_batch} per rank); data parallelism cannot reassemble it. Return batch-major "
                    f"outputs, or use strategy={{'data': 1}}")
        output.replace_input_with(value, new)
    gm.graph.lint()
    gm.recompile()
    return gm
