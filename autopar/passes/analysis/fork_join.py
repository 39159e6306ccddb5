"""Analysis pass: explicit fork/join regions (Inception blocks, multi-branch heads).

One value, the *fork*, feeds k >= 2 independent branches that each compute (a linear,
matmul or convolution) and meet again in a sum or a concat, the *join*. D&SP and
D&SP-cSub (super-subgraph-parallelism) run such branches on separate sub-grids; this pass
records the branches, how they are joined, and each branch's FLOPs and parameter count.
A branch's FLOPs are its nodes' :func:`autopar.passes.analysis.flops.node_flops`, its
parameters those its nodes read (:func:`node_parameters`).

Example (an Inception-style block on ``x: [2, 3, 4, 4]``, symbolic_trace)::

    fork_join:b1: concat(dim=1) at cat; branches [model_b1] | [model_b2a, relu, model_b2b]
        | [max_pool2d, model_b3]; flops [768, 9984, 768]; params [16, 164, 16]
"""
from __future__ import annotations

import logging
import operator

import networkx as nx
import torch
import torch.fx as fx

from autopar.ir import SPEC, Region, TensorSpec, add_region, clear_regions, node_index, regions, tensor_spec
from autopar.passes.manager import examining
from autopar.passes.analysis.naming import RegionNames
from autopar.passes.analysis.ops import CONCAT_FUNCTIONS
from autopar.passes.analysis.flops import node_flops

log = logging.getLogger("autopar.analysis.fork_join")
aten = torch.ops.aten


def _overloads(*packets) -> set:
    return {getattr(p, o) for p in packets for o in p.overloads()}


ADD_FUNCTIONS = {operator.add, operator.iadd, torch.add, aten.add.Tensor}
STACK_FUNCTIONS = {torch.stack} | _overloads(aten.stack)
SUM_FUNCTIONS = {torch.sum} | _overloads(aten.sum)


# ---------------------------------------------------------------- per-node parameters


def node_parameters(gm: fx.GraphModule, node: fx.Node, dynamic: set[fx.Node],
                    params: dict[str, torch.Tensor] | None = None) -> dict[str, int]:
    """``{qualified name: element count}`` of the parameters ``node`` reads: its module's
    (``call_module``), or the ``get_attr`` parameters it reaches through nodes outside
    ``dynamic`` (the nodes that depend on a graph input), e.g. through ``aten.t(W)``.
    ``params`` is ``dict(gm.named_parameters())``, passed in by callers that loop."""
    params = dict(gm.named_parameters()) if params is None else params
    found: dict[str, int] = {}
    if node.op == "call_module":
        for name, p in gm.get_submodule(node.target).named_parameters():
            found[f"{node.target}.{name}"] = p.numel()
    stack, seen = list(node.all_input_nodes), set()
    while stack:
        n = stack.pop()
        if n in seen or n in dynamic:
            continue
        seen.add(n)
        if n.op == "get_attr" and n.target in params:
            found[n.target] = params[n.target].numel()
        stack.extend(n.all_input_nodes)
    return found


# ---------------------------------------------------------------- the data-flow view


def _carries_tensor(node: fx.Node) -> bool:
    spec = node.meta.get(SPEC)
    return isinstance(spec, TensorSpec) or (isinstance(spec, tuple) and
                                            any(isinstance(s, TensorSpec) for s in spec))


def dataflow_graph(gm: fx.GraphModule) -> tuple[nx.DiGraph, set[fx.Node]]:
    """``(graph, dynamic)``: the tensor data flow from the inputs to the output, as a DiGraph
    of fx nodes, and the set of tensor nodes that depend on a graph input.

    Parameters and constants (and what is computed from them alone) depend on no input,
    so they are left out: a weight read by two layers is no fork. So are non-tensor values
    (``x.size(0)``), which would otherwise tie independent branches together, and dead
    nodes, which would give the fork a second exit.
    """
    dynamic: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if _carries_tensor(n) and (n.op == "placeholder" or any(a in dynamic for a in n.all_input_nodes)):
            dynamic.add(n)
    output = next(iter(gm.graph.find_nodes(op="output")))
    live, stack = {output}, [output]
    while stack:
        for a in stack.pop().all_input_nodes:
            if a in dynamic and a not in live:
                live.add(a)
                stack.append(a)
    graph = nx.DiGraph()
    graph.add_nodes_from(n for n in gm.graph.nodes if n in live)
    graph.add_edges_from((a, n) for n in graph.nodes for a in n.all_input_nodes if a in live)
    return graph, dynamic


# ---------------------------------------------------------------- joins


