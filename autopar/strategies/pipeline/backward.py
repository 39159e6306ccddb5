"""A stage's backward in two passes (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR
2024, §2): ``I``, the gradient of the stage's inputs, which the stage before waits for,
and ``W``, the gradient of its weights, which nobody waits for and a zero-bubble schedule
runs later, in what would have been a bubble.

The split is made on the autograd graph the stage's forward recorded, as
``torch.distributed.pipelining`` does (``_backward.stage_backward_input`` /
``stage_backward_weight``): the graph nodes that lie on a path from the outputs to the
received inputs form the input closure; walking up from each weight's gradient
accumulator, the first nodes met in that closure are the weight's *intermediates* (for
``y = x Wᵀ`` the matmul's backward). ``I`` runs ``torch.autograd.grad`` of the outputs
with respect to the inputs only, keeping the graph, and records the gradient arriving at
every intermediate; ``W`` starts a second backward at the intermediates with those
gradients and runs it into the weights. Each autograd node's work thus falls in one half:
the matmul's input gradient in ``I``, its weight gradient in ``W`` (the engine computes
only the outputs a pass needs), a tensor-parallel all-reduce of an input gradient in
``I``; a node with both an input and a weight edge whose backward cannot be cut (a custom
``autograd.Function`` such as a fused kernel) runs in ``I`` and once more, for the weight,
in ``W``.

Why the recorded graph and not a partitioned joint graph: autopar's stage programs are
``fx.GraphModule`` s run eagerly, with collectives as autograd Functions and recomputed
blocks as ``torch.utils.checkpoint`` calls; splitting the graph autograd records needs no
second capture and keeps every Function's backward whole. A recomputed block re-runs its
forward in each pass that unpacks its saved tensors — once in ``I`` and once more in
``W`` (the cost model prices both).

A weight group whose intermediates lie one below another on the input path (a value
of its weights used at several points of it: adaLN's modulations in DiT, a gate and a
scale from one projection) reaches the lower intermediates through the input path's
nodes: ``W`` runs such groups first, keeping the graph for the single-intermediate
groups after them (which free what they run), and re-runs those input-path nodes (their
gradients replaced at each lower intermediate by what it received in ``I``, so exact; the
extra work is not priced).

``W`` accumulates into ``param.grad`` through autograd (``torch.autograd.backward`` with
``inputs=``), so the gradient hooks of the data-parallel buckets fire as for a whole
backward. Where no received input needs a gradient (the first stage) ``I`` does nothing
and ``W`` runs the whole backward, as ``torch.distributed.pipelining`` does; where a
weight's gradient reaches an output by any path outside the input closure (an output
computed from weights alone, a bias sent on to later stages beside the hidden state, a
parameter returned as it is), ``I`` runs the whole backward and ``W`` nothing: a split
that would lose a gradient is never made.
"""
from __future__ import annotations

from collections import defaultdict, deque

import torch
from torch.autograd.graph import GradientEdge, Node


def _node(t: torch.Tensor) -> Node | None:
    """The autograd node that receives ``t``'s gradient: its ``grad_fn``, or for a leaf
    its gradient accumulator (made by a view, since autograd creates it lazily)."""
    if t.grad_fn is not None or not t.requires_grad:
        return t.grad_fn
    return t.view_as(t).grad_fn.next_functions[0][0]


