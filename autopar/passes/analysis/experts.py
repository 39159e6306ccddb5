"""Analysis pass: routed mixture-of-experts layers (docs/experts.md).

A routed expert layer sends each token to ``k`` of ``E`` experts its router picks. The
experts themselves are a ``linear_chain`` region with ``details["experts"] = E`` (3-D
weights applied by a grouped matmul, :mod:`autopar.passes.analysis.linear_chains`); this pass
reads around them, in the captured graph, what expert parallelism needs (docs/experts.md):

* the **router**: the linear of ``E`` outputs (a bias or not) whose scores (``softmax``
  or ``sigmoid``, after casts and views), or logits, a ``topk(k)`` reads; its values,
  renormalised over the ``k`` slots (divided by their sum, or their softmax: GPT-OSS) or
  not, are the routing weights, its indices the experts;
* the **dispatch**: what takes the indices to the grouped matmul's offsets and the
  tokens to its rows (Hugging Face: ``sort`` of the expert ids, ``histc``, ``cumsum``,
  an index by ``perm // k``);
* the **combine**: from the down projection to the sum over the ``k`` slots
  (``(out * w)[inverse].view(T, k, H).sum(1)``);
* **shared experts** (Qwen2-MoE, DeepSeek): MLPs (``linear_chain`` regions without
  experts) that read the router's input and whose output, gated or not, is added to the
  combine's: a parallel branch beside the routed experts;
* the **experts** themselves: their biases (``out + bias[expert_ids]`` after a grouped
  matmul, Hugging Face GPT-OSS) and the activation between their projections, read and
  then checked by running the captured ops against what the expert-parallel call
  computes (:func:`expert_activation`, :func:`gated`: SiLU, exact or tanh GeLU, ReLU, or
  GPT-OSS's clamped SwiGLU; gate and up as halves or alternating columns).

It records one ``experts`` region per layer, its nodes the router's, the dispatch's, the
experts' and the combine's, ``details``: ``experts``, ``top_k``, ``router`` (the linear's
node), ``router_weight`` (its parameter), ``scores`` (``"softmax"``/``"sigmoid"``),
``normalized`` (the top-k values divided by their sum, or their softmax over the slots),
``chain`` (the experts' ``linear_chain`` id), ``input`` (the tokens the
router reads), ``index`` and ``weights`` (the top-k experts and their weights, ``[tokens,
k]``), ``combine`` (the node whose value is the layer's routed output), ``shared`` (the
shared experts' ``linear_chain`` ids), ``router_bias``, ``gate_up_bias`` and ``down_bias``
(parameter names, or None), ``activation`` (``{"name": ...}``, with ``alpha`` and ``limit``
for the clamped SwiGLU), ``interleaved`` (gate and up columns alternate) and ``unread``
(why the expert-parallel call cannot compute these experts; None when it can). An
expert chain whose router it cannot read (no ``topk`` before its offsets, a router of
another width) gets no region, with a warning that names the chain and says the layer
stays in its data or tensor plan.

Experts written as separate modules (a ``ModuleList``) and a loop over them
(``token, slot = where(index == e)``; the expert on ``x[token]``; its output weighted
and ``index_add``-ed into the layer's output) give a region too, ``details["form"] =
"module_list"``, with every expert's chain (``chains``) and module path (``modules``) in
expert order.

:func:`router_statistics` finds what a load-balancing loss reduces over the tokens
(the data family makes those the whole batch's). The expert family
(:mod:`autopar.strategies.experts.planner`) prices and rewrites the regions.
"""
from __future__ import annotations

import logging
from collections import deque

import torch
import torch.fx as fx
import torch.nn.functional as F

from autopar.passes.analysis.linear_chains import expert_bias
from autopar.passes.manager import examining
from autopar.passes.analysis.ops import LINEAR_FUNCTIONS, LinearMatch, call_name, match_linear
from autopar.ir import Region, add_region, clear_regions, regions, tensor_spec

log = logging.getLogger("autopar.analysis.experts")

_TOPK = {torch.topk}
_SCORES = {torch.softmax: "softmax", torch.nn.functional.softmax: "softmax", torch.sigmoid: "sigmoid",
           torch.nn.functional.sigmoid: "sigmoid"}
_PASS_THROUGH = ("to", "_to_copy", "view", "reshape", "_unsafe_view", "float", "type_as", "contiguous", "clone")


def _is_topk(node: fx.Node) -> bool:
    return node.op in ("call_function", "call_method") and (node.target in _TOPK or call_name(node) == "topk")


