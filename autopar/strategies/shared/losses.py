"""The loss under a split batch: a mean over counted targets becomes each part's share of
the whole batch's mean (:func:`global_mean_losses`; which losses count, and the count
itself, are read by :mod:`autopar.passes.analysis.counted_targets`), and the sums over the
batch a mean loss holds are weighed by the number of parts (:func:`weigh_summed_terms`).
The rules every family that splits the batch's rows or tokens applies to the loss: the
data pass (:mod:`autopar.strategies.data.rewrite`) and context parallelism's
(:mod:`autopar.strategies.context.rewrite`; its meeting points,
:mod:`autopar.strategies.context.meeting`, make a counted mean the ranks' sums over their
counts with :func:`set_sum_reduction`)."""
from __future__ import annotations

import inspect
import logging
import operator

import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar._torch_compat import argument_names, is_aten_op
from autopar.ir import LOSS_TERMS, SPEC, TensorSpec
from autopar.passes.analysis.counted_targets import counted_losses, row_positions, target_count_program
from autopar.runtime.target_count import TARGET_COUNT, global_mean
from autopar.strategies.shared.outputs import output_reduction

log = logging.getLogger("autopar.strategies.data.rewrite")   # the data pass's log, whichever part writes


def set_sum_reduction(node: fx.Node, gm: fx.GraphModule) -> fx.Node:
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


def global_mean_losses(gm: fx.GraphModule, parts: int | None = None) -> int:
    """Rewrite the graph's output loss that averages over its counted targets (a
    cross-entropy or NLL over class indices, ``reduction="mean"``, no class weights,
    read only by the output) into ``global_mean(the same loss summed)``, and record under
    :data:`TARGET_COUNT` the program counting its targets from the graph inputs. With
    ``parts`` (the parts the batch is split into, whose losses are averaged), such a loss
    that is a term of the output (``ce + 0.1 * penalty``) becomes ``parts ·
    global_mean(...)``: the parts' average of the output then holds the whole batch's
    mean. Returns how many losses were rewritten (0 or 1: a second one would need a count
    of its own and is left as it is, with a warning)."""
    found = counted_losses(gm, terms=parts is not None)
    if len(found) > 1:
        log.warning("data parallel: %d outputs average over their targets (%s); only the first is averaged over the "
                    "whole batch, the others per rank", len(found), ", ".join(v.name for v, _, _ in found))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    for value, target, ignore_index in found[:1]:
        program = target_count_program(gm, target, ignore_index)
        if program is None and row_positions(target):
            return 0   # targets arange(rows): none is ignored, every rank counts its rows
        if program is None:
            log.warning("data parallel: the targets of %s are not computed from the graph inputs alone; it is "
                        "averaged per rank, which equals the single-device mean only if every rank counts as many "
                        "targets", value.format_node())
            return 0
        term = value not in output.all_input_nodes
        loss = set_sum_reduction(value, gm)
        with gm.graph.inserting_after(loss):
            mean = gm.graph.call_function(global_mean, (loss,))
        with gm.graph.inserting_after(mean):
            share = gm.graph.call_function(operator.mul, (mean, float(parts))) if term else mean
        mean.meta.update({k: v for k, v in loss.meta.items() if k == SPEC})
        share.meta.update({k: v for k, v in loss.meta.items() if k == SPEC})
        if term:
            loss.replace_all_uses_with(share, delete_user_cb=lambda user: user is not mean)
        else:
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
    (:func:`~autopar.strategies.shared.outputs.loss_reduction`) is summed over the parts
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
