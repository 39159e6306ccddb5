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
"""
from __future__ import annotations

import inspect
import math
import logging
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar._torch_compat import argument_names, is_aten_op
from autopar.ir import CAPTURE, LOSS_REDUCTION, SPEC, TensorSpec
from autopar.passes.analysis import ops
from autopar.runtime import collectives as C
from autopar.runtime.target_count import TARGET_COUNT, global_mean

log = logging.getLogger("autopar.strategies.data.rewrite")


class DataParallelError(ValueError):
    pass


_REDUCTION_ENUM = {0: "none", 1: "mean", 2: "sum"}  # aten's loss reduction argument
_SUM = {torch.sum} | ops._targets("sum")
_MEAN = {torch.mean} | ops._targets("mean")


def loss_reduction(node: fx.Node) -> str:
    """How the scalar ``node`` reduces over the batch: ``"sum"`` or ``"mean"`` (the
    assumption when it cannot be read off the graph: losses are means by default). A
    :func:`global_mean` is a sum: its parts on the ranks add up to the mean."""
    if node.op == "call_function" and node.target is global_mean:
        return "sum"
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


_ROW_WISE = ("to", "_to_copy", "linear", "softmax", "_softmax", "float", "contiguous", "alias", "clone", "detach",
             "type_as", "view", "reshape", "_unsafe_view")


def batch_major_rows(node: fx.Node, local_batch: int) -> bool:
    """Whether ``node``'s rows are the batch's, batch-major: ``[local_batch · n, ...]``
    made by row-wise ops (casts, a linear, a softmax over the last dimension) from a view
    that merged the leading dimensions ``[local_batch, n, ...]`` (a router's logits over
    every token, ``gate(hidden.view(-1, H))``): gathered over the data ranks along the
    rows, they are the single-device value. A pipeline stage's input carries what
    :func:`mark_batch_major_rows` found on the whole graph."""
    for _ in range(16):
        if node.meta.get(BATCH_MAJOR_ROWS):
            return True
        spec = node.meta.get(SPEC)
        if node.op == "call_module":   # a traced nn.Linear (symbolic tracing keeps the module)
            module = node.graph.owning_module.get_submodule(node.target)
            name = "linear" if isinstance(module, nn.Linear) else type(module).__name__
        else:
            name = ops.call_name(node)
        if not isinstance(spec, TensorSpec) or not spec.shape or name not in _ROW_WISE or not node.args \
                or not isinstance(node.args[0], fx.Node):
            return False
        if name == "softmax" or name == "_softmax":
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            if dim not in (-1, len(spec.shape) - 1):
                return False
        source = node.args[0].meta.get(SPEC)
        if not isinstance(source, TensorSpec) or not source.shape:
            return False
        if name in ("view", "reshape", "_unsafe_view") and source.shape[0] != spec.shape[0]:
            leading = [math.prod(source.shape[:j]) for j in range(2, len(source.shape) + 1)]
            return source.shape[0] == local_batch and spec.shape[0] in leading
        if source.shape[0] != spec.shape[0]:
            return False
        node = node.args[0]
    return False


BATCH_MAJOR_ROWS = "autopar_batch_major_rows"


def mark_batch_major_rows(gm: fx.GraphModule, local_batch: int) -> None:
    """Mark the nodes whose rows are the batch's (:func:`batch_major_rows`) on a whole
    graph, before a pipeline cuts it: a later stage receives such a value as an input,
    whose producer it cannot see."""
    for node in gm.graph.nodes:
        spec = node.meta.get(SPEC)
        if isinstance(spec, TensorSpec) and spec.shape and spec.shape[0] != local_batch \
                and batch_major_rows(node, local_batch):
            node.meta[BATCH_MAJOR_ROWS] = True


def sync_router_statistics(gm: fx.GraphModule, group: str, microbatches: int = 1) -> list[str]:
    """Make the statistics a mixture of experts' load-balancing loss reduces over the
    tokens (:func:`autopar.passes.analysis.experts.router_statistics`) the whole batch's: each
    becomes its mean over the data ranks (:func:`autopar.runtime.collectives.batch_statistic`),
    so the auxiliary loss and its gradients equal the single-device model's. With
    gradient accumulation the statistics are each microbatch's (as Megatron-LM computes
    them), which differs from one pass over the whole batch: a warning says so. Returns
    the nodes synchronised."""
    from autopar.passes.analysis.experts import router_statistics
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
            synced = gm.graph.call_function(C.batch_statistic, (node, group))
        synced.meta[SPEC] = node.meta.get(SPEC)
        node.replace_all_uses_with(synced, delete_user_cb=lambda user: user is not synced)
    return names


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
    from autopar.passes.analysis.batch_rows import couplings
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
        synced = gm.graph.call_function(C.batch_statistic, (node, group))
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
        gathered_a = graph.call_function(C.gather_rows, (a, group))
        gathered_b = graph.call_function(C.gather_rows, (src, group))
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
                    placed = graph.call_function(C.global_rows, (target, local_batch, group))
                placed.meta[SPEC] = target.meta.get(SPEC)
                user.replace_input_with(target, placed)
    for node in reversed(chain):   # the single-device chain on this rank's rows alone: unread now
        if not node.users:
            graph.erase_node(node)
    for form in (cols, rows):
        for node in reversed(list(form.values())):
            if not node.users:
                graph.erase_node(node)


_MEAN_LOSSES = {F.cross_entropy, F.nll_loss, C.vocab_parallel_cross_entropy} | \
    ops._targets("cross_entropy_loss", "nll_loss", "nll_loss_nd")
_MEAN_LOSS_MODULES = (nn.CrossEntropyLoss, nn.NLLLoss)


def _loss_arguments(node: fx.Node, gm: fx.GraphModule) -> dict | None:
    """A cross-entropy or NLL loss's arguments by name (defaults filled in), or None."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        if type(module) not in _MEAN_LOSS_MODULES or len(node.args) + len(node.kwargs) != 2:
            return None
        values = dict(zip(("input", "target"), node.args), **node.kwargs)
        return {**values, "weight": module.weight, "ignore_index": module.ignore_index,
                "reduction": module.reduction, "label_smoothing": getattr(module, "label_smoothing", 0.0)}
    if node.op != "call_function" or node.target not in _MEAN_LOSSES:
        return None
    try:
        if is_aten_op(node.target):
            names = ["input"] + argument_names(node.target)[1:]
            values = dict(zip(names, node.args), **node.kwargs)
            defaults = {"weight": None, "reduction": 1, "ignore_index": -100, "label_smoothing": 0.0}
            return {**defaults, **values}
        bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    values = dict(bound.arguments)
    if node.target is C.vocab_parallel_cross_entropy:
        values["input"] = values.pop("logits_shard")
    return values


