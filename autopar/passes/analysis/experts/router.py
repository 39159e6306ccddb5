"""Reading a routed layer around its experts: the grouped matmul's offsets, the router
(the linear whose scores a ``topk`` picks from), the routing weights, the combine over the
``k`` slots, the tokens the experts read and the shared experts beside them."""
from __future__ import annotations

import torch.fx as fx

from autopar.ir import regions, tensor_spec
from autopar.passes.analysis.experts.reading import PASS_THROUGH, nearest, score_kind
from autopar.passes.analysis.ops import LINEAR_FUNCTIONS, LinearMatch, call_name, match_linear


def group_offsets(node: fx.Node) -> fx.Node | None:
    """The group offsets a grouped matmul reads (its third argument, or ``offs=``)."""
    offs = node.args[2] if len(node.args) > 2 else node.kwargs.get("offs")
    return offs if isinstance(offs, fx.Node) else None


def _router_linear(node: fx.Node, gm: fx.GraphModule):
    """``node`` as a linear (:func:`autopar.passes.analysis.ops.match_linear`), also when its
    weight is cast first (DeepSeek-V3's router computes in float32: ``linear(x.float(),
    W.float())``)."""
    found = match_linear(node, gm)
    if found is not None or node.op != "call_function" or node.target not in LINEAR_FUNCTIONS or len(node.args) < 2:
        return found
    x, w = node.args[0], node.args[1]
    if not (isinstance(x, fx.Node) and isinstance(w, fx.Node) and call_name(w) in ("to", "_to_copy") and w.args
            and isinstance(w.args[0], fx.Node) and w.args[0].op == "get_attr") or len(node.args) > 2:
        return None
    spec = tensor_spec(w.args[0])
    if spec is None or len(spec.shape) != 2:
        return None
    out_f, in_f = spec.shape
    return LinearMatch(node, x, str(w.args[0].target), None, "out_in", in_f, out_f, "aten.linear")


def read_router(topk: fx.Node, gm: fx.GraphModule):
    """(router linear match, score function) read back from ``topk``'s input through
    casts and views, or (None, None)."""
    scores, node = None, topk.args[0]
    for _ in range(8):
        if not isinstance(node, fx.Node):
            return None, None
        found = _router_linear(node, gm)
        if found is not None:
            return found, scores
        scores = scores or score_kind(node)
        # casts and views; DeepSeek-V3's score correction bias (an add) and group-limited
        # routing (a masked_fill of the groups not picked) choose, but do not weight
        if not (score_kind(node) or call_name(node) in PASS_THROUGH + ("add", "masked_fill")) or not node.args:
            return None, None
        node = node.args[0]
    return None, None


def experts_input(column: fx.Node) -> fx.Node | None:
    """The tokens ``[tokens, hidden]`` the experts' rows are taken from: what the index
    feeding the grouped matmul's input (through casts) indexes."""
    node = column.args[0] if column.args else None
    for _ in range(4):
        if not isinstance(node, fx.Node):
            return None
        if call_name(node) in ("index", "getitem") and node.args and isinstance(node.args[0], fx.Node):
            return node.args[0]
        if call_name(node) not in PASS_THROUGH or not node.args:
            return None
        node = node.args[0]
    return None


def routing_weights(topk: fx.Node, indices: fx.Node, combine: fx.Node) -> tuple[fx.Node, bool] | None:
    """The routing weights ``[tokens, k]`` the combine reads, and whether they are
    renormalised over the slots: the top-k values (Mixtral, Qwen), or the scores gathered
    at the top-k indices (DeepSeek-V3 picks by corrected scores and weights by the
    uncorrected ones), after their renormalisation, scaling and casts."""
    ancestors = set(nearest(combine, 5000))
    values = [u for u in topk.users if u.args[1:] == (0,)]
    gathered = [u for u in indices.users if call_name(u) == "gather"]
    for start in values + gathered:
        weights = combined_weights(start)
        if weights in ancestors:
            path = [weights, *nearest(weights, 8)]
            cut = path.index(start) if start in path else len(path)
            return weights, any(call_name(n) in ("div", "div_", "truediv") or _over_slots(n) for n in path[:cut])
    return None


def combine_of(row: fx.Node, top_k: int) -> fx.Node | None:
    """The sum over the ``k`` slots after the down projection ``row`` (its users, breadth
    first): a sum over dimension 1 of a ``[tokens, k, hidden]`` view."""
    for user in nearest(row, 32, forward=True):
        if call_name(user) == "sum":
            dims = user.args[1] if len(user.args) > 1 else user.kwargs.get("dim")
            dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
            source = user.args[0]
            shape = tensor_spec(source).shape if isinstance(source, fx.Node) and tensor_spec(source) else ()
            if dims == [1] and len(shape) == 3 and shape[1] == top_k:
                return user
    return None


def combined_weights(values: fx.Node) -> fx.Node:
    """The routing weights ``[tokens, k]`` as the combine reads them: the top-k values after
    their renormalisation and casts (``values / values.sum(-1, keepdim=True)``), or their
    softmax over the ``k`` slots (GPT-OSS picks the top-k router logits and weights them
    by it)."""
    shape, node = tensor_spec(values).shape, values
    while True:
        step = next((u for u in node.users if u.args and u.args[0] is node and tensor_spec(u) is not None
                     and tensor_spec(u).shape == shape
                     and (call_name(u) in ("div", "div_", "truediv", "mul", "to", "_to_copy", "type_as")
                          or _over_slots(u))), None)
        if step is None:
            return node
        node = step


def _over_slots(node: fx.Node) -> bool:
    """A softmax over the last dimension of a ``[tokens, k]`` value (the slots)."""
    if score_kind(node) != "softmax":
        return False
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    spec = tensor_spec(node)
    return spec is not None and len(spec.shape) == 2 and dim in (-1, 1)


def shared_experts(gm: fx.GraphModule, router_input: fx.Node, combine: fx.Node, own: tuple = ()) -> list[str]:
    """The ``linear_chain`` regions without experts (and not among ``own``, a layer's
    expert modules) that read the router's input (up to views) and whose output meets
    the combine's in an add."""
    table = {n.name: n for n in gm.graph.nodes}
    bases = {router_input} | {a for a in nearest(router_input, 4) if call_name(a) in PASS_THROUGH}
    downstream = {combine, *nearest(combine, 16, forward=True)}   # the routed output's casts and views up to the add
    shared = []
    for chain in regions(gm, "linear_chain"):
        if chain.details.get("experts") or chain.id in own:
            continue
        column = table[chain.details["column"][0]]
        source = column.args[0] if column.args else None
        if source not in bases and not (isinstance(source, fx.Node) and set(nearest(source, 4)) & bases):
            continue
        row = table[chain.details["row"]]
        reached = {row, *nearest(row, 8, forward=True)}
        if any(call_name(n) == "add" and set(n.all_input_nodes) & downstream for n in reached):
            shared.append(chain.id)
    return shared
