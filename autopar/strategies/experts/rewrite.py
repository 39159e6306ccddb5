"""Expert parallelism's rewrite of one rank's graph: a routed layer's experts run where
they are held.

For an ``experts`` region (:mod:`autopar.passes.analysis.experts`) the pass replaces everything
between the router's outputs and the layer's routed output (the sort by expert, the
grouped matmuls over all ``E`` experts, the un-sort and the sum over the ``k`` slots) by
one call of :func:`expert_parallel_mlp`: the tokens :func:`~.collectives.dispatch`-ed to
the ranks of the expert group that hold their experts, each rank's ``E/P`` experts on the
rows it received, and the outputs :func:`~.collectives.combine`-d back, weighted and
summed over the slots. The router (its linear, scores, ``topk``, renormalisation) stays
in the graph, replicated, so every rank routes its own tokens as the single-device model
would. The experts' parameters the call reads are this rank's slices of the 3-D weights
(``[E/P, ...]``: the layout cuts them on the experts' dimension; the caller installs
them), their biases too when they have them (``[E/P, width]``: Hugging Face GPT-OSS adds
each row's expert's bias after both projections). Between the projections the call
computes the activation the analysis read and checked (``details["activation"]``:
SiLU, exact or tanh GeLU or ReLU gating the up half, or GPT-OSS's clamped SwiGLU;
gate and up as halves or alternating columns, :func:`autopar.passes.analysis.experts.gated`).
What the analysis could not read (another activation, an ungated expert, a parameter
the call does not take; ``details["unread"]``) raises: rewrites fail loudly. With a
tensor group the rank's experts are also Megatron-split (f and g around the call): the
gated projection and its bias by columns, the down projection by rows, its bias whole
on every tensor rank and added by the first (its gradient summed over the tensor group
by f), so the reduced output holds it once.

A layer of separate expert modules (a ``ModuleList`` and a loop over the experts,
``details["form"] = "module_list"``) is replaced the same way by
:func:`expert_parallel_modules`, which runs the rank's own expert modules whole (any
module: biases, any activation) on the rows dispatched to them.

The plan reaches it through :class:`~autopar.strategies.experts.planner.ExpertParallel`'s
rank pass (:func:`expert_parallel_regions_pass`, docs/experts.md).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from autopar.grid import MeshAxis
from autopar.ir import PARAM_SHARDS, SPEC, Region, regions
from autopar.passes.analysis.experts import activation_argument, gated
from autopar.passes.analysis.ops import match_linear
from autopar.runtime.collectives import copy_to_tensor_region, reduce_from_tensor_region
from autopar.runtime.groups import group_rank
from autopar.strategies.experts.collectives import combine, dispatch, record_load
from autopar.strategies.experts.layout import ExpertShard


def _project(x: torch.Tensor, weight: torch.Tensor, layout: str) -> torch.Tensor:
    """``x`` times one expert's weight: ``[out, in]`` used transposed (``experts_out_in``)
    or ``[in, out]`` (``experts_in_out``)."""
    return x @ (weight.t() if layout == "experts_out_in" else weight)


def by_expert(rows: torch.Tensor, ids: torch.Tensor, count: int, run) -> torch.Tensor:
    """``run(j, rows of expert j)`` for each of this rank's ``count`` experts, the outputs
    put back in the rows' order (zeros of the rows' shape when the rank holds none)."""
    outputs, order = [], []
    for expert in range(count):
        picked = (ids == expert).nonzero().squeeze(1)
        outputs.append(run(expert, rows[picked]))
        order.append(picked)
    if not outputs:
        return rows.new_zeros(rows.shape)
    return torch.cat(outputs)[torch.argsort(torch.cat(order))]


def local_experts(rows: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                  activation, layouts: tuple[str, str], gate_up_bias: torch.Tensor | None = None,
                  down_bias: torch.Tensor | None = None, *, interleaved: bool = False) -> torch.Tensor:
    """This rank's experts (``gate_up`` ``[E/P, ...]``, ``down`` ``[E/P, ...]``, their biases
    ``[E/P, width]`` when given) on the rows it received, each by the expert ``ids`` names:
    ``down(act(gate) * up + ...)`` as Hugging Face's experts compute it, the activation and
    the gate/up layout as :func:`autopar.passes.analysis.experts.gated` takes them (halves, gate
    first, or alternating columns when ``interleaved``)."""
    def run(expert, x):
        h = _project(x, gate_up[expert], layouts[0])
        if gate_up_bias is not None:
            h = h + gate_up_bias[expert]
        out = _project(gated(h, activation, interleaved), down[expert], layouts[1])
        return out if down_bias is None else out + down_bias[expert]
    return by_expert(rows, ids, gate_up.shape[0], run)


def _routed(hidden, index, weights, experts: int, group: str, layer: str, run_local) -> torch.Tensor:
    """Dispatch ``hidden``'s (token, slot) rows to their experts' ranks, ``run_local(rows,
    ids)`` there, combine back; the rows received counted under ``layer``."""
    rows, ids, routing = dispatch(hidden, index.long(), experts, group)
    if layer:
        record_load(layer, routing.rows)
    return combine(run_local(rows, ids), routing, weights, group, rows)


def _input_weighted(hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, route) -> torch.Tensor:
    """``route(rows, index, weights)`` with each (token, slot) pair's row scaled by its weight
    before its expert (``weighted="input"``, Llama 4) rather than after: the pairs are
    routed as tokens of one slot each, weighted by one, and summed over the slots after."""
    tokens, top_k = index.shape
    pairs = (hidden.unsqueeze(1) * weights.unsqueeze(-1).to(hidden.dtype)).reshape(tokens * top_k, *hidden.shape[1:])
    ones = torch.ones((tokens * top_k, 1), dtype=hidden.dtype, device=hidden.device)
    out = route(pairs, index.reshape(tokens * top_k, 1), ones)
    return out.view(tokens, top_k, *out.shape[1:]).sum(1)


def expert_parallel_mlp(hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                        down: torch.Tensor, *, experts: int, group: str, activation,
                        layouts: tuple[str, str], tensor: str | None = None, layer: str = "",
                        gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
                        interleaved: bool = False, weighted: str = "output") -> torch.Tensor:
    """A routed layer's output ``[tokens, hidden]`` with its experts spread over ``group``
    (dispatch, this rank's experts, combine): what the layer computes on one device.
    ``gate_up_bias``, ``down_bias``: the rank's experts' biases (``[E/P, width]``);
    ``activation`` and ``interleaved``: what :func:`autopar.passes.analysis.experts.gated` takes.

    ``tensor``: the experts are also Megatron-split over that group (each rank holds its
    columns of the gated projection and of its bias, its rows of the down projection): the
    tokens and routing weights enter through Megatron's f (identity forward, all-reduce
    backward) and the combined output leaves through g (all-reduce forward), megatron
    §2.3. The down projection's bias, whole on every tensor rank, is added by the group's
    first rank (the others add it times zero) after its own f, so g's sum holds it once
    and f's backward gives every tensor rank the first rank's gradient of it. ``layer``:
    the region id the rows it processes are counted under (:data:`.collectives.LOAD`).
    ``weighted="input"``: each row is scaled by its routing weight before its expert
    (:func:`_input_weighted`; docs/experts.md, "Experts written densely")."""
    if tensor is not None:
        hidden, weights = copy_to_tensor_region(hidden, tensor), copy_to_tensor_region(weights, tensor)
        if down_bias is not None:
            down_bias = copy_to_tensor_region(down_bias, tensor)
            if group_rank(tensor) != 0:
                down_bias = down_bias * 0.0
    def route(rows, index, weights):
        return _routed(rows, index, weights, experts, group, layer,
                       lambda rows, ids: local_experts(rows, ids, gate_up, down, activation, layouts, gate_up_bias,
                                                       down_bias, interleaved=interleaved))
    out = _input_weighted(hidden, index, weights, route) if weighted == "input" else route(hidden, index, weights)
    return reduce_from_tensor_region(out, tensor) if tensor is not None else out


def expert_parallel_modules(hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, *modules,
                            experts: int, group: str, layer: str = "") -> torch.Tensor:
    """A routed layer of separate expert modules (a ``ModuleList``) with its experts spread
    over ``group``: ``modules`` are this rank's ``E/P`` experts (any module: biases, any
    activation), each run on the rows dispatched to it; the result is what the layer's
    loop over every expert computes on one device (the weighted outputs summed over the
    ``k`` slots)."""
    return _routed(hidden, index, weights, experts, group, layer,
                   lambda rows, ids: by_expert(rows, ids, len(modules), lambda j, x: modules[j](x)))


torch.fx.wrap("expert_parallel_mlp")
torch.fx.wrap("expert_parallel_modules")


def expert_weights(gm: fx.GraphModule, region: Region) -> tuple:
    """The experts' (gated projection, down projection) matches of ``region``
    (:func:`autopar.passes.analysis.ops.match_linear`) and their chain, checked: what the
    analysis read of them (gated, an activation :func:`local_experts` computes, no
    parameter besides the weights and their biases) raises ``ValueError`` with its reason
    when unread (``details["unread"]``). A layer of separate expert modules needs no
    check (its modules run as they are): ``()``."""
    if region.details.get("form") == "module_list":
        return ()
    table = {n.name: n for n in gm.graph.nodes}
    chain = next(r for r in regions(gm, "linear_chain") if r.id == region.details["chain"])
    up, down = match_linear(table[chain.details["column"][0]], gm), match_linear(table[chain.details["row"]], gm)
    why = region.details.get("unread")
    if why is None and region.details.get("activation") is None:
        why = f"{chain.id}: the analysis read no activation of its experts"
    if why is not None:
        raise ValueError(f"expert parallelism: {why}")
    return up, down, chain


def expert_shards(gm: fx.GraphModule, region: Region, tensor: bool) -> dict:
    """The cut of ``region``'s expert weights and biases (by the graph's parameter names):
    dimension 0 over the expert group; with ``tensor``, the gated projection's output
    width (gate and up blocks, or a contiguous cut when they alternate: each gate beside
    its up) and its bias alike, and the down projection's input width over the tensor
    group (its bias, of the output width, whole on every tensor rank)."""
    if region.details.get("form") == "module_list":
        return {}   # whole modules, held by their rank (strategies/experts/layout.place_modules)
    up, down, _ = expert_weights(gm, region)
    d = region.details
    out = {up.weight: ExpertShard(), down.weight: ExpertShard()}
    if tensor:
        out_dim = {"experts_out_in": 1, "experts_in_out": 2}
        blocks = 1 if d.get("interleaved") else 2
        out = {up.weight: ExpertShard(out_dim[up.weight_layout], blocks),
               down.weight: ExpertShard(3 - out_dim[down.weight_layout])}
    if d.get("gate_up_bias"):
        out[d["gate_up_bias"]] = ExpertShard(1, 1 if d.get("interleaved") else 2) if tensor else ExpertShard()
    if d.get("down_bias"):
        out[d["down_bias"]] = ExpertShard()
    return out


def expert_parallel_pass(gm: fx.GraphModule, region: Region, group: str, tensor: str | None = None,
                         place: int = 0, degree: int = 1) -> fx.GraphModule:
    """Replace ``region``'s experts by :func:`expert_parallel_mlp` over the named process
    ``group`` (see the module docstring), Megatron-split over ``tensor`` when named; the
    graph's expert parameters must already be this rank's slices (:func:`expert_shards`).
    A layer of separate expert modules calls :func:`expert_parallel_modules` with the
    modules of the rank at ``place`` in the group of ``degree`` (they run whole: no tensor split
    inside). Returns ``gm``, recompiled."""
    graph, d = gm.graph, region.details
    table = {n.name: n for n in graph.nodes}
    output = table[d["combine"]]
    if d.get("form") == "module_list":
        per_rank = d["experts"] // degree
        mine = d["modules"][place * per_rank:(place + 1) * per_rank]
        with graph.inserting_before(output):
            modules = [graph.get_attr(path) for path in mine]
            call = graph.call_function(expert_parallel_modules,
                                       (table[d["input"]], table[d["index"]], table[d["weights"]], *modules),
                                       {"experts": d["experts"], "group": group, "layer": region.id})
    else:
        up, down, chain = expert_weights(gm, region)
        with graph.inserting_before(output):
            gate_up_w, down_w = graph.get_attr(up.weight), graph.get_attr(down.weight)
            kwargs = {"experts": d["experts"], "group": group, "activation": activation_argument(d["activation"]),
                      "layouts": (up.weight_layout, down.weight_layout), "tensor": tensor, "layer": region.id}
            for key in ("gate_up_bias", "down_bias"):
                if d.get(key):
                    kwargs[key] = graph.get_attr(d[key])
            if d.get("interleaved"):
                kwargs["interleaved"] = True
            weights = table[d["weights"]]
            if d.get("form") == "dense":   # the picked experts' weights, from the dense [T, E] scores
                kwargs["weighted"] = d["weighted"]
                weights = graph.call_function(torch.gather, (weights, 1, table[d["index"]]))
            call = graph.call_function(expert_parallel_mlp,
                                       (table[d["input"]], table[d["index"]], weights, gate_up_w, down_w), kwargs)
    call.meta[SPEC] = output.meta.get(SPEC)
    output.replace_all_uses_with(call)
    doomed, erased = [table[n] for n in reversed(region.nodes)], set()
    while doomed:   # what only fed the replaced part, then what only fed that (index helpers, transposes)
        freed = []
        for node in doomed:
            if node in erased or node.users or node.op in ("placeholder", "output", "get_attr") or node is call:
                continue
            inputs = node.all_input_nodes
            graph.erase_node(node)
            erased.add(node)
            freed += [a for a in inputs if a.op == "call_function" and not a.is_impure()]
        doomed = [n for n in dict.fromkeys(freed) if n not in erased and not n.users]
    graph.lint()
    gm.recompile()
    return gm


def expert_parallel_regions_pass(gm: fx.GraphModule, *, regions_: list[str], group: str = MeshAxis.EXPERTS,
                                 tensor: str | None = None, place: int = 0, degree: int = 1) -> fx.GraphModule:
    """A rank program's pass: :func:`expert_parallel_pass` on each of the plan's expert
    parallel regions (by id) this graph holds (a pipeline stage holds some)."""
    found = {r.id: r for r in regions(gm, "experts")}
    made = gm.meta.setdefault(PARAM_SHARDS, {})   # the other split passes record theirs too
    for rid in regions_:
        if rid in found:
            made.update(expert_shards(gm, found[rid], tensor is not None))
            expert_parallel_pass(gm, found[rid], group, tensor, place, degree)
    return gm


__all__ = ["expert_parallel_mlp", "expert_parallel_modules", "expert_parallel_pass", "expert_parallel_regions_pass",
           "expert_shards", "expert_weights", "local_experts"]
