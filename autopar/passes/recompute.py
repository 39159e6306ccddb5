"""Rewrite pass: activation recomputation of split regions (megatron §3.5, axonn §IV-D).

Each chosen region's nodes (the contiguous span of the rank graph from its first to its
last member) are outlined into a sub-graph that runs under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: its activations are not
kept for backward but recomputed, collectives included, when backward reaches it. The
rank graph shows one call per region::

    recompute = recompute_attention_softmax(scatter_to_tensor_region, model_blocks_0_attn_qkv_weight, ...)
    getitem = recompute[0]

Parameters stay ``get_attr`` reads of the outer graph and enter the sub-graph as inputs,
so the sub-graph holds no parameter of its own. Dropout masks are replayed: autopar's
rank-aware streams are snapshotted before the forward and restored around the
recomputation (``torch.utils.checkpoint`` preserves only torch's default generators).
A call that can use knowing it is recomputed says so with a ``checkpointed=False``
keyword (the 3D and cube layers, :func:`autopar.strategies.tensor3d.runtime.linear_3d`,
put there by their rewrites); inside a recomputed region it becomes ``True``, so the
runtime keeps their all-gathered weights for the second forward (axonn §IV-D). The
pass knows no family.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import operator

import torch
import torch.fx as fx
import torch.utils.checkpoint

from autopar.ir import REGION_OF
from autopar.ir import regions as regions_of
from autopar.runtime import rng

log = logging.getLogger("autopar.transforms.recompute")


def recompute_pass(gm: fx.GraphModule, *, regions: list[str], blocks: bool = False,
                   selective: bool = False) -> fx.GraphModule:
    """Outline each region of ``regions`` into a checkpointed call (see module docstring);
    ``blocks``: the graph's repeated blocks instead where it has them (full recomputation,
    megatron §3.5: a block's split regions recompute with it); ``selective``: only each
    attention region's core instead, the score matmul, scaling, mask, softmax, dropout
    and the context matmul (Korthikanti et al.'s selective recomputation: the activations
    that grow with the sequence squared, cheap to recompute)."""
    if selective:
        for r in regions_of(gm, "attention"):
            _outline(gm, f"{r.id}.core", set(r.details.get("core", ())))
        gm.graph.lint()
        gm.recompile()
        return gm
    if blocks and regions_of(gm, "block"):
        regions = [r.id for r in regions_of(gm, "block")]
    for rid in regions:
        _outline(gm, rid)
    gm.graph.lint()
    gm.recompile()
    return gm


def _outline(gm: fx.GraphModule, rid: str, names: set[str] | None = None) -> None:
    """Outline the span of region ``rid`` (or of the nodes ``names``) into a checkpointed call."""
    graph = gm.graph
    order = list(graph.nodes)
    # its computing nodes: a parameter read (export reads them all at the top of the
    # graph) would stretch the span over everything before the region
    members = [n for n in order if (n.name in names if names is not None else
                                    rid in n.meta.get(REGION_OF, {}).values())
               and n.op in ("call_function", "call_method", "call_module")]
    if not members:
        return
    first, last = order.index(members[0]), order.index(members[-1])
    span = [n for n in order[first:last + 1] if n.op in ("call_function", "call_method", "call_module")]
    inside = set(span)
    inputs = list(dict.fromkeys(a for n in span for a in n.all_input_nodes if a not in inside))
    outputs = [n for n in span if any(u not in inside for u in n.users)]
    sub = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for a in inputs:
        env[a] = sub.placeholder(a.name)
        env[a].meta.update(a.meta)
    for n in span:
        env[n] = sub.node_copy(n, lambda a: env[a])
        if "checkpointed" in n.kwargs:  # a call that keeps state for its recomputation
            env[n].kwargs = {**env[n].kwargs, "checkpointed": True}
    sub.output(tuple(env[o] for o in outputs))
    body = fx.GraphModule(gm, sub, class_name=f"Recompute_{_safe(rid)}")
    fn = _checkpointed(body, f"recompute_{_safe(rid)}")
    with graph.inserting_after(span[-1]):
        call = graph.call_function(fn, tuple(inputs))
    anchor = call
    for k, o in enumerate(outputs):
        with graph.inserting_after(anchor):
            item = graph.call_function(operator.getitem, (call, k))
        item.meta.update(o.meta)
        o.replace_all_uses_with(item, delete_user_cb=lambda user: user not in inside)
        anchor = item
    for n in reversed(span):
        graph.erase_node(n)


def _safe(rid: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in rid)


def _checkpointed(body: fx.GraphModule, name: str):
    def run(*args):
        states = rng.get_random_states()
        context = functools.partial(_replay_contexts, states, states.get_state())
        return torch.utils.checkpoint.checkpoint(body, *args, use_reentrant=False, context_fn=context)

    run.__name__ = run.__qualname__ = name
    run.body = body  # the outlined sub-graph, for reading: print(fn.body.code)
    return run


def rebound(fn, body: fx.GraphModule):
    """The checkpointed call ``fn`` (of :func:`recompute_pass`) over ``body`` instead: the
    same sub-graph reading the rank's module tree (:func:`autopar.engine.executable.executable`),
    not the capture's."""
    return _checkpointed(body, fn.__name__)


class _Replay:
    """The recomputation context: the dropout streams at their state of the forward, the
    current state back afterwards. Entered once per recomputation — twice when a
    zero-bubble schedule splits the backward (``I`` and ``W`` each unpack the block's
    saved tensors, :mod:`autopar.strategies.pipeline.backward`), so not a one-shot
    generator context."""

    def __init__(self, states, snapshot):
        self.states, self.snapshot, self.current = states, snapshot, []

    def __enter__(self):
        self.current.append(self.states.get_state())
        self.states.set_state(self.snapshot)

    def __exit__(self, *exc):
        self.states.set_state(self.current.pop())
        return False


def _replay_contexts(states, snapshot):
    """(forward context, recomputation context) for checkpoint's ``context_fn``: the
    recomputation starts from the dropout streams' state at the forward."""
    return contextlib.nullcontext(), _Replay(states, snapshot)
