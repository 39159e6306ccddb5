"""Where rows of the batch meet, made exact over the data ranks: the couplings the
batch-rows analysis found (:func:`sync_batch_couplings`: pairwise scores gathered, batch
statistics and masked means averaged over the ranks) and the routers' load-balancing
statistics (:func:`sync_router_statistics`)."""
from __future__ import annotations

import logging
import operator

import torch.fx as fx

from autopar.ir import CAPTURE, SPEC, TensorSpec
from autopar.passes.analysis.batch_rows import couplings
from autopar.passes.analysis.experts import router_statistics
from autopar.runtime import collectives
from autopar.strategies.data.outputs import DataParallelError

log = logging.getLogger("autopar.strategies.data.rewrite")   # the data pass's log, whichever part writes


def sync_router_statistics(gm: fx.GraphModule, group: str, microbatches: int = 1) -> list[str]:
    """Make the statistics a mixture of experts' load-balancing loss reduces over the
    tokens (:func:`autopar.passes.analysis.experts.router_statistics`) the whole batch's: each
    becomes its mean over the data ranks (:func:`autopar.runtime.collectives.batch_statistic`),
    so the auxiliary loss and its gradients equal the single-device model's. With
    gradient accumulation the statistics are each microbatch's (as Megatron-LM computes
    them), which differs from one pass over the whole batch: a warning says so. Returns
    the nodes synchronised."""
    names = router_statistics(gm)
    if not names:
        return names
    if microbatches > 1:
        log.warning("the routers' load-balancing statistics %s are computed per microbatch of %d (gradient "
                    "accumulation or a pipeline), not over the whole batch: the auxiliary loss differs from one "
                    "pass over the batch", names, microbatches)
    table = {n.name: n for n in gm.graph.nodes}
    for name in names:
        node = table[name]
        with gm.graph.inserting_after(node):
            synced = gm.graph.call_function(collectives.batch_statistic, (node, group))
        synced.meta[SPEC] = node.meta.get(SPEC)
        node.replace_all_uses_with(synced, delete_user_cb=lambda user: user is not synced)
    return names


def sync_batch_couplings(gm: fx.GraphModule, group: str, local_batch: int, degree: int,
                         planned: list | None = None) -> list[str]:
    """Make every node where rows of the batch meet (:mod:`autopar.passes.analysis.batch_rows`,
    found on this rank's graph) compute what the single device computes, with the data
    ranks of ``group`` holding the batch's parts:

    * a pairwise score ``a @ b.T`` becomes this rank's rows against every row
      (``a_r @ gather_rows(b).T``) and, where a reader transposes it, every row against this
      rank's (``gather_rows(a) @ b_r.T``, transposed), the pointwise ops between replayed on
      both; row positions its cross-entropy reads as targets are offset by the rank's first
      row (:func:`~autopar.runtime.collectives.gather_rows`, ``global_rows``);
    * a mean over the batch inside the model becomes the mean over the ranks of each rank's
      (``batch_statistic``, forward and backward); a sum, that times the degree;
    * a masked mean's numerator and denominator both become their means over the ranks.

    ``planned``: the couplings the plan was made with (JSON dicts); each with a remedy must
    be found here, and none without one may be (:class:`DataParallelError` otherwise).
    Returns the names of the nodes rewritten."""
    found = {c.node: c for c in couplings(gm)}
    if planned is not None:   # the plan's (found on the whole batch) decide; this graph must hold them
        with_loss = gm.meta[CAPTURE].with_loss if CAPTURE in gm.meta else True
        names = {n.name for n in gm.graph.nodes}
        for c in planned:
            if not with_loss and c["node"] not in names:
                continue   # in the loss, which a forward program does not compute
            if c.get("remedy") and (c["node"] not in found or found[c["node"]].kind != c["kind"]):
                raise DataParallelError(
                    f"the plan makes {c['node']} ({c['kind']}, module {c.get('module') or '?'}) exact over the data "
                    f"ranks, and this rank's graph (at {local_batch} rows) has no such node; re-plan, or use "
                    f"strategy={{'data': 1}}")
        kept = {c["node"] for c in planned}
        extra = [c for name, c in found.items() if name not in kept]
        if extra:
            log.warning("data parallel: at its %d rows this rank's graph shows rows meeting at %s, which the plan "
                        "(made on the whole batch) does not; the plan's reading is kept", local_batch,
                        ", ".join(c.node for c in extra))
        found = {name: c for name, c in found.items() if name in kept}
    refused = [c for c in found.values() if not c.exact]
    if refused:
        raise DataParallelError(f"rows of the batch meet at {refused[0].describe()}; data parallelism would not equal "
                                f"the single device")
    table = {n.name: n for n in gm.graph.nodes}
    done = []
    for c in found.values():
        if c.kind == "pairwise":
            _gather_pairwise(gm, table, c, group, local_batch, degree)
        elif c.kind in ("batch_mean", "batch_sum"):
            _batch_statistic(gm, table[c.node], group, degree if c.kind == "batch_sum" else 1)
        elif c.kind == "masked_mean":
            for part in (c.details["numerator"], c.details["denominator"]):
                _batch_statistic(gm, table[part], group, 1)
        else:
            raise DataParallelError(f"{c.describe()}: no rewrite for a coupling of kind {c.kind!r}")
        done.append(c.node)
    return done