def _scores(node: fx.Node) -> str | None:
    if node.op not in ("call_function", "call_method"):
        return None
    return _SCORES.get(node.target) or {"softmax": "softmax", "_softmax": "softmax", "sigmoid": "sigmoid"}.get(
        call_name(node))


def _walk(start: fx.Node, limit: int, forward: bool = False):
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


def _offsets(node: fx.Node) -> fx.Node | None:
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


def _router(topk: fx.Node, gm: fx.GraphModule):
    """(router linear match, score function) read back from ``topk``'s input through
    casts and views, or (None, None)."""
    scores, node = None, topk.args[0]
    for _ in range(8):
        if not isinstance(node, fx.Node):
            return None, None
        found = _router_linear(node, gm)
        if found is not None:
            return found, scores
        scores = scores or _scores(node)
        # casts and views; DeepSeek-V3's score correction bias (an add) and group-limited
        # routing (a masked_fill of the groups not picked) choose, but do not weight
        if not (_scores(node) or call_name(node) in _PASS_THROUGH + ("add", "masked_fill")) or not node.args:
            return None, None
        node = node.args[0]
    return None, None


def _experts_input(column: fx.Node) -> fx.Node | None:
    """The tokens ``[tokens, hidden]`` the experts' rows are taken from: what the index
    feeding the grouped matmul's input (through casts) indexes."""
    node = column.args[0] if column.args else None
    for _ in range(4):
        if not isinstance(node, fx.Node):
            return None
        if call_name(node) in ("index", "getitem") and node.args and isinstance(node.args[0], fx.Node):
            return node.args[0]
        if call_name(node) not in _PASS_THROUGH or not node.args:
            return None
        node = node.args[0]
    return None


def _routing_weights(topk: fx.Node, indices: fx.Node, combine: fx.Node) -> tuple[fx.Node, bool] | None:
    """The routing weights ``[tokens, k]`` the combine reads, and whether they are
    renormalised over the slots: the top-k values (Mixtral, Qwen), or the scores gathered
    at the top-k indices (DeepSeek-V3 picks by corrected scores and weights by the
    uncorrected ones), after their renormalisation, scaling and casts."""
    ancestors = set(_walk(combine, 5000))
    values = [u for u in topk.users if u.args[1:] == (0,)]
    gathered = [u for u in indices.users if call_name(u) == "gather"]
    for start in values + gathered:
        weights = _weights(start)
        if weights in ancestors:
            path = [weights, *_walk(weights, 8)]
            cut = path.index(start) if start in path else len(path)
            return weights, any(call_name(n) in ("div", "div_", "truediv") or _over_slots(n) for n in path[:cut])
    return None


def _combine(row: fx.Node, top_k: int) -> fx.Node | None:
    """The sum over the ``k`` slots after the down projection ``row`` (its users, breadth
    first): a sum over dimension 1 of a ``[tokens, k, hidden]`` view."""
    for user in _walk(row, 32, forward=True):
        if call_name(user) == "sum":
            dims = user.args[1] if len(user.args) > 1 else user.kwargs.get("dim")
            dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
            source = user.args[0]
            shape = tensor_spec(source).shape if isinstance(source, fx.Node) and tensor_spec(source) else ()
            if dims == [1] and len(shape) == 3 and shape[1] == top_k:
                return user
    return None


def _weights(values: fx.Node) -> fx.Node:
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
    if _scores(node) != "softmax":
        return False
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    spec = tensor_spec(node)
    return spec is not None and len(spec.shape) == 2 and dim in (-1, 1)


def _between(first: fx.Node, last: fx.Node, order: dict) -> set[fx.Node]:
    """The nodes on a path from ``first`` to ``last`` (both included)."""
    ancestors = {last} | set(_walk(last, 10_000))
    out, queue = {first}, deque([first])
    while queue:
        for user in queue.popleft().users:
            if user not in out and user in ancestors and order[user] <= order[last]:
                out.add(user)
                queue.append(user)
    return out


