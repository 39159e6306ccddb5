"""A routed layer written densely: every expert runs on every token, its input scaled by
the token's routing weight for that expert, which is exactly zero for the experts the
router did not pick (Hugging Face's Llama 4)::

    logits = router(x)                                        # [T, E]
    top_value, top_index = topk(logits, k, dim=1)
    scores = sigmoid(full_like(logits, -inf).scatter_(1, top_index, top_value))
    routed_in = x.repeat(E, 1) * scores.t().reshape(-1, 1)    # [E·T, H], expert-major
    h = bmm(routed_in.view(E, -1, H), gate_up)                # [E, T, 2I]
    out = bmm(act(gate) * up, down).view(-1, H).reshape(E, -1, H).sum(0)

Because an unpicked expert's weight is zero (``sigmoid(-inf)``, a softmax's ``-inf``
entries, or a scatter into zeros) and a gated expert without biases maps a zero row to
a zero row (``act(0) · 0``, then ``down · 0``; its gradients there are zero too), the
layer equals the sparse one: each token's ``k`` picked experts on its row scaled by their
weights, summed over the slots. :func:`dense_layer` reads and checks each of these
facts; expert parallelism then dispatches only the picked (token, expert) pairs
(``details["weighted"] = "input"``: the weight scales the expert's input, not its
output) and the rewrite gathers the picked weights from the dense ``[T, E]`` scores."""
from __future__ import annotations

import math

import torch.fx as fx

from autopar.ir import tensor_spec
from autopar.passes.analysis.experts.reading import PASS_THROUGH, is_topk, score_kind
from autopar.passes.analysis.ops import call_name

_VIEWS = ("view", "reshape", "_unsafe_view", "contiguous", "clone")
_FILLS = ("full_like", "full", "zeros_like", "zeros", "new_full", "new_zeros")


def _through(node, names) -> fx.Node | None:
    while isinstance(node, fx.Node) and call_name(node) in names and node.args:
        node = node.args[0]
    return node if isinstance(node, fx.Node) else None


def _shape(node) -> tuple | None:
    spec = tensor_spec(node) if isinstance(node, fx.Node) else None
    return tuple(spec.shape) if spec is not None else None


def _fill(node: fx.Node) -> float | None:
    """The constant a fill factory writes (``full_like(x, v)``, ``zeros_like(x)``)."""
    name = call_name(node)
    if name in ("zeros_like", "zeros", "new_zeros"):
        return 0.0
    if name in ("full_like", "full", "new_full"):
        value = node.args[-1] if len(node.args) >= 2 else node.kwargs.get("fill_value")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return None


def _dense_scores(scores: fx.Node, experts: int):
    """``(topk, score function)`` when ``scores`` ``[T, E]`` is zero wherever the router did
    not pick: a scatter of the top-k values at the top-k indices into ``-inf`` followed by
    a sigmoid (or a softmax over the experts), or into zeros with nothing after it but
    casts. None otherwise."""
    node, kind = scores, None
    for _ in range(8):
        if call_name(node) in PASS_THROUGH and node.args and isinstance(node.args[0], fx.Node):
            node = node.args[0]
            continue
        found = score_kind(node)
        if found is not None and kind is None and node.args and isinstance(node.args[0], fx.Node):
            if found == "softmax":
                dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
                if dim not in (-1, 1):
                    return None
            kind, node = found, node.args[0]
            continue
        break
    if call_name(node) not in ("scatter", "scatter_") or len(node.args) < 4 or node.args[1] not in (1, -1):
        return None
    base, index, values = node.args[0], node.args[2], node.args[3]
    if not all(isinstance(a, fx.Node) for a in (base, index, values)) or _shape(base) != _shape(scores):
        return None
    # (the values written are the picked experts' weights, whatever computed them)
    topk = index.args[0] if call_name(index) == "getitem" and index.args[1:] == (1,) else None
    if topk is None or not is_topk(topk):
        return None
    fill = _fill(base)
    zero = (fill == -math.inf and kind is not None) or (fill == 0.0 and kind is None)
    return (topk, kind or "none") if zero and (_shape(scores) or (0, 0))[1] == experts else None


def _tiled_rows(node: fx.Node, experts: int) -> fx.Node | None:
    """``x`` when ``node`` is ``x.repeat(E, 1)`` of a ``[T, H]`` value: every token's row once
    per expert, expert-major."""
    if call_name(node) not in ("repeat", "tile") or len(node.args) < 2:
        return None
    reps = node.args[1] if len(node.args) == 2 else node.args[1:]
    x = node.args[0]
    return x if list(reps) == [experts, 1] and len(_shape(x) or ()) == 2 else None


def _expert_major_weights(node: fx.Node, tokens: int, experts: int) -> fx.Node | None:
    """The ``[T, E]`` weights when ``node`` is their transpose flattened to a column,
    ``scores.t().reshape(-1, 1)`` (one weight per row of the tiled tokens)."""
    if call_name(node) not in _VIEWS or _shape(node) != (experts * tokens, 1):
        return None
    t = _through(node, _VIEWS)
    name = call_name(t)
    swapped = (name == "t") or (name in ("transpose", "swapaxes") and {d % 2 for d in t.args[1:3]} == {0, 1}) or \
        (name == "permute" and list(t.args[1] if len(t.args) == 2 else t.args[1:]) == [1, 0])
    source = t.args[0] if swapped and t.args else None
    return source if isinstance(source, fx.Node) and _shape(source) == (tokens, experts) else None


def _summed_over_experts(row: fx.Node, experts: int, tokens: int) -> fx.Node | None:
    """The sum over the experts of the down projection's ``[E, T, H]`` output, through views."""
    node = row
    for _ in range(6):
        users = list(node.users)
        if len(users) != 1:
            return None
        node = users[0]
        if call_name(node) in _VIEWS:
            continue
        if call_name(node) != "sum":
            return None
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
        shape = _shape(node.args[0]) or ()
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        return node if dims in ([0], [-len(shape)]) and len(shape) == 3 and shape[:2] == (experts, tokens) \
            and not keep else None
    return None


def dense_layer(chain, table: dict) -> dict | None:
    """What a densely written routed layer around the experts' ``chain`` (a
    ``linear_chain`` of ``bmm``s with 3-D weights, ``details["experts"] = E``) is, as the
    module docstring describes it: ``{"topk", "scores", "input", "weights", "combine"}``
    (nodes; ``weights`` the dense ``[T, E]`` routing weights, zero where not picked;
    ``scores`` the score function's name), or None when any fact does not hold."""
    experts = chain.details["experts"]
    column, row = table[chain.details["column"][0]], table[chain.details["row"]]
    if chain.details.get("column_bias") or not column.args:
        return None
    scaled = _through(column.args[0], _VIEWS)
    shape = _shape(column.args[0])
    if call_name(scaled) != "mul" or shape is None or len(shape) != 3 or shape[0] != experts:
        return None
    tokens = shape[1]
    a, b = scaled.args[:2]
    for tiled, column_weights in ((a, b), (b, a)):
        x = _tiled_rows(tiled, experts) if isinstance(tiled, fx.Node) else None
        weights = _expert_major_weights(column_weights, tokens, experts) if isinstance(column_weights, fx.Node) \
            else None
        if x is not None and weights is not None and (_shape(x) or (0,))[0] == tokens:
            break
    else:
        return None
    found = _dense_scores(weights, experts)
    combine = _summed_over_experts(row, experts, tokens)
    if found is None or combine is None:
        return None
    topk, kind = found
    return {"topk": topk, "scores": kind, "input": x, "weights": weights, "combine": combine}
