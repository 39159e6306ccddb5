"""Analysis pass: attention regions (Q/K/V projections, a per-head core, an output projection).

The head dimension is an implicit branch dimension: each head's computation is
independent, so Megatron splits heads across tensor ranks (megatron §2.3, Figure 5b) and
D&SP can treat heads as branches. The pass finds, for every attention core
(``scaled_dot_product_attention``, or ``softmax`` between two activation matmuls):

* the projections producing Q, K and V — separate linears, or one fused linear whose
  output is split three ways (``split``/``chunk``/``view(B, T, 3, H, d)``, or
  ``unflatten(-1, [3, E])`` then ``select``: ``nn.MultiheadAttention``'s packed
  ``in_proj_weight`` under ``torch.export``; autopar's symbolic tracing spells it with
  ``chunk``, see :mod:`autopar.trace.standard_layers`);
* the output projection consuming the merged heads;
* the head count and head size from the core's input shape ``[B, H, T, d]``;
* the views whose literal shape bakes the head count in (``view(b, t, 12, 64)``), which
  the tensor-parallel rewrite must change to the local head count;
* attention sinks (Hugging Face GPT-OSS): a learned logit per head joined to each row of
  the scores before the softmax (``cat([scores, sinks.reshape(1, H, 1, 1).expand(..)],
  -1)``, the softmax's stabilising max taken over both) and dropped after it
  (``probs[..., :-1]``); the parameter ``[H]`` is per head, so a head split cuts it with
  the heads (``details["sinks"]``).

Example (a nanoGPT block captured with symbolic_trace)::

    attention:attn  heads=4 head_dim=16 hidden=64
        qkv=model.attn.c_attn (fused, 3 blocks)  out=model.attn.c_proj
"""
from __future__ import annotations

import logging
import math

import torch.fx as fx

from autopar.ir import Region, add_region, clear_regions, node_index, tensor_spec
from autopar.passes.manager import examining
from autopar.passes.analysis.naming import RegionNames
from autopar.passes.analysis.ops import (CONCAT_FUNCTIONS, SLICE_FUNCTIONS, call_name, is_activation_matmul, is_dropout,
                                is_pointwise, is_sdpa, is_select, is_softmax, is_view_like, match_linear,
                                reshape_target)

log = logging.getLogger("autopar.analysis.attention")

# Ops allowed between a projection and the core besides views: scaling, casts, and
# positional rotations, which act on each head independently.
_MAX_WALK = 64


def _walk_back_to_linear(node: fx.Node, gm: fx.GraphModule, seen: list[fx.Node]):
    """Follow the first tensor argument backwards through views, pointwise ops and parts
    of the head dimension to a linear."""
    current = node
    for _ in range(_MAX_WALK):
        match = match_linear(current, gm)
        if match is not None:
            return match
        # select: nn.MultiheadAttention's packed Q/K/V taken apart under torch.export; a
        # norm of each head's own features (Qwen 3's and OLMo's q/k norms, after the view
        # to heads) acts per head. Whether every op keeps the heads apart is the rewrite's
        # to prove (its propagation gathers what no rule splits); the walk follows the
        # activation, not a parameter beside it (``weight * x`` of a norm written out)
        if is_view_like(current) or is_pointwise(current, gm) or is_select(current) or _head_norm(current, gm):
            nxt = next((a for a in current.args if isinstance(a, fx.Node) and a.op != "get_attr"), None)
        else:
            nxt = _head_dimension_part(current)
            if nxt is None:
                return None
        seen.append(current)
        if nxt is None:
            return None
        current = nxt
    return None


_NORMS = ("rms_norm", "layer_norm")