def _shared(gm: fx.GraphModule, router_input: fx.Node, combine: fx.Node, own: tuple = ()) -> list[str]:
    """The ``linear_chain`` regions without experts (and not among ``own``, a layer's
    expert modules) that read the router's input (up to views) and whose output meets
    the combine's in an add."""
    table = {n.name: n for n in gm.graph.nodes}
    bases = {router_input} | {a for a in _walk(router_input, 4) if call_name(a) in _PASS_THROUGH}
    downstream = {combine, *_walk(combine, 16, forward=True)}   # the routed output's casts and views up to the add
    shared = []
    for chain in regions(gm, "linear_chain"):
        if chain.details.get("experts") or chain.id in own:
            continue
        column = table[chain.details["column"][0]]
        source = column.args[0] if column.args else None
        if source not in bases and not (isinstance(source, fx.Node) and set(_walk(source, 4)) & bases):
            continue
        row = table[chain.details["row"]]
        reached = {row, *_walk(row, 8, forward=True)}
        if any(call_name(n) == "add" and set(n.all_input_nodes) & downstream for n in reached):
            shared.append(chain.id)
    return shared


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _module_path(gm: fx.GraphModule, chain, table: dict) -> str:
    """The module holding a chain's linears (their weights' longest common module path)."""
    paths = []
    for name in [*chain.details["column"], chain.details["row"]]:
        found = match_linear(table[name], gm)
        if found is not None:
            paths.append(found.weight.split(".")[:-2])
    common = paths[0] if paths else []
    for path in paths[1:]:
        common = [a for a, b in zip(common, path) if a == b][:len(common)]
        while common and path[:len(common)] != common:
            common = common[:-1]
    return ".".join(common)


def _module_list_layer(gm: fx.GraphModule, topk: fx.Node, chains: dict, table: dict, order: dict):
    """A routed layer whose experts are separate modules (a ``ModuleList``), written as a
    loop over the experts: ``token, slot = where(index == e)``, the expert on
    ``x[token]``, its output weighted by ``weights[token, slot]`` and ``index_add``-ed
    into the layer's output. Returns ``(x, [(chain, index_add)] in expert order)`` or None."""
    indices = [u for u in topk.users if u.args[1:] == (1,)]
    if len(indices) != 1:
        return None
    found: dict[int, tuple] = {}
    source = None
    for eq in indices[0].users:
        if call_name(eq) != "eq" or len(eq.args) < 2 or _int(eq.args[1]) is None:
            continue
        where = next((u for u in eq.users if call_name(u) in ("where", "nonzero_numpy") and len(u.args) == 1), None)
        token = next((u for u in (where.users if where is not None else ()) if u.args[1:] == (0,)), None)
        if token is None:
            continue
        rows = next((u for u in token.users if call_name(u) in ("getitem", "index") and u.args[1] in (token, [token])
                     and isinstance(u.args[0], fx.Node)), None)
        chain = next((c for c in chains.values() if rows is not None and any(
            table[n].args and table[n].args[0] is rows for n in c.details["column"])), None)
        add = next((u for u in token.users if call_name(u) in ("index_add", "index_add_")), None)
        if rows is None or chain is None or add is None or (source is not None and rows.args[0] is not source):
            return None
        # the expert is its chain and nothing else: every op from its rows to its output
        # (what the weighting multiplies) is the chain's, so the module the rewrite calls
        # computes what the loop computed
        row = table[chain.details["row"]]
        weighted = add.args[3] if len(add.args) > 3 else add.kwargs.get("source")
        span = _between(rows, row, order) - {rows}
        if not (isinstance(weighted, fx.Node) and row in weighted.all_input_nodes) or \
                not span <= {table[n] for n in chain.nodes}:
            log.warning("experts: %s: the expert's forward between its rows and its weighted output holds ops outside "
                        "its MLP chain (%s); the layer stays in its data or tensor plan", chain.id,
                        sorted(n.name for n in span - {table[n] for n in chain.nodes})[:4])
            return None
        source = rows.args[0]
        found[_int(eq.args[1])] = (chain, add)
    if not found or sorted(found) != list(range(len(found))):
        return None
    return source, [found[e] for e in range(len(found))]


