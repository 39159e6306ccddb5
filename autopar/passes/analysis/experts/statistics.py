"""The routers' load-balancing statistics: what a load-balancing loss reduces over the
tokens, which a split of the batch must make the whole batch's."""
from __future__ import annotations

import torch.fx as fx

from autopar.ir import tensor_spec
from autopar.passes.analysis.experts.reading import PASS_THROUGH, is_topk, nearest, score_kind
from autopar.passes.analysis.ops import call_name

_REDUCTIONS = ("histc", "bincount", "sum", "mean", "scatter_add", "scatter_add_", "index_add", "index_add_")
_BOOKKEEPING = ("cumsum", "_grouped_mm", "grouped_mm", "sort", "argsort", "repeat_interleave")


def _reduces_tokens(node: fx.Node, tokens: int, experts: int) -> bool:
    """Whether ``node`` reduces a value whose first dimension holds the ``tokens`` (a
    multiple of them: views that merged the slots in) over that dimension into one value
    per expert (``[experts]``: a count or a mean probability per expert)."""
    name = call_name(node)
    out = tensor_spec(node)
    if name not in _REDUCTIONS or not node.args or not isinstance(node.args[0], fx.Node) or out is None \
            or tuple(out.shape) != (experts,):
        return False
    if name.startswith(("scatter", "index")):
        # a scatter/index add into a tensor without the tokens: the source's rows summed into it
        source = node.args[3] if len(node.args) > 3 else node.kwargs.get("src", node.kwargs.get("source"))
        source_spec = tensor_spec(source) if isinstance(source, fx.Node) else None
        return source_spec is not None and bool(source_spec.shape) and source_spec.shape[0] > 0 \
            and source_spec.shape[0] % tokens == 0
    spec = tensor_spec(node.args[0])
    if spec is None or not spec.shape or spec.shape[0] % tokens:
        return False
    return name in ("histc", "bincount") or _over_rows(node, len(spec.shape))


def _over_rows(node: fx.Node, ndim: int) -> bool:
    """Whether a ``sum``/``mean`` reduces its input's first dimension (or every one)."""
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or dims == []:
        return True
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    return any(isinstance(d, int) and d % ndim == 0 for d in dims)


def _scored(topk: fx.Node) -> bool:
    """Whether ``topk`` picks from router scores: a softmax or sigmoid, through casts."""
    node = topk.args[0]
    for _ in range(4):
        if not isinstance(node, fx.Node):
            return False
        if score_kind(node):
            return True
        if call_name(node) not in PASS_THROUGH or not node.args:
            return False
        node = node.args[0]
    return False


def router_statistics(gm: fx.GraphModule) -> list[str]:
    """The nodes that reduce routers' scores over the tokens into statistics the model
    then uses (a load-balancing loss: Switch Transformer eqs 4-6, Hugging Face's
    ``load_balancing_loss_func``, the fraction of tokens routed to each expert and the
    mean router probability): downstream of a ``topk`` of softmax or sigmoid scores
    ``[tokens, E]``, reductions over the first (token) dimension into one value per
    expert (``[E]``) that do not feed the dispatch's bookkeeping (``cumsum`` into
    grouped-matmul offsets, sorts); and the reductions over the token rows of a batch
    input they are divided by (the count of unmasked tokens). Split over data ranks, each
    must be the mean over the ranks (:func:`autopar.runtime.collectives.batch_statistic`)
    for the loss to equal the single-device model's."""
    found: dict[fx.Node, None] = {}
    tokens_of: dict[fx.Node, int] = {}
    for topk in (n for n in gm.graph.nodes if is_topk(n) and _scored(n)):
        spec = tensor_spec(topk.args[0])
        if spec is None or len(spec.shape) != 2:
            continue
        tokens, experts = spec.shape
        for node in nearest(topk.args[0], 400, forward=True):
            if node.op not in ("call_function", "call_method") or not _reduces_tokens(node, tokens, experts):
                continue
            if any(call_name(u) in _BOOKKEEPING for u in nearest(node, 64, forward=True)):
                continue
            found[node] = None
            tokens_of[node] = tokens
    for node in list(found):   # the denominators: a reduction over a batch input the statistic is divided by
        for user in nearest(node, 16, forward=True):
            if call_name(user) not in ("div", "div_", "truediv") or len(user.args) < 2 or \
                    not isinstance(user.args[1], fx.Node):
                continue
            for other in [user.args[1], *nearest(user.args[1], 2000)]:   # (a sum over every layer: deep)
                spec = tensor_spec(other.args[0]) if other.args and isinstance(other.args[0], fx.Node) else None
                if other not in found and call_name(other) in ("sum", "mean") and spec is not None and spec.shape \
                        and spec.shape[0] % tokens_of[node] == 0 and _over_rows(other, len(spec.shape)) \
                        and not (set(nearest(other, 64)) & set(found)):
                    found[other] = None
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return [n.name for n in sorted(found, key=order.__getitem__)]
