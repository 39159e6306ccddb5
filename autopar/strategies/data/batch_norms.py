"""Batch norms under data parallelism: which nodes normalise over the batch
(:func:`batch_norm_arguments`) and their rewrite to statistics over the whole batch the
data ranks share (:func:`sync_batch_norms`)."""
from __future__ import annotations

import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.passes.analysis import ops
from autopar.runtime import collectives
from autopar.strategies.data.outputs import DataParallelError

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
            new = gm.graph.call_function(collectives.sync_batch_norm, args)
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        count += 1
    return count