def _module_list_layers(gm: fx.GraphModule, table: dict, order: dict) -> None:
    """One ``experts`` region (``details["form"] = "module_list"``) per routed layer of
    separate expert modules (:func:`_module_list_layer`)."""
    chains = {r.id: r for r in regions(gm, "linear_chain") if not r.details.get("experts")}
    for topk in [n for n in gm.graph.nodes if _is_topk(n)]:
        with examining("experts", topk, "routed experts (separate modules)"):
            layer = _module_list_layer(gm, topk, chains, table, order)
            if layer is None:
                continue
            source, experts = layer
            router, scores = _router(topk, gm)
            if router is None or router.out_features != len(experts):
                log.warning("experts: %d expert modules (%s ..) routed by %s, but no router the analysis can read "
                            "(a linear of %d outputs whose scores the topk reads); the layer stays in its data or "
                            "tensor plan", len(experts), experts[0][0].id, topk.name, len(experts))
                continue
            adds = {add for _, add in experts}
            combine = next((a for a in adds if not any(u in adds for u in a.users)), None)
            values = [u for u in topk.users if u.args[1:] == (0,)]
            if combine is None or len(values) != 1:
                continue
            top_k = _int(topk.args[1] if len(topk.args) > 1 else topk.kwargs.get("k"))
            members = _between(router.node, combine, order)
            for chain, _ in experts:
                members |= {table[n] for n in chain.nodes}
            path = _module_path(gm, experts[0][0], table).rsplit(".", 2)[0]   # the block holding the list
            details = {"experts": len(experts), "top_k": top_k, "router": router.node.name,
                       "router_weight": router.weight, "scores": scores or "none",
                       "normalized": any(call_name(u) in ("div", "div_", "truediv") for u in values[0].users),
                       "chain": experts[0][0].id, "chains": [c.id for c, _ in experts], "form": "module_list",
                       "modules": [_module_path(gm, c, table) for c, _ in experts], "input": source.name,
                       "index": [u for u in topk.users if u.args[1:] == (1,)][0].name,
                       "weights": _weights(values[0]).name, "combine": combine.name,
                       "shared": _shared(gm, router.input, combine, tuple(c.id for c, _ in experts))}
            prefix = path[len("model."):] if path.startswith("model.") else path
            add_region(gm, Region(id=f"experts:{prefix}", kind="experts",
                                  nodes=[n.name for n in sorted(members, key=order.__getitem__)], details=details))


_GATES = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


