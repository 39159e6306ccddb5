"""Context parallelism's rewrite of one rank's graph (:mod:`.walk` does the work).

The rank's graph is captured at its rows of the batch and the whole sequence; the
inputs reach it whole. :func:`context_parallel_pass` first makes a loss that averages
over the targets it counts (a cross-entropy with ``ignore_index``) a share of the whole
batch's mean, as the data-parallel pass does
(:func:`autopar.strategies.data.losses.global_mean_losses`: the sum over the rank's
targets divided by the count of every target of the batch, counted from the inputs),
then walks the graph (:class:`.walk.Walk`): from the token embeddings (or a float input
with a sequence dimension) on, values hold this rank's tokens; attention runs as a ring;
sums over the sequence add the ranks' parts; outputs are gathered whole.
"""
from __future__ import annotations

import torch.fx as fx

from autopar.strategies.context.walk import Walk
from autopar.strategies.data.losses import global_mean_losses

CONTEXT = "autopar.context"
"""``gm.meta[CONTEXT]``: what the pass did: ring attentions, values cut, sums over the
sequence, and the nodes that ran on the whole sequence (their operands gathered)."""


def context_parallel_pass(gm: fx.GraphModule, *, degree: int, group: str, seq: int, balanced: bool, mode: str,
                          local_batch: int) -> fx.GraphModule:
    """Split ``gm``'s sequence of ``seq`` tokens over the context ``group`` of ``degree``
    ranks (load-balanced chunks when ``balanced``; attention by ``mode``, ``"ring"`` or
    ``"allgather"``); ``local_batch``: the rows of the graph. Returns ``gm``, recompiled."""
    if degree == 1:
        return gm
    global_mean_losses(gm)
    report = Walk(gm, seq=seq, degree=degree, group=group, balanced=balanced, mode=mode, batch=local_batch).run()
    gm.meta[CONTEXT] = report
    gm.graph.lint()
    gm.recompile()
    return gm