def _set_sum_reduction(node: fx.Node, gm: fx.GraphModule) -> fx.Node:
    """Make the loss ``node`` sum over its targets instead of averaging; returns the
    node that now computes it (a module call becomes the functional call)."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        function = F.cross_entropy if isinstance(module, nn.CrossEntropyLoss) else F.nll_loss
        extra = {"label_smoothing": module.label_smoothing} if function is F.cross_entropy and \
            module.label_smoothing else {}
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(function, (*node.args,), {**node.kwargs, "ignore_index": module.ignore_index,
                                                                   "reduction": "sum", **extra})
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        return new
    summed = 2 if is_aten_op(node.target) else "sum"
    names = argument_names(node.target) if is_aten_op(node.target) else list(inspect.signature(node.target).parameters)
    position = names.index("reduction")
    if "reduction" not in node.kwargs and position < len(node.args):
        node.args = node.args[:position] + (summed,) + node.args[position + 1:]
    else:
        node.kwargs = {**node.kwargs, "reduction": summed}
    return node


def _target_count_program(gm: fx.GraphModule, target: fx.Node, ignore_index: int) -> fx.GraphModule | None:
    """A program computing, from the graph inputs ``target`` is derived from, how many of
    its targets are not ``ignore_index``; None when the targets depend on anything else
    (a parameter, a module, a value carried from another pipeline stage)."""
    inputs = set(gm.meta[CAPTURE].input_names) if CAPTURE in gm.meta else None
    needed, stack = set(), [target]
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        stack.extend(n.all_input_nodes)
    for n in needed:
        if n.op == "call_module" or (n.op == "placeholder" and inputs is not None and n.name not in inputs):
            return None
        if n.op == "get_attr" and isinstance(getattr(gm, n.target, None), nn.Parameter):
            return None
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in gm.graph.nodes:
        if n in needed:
            env[n] = graph.node_copy(n, lambda a: env[a])
    counted = graph.call_function(torch.ne, (env[target], ignore_index))
    graph.output(graph.call_function(torch.sum, (counted,)))
    return fx.GraphModule(gm, graph, class_name="TargetCount")


def _positions(node: fx.Node) -> bool:
    """Whether ``node`` is an ``arange`` (cast, viewed, offset to the batch's rows)."""
    from autopar.passes.analysis.batch_rows import bare_positions
    if node.op == "call_function" and node.target is C.global_rows:
        node = node.args[0]
    return bare_positions(node)


def _counted_losses(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node, int]]:
    """The graph's output losses that average over their counted targets: (loss, target,
    ignore_index) for each (see :func:`global_mean_losses`)."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    found = []
    for value in output.all_input_nodes:
        arguments = _loss_arguments(value, gm)
        if arguments is None or set(value.users) != {output}:
            continue
        target = arguments.get("target")
        spec = target.meta.get(SPEC) if isinstance(target, fx.Node) else None
        if arguments.get("reduction") not in ("mean", 1) or arguments.get("weight") is not None or \
                arguments.get("size_average") is not None or arguments.get("reduce") is not None or \
                not isinstance(spec, TensorSpec) or spec.dtype.is_floating_point:
            continue  # a sum, class weights, legacy flags or probability targets: no count to share
        found.append((value, target, int(arguments.get("ignore_index", -100))))
    return found


def counts_targets(gm: fx.GraphModule) -> bool:
    """Whether a plan that splits the batch counts the targets over its ranks each step
    (:func:`global_mean_losses` would rewrite a loss: one small all-reduce per step)."""
    found = _counted_losses(gm)
    return bool(found) and _target_count_program(gm, found[0][1], found[0][2]) is not None


def global_mean_losses(gm: fx.GraphModule) -> int:
    """Rewrite the graph's output loss that averages over its counted targets (a
    cross-entropy or NLL over class indices, ``reduction="mean"``, no class weights,
    read only by the output) into ``global_mean(the same loss summed)``, and record under
    :data:`TARGET_COUNT` the program counting its targets from the graph inputs. Returns
    how many losses were rewritten (0 or 1: a second one would need a count of its own
    and is left as it is, with a warning)."""
    found = _counted_losses(gm)
    if len(found) > 1:
        log.warning("data parallel: %d outputs average over their targets (%s); only the first is averaged over the "
                    "whole batch, the others per rank", len(found), ", ".join(v.name for v, _, _ in found))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    for value, target, ignore_index in found[:1]:
        program = _target_count_program(gm, target, ignore_index)
        if program is None and _positions(target):
            return 0   # targets arange(rows): none is ignored, every rank counts its rows
        if program is None:
            log.warning("data parallel: the targets of %s are not computed from the graph inputs alone; it is "
                        "averaged per rank, which equals the single-device mean only if every rank counts as many "
                        "targets", value.format_node())
            return 0
        loss = _set_sum_reduction(value, gm)
        with gm.graph.inserting_after(loss):
            mean = gm.graph.call_function(global_mean, (loss,))
        mean.meta.update({k: v for k, v in loss.meta.items() if k == SPEC})
        output.replace_input_with(loss, mean)
        gm.meta[TARGET_COUNT] = program
        return 1
    return 0


def output_reduction(gm: fx.GraphModule, node: fx.Node, terms: list | None = None) -> str:
    """How the scalar output ``node`` reduces over the parts of the batch: ``"sum"`` where
    it is a sum over the batch itself (a loss term of that kind, or a share of a counted
    mean), else ``"mean"`` (a mean, a loss already the whole batch's on every rank, or a
    sum over other dimensions of terms weighed by :func:`weigh_summed_terms`). Without the
    analysis's terms, :func:`loss_reduction` reads the node alone."""
    from autopar.ir import LOSS_TERMS
    terms = terms if terms is not None else gm.meta.get(LOSS_TERMS)
    if node.op == "call_function" and node.target is global_mean:
        return "sum"
    kinds = dict((name, kind) for name, kind in (terms or []))
    return kinds.get(node.name, loss_reduction(node))


