"""What the experts compute between their projections: their parameters by role, and the
activation of gated experts, read off the captured ops and then checked by running them
against :func:`gated` (SiLU, exact or tanh GeLU, ReLU, or GPT-OSS's clamped SwiGLU)."""
from __future__ import annotations

import weakref

import torch
import torch.fx as fx
import torch.nn.functional as F

from autopar.ir import tensor_spec
from autopar.passes.analysis.experts.reading import between, score_kind
from autopar.passes.analysis.linear_chains import expert_bias
from autopar.passes.analysis.ops import call_name, match_linear

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
    alphas = {_scalar(a) for n in nodes if call_name(n) == "mul" and any(score_kind(u) == "sigmoid" for u in n.users)
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
    spec = tensor_spec(start)
    if spec is None or chain.details.get("blocks") != 2:
        return None
    # every layer of a stack computes the same ops on the same shapes: checked once
    key = (_structure(start, inside, end), tuple(spec.shape), spec.dtype, bool(chain.details.get("interleaved")))
    checked = _CHECKED.setdefault(start.graph, {})
    if key not in checked:
        checked[key] = _checked_activation(chain, start, inside, end, spec)
    found = checked[key]
    return None if found is None else dict(found)


_CHECKED: "weakref.WeakKeyDictionary[fx.Graph, dict]" = weakref.WeakKeyDictionary()


def _structure(start: fx.Node, inside: list[fx.Node], end: fx.Node) -> tuple:
    """The ops ``inside`` as :func:`_subgraph` runs them, by position: each op's kind,
    target, arguments (a node by its position, None outside) and the output's position."""
    position = {start: 0, **{node: i + 1 for i, node in enumerate(inside)}}

    def norm(value):
        if isinstance(value, fx.Node):
            return ("node", position.get(value))
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, tuple(norm(v) for v in value))
        if isinstance(value, dict):
            return ("dict", tuple((k, norm(v)) for k, v in value.items()))
        if isinstance(value, slice):
            return ("slice", norm(value.start), norm(value.stop), norm(value.step))
        try:
            hash(value)
        except TypeError:
            return ("repr", repr(value))
        return (type(value).__name__, value)

    return (tuple((n.op, n.target, norm(n.args), norm(n.kwargs)) for n in inside), position.get(end))


def _checked_activation(chain, start: fx.Node, inside: list[fx.Node], end: fx.Node, spec) -> dict | None:
    """:func:`expert_activation`, run: the candidates read off the ops, each checked."""
    fn = _subgraph(start, inside, end)
    if fn is None:
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


def expert_parameters(gm: fx.GraphModule, chain, combine: fx.Node, table: dict, order: dict) -> dict:
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
    read = {str(a.target) for n in between(column, combine, order) for a in n.all_input_nodes if a.op == "get_attr"}
    read |= {str(g.args[0].target) for n in between(column, combine, order) for g in n.all_input_nodes
             if call_name(g) == "index" and isinstance(g.args[0], fx.Node) and g.args[0].op == "get_attr"}
    if read - known:
        out["unread"] = (f"{chain.id}: the layer reads {sorted(read - known)} between its experts and its output, "
                         f"which the expert-parallel call does not take")
    return out
