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
import torch.nn as nn
import torch.nn.functional as F

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


# batch norm's arguments by spelling: (input, weight, bias, running_mean, running_var,
# training, momentum, eps) as positions in the call, with the defaults
_BN_ATEN = ops._targets("batch_norm")
_BN_ORDER = {"aten": (0, 1, 2, 3, 4, 5, 6, 7), "functional": (0, 3, 4, 1, 2, 5, 6, 7)}
_BN_NAMES = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")
_BN_DEFAULTS = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}


def batch_norm_arguments(node: fx.Node) -> dict | None:
    """The arguments of a batch norm that normalises over the batch (training mode, or
    no running statistics), by name, or None when ``node`` is not one. Module calls give
    ``module`` (the ``nn.BatchNorm*d``) and its attributes' names instead of nodes."""
    if node.op == "call_module":
        module = node.graph.owning_module.get_submodule(node.target)
        if not isinstance(module, nn.modules.batchnorm._BatchNorm):
            return None
        if not (module.training or module.running_mean is None):
            return None
        return {"module": module, "input": node.args[0] if node.args else node.kwargs["input"]}
    if node.op != "call_function" or not (node.target is F.batch_norm or node.target in _BN_ATEN):
        return None
    order = _BN_ORDER["functional" if node.target is F.batch_norm else "aten"]
    values = dict(_BN_DEFAULTS)
    for name, position in zip(_BN_NAMES, order):
        if position < len(node.args):
            values[name] = node.args[position]
    values.update({k: v for k, v in node.kwargs.items() if k in _BN_NAMES})
    if not (values["training"] or values.get("running_mean") is None):
        return None
    return values


def sync_batch_norms(gm: fx.GraphModule, group: str) -> int:
    """Make every batch-normalising batch norm compute its statistics over the whole
    batch the ranks of ``group`` share (:func:`autopar.runtime.collectives.sync_batch_norm`):
    per-rank statistics would make data parallelism differ from the single-device model
    (and update the running statistics with each rank's own). Returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        values = batch_norm_arguments(node)
        if values is None:
            continue
        with gm.graph.inserting_before(node):
            module = values.get("module")
            if module is not None:
                if module.momentum is None:
                    raise DataParallelError(
                        f"{node.format_node()}: {type(module).__name__} with momentum=None (a cumulative average) is "
                        f"not supported under data parallelism; give it a momentum, or use strategy={{'data': 1}}")
                attr = {name: (gm.graph.get_attr(f"{node.target}.{name}") if getattr(module, name) is not None
                               else None) for name in ("weight", "bias", "running_mean", "running_var")}
                if module.track_running_stats and module.num_batches_tracked is not None:
                    tracked = gm.graph.get_attr(f"{node.target}.num_batches_tracked")
                    gm.graph.call_method("add_", (tracked, 1))
                args = (values["input"], attr["weight"], attr["bias"], attr["running_mean"], attr["running_var"],
                        float(module.momentum), float(module.eps), group)
            else:
                args = (values["input"], values["weight"], values["bias"], values.get("running_mean"),
                        values.get("running_var"), float(values["momentum"] or 0.0), float(values["eps"]), group)
            new = gm.graph.call_function(C.sync_batch_norm, args)
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        count += 1
    return count


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
    sync_batch_norms(gm, group)
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
