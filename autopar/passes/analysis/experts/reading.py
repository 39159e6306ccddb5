"""Small readers of the captured graph the experts analysis shares: a ``topk``, the score
function a router applies, the nodes near a node, the nodes between two."""
from __future__ import annotations

from collections import deque

import torch
import torch.fx as fx

from autopar.passes.analysis.ops import call_name

_TOPK = {torch.topk}
_SCORES = {torch.softmax: "softmax", torch.nn.functional.softmax: "softmax", torch.sigmoid: "sigmoid",
           torch.nn.functional.sigmoid: "sigmoid"}
PASS_THROUGH = ("to", "_to_copy", "view", "reshape", "_unsafe_view", "float", "type_as", "contiguous", "clone")


def is_topk(node: fx.Node) -> bool:
    """Whether ``node`` is a ``topk`` (the router's pick of experts)."""
    return node.op in ("call_function", "call_method") and (node.target in _TOPK or call_name(node) == "topk")


def score_kind(node: fx.Node) -> str | None:
    """The score function ``node`` applies (``"softmax"``, ``"sigmoid"``), or None."""
    if node.op not in ("call_function", "call_method"):
        return None
    return _SCORES.get(node.target) or {"softmax": "softmax", "_softmax": "softmax", "sigmoid": "sigmoid"}.get(
        call_name(node))


def nearest(start: fx.Node, limit: int, forward: bool = False):
    """``start``'s producers (``forward``: its readers), nearest first: breadth first, at
    most ``limit`` nodes."""
    seen, queue = {start}, deque([start])
    while queue and len(seen) < limit:
        node = queue.popleft()
        for other in (node.users if forward else node.all_input_nodes):
            if other not in seen:
                seen.add(other)
                queue.append(other)
                yield other


def between(first: fx.Node, last: fx.Node, order: dict) -> set[fx.Node]:
    """The nodes on a path from ``first`` to ``last`` (both included). Such a node comes
    after ``first`` in graph order, so ``last``'s producers are walked back to there only
    (not through every earlier layer: the walk is as long as the span, not the graph)."""
    start = order[first]
    ancestors, queue = {last}, deque([last])
    while queue and len(ancestors) < 10_000:
        for producer in queue.popleft().all_input_nodes:
            if producer not in ancestors and order.get(producer, -1) >= start:
                ancestors.add(producer)
                queue.append(producer)
    out, queue = {first}, deque([first])
    while queue:
        for user in queue.popleft().users:
            if user not in out and user in ancestors and order[user] <= order[last]:
                out.add(user)
                queue.append(user)
    return out
