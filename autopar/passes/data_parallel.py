"""Rewrite pass: data parallelism at the graph's outputs.

Each rank's graph is captured at its local batch (global batch / data degree), so the
body needs no change: the batch split happens when ``ParallelModule`` slices the inputs.
What the rank graph must do is return what the single-device model returns: outputs
whose first dimension is the local batch are all-gathered over the data group
(``all_gather_batch``), and scalar outputs (a loss) are averaged over it.

Example: the output ``return model_2`` of an MLP on 2 data ranks becomes
``all_gather_batch = all_gather_batch(model_2, 'data'); return all_gather_batch``.
"""
from __future__ import annotations

import torch.fx as fx

from autopar.ir import TensorSpec
from autopar.runtime import collectives as C


class DataParallelError(ValueError):
    pass


def data_parallel_pass(gm: fx.GraphModule, *, degree: int, local_batch: int, group: str = "data") -> fx.GraphModule:
    """Gather batch-major outputs and average scalar outputs over the data group."""
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
                new = gm.graph.call_function(C.average_over_group, (value, group))
            else:
                raise DataParallelError(
                    f"output {value.format_node()} has shape {list(spec.shape)}, whose first dimension is not the "
                    f"batch ({local_batch} per rank); data parallelism cannot reassemble it. Return batch-major "
                    f"outputs, or use strategy={{'data': 1}}")
        output.replace_input_with(value, new)
    gm.graph.lint()
    gm.recompile()
    return gm
