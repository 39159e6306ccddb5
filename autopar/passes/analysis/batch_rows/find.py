"""The pass: :func:`find_batch_couplings_pass` walks the batch through the graph (twice
when it holds pairwise scores), reads what the reductions over the batch are, and writes
the couplings and the loss terms on the graph."""
from __future__ import annotations

import logging

import torch.fx as fx

from autopar.ir import (BATCH_COUPLINGS, LOSS_TERMS, OUTPUT_ROWS, RANDOM_SITES, SPEC, VALUE_ROWS, TensorSpec,
                        regions)
from autopar.passes.analysis import ops
from autopar.passes.analysis.experts import router_statistics
from autopar.passes.analysis.batch_rows.loss_terms import check_size_reads, classify_reductions, depends_on_batch
from autopar.passes.analysis.batch_rows.op_tables import bare_name, shape_of
from autopar.passes.analysis.batch_rows.pairwise import check_pairwise, pairwise_closure
from autopar.passes.analysis.batch_rows.sources import sorted_at
from autopar.passes.analysis.batch_rows.rows import Rows
from autopar.passes.analysis.batch_rows.walk import Walk

log = logging.getLogger("autopar.analysis.batch_rows")


def batch_size(gm: fx.GraphModule) -> int | None:
    """The batch: the first dimension of the graph's first tensor input (as the runtime
    splits it, :func:`autopar.engine.executable.batch_of`); of a cut of an analysed graph
    (a pipeline stage, whose first input may be a sequence-first value), the whole graph's
    (:data:`~autopar.ir.VALUE_ROWS`)."""
    if VALUE_ROWS in gm.meta:
        return gm.meta[VALUE_ROWS]
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            shape = shape_of(node)
            if shape:
                return shape[0]
    return None


def find_batch_couplings_pass(gm: fx.GraphModule) -> fx.GraphModule:
    """Write :data:`~autopar.ir.BATCH_COUPLINGS` (a list of :class:`Coupling`) on ``gm``."""
    batch = batch_size(gm)
    gm.meta[BATCH_COUPLINGS] = []
    gm.meta[LOSS_TERMS] = []
    gm.meta[VALUE_ROWS] = batch
    if not batch or batch < 2:
        return gm
    walk = Walk(gm, batch)
    # a first walk finds the pairwise scores; the second knows them (their columns are rows too)
    walk.run()
    if walk.pairwise:
        values = pairwise_closure(walk)
        walk = Walk(gm, batch, values)
        walk.run()
    try:
        _after_walk(walk, gm)
    except Exception as e:  # noqa: BLE001 - a pattern it cannot read: refused, never a crash
        output = next(n for n in gm.graph.nodes if n.op == "output")
        walk.couple(output, "unknown", f"autopar could not read where rows of the batch meet "
                                       f"({type(e).__name__}: {e})")
    dispatch = {n for r in regions(gm, "experts") for n in r.nodes}
    walk.found = [c for c in walk.found if c.node not in dispatch]
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    walk.found.sort(key=lambda c: order.get(c.node, 0))
    gm.meta[BATCH_COUPLINGS] = walk.found
    gm.meta[LOSS_TERMS] = walk.loss_terms
    _random_rows(walk, gm)
    _output_rows(walk, gm)
    for node, state in walk.state.items():
        node.meta[VALUE_ROWS] = state if isinstance(state, Rows) else None
    if walk.unknown:
        log.info("batch rows: %d op(s) take PyTorch's rule (DTensor's sharding propagation): %s", len(walk.unknown),
                 ", ".join(walk.unknown[:8]) + (" ..." if len(walk.unknown) > 8 else ""))
    return gm


def _output_rows(walk: Walk, gm: fx.GraphModule) -> None:
    """Which dimensions of each value the graph returns hold rows of the batch
    (:data:`~autopar.ir.OUTPUT_ROWS`, read by the data pass's outputs)."""
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    for value in (output.all_input_nodes if output is not None else ()):
        state = walk.state.get(value)
        if isinstance(state, Rows):
            value.meta[OUTPUT_ROWS] = tuple(sorted(state.dims | state.pos))
        elif state is None and value.op != "placeholder":
            value.meta[OUTPUT_ROWS] = ()


def _random_rows(walk: Walk, gm: fx.GraphModule) -> None:
    """Which dimensions of each random op's value hold rows of the batch (``rows``), and
    those where the rows sit inside another dimension (``folded``: the draws place rows
    outermost only, :mod:`autopar.passes.random_draws`)."""
    table = {n.name: n for n in gm.graph.nodes}
    for site in gm.meta.get(RANDOM_SITES, []):
        node = table.get(site["node"])
        state = walk.state.get(node) if node is not None else None
        rows = state[0] if isinstance(state, tuple) and state else state
        if isinstance(rows, Rows):
            site["rows"] = sorted(rows.dims)
            site["folded"] = sorted(d for d, _ in rows.inner)


def _after_walk(walk: Walk, gm: fx.GraphModule) -> None:
    for node in walk.pairwise:
        check_pairwise(walk, node)
    _exempt_router_statistics(walk)
    for node in walk.counts:
        if node.name not in walk.statistics and not _offsets_only(node):
            walk.couple(node, "reduce", f"{ops.op_name(node)} counts rows of the batch, and the count is used "
                                        f"beyond a grouped matmul's offsets: each rank would count its own rows")
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    for value in (output.all_input_nodes if output is not None else ()):
        r = walk.rows(value)
        if r is not None and r.perm:
            walk.couple(sorted_at(value), "scan", "a sort along the batch puts rows in an order that reaches the "
                                                  "output: each rank would sort its own rows only")
    classify_reductions(walk)
    check_size_reads(walk)
    # a scalar output that sums over other dimensions than the batch (a stack of losses, a
    # statistic's entries) is not summed over the parts: its terms are weighed instead
    named = {name for name, _ in walk.loss_terms}
    output = next((n for n in walk.gm.graph.nodes if n.op == "output"), None)
    for value in (output.all_input_nodes if output is not None else ()):
        spec = value.meta.get(SPEC)
        if isinstance(spec, TensorSpec) and not spec.shape and value.name not in named and \
                bare_name(value) in ("sum", "nansum") and depends_on_batch(walk, value):
            walk.loss_terms.append((value.name, "mean"))
    # A routed MoE layer's dispatch (autopar.passes.analysis.experts: its tokens sorted by expert,
    # gathered, counted, run through their experts and put back in place) permutes the
    # layer's own rows; with dropless routing each row's output depends on that row alone,
    # so its sort, indexes and counts are not rows of the batch meeting (filtered above).


def _exempt_router_statistics(walk: Walk) -> None:
    """The routers' load-balancing statistics are the data pass's own (its
    ``sync_router_statistics`` makes each the mean over the data ranks): not couplings."""
    walk.statistics = set(router_statistics(walk.gm))
    walk.reductions = [(n, k) for n, k in walk.reductions if n.name not in walk.statistics]


def _offsets_only(node: fx.Node) -> bool:
    """Whether a count of rows per value (a histogram of expert ids) only makes a grouped
    matmul's group offsets (through cumsum and casts): organising the rank's own rows."""
    stack, seen, used = [node], set(), False
    while stack:
        n = stack.pop()
        for user in n.users:
            if user in seen:
                continue
            seen.add(user)
            name = bare_name(user)
            if name in ("grouped_mm_fallback", "_grouped_mm", "grouped_mm") and user.args and user.args[0] is not n:
                used = True
            elif name in ("cumsum", "to", "_to_copy", "int", "long", "contiguous", "clone", "detach"):
                stack.append(user)
            else:
                return False
    return used
