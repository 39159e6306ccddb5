"""What splitting the batch does at a graph's outputs, as the families that split it read
it: how a scalar output reduces over the parts of the batch (:func:`loss_reduction`,
:func:`output_reduction`) and which values hold the batch's rows batch-major
(:func:`batch_major_rows`, marked on a whole graph before a pipeline cuts it by
:func:`mark_batch_major_rows`). The data pass gathers and reduces the outputs with them
(:mod:`autopar.strategies.data.outputs`), a pipeline's last stage reads its loss's
reduction with them (:mod:`autopar.strategies.pipeline.program`), and the loss rules
(:mod:`.losses`) weigh the summed terms by them."""
from __future__ import annotations

import math

import torch
import torch.fx as fx
import torch.nn as nn

from autopar._torch_compat import argument_names
from autopar.ir import LOSS_TERMS, SPEC, TensorSpec
from autopar.passes.analysis import ops
from autopar.runtime import collectives
from autopar.runtime.target_count import global_mean


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
        if reduction is None and node.target is collectives.vocab_parallel_cross_entropy and len(node.args) > 5:
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


def output_reduction(gm: fx.GraphModule, node: fx.Node, terms: list | None = None) -> str:
    """How the scalar output ``node`` reduces over the parts of the batch: ``"sum"`` where
    it is a sum over the batch itself (a loss term of that kind, or a share of a counted
    mean), else ``"mean"`` (a mean, a loss already the whole batch's on every rank, or a
    sum over other dimensions of terms weighed by
    :func:`~autopar.strategies.shared.losses.weigh_summed_terms`). Without the analysis's
    terms, :func:`loss_reduction` reads the node alone."""
    terms = terms if terms is not None else gm.meta.get(LOSS_TERMS)
    if node.op == "call_function" and node.target is global_mean:
        return "sum"
    kinds = dict((name, kind) for name, kind in (terms or []))
    return kinds.get(node.name, loss_reduction(node))
