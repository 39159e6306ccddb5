"""The pass: :func:`find_routed_experts_pass` records one ``experts`` region per routed
layer, whether its experts are one grouped matmul's (3-D weights) or separate modules
called in a loop over the experts (a ``ModuleList``)."""
from __future__ import annotations

import logging

import torch.fx as fx

from autopar.ir import Region, add_region, clear_regions, regions
from autopar.passes.analysis.experts.activation import expert_parameters
from autopar.passes.analysis.experts.dense import dense_layer
from autopar.passes.analysis.experts.reading import between, is_topk, nearest
from autopar.passes.analysis.experts.router import (combine_of, combined_weights, experts_input, group_offsets,
                                                    read_router, routing_weights, shared_experts)
from autopar.passes.analysis.ops import call_name, match_linear
from autopar.passes.manager import examining

log = logging.getLogger("autopar.analysis.experts")


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
        span = between(rows, row, order) - {rows}
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
    for topk in [n for n in gm.graph.nodes if is_topk(n)]:
        with examining("experts", topk, "routed experts (separate modules)"):
            layer = _module_list_layer(gm, topk, chains, table, order)
            if layer is None:
                continue
            source, experts = layer
            router, scores = read_router(topk, gm)
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
            members = between(router.node, combine, order)
            for chain, _ in experts:
                members |= {table[n] for n in chain.nodes}
            path = _module_path(gm, experts[0][0], table).rsplit(".", 2)[0]   # the block holding the list
            details = {"experts": len(experts), "top_k": top_k, "router": router.node.name,
                       "router_weight": router.weight, "scores": scores or "none",
                       "normalized": any(call_name(u) in ("div", "div_", "truediv") for u in values[0].users),
                       "chain": experts[0][0].id, "chains": [c.id for c, _ in experts], "form": "module_list",
                       "modules": [_module_path(gm, c, table) for c, _ in experts], "input": source.name,
                       "index": [u for u in topk.users if u.args[1:] == (1,)][0].name,
                       "weights": combined_weights(values[0]).name, "combine": combine.name,
                       "shared": shared_experts(gm, router.input, combine, tuple(c.id for c, _ in experts))}
            prefix = path[len("model."):] if path.startswith("model.") else path
            add_region(gm, Region(id=f"experts:{prefix}", kind="experts",
                                  nodes=[n.name for n in sorted(members, key=order.__getitem__)], details=details), table)


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
            offsets = group_offsets(column)
            dense = dense_layer(chain, table) if offsets is None else None   # every expert on every token
            topk = dense["topk"] if dense else \
                next((a for a in nearest(offsets, 64) if is_topk(a)), None) if offsets is not None else None
            router, scores = read_router(topk, gm) if topk is not None else (None, None)
            if router is None and offsets is None:
                log.warning("experts: %s: %d experts in a batched matmul over every token, but no routing weights "
                            "the analysis can prove zero for the experts a top-k did not pick (docs/experts.md, "
                            "\"Experts written densely\"); the layer stays in its data or tensor plan",
                            chain.id, experts)
                continue
            if router is None or router.out_features != experts:
                log.warning("experts: %s has %d experts but no router the analysis can read (a linear of %d "
                            "outputs whose scores a topk reads, before the grouped matmul's offsets); the layer "
                            "stays in its data or tensor plan", chain.id, experts, experts)
                continue
            top_k = topk.args[1] if len(topk.args) > 1 else topk.kwargs.get("k")
            combine = dense["combine"] if dense else combine_of(row, int(top_k))
            if combine is None:
                log.warning("experts: %s: no sum over the %s slots after its down projection; the layer stays in "
                            "its data or tensor plan", chain.id, top_k)
                continue
            indices = [u for u in topk.users if u.args[1:] == (1,)]
            found = (dense["weights"], False) if dense else \
                routing_weights(topk, indices[0], combine) if len(indices) == 1 else None
            if found is None:
                log.warning("experts: %s: its routing weights (the top-k values, or the scores gathered at the top-k "
                            "indices) are not what its combine reads; the layer stays in its data or tensor plan",
                            chain.id)
                continue
            weights, normalized = found
            source = dense["input"] if dense else experts_input(column) or router.input
            members = between(router.node, combine, order) | {table[n] for n in chain.nodes}
            shared = shared_experts(gm, router.input, combine)
            parameters = expert_parameters(gm, chain, combine, table, order)
            details = {"experts": experts, "top_k": int(top_k), "router": router.node.name,
                       "router_weight": router.weight, "router_bias": router.bias, "scores": scores or "none",
                       "normalized": normalized, "chain": chain.id, "input": source.name, "index": indices[0].name,
                       "weights": weights.name, "combine": combine.name, "shared": shared,
                       **{k: parameters[k] for k in ("gate_up_bias", "down_bias", "activation", "interleaved",
                                                     "unread")}}
            if dense:   # the weights [T, E] scale the experts' input (passes/analysis/experts/dense.py)
                details.update(form="dense", weighted="input")
            path = chain.id.split(":", 1)[1].rsplit(".experts", 1)[0]
            add_region(gm, Region(id=f"experts:{path}", kind="experts",
                                  nodes=[n.name for n in sorted(members, key=order.__getitem__)], details=details), table)
    return gm