def gated(h: torch.Tensor, activation, interleaved: bool = False) -> torch.Tensor:
    """What a gated expert computes between its projections from the gated projection's
    output ``h`` (its bias added): gate and up taken apart (halves, gate first; or
    alternating columns when ``interleaved``), then ``act(gate) * up`` for ``activation``
    ``"silu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"relu"``, or, for ``("clamped_swiglu",
    alpha, limit)``, GPT-OSS's clamped SwiGLU: the gate clamped above at ``limit``, the up
    to ``[-limit, limit]``, ``(up + 1) * gate * sigmoid(alpha * gate)``, op for op as
    Hugging Face computes it."""
    gate, up = (h[..., ::2], h[..., 1::2]) if interleaved else h.chunk(2, dim=-1)
    if isinstance(activation, (tuple, list)):
        name, alpha, limit = activation
        if name != "clamped_swiglu":
            raise ValueError(f"unknown expert activation {activation!r}")
        gate = gate.clamp(min=None, max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    return _GATES[activation](gate) * up


def activation_argument(activation: dict):
    """A region's ``details["activation"]`` as :func:`gated` takes it: the name, or
    ``("clamped_swiglu", alpha, limit)``."""
    if activation["name"] == "clamped_swiglu":
        return ("clamped_swiglu", activation["alpha"], activation["limit"])
    return activation["name"]


def _scalar(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _swiglu_constants(nodes: list[fx.Node]) -> tuple[float, float] | None:
    """``(alpha, limit)`` of a clamped SwiGLU among ``nodes``: the upper clamp of the gate,
    the clamp of the up to ``[-limit, limit]``, and the scale inside the sigmoid."""
    bounds = []
    for node in nodes:
        if call_name(node) in ("clamp", "clip"):
            low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
            high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
            bounds.append((None if low is None else _scalar(low), _scalar(high)))
    limits = {high for low, high in bounds if low is None and high is not None}
    if len(limits) != 1:
        return None
    limit = limits.pop()
    if (-limit, limit) not in bounds:
        return None
    alphas = {_scalar(a) for n in nodes if call_name(n) == "mul" and any(_scores(u) == "sigmoid" for u in n.users)
              for a in n.args[1:2]}
    alphas.discard(None)
    return (alphas.pop(), limit) if len(alphas) == 1 else None


def _subgraph(start: fx.Node, inside: list[fx.Node], end: fx.Node) -> fx.GraphModule | None:
    """The ops ``inside`` (in graph order) as a module of one input, ``start``'s value, and
    one output, ``end``'s; None when they read anything else (a parameter, another value)."""
    graph = fx.Graph()
    env = {start: graph.placeholder("x")}
    for node in inside:
        if any(a not in env for a in node.all_input_nodes):
            return None
        env[node] = graph.node_copy(node, env.__getitem__)
    if end not in env:
        return None
    graph.output(env[end])
    return fx.GraphModule(torch.nn.Module(), graph)


def expert_activation(chain, start: fx.Node, end: fx.Node, table: dict) -> dict | None:
    """The activation of gated experts (a ``linear_chain`` with 2 blocks) between their
    gated projection's output ``start`` (its bias added) and the down projection's input
    ``end``: ``{"name": "silu" | "gelu" | "gelu_tanh" | "relu"}`` or ``{"name":
    "clamped_swiglu", "alpha": a, "limit": l}`` (:func:`gated`), or None when none is what
    the captured ops compute. Read, then checked: the ops are run on a random value (spread
    past the clamp's limit) against :func:`gated` with the chain's gate/up layout."""
    inside = [table[n] for n in chain.details["pointwise"] if table[n] is not start]
    fn = _subgraph(start, inside, end)
    spec = tensor_spec(start)
    if fn is None or spec is None or chain.details.get("blocks") != 2:
        return None
    candidates = []
    constants = _swiglu_constants(inside)
    if constants is not None:
        candidates.append(({"name": "clamped_swiglu", "alpha": constants[0], "limit": constants[1]},
                           3 * abs(constants[1])))
    candidates += [({"name": name}, 3.0) for name in _GATES]
    interleaved = bool(chain.details.get("interleaved"))
    exact = spec.dtype in (torch.float32, torch.float64)
    generator = torch.Generator().manual_seed(0)
    # a few rows: the chain is pointwise over them (a real model routes millions of rows)
    rows = (min(spec.shape[0], 16), *spec.shape[1:]) if spec.shape else ()
    for activation, spread in candidates:
        x = (torch.randn(rows, generator=generator, dtype=torch.float32, device="cpu") * spread).to(spec.dtype)
        try:
            with torch.no_grad():
                got = fn(x.clone())
        except Exception:  # noqa: BLE001 - ops that do not run on their own: unread
            return None
        want = gated(x, activation_argument(activation), interleaved)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(
                got.float(), want.float(), rtol=1e-5 if exact else 2e-2, atol=1e-6 if exact else 1e-2):
            return activation
    return None


def _expert_parameters(gm: fx.GraphModule, chain, combine: fx.Node, table: dict, order: dict) -> dict:
    """The experts' parameters, by what they are: ``gate_up`` and ``down`` (the 3-D weights),
    ``gate_up_bias`` and ``down_bias`` (``[E, width]``, each row's expert's added after its
    grouped matmul; None without), ``activation`` (:func:`expert_activation`) and
    ``interleaved``; ``unread``: why the expert-parallel call cannot compute these experts
    (None: it can)."""
    column, row = table[chain.details["column"][0]], table[chain.details["row"]]
    up, down = match_linear(column, gm), match_linear(row, gm)
    out = {"gate_up": up.weight, "down": down.weight, "gate_up_bias": chain.details.get("column_bias"),
           "down_bias": None, "activation": None, "interleaved": bool(chain.details.get("interleaved")),
           "unread": None}
    added = expert_bias(down)
    if added is not None:
        out["down_bias"] = added[0]
    if chain.details.get("blocks") != 2:
        out["unread"] = (f"{chain.id} is not a gated expert (gate and up in one projection cut in two); this rewrite "
                         f"handles gated experts")
        return out
    start = next((table[n] for n in chain.details["pointwise"] if table[n] in column.users), column) \
        if out["gate_up_bias"] else column
    out["activation"] = expert_activation(chain, start, down.input, table)
    if out["activation"] is None:
        out["unread"] = (f"the experts {[column.name, *chain.details['pointwise'], row.name]} compute no activation "
                         f"this rewrite knows between their projections (SiLU, GeLU exact or tanh, ReLU gating the "
                         f"up half, or GPT-OSS's clamped SwiGLU)")
        return out
    # every parameter the layer reads from its gated projection to its output is one of these
    known = {out[k] for k in ("gate_up", "down", "gate_up_bias", "down_bias") if out[k]}
    read = {str(a.target) for n in _between(column, combine, order) for a in n.all_input_nodes if a.op == "get_attr"}
    read |= {str(g.args[0].target) for n in _between(column, combine, order) for g in n.all_input_nodes
             if call_name(g) == "index" and isinstance(g.args[0], fx.Node) and g.args[0].op == "get_attr"}
    if read - known:
        out["unread"] = (f"{chain.id}: the layer reads {sorted(read - known)} between its experts and its output, "
                         f"which the expert-parallel call does not take")
    return out


def find_routed_experts_pass(gm: fx.GraphModule) -> fx.GraphModule:
    """Record one ``experts`` region per routed mixture-of-experts layer of ``gm`` (see
    the module docstring). Run after :mod:`autopar.passes.analysis.linear_chains`."""
    clear_regions(gm, "experts")
    table = {n.name: n for n in gm.graph.nodes}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    _module_list_layers(gm, table, order)
    for chain in regions(gm, "linear_chain"):
        experts = chain.details.get("experts")
        if not experts:
            continue
        column, row = table[chain.details["column"][0]], table[chain.details["row"]]
        with examining("experts", column, "routed experts"):
            offsets = _offsets(column)
            topk = next((a for a in _walk(offsets, 64) if _is_topk(a)), None) if offsets is not None else None
            router, scores = _router(topk, gm) if topk is not None else (None, None)
            if router is None or router.out_features != experts:
                log.warning("experts: %s has %d experts but no router the analysis can read (a linear of %d "
                            "outputs whose scores a topk reads, before the grouped matmul's offsets); the layer "
                            "stays in its data or tensor plan", chain.id, experts, experts)
                continue
            top_k = topk.args[1] if len(topk.args) > 1 else topk.kwargs.get("k")
            combine = _combine(row, int(top_k))
            if combine is None:
                log.warning("experts: %s: no sum over the %s slots after its down projection; the layer stays in "
                            "its data or tensor plan", chain.id, top_k)
                continue
            indices = [u for u in topk.users if u.args[1:] == (1,)]
            found = _routing_weights(topk, indices[0], combine) if len(indices) == 1 else None
            if found is None:
                log.warning("experts: %s: its routing weights (the top-k values, or the scores gathered at the top-k "
                            "indices) are not what its combine reads; the layer stays in its data or tensor plan",
                            chain.id)
                continue
            weights, normalized = found
            source = _experts_input(column) or router.input
            members = _between(router.node, combine, order) | {table[n] for n in chain.nodes}
            shared = _shared(gm, router.input, combine)
            parameters = _expert_parameters(gm, chain, combine, table, order)
            details = {"experts": experts, "top_k": int(top_k), "router": router.node.name,
                       "router_weight": router.weight, "router_bias": router.bias, "scores": scores or "none",
                       "normalized": normalized, "chain": chain.id, "input": source.name, "index": indices[0].name,
                       "weights": weights.name, "combine": combine.name, "shared": shared,
                       **{k: parameters[k] for k in ("gate_up_bias", "down_bias", "activation", "interleaved",
                                                     "unread")}}
            path = chain.id.split(":", 1)[1].rsplit(".experts", 1)[0]
            add_region(gm, Region(id=f"experts:{path}", kind="experts",
                                  nodes=[n.name for n in sorted(members, key=order.__getitem__)], details=details))
    return gm


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
        if _scores(node):
            return True
        if call_name(node) not in _PASS_THROUGH or not node.args:
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
    for topk in (n for n in gm.graph.nodes if _is_topk(n) and _scored(n)):
        spec = tensor_spec(topk.args[0])
        if spec is None or len(spec.shape) != 2:
            continue
        tokens, experts = spec.shape
        for node in _walk(topk.args[0], 400, forward=True):
            if node.op not in ("call_function", "call_method") or not _reduces_tokens(node, tokens, experts):
                continue
            if any(call_name(u) in _BOOKKEEPING for u in _walk(node, 64, forward=True)):
                continue
            found[node] = None
            tokens_of[node] = tokens
    for node in list(found):   # the denominators: a reduction over a batch input the statistic is divided by
        for user in _walk(node, 16, forward=True):
            if call_name(user) not in ("div", "div_", "truediv") or len(user.args) < 2 or \
                    not isinstance(user.args[1], fx.Node):
                continue
            for other in [user.args[1], *_walk(user.args[1], 2000)]:   # (a sum over every layer: deep)
                spec = tensor_spec(other.args[0]) if other.args and isinstance(other.args[0], fx.Node) else None
                if other not in found and call_name(other) in ("sum", "mean") and spec is not None and spec.shape \
                        and spec.shape[0] % tokens_of[node] == 0 and _over_rows(other, len(spec.shape)) \
                        and not (set(_walk(other, 64)) & set(found)):
                    found[other] = None
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return [n.name for n in sorted(found, key=order.__getitem__)]


__all__ = ["activation_argument", "expert_activation", "find_routed_experts_pass", "gated", "router_statistics"]
