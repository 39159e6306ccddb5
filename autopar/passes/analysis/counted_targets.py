"""Which losses of a graph average over counted targets, and the program that counts
them (:mod:`autopar.runtime.target_count`): a cross-entropy or NLL over class indices
with ``reduction="mean"``, no class weights, read only by the output. The data-parallel
pass rewrites such a loss into each part's share of the whole batch's mean
(``autopar.strategies.shared.losses.global_mean_losses``); the planner prices the count's
all-reduce (:func:`counts_targets`)."""
from __future__ import annotations

import operator

import inspect

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar._torch_compat import argument_names, is_aten_op
from autopar.ir import CAPTURE, SPEC, TensorSpec
from autopar.passes.analysis import ops
from autopar.passes.analysis.batch_rows import bare_positions
from autopar.runtime import collectives


_MEAN_LOSSES = {F.cross_entropy, F.nll_loss, collectives.vocab_parallel_cross_entropy} | \
    ops._targets("cross_entropy_loss", "nll_loss", "nll_loss_nd")
_MEAN_LOSS_MODULES = (nn.CrossEntropyLoss, nn.NLLLoss)


def loss_arguments(node: fx.Node, gm: fx.GraphModule) -> dict | None:
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


def target_count_program(gm: fx.GraphModule, target: fx.Node, ignore_index: int) -> fx.GraphModule | None:
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


def row_positions(node: fx.Node) -> bool:
    """Whether ``node`` is an ``arange`` (cast, viewed, offset to the batch's rows)."""
    if node.op == "call_function" and node.target is collectives.global_rows:
        node = node.args[0]
    return bare_positions(node)


_SCALAR_LINEAR = {operator.add, operator.sub, operator.mul, operator.truediv, operator.neg}


def loss_term_path(value: fx.Node, output: fx.Node) -> bool:
    """Whether the scalar ``value`` reaches ``output`` only through sums, differences and
    scalings by numbers (``ce + 0.1 * penalty``, ``(ce_a + ce_b) / 2``): a term of the loss."""
    node = value
    for _ in range(16):
        users = list(node.users)
        if len(users) != 1:
            return False
        user = users[0]
        if user is output:
            return node is not value
        if user.op != "call_function" or user.target not in _SCALAR_LINEAR:
            return False
        if user.target in (operator.mul, operator.truediv) and any(isinstance(a, fx.Node) for a in user.args
                                                                    if a is not node):
            return False   # scaled by a tensor: not linear in this term alone
        if user.target is operator.truediv and user.args[0] is not node:
            return False
        node = user
    return False


def counted_losses(gm: fx.GraphModule, terms: bool = False) -> list[tuple[fx.Node, fx.Node, int]]:
    """The graph's output losses that average over their counted targets: (loss, target,
    ignore_index) for each (see ``autopar.strategies.shared.losses.global_mean_losses``);
    with ``terms``, also such losses summed or scaled into the output
    (:func:`loss_term_path`), after the outputs themselves."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    found = []
    candidates = list(output.all_input_nodes)
    if terms:
        candidates += [n for n in gm.graph.nodes if n not in candidates and n.op in ("call_function", "call_module")
                       and loss_term_path(n, output)]
    for value in candidates:
        arguments = loss_arguments(value, gm)
        if arguments is None or (set(value.users) != {output} and not (terms and loss_term_path(value, output))):
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
    (the data-parallel pass would rewrite a loss: one small all-reduce per step)."""
    found = counted_losses(gm)
    return bool(found) and target_count_program(gm, found[0][1], found[0][2]) is not None