def _is_add(node: fx.Node, tensors: int = 2) -> bool:
    """An unscaled add of ``tensors`` tensor operands (and, for one, the literal 0 that
    Python's ``sum()`` starts from: any other scalar makes a pointwise op of a branch)."""
    is_add = (node.op == "call_function" and node.target in ADD_FUNCTIONS) or (
        node.op == "call_method" and node.target in ("add", "__add__"))
    operands = node.args[:2]
    return (is_add and node.kwargs.get("alpha", 1) == 1 and len(operands) == 2
            and sum(isinstance(a, fx.Node) for a in operands) == tensors
            and all(isinstance(a, fx.Node) or (isinstance(a, (int, float)) and a == 0) for a in operands))


def _dim(node: fx.Node, position: int, default: int = 0, names=("dim", "axis")):
    value = node.args[position] if len(node.args) > position else next(
        (node.kwargs[k] for k in names if k in node.kwargs), default)
    if isinstance(value, (list, tuple)):
        value = value[0] if len(value) == 1 else None
    return value


def _normalised(dim, node: fx.Node) -> int | None:
    spec = tensor_spec(node)
    return None if dim is None or spec is None else dim % max(len(spec.shape), 1)


def _stack_sum(stack: fx.Node) -> fx.Node | None:
    """The ``sum`` over the stacked dimension that is ``stack``'s only user, if any."""
    if not (stack.op == "call_function" and stack.target in STACK_FUNCTIONS) or len(stack.users) != 1:
        return None
    total = next(iter(stack.users))
    is_sum = (total.op == "call_function" and total.target in SUM_FUNCTIONS) or (
        total.op == "call_method" and total.target == "sum")
    if not is_sum or total.kwargs.get("keepdim") or (len(total.args) > 2 and total.args[2]):
        return None
    same = _normalised(_dim(total, 1, None), stack) == _normalised(_dim(stack, 1), stack)
    return total if same else None


def _join(meet: fx.Node, reached: set[fx.Node]):
    """``(join_op, join node, join nodes, operands, concat_dim)`` for the node where the
    branches meet, or None when it is no sum or concat.

    A sum may be a tree of adds (``a + b + c`` is ``add(add(a, b), c)``): adds that are
    reached from the fork and used only by the tree belong to the join, their other
    operands are what the join combines.
    """
    if meet.op == "call_function" and meet.target in CONCAT_FUNCTIONS:
        operands = [a for a in meet.args[0] if isinstance(a, fx.Node)]
        return "concat", meet, [meet], operands, _normalised(_dim(meet, 1), meet)
    total = _stack_sum(meet)
    if total is not None:
        return "sum", total, [meet, total], [a for a in meet.args[0] if isinstance(a, fx.Node)], None
    if not _is_add(meet):
        return None
    tree, operands = [], []

    def visit(add: fx.Node) -> None:
        tree.append(add)
        for a in add.args[:2]:
            if a in reached and (_is_add(a) or _is_add(a, tensors=1)) and len(a.users) == 1:
                visit(a)
            elif isinstance(a, fx.Node):
                operands.append(a)

    visit(meet)
    return "sum", meet, tree, operands, None


# ---------------------------------------------------------------- the pass


def find_fork_join_regions_pass(gm: fx.GraphModule) -> fx.GraphModule:
    """Record one ``fork_join`` region per fork whose branches meet in a sum or concat.

    For each value used by two or more nodes (the fork) the join is its immediate
    post-dominator in :func:`dataflow_graph`. Members are the nodes between (reachable from
    the fork without passing the join: with no side inputs, exactly those the fork
    dominates and the join post-dominates) and the join nodes; the fork is the region's
    input, not a member. Branches are the weakly connected parts of the nodes between, so
    values that meet before the join (Q and K in ``q @ k.T``) are one branch.

    Kept when the join is a sum (``+``/``torch.add``/``aten.add.Tensor``, trees of them,
    ``torch.stack(...).sum(0)``) or a concat (``torch.cat``/``aten.cat``) and at least two
    branches contain a linear, matmul or convolution. So a residual ``x + f(x)`` is no
    region (the identity side computes nothing), nor is attention's Q/K/V fan-out (it meets
    in a matmul). What the join takes from no computing branch (the fork itself, a value
    from before the fork, a pointwise-only branch) is ``passthrough``:
    ``x + a(ln(x)) + b(ln(x))`` is a region at ``ln`` with passthrough ``[x]``. Nested
    regions are all recorded, outer first (by the fork's graph position), with
    ``parent`` the smallest region containing them; ``node.meta[REGION_OF]["fork_join"]``
    names the innermost one.

    ``details``: ``fork``, ``fork_kind`` ("replicate"; "slice" when the fork is a split read
    through ``getitem``), ``join``, ``join_op`` ("sum" | "concat"), ``concat_dim`` (>= 0;
    None for sums), ``join_nodes``, ``branches`` (node names, branches in the join's
    operand order), ``branch_outputs``, ``branch_flops``, ``branch_params``,
    ``passthrough``, ``side_inputs`` (outside values read in a branch, e.g. a mask),
    ``parent``. The graph is not changed. Ids name the module holding the branches and the
    join, or, when that is the model's root, the module of its first computing node (see
    :mod:`autopar.passes.analysis.naming`). Example, ``cat([a(x), relu(b(x))], 1)`` with
    ``a, b = Linear(4, 8)`` on ``x: [2, 4]``::

        fork_join:a: concat(dim=1) at cat; branches [model_a] | [model_b, relu];
            flops [128, 128]; params [40, 40]
    """
    clear_regions(gm, "fork_join")
    graph, dynamic = dataflow_graph(gm)
    params = dict(gm.named_parameters())
    output = next(iter(gm.graph.find_nodes(op="output")))
    post_dominator = nx.immediate_dominators(graph.reverse(copy=False), output)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    ids = RegionNames("fork_join")
    found = []
    for fork in gm.graph.nodes:
        if fork in graph and fork is not output and graph.out_degree(fork) >= 2:
            with examining("fork_join", fork, "fork"):
                region = _region_at(gm, graph, dynamic, params, fork, post_dominator.get(fork), order, ids)
                if region is not None:
                    found.append(region)
    index = node_index(gm)
    for region in found:
        inner = set(region.nodes) | {region.details["fork"]}
        outer = [r for r in found if r is not region and inner <= set(r.nodes)]
        region.details["parent"] = min(outer, key=lambda r: len(r.nodes)).id if outer else None
        add_region(gm, region, index)
    log.info("found %d fork/join regions", len(found))
    return gm