def _head_norm(node: fx.Node, gm: fx.GraphModule) -> bool:
    """A layer or RMS norm over the last dimension only (``F.rms_norm(x, [d], w)``, an
    ``nn.RMSNorm``/``nn.LayerNorm`` of one dimension)."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        shape = getattr(module, "normalized_shape", None)
        return type(module).__name__ in ("RMSNorm", "LayerNorm") and shape is not None and len(shape) == 1
    shape = node.args[1] if len(node.args) > 1 else node.kwargs.get("normalized_shape")
    return call_name(node) in _NORMS and isinstance(shape, (list, tuple)) and len(shape) == 1


def _head_major(path: list[fx.Node], heads: int, head_dim: int, packed: int) -> bool | None:
    """Whether the first reshape (the last of a run of them) after a fused Q/K/V projection of ``packed`` features
    (the last node of the walk back from the query) puts the heads, or the key/value
    groups, outermost in them: the features become dimensions whose first is the heads
    (``[.., H, 3·d]``, GPT-NeoX; ``[.., H, 3, d]``, torchtitan's and BLOOM's fused
    projections) or the groups of grouped-query attention (``[.., G, H/G + 2, d]``,
    torchtitan's fused projection with fewer key/value heads), so that each head's (each
    group's) q, k and v are contiguous and a plain column split is a split by heads;
    ``[.., 3, H, d]`` or a chunk of the packed dimension keep Q, K and V as three blocks.
    With three heads the shapes cannot tell (``[3, 3·d]`` either way): the dimension the
    query is taken along decides, and None says that nothing did."""
    groups = (packed // head_dim - heads) // 2 if packed % head_dim == 0 else heads
    forward = list(reversed(path))
    for i, node in enumerate(forward):
        spec = tensor_spec(node)
        if spec is None or not is_view_like(node):
            return False
        shape = list(spec.shape)
        if shape and shape[-1] == packed:
            continue  # a view that keeps the packed last dimension (a reshape of the batch)
        source = tensor_spec(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
        if call_name(node) not in _RESHAPES or source is None or list(source.shape[-1:]) != [packed] \
                or list(shape[:len(source.shape) - 1]) != list(source.shape[:-1]):
            return False   # only a reshape of the packed features alone says how they are laid out
        batch = list(source.shape[:-1])
        # reshapes in a row compose (row-major order): the last of a run that regroups only
        # the packed features says their layout (Falcon: ``[.., H + 2G, d]``, then
        # ``[.., G, H/G + 2, d]``)
        while i + 1 < len(forward) and _regroups(forward[i + 1], forward[i], batch, packed):
            i += 1
            node, shape = forward[i], list(tensor_spec(forward[i]).shape)
        factors, size = [], 1
        for extent in reversed(shape):   # the trailing dimensions the packed one became
            if size >= packed:
                break
            factors.insert(0, extent)
            size *= extent
        if size != packed or len(factors) < 2 or factors[0] not in (heads, groups):
            return False
        if factors[0] != 3 or groups != heads:   # grouped Q/K/V blocks are unequal: never a view's factor
            return True
        taken = _taken_along(forward[i + 1:], len(shape))
        first = len(shape) - len(factors)
        return None if taken is None else taken != first
    return False


def _regroups(node: fx.Node, source: fx.Node, batch: list, packed: int) -> bool:
    """Whether ``node`` reshapes ``source`` (itself the packed features of one row of
    ``batch`` cut into trailing dimensions) into other trailing dimensions of the same
    ``packed`` features, keeping ``batch``."""
    spec = tensor_spec(node)
    if spec is None or call_name(node) not in _RESHAPES or not node.args or node.args[0] is not source:
        return False
    shape = list(spec.shape)
    return shape[:len(batch)] == batch and math.prod(shape[len(batch):]) == packed and len(shape) > len(batch) + 1


def _fused_layout(core: fx.Node, q_path: list[fx.Node], packed: int, heads: int,
                  head_dim: int) -> tuple[int, int | None] | None:
    """How a fused projection of ``packed`` features is cut: ``(qkv_blocks, key/value
    heads or None)``, or None where it cannot be split (logged). Three blocks (Q, K, V),
    each split by heads, unless its output is laid out head by head or group by group
    (:func:`_head_major`): then each head's q, k and v rows are already contiguous and a
    plain column split keeps them (one block; with groups outermost, their count is the
    key/value heads)."""
    major = _head_major(q_path, heads, head_dim, packed)
    if major is None:
        log.info("attention core %s: a fused projection with three heads whose layout (heads or q, k and v "
                 "outermost) the graph does not show, not a region", core.name)
        return None
    mha = packed == 3 * heads * head_dim
    if not major and not mha:
        log.info("attention core %s: a fused projection of %d features for %d heads of %d, cut by sizes into "
                 "unequal Q, K and V blocks (grouped-query), not a region", core.name, packed, heads, head_dim)
        return None
    return (1, None if mha else (packed // head_dim - heads) // 2) if major else (3, None)


_RESHAPES = ("view", "reshape", "_unsafe_view", "unflatten")


def _taken_along(nodes: list[fx.Node], ndim: int) -> int | None:
    """The dimension of a reshape's ``ndim``-dimensional output along which the first of
    ``nodes`` (the walk on from it) takes a part (``unbind``, ``select``, ``chunk``,
    ``split``, an index ``x[0]`` or ``x[:, :, 0]``), followed back through permutes and
    transposes; None where another op comes first or nothing takes a part."""
    where = list(range(ndim))   # each current dimension's dimension of the reshape's output
    for node in nodes:
        name = call_name(node)
        args = node.args
        if name == "permute":
            order = args[1:] if len(args) > 2 else (args[1] if len(args) > 1 else node.kwargs.get("dims"))
            if not isinstance(order, (list, tuple)) or len(order) != len(where):
                return None
            where = [where[d % len(where)] for d in order]
        elif name in ("transpose", "swapaxes", "swapdims"):
            pair = list(args[1:3]) + [node.kwargs.get(k) for k in ("dim0", "dim1")][len(args[1:3]):]
            if len(pair) != 2 or not all(isinstance(d, int) for d in pair):
                return None
            a, b = (d % len(where) for d in pair)
            where[a], where[b] = where[b], where[a]
        elif name in ("contiguous", "clone", "to", "float", "type_as"):
            continue
        elif name in ("unbind", "select", "chunk", "split", "tensor_split", "split_with_sizes"):
            at = 1 if name in ("unbind", "select") else 2
            dim = args[at] if len(args) > at else node.kwargs.get("dim", 0)
            return where[dim % len(where)] if isinstance(dim, int) else None
        elif name == "getitem" and isinstance(args[1], int):
            return where[0]
        elif name == "getitem" and isinstance(args[1], tuple) and Ellipsis not in args[1] and None not in args[1]:
            ints = [d for d, index in enumerate(args[1]) if isinstance(index, int)]
            return where[ints[0]] if ints else None
        else:
            return None
    return None


def _head_dimension_part(node: fx.Node) -> fx.Node | None:
    """The value a slice or concatenation of the last (head) dimension is made from, or
    None for any other node: a partial rotary embedding (GPT-NeoX) rotates ``q[..., :r]``
    and joins it again with ``q[..., r:]``, each head on its own (the layout rules keep a
    head split through both)."""
    if not (node.op == "call_function" and node.args):
        return None
    spec = tensor_spec(node)
    if spec is None:
        return None
    last = (-1, len(spec.shape) - 1)
    if node.target in CONCAT_FUNCTIONS and isinstance(node.args[0], (list, tuple)):
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        return next((a for a in node.args[0] if isinstance(a, fx.Node)), None) if dim in last else None
    if node.target in SLICE_FUNCTIONS:
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if dim in last and isinstance(node.args[0], fx.Node):
            return node.args[0]
        return _group_part(node, dim)
    if call_name(node) == "index" and len(node.args) > 1 and isinstance(node.args[1], (list, tuple)):
        indexed = [d for d, i in enumerate(node.args[1]) if i is not None]
        constant = all(_constant(i) for i in node.args[1] if i is not None)
        return _group_part(node, indexed[0]) if len(indexed) == 1 and constant else None
    if call_name(node) in ("broadcast_to", "expand") and isinstance(node.args[0], fx.Node):
        return node.args[0]   # a key/value head shared by its group's queries (Falcon)
    return None


def _constant(node) -> bool:
    """A tensor the graph holds (``get_attr``), or a copy of one (export's ``lift_fresh_copy``)."""
    return isinstance(node, fx.Node) and (node.op == "get_attr" or (
        call_name(node) in ("lift_fresh_copy", "clone", "to", "_to_copy") and
        all(a.op == "get_attr" for a in node.all_input_nodes) and bool(node.all_input_nodes)))


def _group_part(node: fx.Node, dim: int) -> fx.Node | None:
    """The fused value a part of a grouped Q/K/V view is taken from: ``qkv[:, :, :, :-2]``
    (the queries) or ``qkv[:, :, :, [-2]]`` (the key) of ``[B, T, G, H/G + 2, d]``
    (Falcon's new architecture), a part along the dimension right inside the groups, of a
    view of a projection's features into three or more trailing dimensions."""
    source = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    spec = tensor_spec(source) if source is not None else None
    if spec is None or not is_view_like(source):
        return None
    n = len(spec.shape)
    return source if dim % n == n - 2 and n >= 5 else None


def _walk_forward_to_linear(node: fx.Node, gm: fx.GraphModule, seen: list[fx.Node]):
    current = node
    for _ in range(_MAX_WALK):
        users = list(current.users)
        if len(users) != 1:
            return None
        current = users[0]
        match = match_linear(current, gm)
        if match is not None:
            return match
        if not (is_view_like(current) or is_dropout(current, gm)):
            return None
        seen.append(current)
    return None


_SINK_PATH = ("expand", "reshape", "view", "_unsafe_view", "unsqueeze", "to", "_to_copy", "type_as", "clone",
              "contiguous", "alias")


def _sink(piece) -> fx.Node | None:
    """The parameter a value joined to the attention scores is made of, through views,
    expands and casts (attention sinks: ``sinks.reshape(1, -1, 1, 1).expand(B, -1, T, -1)``),
    when it is a 1-D parameter (its length, one per head, is checked by the caller)."""
    node = piece
    for _ in range(8):
        if not isinstance(node, fx.Node):
            return None
        if node.op == "get_attr":
            spec = tensor_spec(node)
            return node if spec is not None and len(spec.shape) == 1 else None
        if call_name(node) not in _SINK_PATH or not node.args:
            return None
        node = node.args[0]
    return None


def _score_operand(node: fx.Node):
    """The operand of an op on the scores that carries them: one of the op's shape and a
    floating dtype (``where(mask, scores, min)`` masks with its first operand, GPT-Neo;
    ``mask + scores`` adds a broadcast mask first), else the first operand."""
    spec = tensor_spec(node)
    operands = [a for a in node.args if isinstance(a, fx.Node)]
    for a in operands:
        s = tensor_spec(a)
        if spec is not None and s is not None and tuple(s.shape) == tuple(spec.shape) and s.dtype.is_floating_point:
            return a
    return operands[0] if operands else None


def _core_inputs(core: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node, list[fx.Node], fx.Node | None] | None:
    """(q, k, v, core nodes, sinks parameter or None) for an sdpa node or a softmax
    between two activation matmuls."""
    if is_sdpa(core):
        q, k, v = core.args[:3]
        return q, k, v, [core], None
    if not is_softmax(core):
        return None
    # scores = q @ k^T, possibly scaled/masked before the softmax (and joined to sinks)
    nodes = [core]
    scores, sink = core.args[0], None
    for _ in range(8):
        if not isinstance(scores, fx.Node) or not scores.args:
            return None  # reached a parameter or input: no q @ k^T behind this softmax
        if is_activation_matmul(scores):
            break
        nodes.append(scores)
        if scores.op == "call_function" and scores.target in CONCAT_FUNCTIONS:
            # attention sinks: one more logit per head and row, joined along the keys
            pieces = scores.args[0]
            dim = scores.args[1] if len(scores.args) > 1 else scores.kwargs.get("dim", 0)
            spec = tensor_spec(scores)
            if sink is not None or not isinstance(pieces, (list, tuple)) or len(pieces) != 2 or spec is None \
                    or dim not in (-1, len(spec.shape) - 1):
                return None
            sink = _sink(pieces[1])
            if sink is None:
                return None
            scores = pieces[0]
            continue
        scores = _score_operand(scores)
    else:
        return None
    nodes.append(scores)
    q, kt = scores.args[0], scores.args[1]
    # context = probs @ v, possibly after dropout (and after the sinks' column is dropped)
    ctx = core
    for _ in range(6 if sink is not None else 4):
        users = list(ctx.users)
        if len(users) != 1:
            return None
        ctx = users[0]
        if is_activation_matmul(ctx):
            break
        nodes.append(ctx)
    else:
        return None
    nodes.append(ctx)
    return q, kt, ctx.args[1], nodes, sink


def find_attention_regions_pass(gm: fx.GraphModule) -> fx.GraphModule:
    """Record one ``attention`` region per attention core found in ``gm``.

    ``details``: ``q_proj``/``k_proj``/``v_proj``/``out_proj`` (node names; equal when
    fused), ``fused_qkv``, ``qkv_blocks`` (3 when one projection yields Q, K and V as
    three blocks, else 1: separate projections, or a fused one laid out head by head), ``heads``, ``kv_heads``, ``head_dim``, ``hidden``, ``core`` (node names of the
    per-head computation), ``core_inputs`` (the query, key and value the core reads, each
    ``[B, H, ..]``; the key may be transposed), ``head_count_views`` (views whose literal
    shape holds the head count), ``sinks`` (only with attention sinks: the ``[H]``
    parameter of the sinks' logits). The graph is not changed. Ids name the module holding
    the region (``attention:transformer.h.0.attn``), see :mod:`autopar.passes.analysis.naming`.
    """
    clear_regions(gm, "attention")
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    index = node_index(gm)
    names = RegionNames("attention")
    for node in gm.graph.nodes:
        with examining("attention", node, "attention core"):
            found = _core_inputs(node)
            if found is None:
                continue
            q, k, v, core_nodes, sink = found
            paths: dict[str, list[fx.Node]] = {"q": [], "k": [], "v": []}
            projections = {}
            for name, value in (("q", q), ("k", k), ("v", v)):
                projections[name] = _walk_back_to_linear(value, gm, paths[name]) if isinstance(value, fx.Node) else None
            out_path: list[fx.Node] = []
            out_proj = _walk_forward_to_linear(core_nodes[-1], gm, out_path)
            if any(p is None for p in projections.values()) or out_proj is None:
                log.info("attention core %s: projections not found, not a region", node.name)
                continue
            q_spec = tensor_spec(q)
            k_spec = tensor_spec(k)
            if q_spec is None or len(q_spec.shape) != 4:
                log.info("attention core %s: query is not [B, H, T, d], not a region", node.name)
                continue
            heads, head_dim = q_spec.shape[1], q_spec.shape[3]
            if sink is not None and tuple(tensor_spec(sink).shape) != (heads,):
                log.info("attention core %s: joins a parameter of %s values to its scores, not one per head, not "
                         "a region", node.name, list(tensor_spec(sink).shape))
                continue
            # k may be transposed for the explicit matmul form ([B, H, d, T]); heads stay at dim 1
            kv_heads = k_spec.shape[1] if k_spec is not None and len(k_spec.shape) == 4 else heads
            fused = len({p.node for p in projections.values()}) == 1
            if not fused and projections["k"].out_features % head_dim == 0:  # grouped-query attention:
                kv_heads = projections["k"].out_features // head_dim  # k may be repeated to H heads before the core
            layout = _fused_layout(node, paths["q"], projections["q"].out_features, heads, head_dim) \
                if fused else (1, kv_heads)
            if layout is None:
                continue
            qkv_blocks, kv_heads = layout[0], layout[1] or kv_heads
            q_match = projections["q"]
            if q_match.out_features != heads * head_dim * qkv_blocks and not fused:
                log.info("attention core %s: projection width %d != heads*head_dim", node.name, q_match.out_features)
                continue
            members = {p.node for p in projections.values()} | {out_proj.node}
            members.update(core_nodes)
            for path in list(paths.values()) + [out_path]:
                members.update(path)
            # everything between the projections and the core (e.g. a split's getitems)
            members.update(_between(nodes, {p.node for p in projections.values()}, set(core_nodes), order))
            ordered = sorted(members, key=order.__getitem__)
            head_views = [n.name for n in ordered if is_view_like(n) and _shape_literal_has(n, heads)]
            add_region(gm, Region(
                id=names.of(gm, ordered),
                kind="attention",
                nodes=[n.name for n in ordered],
                details={
                    "q_proj": projections["q"].node.name, "k_proj": projections["k"].node.name,
                    "v_proj": projections["v"].node.name, "out_proj": out_proj.node.name,
                    "fused_qkv": fused, "qkv_blocks": qkv_blocks, "heads": heads, "kv_heads": kv_heads,
                    "head_dim": head_dim, "hidden": out_proj.out_features,
                    "core": [n.name for n in core_nodes], "head_count_views": head_views,
                    "core_inputs": [x.name for x in (q, k, v)],
                    **({"sinks": str(sink.target)} if sink is not None else {}),
                },
            ), index)
    return gm


def _between(nodes: list[fx.Node], sources: set, sinks: set, order) -> set:
    """Nodes on some path from ``sources`` to ``sinks`` (exclusive); ``nodes``: the
    graph's, in order (only those between the first source and the last sink are read)."""
    lo = min(order[s] for s in sources)
    hi = max(order[s] for s in sinks)
    forward: set = set(sources)
    for n in nodes[lo + 1:hi + 1]:
        if any(a in forward for a in n.all_input_nodes):
            forward.add(n)
    backward: set = set(sinks)
    for n in reversed(nodes[lo:hi]):
        if any(u in backward for u in n.users):
            backward.add(n)
    return (forward & backward) - sources - sinks


def _shape_literal_has(node: fx.Node, value: int) -> bool:
    shape = reshape_target(node)
    return shape is not None and any(isinstance(a, int) and a == value for a in shape)
