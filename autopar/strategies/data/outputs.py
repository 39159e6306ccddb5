"""The data pass at the graph's outputs: the step that gathers or reduces every output
over the data group (:func:`gather_outputs`), reading how a scalar output reduces over
the parts of the batch and which values hold the batch's rows batch-major as every
family that splits the batch reads them (:mod:`autopar.strategies.shared.outputs`), with
the error the data pass raises where it cannot make a graph equal the single device."""
from __future__ import annotations

import torch.fx as fx

from autopar.ir import LOSS_REDUCTION, OUTPUT_ROWS, SPEC, TensorSpec
from autopar.runtime import collectives
from autopar.strategies.shared.outputs import batch_major_rows, output_reduction


class DataParallelError(ValueError):
    pass


def output_rows(value: fx.Node) -> tuple | None:
    """The dimensions of output ``value`` that hold the batch's rows, as the analysis read
    them (:data:`~autopar.ir.OUTPUT_ROWS`), through what later passes put in front of it
    (a tensor group's gather, keeping the value's shape); None where it did not say."""
    for _ in range(8):
        if OUTPUT_ROWS in value.meta:
            return tuple(value.meta[OUTPUT_ROWS])
        source = value.args[0] if value.op == "call_function" and value.args else None
        if not isinstance(source, fx.Node) or value.meta.get(SPEC) != source.meta.get(SPEC):
            return None
        value = source
    return None


def gather_outputs(gm: fx.GraphModule, group: str, local_batch: int, reduce_scalars: bool = True,
                   loss_terms: list | None = None) -> None:
    """Gather the batch-major outputs over ``group``; reduce the scalar outputs over it
    (:func:`output_reduction`), or, without ``reduce_scalars``, record how the loss reduces
    under :data:`LOSS_REDUCTION` and leave it local (:class:`DataParallelError` for any
    other output)."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    for value in list(output.all_input_nodes):
        spec = value.meta.get(SPEC)
        if not isinstance(spec, TensorSpec):
            continue
        rows = output_rows(value)
        if spec.shape and rows == ():
            continue   # the same on every part of the batch (a parameter's, an all-reduced statistic)
        if spec.shape and rows is not None and 0 not in rows:
            raise DataParallelError(
                f"output {value.format_node()} holds the batch's rows in dimension {rows[0]}, not the first; data "
                f"parallelism gathers outputs along their first dimension. Return batch-major outputs, or use "
                f"strategy={{'data': 1}}")
        with gm.graph.inserting_before(output):
            # rows in the first dimension (a pairwise score's too: its remedy made it this
            # rank's rows against every row)
            if spec.shape and ((rows and 0 in rows) or spec.shape[0] == local_batch
                               or batch_major_rows(value, local_batch)):
                new = gm.graph.call_function(collectives.all_gather_batch, (value, group))
            elif not spec.shape:
                reduction = output_reduction(gm, value, loss_terms)
                if not reduce_scalars:
                    gm.meta[LOSS_REDUCTION] = reduction
                    continue
                reduce = collectives.sum_over_group if reduction == "sum" else collectives.average_over_group
                new = gm.graph.call_function(reduce, (value, group))
            else:
                raise DataParallelError(
                    f"output {value.format_node()} has shape {list(spec.shape)}, whose first dimension is not the "
                    f"batch ({local_batch} per rank); data parallelism cannot reassemble it. Return batch-major "
                    f"outputs, or use strategy={{'data': 1}}")
        output.replace_input_with(value, new)