def _users(roots: list[Node]) -> dict[Node, list[Node]]:
    """Each node of the graph below ``roots`` → the nodes whose backward feeds it."""
    users: dict[Node, list[Node]] = defaultdict(list)
    queue, seen = deque(roots), set(roots)
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            users[child].append(node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return users


def _upward(starts: list[Node], users: dict[Node, list[Node]], stop: set[Node]) -> tuple[set[Node], set[Node]]:
    """The nodes reached from ``starts`` towards the outputs, not crossing ``stop``, and
    the nodes of ``stop`` met."""
    seen, met = set(starts), set()
    queue = deque(starts)
    while queue:
        for user in users.get(queue.popleft(), ()):
            if user in stop:
                met.add(user)
            elif user not in seen:
                seen.add(user)
                queue.append(user)
    return seen, met


class WeightPass:
    """What ``W`` needs of one microbatch on one stage; :meth:`run` it once."""

    def __init__(self, groups=(), whole=None):
        # per group: (intermediates, the gradients each received in I, {accumulator: weight})
        self.groups: list[tuple[list[Node], list[tuple], dict[Node, torch.Tensor]]] = list(groups)
        self.whole = whole  # (outputs, gradients): the first stage's whole backward, run by W

    def run(self) -> None:
        if self.whole is not None:
            outputs, grads = self.whole
            torch.autograd.backward(outputs, grads)
        # a group whose intermediates lie one below another (a value of its weights used at
        # several points of the input path: adaLN's modulations, a weight used twice) reaches
        # the lower ones through the input path, whose nodes other groups' passes free: such
        # groups run first and keep the graph (the clamps below keep them exact)
        groups = sorted(self.groups, key=lambda group: len(group[0]) == 1)
        for index, (intermediates, received, weights) in enumerate(groups):
            keep = len(intermediates) > 1 and index < len(groups) - 1
            edges, grads = [], []
            for node, arrived in zip(intermediates, received):
                for i, g in enumerate(arrived or ()):
                    if g is not None:
                        edges.append(GradientEdge(node, i))
                        grads.append(g)
            if not edges:
                continue
            # an intermediate below another receives, in this pass, the gradient it received
            # in I (which already holds what flows from the one above), not that again plus it
            handles = [node.register_prehook(lambda _, saved=tuple(arrived): saved)
                       for node, arrived in zip(intermediates, received)
                       if arrived is not None and len(intermediates) > 1]
            try:
                torch.autograd.backward(edges, grads, inputs=list(weights.values()), retain_graph=keep)
            finally:
                for h in handles:
                    h.remove()
        self.groups, self.whole = [], None


def input_pass(outputs: list[torch.Tensor], grads: list[torch.Tensor], inputs: list[torch.Tensor]) -> WeightPass:
    """``I`` of one microbatch: the gradients of ``inputs`` (those that require one) into
    their ``.grad``, the graph kept for :meth:`WeightPass.run`, which gives the weights
    theirs (module docstring). The weights are the graph's other leaves: every gradient
    accumulator below the outputs, whichever module holds its tensor (a module called
    inside a recomputed block is no submodule of the stage's program)."""
    leaves = [x for x in inputs if x.requires_grad]
    if not leaves:
        return WeightPass(whole=(outputs, grads))
    if any(y.grad_fn is None and not any(y is x for x in leaves) for y in outputs):
        # an output that is a leaf other than a received input passed on (a parameter): no split
        torch.autograd.backward(outputs, grads)
        return WeightPass()
    roots = [n for n in map(_node, outputs) if n is not None]
    users = _users(roots)
    starts = [n for n in map(_node, leaves) if n is not None]
    closure, _ = _upward(starts, users, set())
    outside = set(roots) - closure  # outputs the inputs do not reach (a parameter itself, a bias...)
    by_intermediate: dict[Node, dict] = {}
    for acc in [n for n in users if n not in starts and isinstance(getattr(n, "variable", None), torch.Tensor)]:
        weight = acc.variable
        seen, met = _upward([acc], users, closure)
        if not met or seen & outside:  # reaches an output beside the inputs' graph: no split
            torch.autograd.backward(outputs, grads)
            return WeightPass()
        group = {"intermediates": set(met), "weights": {acc: weight}}
        for node in met:  # groups sharing an intermediate are one
            other = by_intermediate.get(node)
            if other is not None and other is not group:
                other["intermediates"] |= group["intermediates"]
                other["weights"].update(group["weights"])
                group = other
        for node in group["intermediates"]:
            by_intermediate[node] = group
    groups = list({id(g): g for g in by_intermediate.values()}.values())
    arrived: dict[Node, tuple] = {}
    handles = [node.register_prehook(lambda grad_outputs, node=node: arrived.__setitem__(node, grad_outputs))
               for g in groups for node in g["intermediates"]]
    try:
        found = torch.autograd.grad(outputs, leaves, grads, retain_graph=True, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    for x, g in zip(leaves, found):
        if g is not None:
            x.grad = g if x.grad is None else x.grad + g
    out = []
    for g in groups:
        nodes = list(g["intermediates"])
        out.append((nodes, [arrived.get(n) for n in nodes], g["weights"]))
    return WeightPass(out)
