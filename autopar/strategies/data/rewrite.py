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

A loss that averages over the class-index targets it does not ignore (cross-entropy or
NLL, ``reduction="mean"``, ``ignore_index`` -100: padding) would be averaged per rank,
which is the single-device mean only when every rank ignores as many targets. Such a
loss (an output of the graph) is rewritten to its sum divided by the count of the whole
batch (:func:`global_mean_losses`, :mod:`autopar.runtime.target_count`), whose sum over
the data ranks and microbatches is the single-device mean.

Example: the output ``return model_2`` of an MLP on 2 data ranks becomes
``all_gather_batch = all_gather_batch(model_2, 'data'); return all_gather_batch``.

The parts, which :func:`data_parallel_pass` runs in order: the loss's rewrites
(:mod:`autopar.strategies.shared.losses`, the rules context parallelism applies too),
batch norms over the whole batch (:mod:`.batch_norms`), the places where rows of the
batch meet and the routers' statistics (:mod:`.batch_couplings`), and the outputs
gathered or reduced (:mod:`.outputs`).
"""
from __future__ import annotations

import torch.fx as fx

from autopar.grid import MeshAxis
from autopar.ir import LOSS_REDUCTION, LOSS_TERMS, SPEC, TensorSpec
from autopar.passes.analysis.batch_rows.find import batch_size
from autopar.passes.analysis.batch_rows.loss_terms import settle_batch_constants
from autopar.strategies.data.batch_couplings import sync_batch_couplings, sync_router_statistics
from autopar.strategies.data.batch_norms import sync_batch_norms
from autopar.strategies.data.outputs import gather_outputs
from autopar.strategies.shared.losses import global_mean_losses, weigh_summed_terms
from autopar.strategies.shared.outputs import output_reduction


def data_parallel_pass(gm: fx.GraphModule, *, degree: int, local_batch: int, group: str = MeshAxis.DATA,
                       reduce_scalars: bool = True, microbatches: int = 1,
                       couplings: list | None = None, loss_terms: list | None = None) -> fx.GraphModule:
    """Gather batch-major outputs over the data group; reduce scalar outputs over it
    (``reduce_scalars``), or leave a training graph's loss local and record how it
    reduces under :data:`LOSS_REDUCTION`. A loss averaged over its counted targets is
    first rewritten to a share of the whole batch's mean (:func:`global_mean_losses`),
    also when the batch is split into ``microbatches`` alone (a pipeline). Where rows of
    the batch meet, the exact remedies run first (:func:`sync_batch_couplings`;
    ``couplings``: the plan's, checked against this graph's)."""
    if degree == 1 and microbatches == 1:
        return gm
    loss_terms = settle_batch_constants(gm, loss_terms if loss_terms is not None else gm.meta.get(LOSS_TERMS),
                                        batch_size(gm) or local_batch)
    global_mean_losses(gm, degree * microbatches)
    weigh_summed_terms(gm, degree * microbatches, loss_terms)
    if degree == 1:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        scalars = [v for v in output.all_input_nodes if isinstance(v.meta.get(SPEC), TensorSpec)
                   and not v.meta[SPEC].shape]
        if not reduce_scalars and scalars:  # the loss a step accumulates over microbatches
            gm.meta[LOSS_REDUCTION] = output_reduction(gm, scalars[0], loss_terms)
        gm.graph.lint()
        gm.recompile()
        return gm
    sync_batch_norms(gm, group)
    sync_router_statistics(gm, group, microbatches)
    sync_batch_couplings(gm, group, local_batch, degree, couplings)
    gather_outputs(gm, group, local_batch, reduce_scalars, loss_terms)
    gm.graph.lint()
    gm.recompile()
    return gm
