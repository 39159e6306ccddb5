"""Expert parallelism's rewrite of one rank's graph: a routed layer's experts run where
they are held.

For an ``experts`` region (:mod:`autopar.analysis.experts`) the pass replaces everything
between the router's outputs and the layer's routed output (the sort by expert, the
grouped matmuls over all ``E`` experts, the un-sort and the sum over the ``k`` slots) by
one call of :func:`expert_parallel_mlp`: the tokens :func:`~.collectives.dispatch`-ed to
the ranks of the expert group that hold their experts, each rank's ``E/P`` experts on the
rows it received, and the outputs :func:`~.collectives.combine`-d back, weighted and
summed over the slots. The router (its linear, scores, ``topk``, renormalisation) stays
in the graph, replicated, so every rank routes its own tokens as the single-device model
would. The experts' parameters the call reads are this rank's slices of the 3-D weights
(``[E/P, ...]``: the layout cuts them on the experts' dimension; the caller installs
them). What the pass cannot read (an activation other than SiLU, GeLU or ReLU between
the projections, an ungated expert) raises: rewrites fail loudly. With a tensor group the
rank's experts are also Megatron-split (f and g around the call).

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
import torch.nn.functional as F

from autopar.analysis.ops import call_name, match_linear
from autopar.ir import SPEC, Region, regions
from autopar.runtime.collectives import copy_to_tensor_region, reduce_from_tensor_region
from autopar.strategies.experts.collectives import combine, dispatch, record_load

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


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
                  activation: str, layouts: tuple[str, str]) -> torch.Tensor:
    """This rank's experts (``gate_up`` ``[E/P, ...]``, ``down`` ``[E/P, ...]``) on the rows
    it received, each by the expert ``ids`` names: ``down(act(gate) * up)`` with the gated
    projection cut in two halves (gate first), as Hugging Face's experts compute it."""
    act = ACTIVATIONS[activation]

    def run(expert, x):
        gate, up = _project(x, gate_up[expert], layouts[0]).chunk(2, dim=-1)
        return _project(act(gate) * up, down[expert], layouts[1])
    return by_expert(rows, ids, gate_up.shape[0], run)


def _routed(hidden, index, weights, experts: int, group: str, layer: str, run_local) -> torch.Tensor:
    """Dispatch ``hidden``'s (token, slot) rows to their experts' ranks, ``run_local(rows,
    ids)`` there, combine back; the rows received counted under ``layer``."""
    rows, ids, routing = dispatch(hidden, index.long(), experts, group)
    if layer:
        record_load(layer, routing.rows)
    return combine(run_local(rows, ids), routing, weights, group, rows)


def expert_parallel_mlp(hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                        down: torch.Tensor, *, experts: int, group: str, activation: str,
                        layouts: tuple[str, str], tensor: str | None = None, layer: str = "") -> torch.Tensor:
    """A routed layer's output ``[tokens, hidden]`` with its experts spread over ``group``
    (dispatch, this rank's experts, combine): what the layer computes on one device.

    ``tensor``: the experts are also Megatron-split over that group (each rank holds its
    columns of the gated projection, its rows of the down projection): the tokens and
    routing weights enter through Megatron's f (identity forward, all-reduce backward) and
    the combined output leaves through g (all-reduce forward), megatron §2.3. ``layer``:
    the region id the rows it processes are counted under (:data:`.collectives.LOAD`)."""
    if tensor is not None:
        hidden, weights = copy_to_tensor_region(hidden, tensor), copy_to_tensor_region(weights, tensor)
    out = _routed(hidden, index, weights, experts, group, layer,
                  lambda rows, ids: local_experts(rows, ids, gate_up, down, activation, layouts))
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


