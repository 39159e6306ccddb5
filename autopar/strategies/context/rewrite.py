"""Context parallelism's rewrite of one rank's graph (:mod:`.walk` does the work).

The rank's graph is captured at its rows of the batch and the whole sequence; the
inputs reach it whole. :func:`context_parallel_pass` first makes a loss that averages
over the targets it counts (a cross-entropy with ``ignore_index``) a share of the whole
batch's mean, as the data-parallel pass does
(:func:`autopar.strategies.shared.losses.global_mean_losses`: the sum over the rank's
targets divided by the count of every target of the batch, counted from the inputs),
then walks the graph (:class:`.walk.Walk`): from the token embeddings (or a float input
with a sequence dimension) on, values hold this rank's tokens; attention runs as a ring;
sums over the sequence add the ranks' parts; outputs are gathered whole.

Attention written out in the graph (:mod:`.written`) runs in the all-gather form, its
softmax on the rank's rows of the scores; the pass checks that each such core (but one
with attention dropout, which runs on the whole sequence by design) did, and refuses the
plan naming the core and the op that kept it whole otherwise: the planner priced it
split.
"""
from __future__ import annotations

import torch.fx as fx

from autopar.planning.strategy import PlanError
from autopar.strategies.context.walk import Walk
from autopar.strategies.context.written import written_cores
from autopar.strategies.shared.losses import global_mean_losses

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
    cores = [core for core in written_cores(gm) if core.problem is None and core.whole is None]
    walk = Walk(gm, seq=seq, degree=degree, group=group, balanced=balanced, mode=mode, batch=local_batch)
    report = walk.run()
    for core in cores:
        if walk.tok(core.softmax) is None:
            raise PlanError(f"context parallelism: the attention written out at {core.softmax.name} cannot run on "
                            f"the rank's rows: {_whole_cause(core.softmax, report['why'])} (docs/context.md, "
                            f"'Attention written out'); drop 'context'")
    report["written"] = len(cores)
    gm.meta[CONTEXT] = report
    gm.graph.lint()
    gm.recompile()
    return gm


def _whole_cause(node: fx.Node, why: dict[str, str]) -> str:
    """The nearest op before ``node`` (or ``node`` itself) that ran on the whole sequence, and why."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop(0)
        if n in seen:
            continue
        seen.add(n)
        if n.name in why:
            return f"{n.name} runs on the whole sequence ({why[n.name]})"
        stack.extend(n.all_input_nodes)
    return "its scores are not split by the queries' rows"
