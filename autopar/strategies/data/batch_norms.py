"""Batch norms under data parallelism: the nodes that normalise over the batch
(:func:`autopar.passes.analysis.ops.batch_norm_arguments`) rewritten to statistics over
the whole batch the data ranks share (:func:`sync_batch_norms`)."""
from __future__ import annotations

import torch.fx as fx

from autopar.passes.analysis.ops import batch_norm_arguments
from autopar.runtime import collectives
from autopar.strategies.data.outputs import DataParallelError

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