def _activation(gm: fx.GraphModule, chain_nodes: list[fx.Node]) -> str:
    for node in chain_nodes:
        name = call_name(node)
        if name in ACTIVATIONS:
            if node.kwargs.get("approximate", "none") != "none" or (name == "gelu" and len(node.args) > 1):
                raise ValueError(f"expert parallelism: {node.name} is an approximate GeLU; this rewrite computes "
                                 f"SiLU, exact GeLU and ReLU")
            return name
    raise ValueError(f"expert parallelism: the experts {[n.name for n in chain_nodes]} have no SiLU, GeLU or ReLU "
                     f"between their projections; this rewrite handles gated experts with one of those")


def expert_weights(gm: fx.GraphModule, region: Region) -> tuple:
    """The experts' (gated projection, down projection) matches of ``region``
    (:func:`autopar.analysis.ops.match_linear`), checked: gated, no biases. A layer of
    separate expert modules needs no check (its modules run as they are): ``()``."""
    if region.details.get("form") == "module_list":
        return ()
    table = {n.name: n for n in gm.graph.nodes}
    chain = next(r for r in regions(gm, "linear_chain") if r.id == region.details["chain"])
    up, down = match_linear(table[chain.details["column"][0]], gm), match_linear(table[chain.details["row"]], gm)
    if chain.details.get("blocks") != 2:
        raise ValueError(f"expert parallelism: {chain.id} is not a gated expert (gate and up in one projection cut "
                         f"in two); this rewrite handles gated experts")
    if up.bias is not None or down.bias is not None:
        raise ValueError(f"expert parallelism: {chain.id}'s experts have biases; this rewrite handles experts "
                         f"without (as Mixtral's)")
    return up, down, chain


def expert_shards(gm: fx.GraphModule, region: Region, tensor: bool) -> dict:
    """The cut of ``region``'s expert weights (by the graph's parameter names): dimension
    0 over the expert group; with ``tensor``, the gated projection's output width (gate
    and up blocks) and the down projection's input width over the tensor group."""
    from autopar.strategies.experts.layout import ExpertShard
    if region.details.get("form") == "module_list":
        return {}   # whole modules, held by their rank (strategies/experts/layout.place_modules)
    up, down, _ = expert_weights(gm, region)
    if not tensor:
        return {up.weight: ExpertShard(), down.weight: ExpertShard()}
    out_dim = {"experts_out_in": 1, "experts_in_out": 2}
    return {up.weight: ExpertShard(out_dim[up.weight_layout], 2),
            down.weight: ExpertShard(3 - out_dim[down.weight_layout])}


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
        activation = _activation(gm, [table[n] for n in chain.details["pointwise"]])
        with graph.inserting_before(output):
            gate_up_w, down_w = graph.get_attr(up.weight), graph.get_attr(down.weight)
            call = graph.call_function(expert_parallel_mlp,
                                       (table[d["input"]], table[d["index"]], table[d["weights"]], gate_up_w, down_w),
                                       {"experts": d["experts"], "group": group, "activation": activation,
                                        "layouts": (up.weight_layout, down.weight_layout), "tensor": tensor,
                                        "layer": region.id})
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


def expert_parallel_regions_pass(gm: fx.GraphModule, *, regions_: list[str], group: str = "experts",
                                 tensor: str | None = None, place: int = 0, degree: int = 1) -> fx.GraphModule:
    """A rank program's pass: :func:`expert_parallel_pass` on each of the plan's expert
    parallel regions (by id) this graph holds (a pipeline stage holds some)."""
    from autopar.strategies.megatron.rewrite import PARAM_SHARDS
    found = {r.id: r for r in regions(gm, "experts")}
    made = gm.meta.setdefault(PARAM_SHARDS, {})   # the other split passes record theirs too
    for rid in regions_:
        if rid in found:
            made.update(expert_shards(gm, found[rid], tensor is not None))
            expert_parallel_pass(gm, found[rid], group, tensor, place, degree)
    return gm


__all__ = ["expert_parallel_mlp", "expert_parallel_modules", "expert_parallel_pass", "expert_parallel_regions_pass",
           "expert_shards", "expert_weights", "local_experts"]