def _batch_statistic(gm: fx.GraphModule, node: fx.Node, group: str, scale: int) -> None:
    with gm.graph.inserting_after(node):
        synced = gm.graph.call_function(collectives.batch_statistic, (node, group))
    synced.meta[SPEC] = node.meta.get(SPEC)
    last = synced
    if scale != 1:
        with gm.graph.inserting_after(synced):
            last = gm.graph.call_function(operator.mul, (synced, scale))
        last.meta[SPEC] = node.meta.get(SPEC)
    node.replace_all_uses_with(last, delete_user_cb=lambda user: user is not synced)


def _gather_pairwise(gm: fx.GraphModule, table: dict, c, group: str, local_batch: int, degree: int) -> None:
    """See :func:`sync_batch_couplings`. Every value of the scores' chain gets two forms:
    ``rows[x]``, this rank's rows of it against every row (what its readers take), and
    ``cols[x]``, every row against this rank's (a transpose's rows); a transpose swaps them."""
    graph = gm.graph
    score = table[c.node]
    a, src = table[c.details["rows"]], table[c.details["columns"]]
    chain = [table[n] for n in dict.fromkeys(c.details["chain"])]
    transposes = set(c.details["transposes"])
    order = {n: i for i, n in enumerate(graph.nodes)}
    chain.sort(key=order.__getitem__)
    members = set(chain)

    def spec_with(node: fx.Node, rows: int, cols: int):
        spec = node.meta.get(SPEC)
        return TensorSpec((rows, cols), spec.dtype) if isinstance(spec, TensorSpec) else spec

    with graph.inserting_before(score):
        gathered_a = graph.call_function(collectives.gather_rows, (a, group))
        gathered_b = graph.call_function(collectives.gather_rows, (src, group))
        env = {src: gathered_b}
        for name in c.details["columns_path"]:   # the right operand's casts and transpose, on every row
            step = table[name]
            env[step] = graph.node_copy(step, lambda x: env.get(x, x))
        right = env.get(score.args[1], gathered_b)
        whole = local_batch * degree
        for node, source in ((gathered_a, a), (gathered_b, src)):
            spec = source.meta.get(SPEC)
            node.meta[SPEC] = TensorSpec((whole, *spec.shape[1:]), spec.dtype) if isinstance(spec, TensorSpec) else spec
    rows, cols = {}, {}
    with graph.inserting_after(score):
        rows[score] = graph.call_function(score.target, (score.args[0], right, *score.args[2:]), dict(score.kwargs))
        rows[score].meta[SPEC] = spec_with(score, local_batch, whole)
    with graph.inserting_after(rows[score]):
        cols[score] = graph.call_function(score.target, (gathered_a, score.args[1], *score.args[2:]),
                                          dict(score.kwargs))
        cols[score].meta[SPEC] = spec_with(score, whole, local_batch)
    for node in chain:
        if node is score:
            continue
        for form, other, flip in ((rows, cols, node.name in transposes), (cols, rows, node.name in transposes)):
            pick = (other if flip else form)
            with graph.inserting_after(node):
                new = graph.node_copy(node, lambda x: pick[x] if x in members else x)
            form[node] = new
        rows[node].meta[SPEC] = spec_with(node, local_batch, whole)
        cols[node].meta[SPEC] = spec_with(node, whole, local_batch)
    # readers outside the chain take this rank's rows; targets counted on the share become the batch's
    offsets = set(c.details.get("offset_targets", []))
    for node in chain:
        for user in list(node.users):
            if user in members or user in rows.values() or user in cols.values():
                continue
            user.replace_input_with(node, rows[node])
            target = user.args[1] if len(user.args) > 1 else user.kwargs.get("target")
            if isinstance(target, fx.Node) and target.name in offsets:
                with graph.inserting_before(user):
                    placed = graph.call_function(collectives.global_rows, (target, local_batch, group))
                placed.meta[SPEC] = target.meta.get(SPEC)
                user.replace_input_with(target, placed)
    for node in reversed(chain):   # the single-device chain on this rank's rows alone: unread now
        if not node.users:
            graph.erase_node(node)
    for form in (cols, rows):
        for node in reversed(list(form.values())):
            if not node.users:
                graph.erase_node(node)