def _region_at(gm, graph: nx.DiGraph, dynamic, params, fork: fx.Node, meet: fx.Node | None, order,
               ids: RegionNames):
    if meet is None or meet.op == "output":
        log.debug("fork %s: its branches meet only at the output", fork.name)
        return None
    reached, stack = set(), [fork]
    while stack:  # everything between: reachable from the fork without passing the meet
        for user in graph.successors(stack.pop()):
            if user is not meet and user not in reached:
                reached.add(user)
                stack.append(user)
    join = _join(meet, reached)
    if join is None:
        log.debug("fork %s: branches meet at %s, neither a sum nor a concat", fork.name, meet.format_node())
        return None
    join_op, join_node, join_nodes, operands, concat_dim = join
    between = reached - set(join_nodes)
    parts = sorted((sorted(p, key=order.__getitem__) for p in
                    nx.weakly_connected_components(graph.subgraph(between))), key=lambda p: order[p[0]])
    part_of = {n: i for i, part in enumerate(parts) for n in part}
    computing = {i for i, part in enumerate(parts) if any(node_flops(gm, n) > 0 for n in part)}
    if len(computing) < 2:
        log.debug("fork %s: %d computing branch(es) meet at %s; a residual or a single branch, no region",
                  fork.name, len(computing), join_node.name)
        return None
    outputs: dict[int, list[str]] = {}
    passthrough: list[str] = []
    for a in operands:  # in the order the join takes them, which orders the branches
        i = part_of.get(a)
        if i in computing:
            names = outputs.setdefault(i, [])
            names += [] if a.name in names else [a.name]
        elif a.name not in passthrough:
            passthrough.append(a.name)
    branches = [parts[i] for i in outputs]
    side_inputs = sorted({a for n in between for a in graph.predecessors(n) if a not in between and a is not fork},
                         key=order.__getitem__)
    flops = [sum(node_flops(gm, n) for n in branch) for branch in branches]
    counts = []
    for branch in branches:  # by name, so a layer applied twice in a branch counts once
        named = {k: v for n in branch for k, v in node_parameters(gm, n, dynamic, params).items()}
        counts.append(sum(named.values()))
    members = sorted(between | set(join_nodes), key=order.__getitem__)
    return Region(id=ids.of(gm, members), kind="fork_join", nodes=[n.name for n in members], details=dict(
        fork=fork.name, fork_kind="slice" if isinstance(fork.meta.get(SPEC), tuple) else "replicate",
        join=join_node.name, join_op=join_op, concat_dim=concat_dim,
        join_nodes=[n.name for n in sorted(join_nodes, key=order.__getitem__)],
        branches=[[n.name for n in branch] for branch in branches], branch_outputs=list(outputs.values()),
        branch_flops=flops, branch_params=counts, passthrough=passthrough,
        side_inputs=[n.name for n in side_inputs]))


def format_regions(gm: fx.GraphModule) -> str:
    """One line per ``fork_join`` region of ``gm``, for logs and golden tests."""
    lines = []
    for r in regions(gm, "fork_join"):
        d = r.details
        how = f"concat(dim={d['concat_dim']})" if d["join_op"] == "concat" else "sum"
        branches = " | ".join(f"[{', '.join(b)}]" for b in d["branches"])
        line = (f"{r.id}: {how} at {d['join']}; branches {branches}; "
                f"flops {d['branch_flops']}; params {d['branch_params']}")
        for key in ("passthrough", "side_inputs", "parent"):
            if d[key]:
                line += f"; {key} {d[key]}"
        lines.append(line)
    return "\n".join(lines)
