"""Attention written out in the graph, as context parallelism reads it.

A model may compute attention op by op instead of calling
``scaled_dot_product_attention`` (Hugging Face's eager attention, nanoGPT's manual path,
Gemma 2's soft-capped scores)::

    scores = q @ k^T                      an activation matmul [..., S, S]
    scores = f(scores, mask, bias, ...)   elementwise: scaling, soft-capping
                                          (tanh(scores / cap) * cap), an additive
                                          mask or bias, masked_fill, casts
    probs  = softmax(scores, dim=-1)      over the keys
    probs  = dropout(probs) / casts
    out    = probs @ v

Context parallelism runs such a core in the all-gather form (docs/context.md): each rank
keeps its queries' rows and gathers the keys and values of the whole sequence (the walk
of :mod:`.walk` does this op by op: the scores' matmul gathers the keys, the
probabilities' matmul the values, before a grouped-query repeat where the graph has one,
and a mask or bias held whole is cut to the rank's rows). Every row of the scores then holds every key, so each elementwise op, the
softmax over the keys and the product with the values are exactly the single device's
rows. A softmax that normalises the scores over another dimension (the queries'), or
probabilities that are not multiplied by values, cannot run on a rank's rows: the
planner refuses context parallelism for such a model, naming the node.

:func:`written_cores` finds the cores: every softmax whose input is an activation
matmul's square ``[..., S, S]`` output through elementwise ops and casts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch.fx as fx

from autopar.passes.analysis.batch_rows.op_tables import argument, bare_name, is_pointwise_name, shape_of
from autopar.passes.analysis.ops import is_activation_matmul, is_dropout, is_softmax

REGROUPS = {"view", "reshape", "_unsafe_view", "unsqueeze", "expand", "transpose", "permute", "contiguous", "clone",
            "broadcast_to", "t", "flatten", "unflatten"}
CASTS = {"to", "_to_copy", "type_as", "float", "double", "half", "bfloat16", "contiguous", "clone", "alias",
         "_assert_tensor_metadata"}
_DEPTH = 16


@dataclass(frozen=True)
class WrittenCore:
    """One written-out attention core: the scores' matmul ``q @ k^T``, the softmax, the
    probabilities' matmul ``probs @ v`` (None when there is none), the keys and values
    as gathered (before a grouped-query repeat in the graph); ``problem``: why context parallelism cannot run
    it on a rank's rows (None: it can); ``whole``: why it runs on the whole sequence
    instead, exact but unsplit (attention dropout)."""

    scores: fx.Node
    softmax: fx.Node
    out: fx.Node | None
    keys: fx.Node
    values: fx.Node | None
    seq: int
    problem: str | None = None
    whole: str | None = None


def _scores_matmul(x, seen: set) -> fx.Node | None:
    """The activation matmul ``x`` is computed from through elementwise ops and casts."""
    stack = [(x, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, fx.Node) or node in seen or depth > _DEPTH:
            continue
        seen.add(node)
        if is_activation_matmul(node) or (node.op == "call_function" and bare_name(node) in ("matmul", "bmm")
                                          and all(isinstance(a, fx.Node) and a.op != "get_attr"
                                                  for a in node.args[:2])):
            return node
        name = bare_name(node)
        if node.op not in ("call_function", "call_method") or not (is_pointwise_name(name) or name in CASTS):
            continue
        stack.extend((a, depth + 1) for a in node.all_input_nodes)
    return None


def _probabilities_matmul(softmax: fx.Node, gm: fx.GraphModule) -> tuple[fx.Node | None, str | None]:
    """The matmul ``probs @ v`` the softmax's output reaches through casts and dropout
    (the probabilities its first operand), and why the core runs on the whole sequence
    (dropout with p > 0 in training)."""
    stack, whole = [softmax], None
    for _ in range(_DEPTH):
        if not stack:
            break
        node = stack.pop()
        for user in node.users:
            name = bare_name(user)
            if name in ("matmul", "bmm") and user.args and user.args[0] is node:
                return user, whole
            if name in CASTS:
                stack.append(user)
            elif is_dropout(user, gm) or name in ("dropout", "native_dropout"):
                p = argument(user, 1, "p", 0.5) if user.op != "call_module" else gm.get_submodule(user.target).p
                train = user.kwargs.get("training", argument(user, 2, "train", True))
                if user.op == "call_module":
                    train = gm.get_submodule(user.target).training
                if p and train is not False:
                    whole = f"attention dropout p={p}"
                stack.append(user)
            elif name == "getitem" and user.args[1] == 0:   # native_dropout's output
                stack.append(user)
    return None, whole


def _unrepeated(value: fx.Node) -> fx.Node:
    """The smallest value ``value`` is a chain of views, transposes and expands of (each
    used only by the next): the key/value heads before a grouped-query repeat, which is
    what the rewrite gathers (:meth:`.meeting.Meetings.gather_unrepeated`)."""
    best, node = value, value
    while bare_name(node) in REGROUPS and len(node.users) == 1 and len(node.all_input_nodes) == 1 \
            and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
        if math.prod(shape_of(node) or (math.inf,)) < math.prod(shape_of(best) or (math.inf,)):
            best = node
    return best


def written_cores(gm: fx.GraphModule) -> list[WrittenCore]:
    """The written-out attention cores of ``gm`` (the module docstring), in graph order."""
    out = []
    for node in gm.graph.nodes:
        if not (is_softmax(node) or (node.op == "call_function" and bare_name(node) in ("softmax", "_softmax",
                                                                                          "_safe_softmax"))):
            continue
        shape = shape_of(node)
        if shape is None or len(shape) < 2 or shape[-1] != shape[-2] or shape[-1] < 2:
            continue
        scores = _scores_matmul(node.args[0] if node.args else None, set())
        if scores is None or shape_of(scores) is None or tuple(shape_of(scores)[-2:]) != tuple(shape[-2:]):
            continue
        seq = shape[-1]
        dim = argument(node, 1, "dim", None)
        probs_mm, whole = _probabilities_matmul(node, gm)
        values = probs_mm.args[1] if probs_mm is not None else None
        problem = None
        if not isinstance(dim, int) or dim % len(shape) != len(shape) - 1:
            problem = (f"normalises the scores over dimension {dim} (the queries'), not over the keys (the last); "
                       f"a rank holding its queries' rows cannot compute it without every row")
        elif probs_mm is None:
            problem = "its probabilities are not multiplied by values (no `probs @ v` after the softmax)"
        elif (shape_of(values) or (None, None))[-2] != seq:
            problem = "its values are not as long as the keys"
        out.append(WrittenCore(scores, node, probs_mm, _unrepeated(scores.args[1]),
                               values if values is None else _unrepeated(values), seq, problem, whole))
    return out