def weigh_summed_terms(gm: fx.GraphModule, parts: int, terms: list | None = None) -> list[str]:
    """A loss the data pass averages over the ``parts`` of the batch (ranks, microbatches)
    that holds sums over the batch (``mse_loss(reduction="sum") / 7``, a mean plus a summed
    penalty): each sum term is multiplied by ``parts``, so that the parts' average of
    ``mean_r + parts · sum_r`` is the single device's ``mean + sum`` (its gradients too).
    A loss that is a sum alone and that the data pass reads as one (:func:`loss_reduction`)
    is summed over the parts already and left as it is. Returns the terms weighed."""
    from autopar.ir import LOSS_TERMS
    terms = terms if terms is not None else (gm.meta.get(LOSS_TERMS) or [])
    output = next(n for n in gm.graph.nodes if n.op == "output")
    scalars = [v for v in output.all_input_nodes if isinstance(v.meta.get(SPEC), TensorSpec) and not v.meta[SPEC].shape]
    if not scalars or output_reduction(gm, scalars[0], terms) == "sum" or parts == 1:
        return []
    table = {n.name: n for n in gm.graph.nodes}
    weighed = []
    for name, kind in terms:
        node = table.get(name)
        if kind != "sum" or node is None:
            continue
        with gm.graph.inserting_after(node):
            scaled = gm.graph.call_function(operator.mul, (node, float(parts)))
        scaled.meta[SPEC] = node.meta.get(SPEC)
        node.replace_all_uses_with(scaled, delete_user_cb=lambda user: user is not scaled)
        weighed.append(name)
    return weighed


def data_parallel_pass(gm: fx.GraphModule, *, degree: int, local_batch: int, group: str = "data",
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
    global_mean_losses(gm)
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
    output = next(n for n in gm.graph.nodes if n.op == "output")
    for value in list(output.all_input_nodes):
        spec = value.meta.get(SPEC)
        if not isinstance(spec, TensorSpec):
            continue
        with gm.graph.inserting_before(output):
            if spec.shape and (spec.shape[0] == local_batch or batch_major_rows(value, local_batch)):
                new = gm.graph.call_function(C.all_gather_batch, (value, group))
            elif not spec.shape:
                reduction = output_reduction(gm, value, loss_terms)
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
