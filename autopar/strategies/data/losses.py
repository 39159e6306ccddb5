"""The loss under a split batch: a mean over counted targets becomes each part's share of
the whole batch's mean (:func:`global_mean_losses`, whose count
:func:`counts_targets` says a plan pays for), and the sums over the batch a mean loss holds
are weighed by the number of parts (:func:`weigh_summed_terms`)."""
from __future__ import annotations

import inspect
import logging
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar._torch_compat import argument_names, is_aten_op
from autopar.ir import CAPTURE, LOSS_TERMS, SPEC, TensorSpec
from autopar.passes.analysis import ops
from autopar.passes.analysis.batch_rows import bare_positions
from autopar.runtime import collectives
from autopar.runtime.target_count import TARGET_COUNT, global_mean
from autopar.strategies.data.outputs import output_reduction

log = logging.getLogger("autopar.strategies.data.rewrite")   # the data pass's log, whichever part writes


_MEAN_LOSSES = {F.cross_entropy, F.nll_loss, collectives.vocab_parallel_cross_entropy} | \
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
    if node.target is collectives.vocab_parallel_cross_entropy:
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
    if node.op == "call_function" and node.target is collectives.global_rows:
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


def weigh_summed_terms(gm: fx.GraphModule, parts: int, terms: list | None = None) -> list[str]:
    """A loss the data pass averages over the ``parts`` of the batch (ranks, microbatches)
    that holds sums over the batch (``mse_loss(reduction="sum") / 7``, a mean plus a summed
    penalty): each sum term is multiplied by ``parts``, so that the parts' average of
    ``mean_r + parts · sum_r`` is the single device's ``mean + sum`` (its gradients too).
    A loss that is a sum alone and that the data pass reads as one
    (:func:`~autopar.strategies.data.outputs.loss_reduction`) is summed over the parts
    already and left as it is. Returns the terms weighed."""
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
