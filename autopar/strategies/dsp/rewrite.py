"""Rewrite pass: D&SP and D&SP-cSub for multi-branch regions (SUPER §III-B/C, §IV-B/C).

Two kinds of region are split over ``g`` sub-grids (rank ``(s, p)`` is position ``p`` of
sub-grid ``s``; see ``docs/dsp_design.md``):

* **explicit branches** (``fork_join`` regions: an Inception block, towers joined by a
  sum): whole branches are assigned to sub-grids (``details["assignment"]``, one entry
  per branch); the fork value is *split* (every branch reads all of it);
* **attention heads** (``attention`` regions, the implicit branches of SUPER Fig. 5):
  heads ``[start_s, start_s + widths[s])`` run on sub-grid ``s``; the projections stay
  common layers and the per-head core (scores, mask, softmax, context) is the branch.
  The query, key and value are *sliced* along the head dimension (dim 1), bundled into
  one ``[B, H, ..]`` tensor so one collective carries all three.

Transitions, per mode (the table of ``autopar/strategies/dsp/collectives.py``):

==========  ===============================  ==============================
            D&SP (all ranks run this graph)  D&SP-cSub
==========  ===============================  ==============================
split       segmented_all_gather             segmented_broadcast
slice       segmented_all_to_all_slice       segmented_scatter
sum join    segmented_reduce_scatter         segmented_reduce
concat      segmented_all_to_all             segmented_gather
==========  ===============================  ==============================

In D&SP every rank runs the rewritten graph (:func:`dsp_pass`). In
D&SP-cSub sub-grid 0 runs it (the common layers and its own branches) and the other
sub-grids run a program of their branches only (:func:`csub_branch_program`), whose
inputs arrive by broadcast or scatter and whose results go back by reduce or gather.
Values the branches read without differentiating them (a causal mask, a scale computed
from a size) are shared from sub-grid 0 with a forward-only ``segment_share``.

Example (an Inception block, branches b1 | b2 | b3 joined by ``cat(dim=1)``, g = 2,
branch 1 on sub-grid 0, D&SP)::

    segmented_all_gather = segmented_all_gather(relu, 'segment')
    model_b2_0 = self.model.b2.0(segmented_all_gather) ... model_b2_2 = ...
    segmented_all_to_all = segmented_all_to_all(model_b2_2, 1, [6, 6], 'segment')
    split = torch.split(segmented_all_to_all, [6, 4, 2], 1)  # sub-grid order: b2 | b1, b3
    cat = torch.cat([split[1], split[0], split[2]], 1)       # original order: b1, b2, b3
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from autopar.grid import MeshAxis
from autopar.ir import REGIONS, ROOT_OUTPUT, SPEC, TensorSpec, regions, tensor_spec
from autopar.strategies.dsp.cost import head_widths
from autopar.strategies.dsp import collectives as segmented
from autopar.runtime import collectives


class DSPError(ValueError):
    """A region cannot be split as the plan says; the message names it."""


@dataclass
class _Cut:
    """What one sub-grid keeps of one region, read off the analysis details and the plan."""

    region: str
    heads: bool                      # attention heads (slice on dim 1) or explicit branches (split)
    fork_inputs: list[fx.Node]       # common-layer values the kept nodes read and differentiate
    side_inputs: list[fx.Node]       # values they read without a gradient (cSub shares them)
    own: list[fx.Node]               # the kept nodes, in graph order
    outputs: list[fx.Node]           # the kept branches' outputs, joined in this order
    join: fx.Node                    # its uses receive the joined result
    join_op: str                     # "sum" | "concat"
    dim: int | None = None           # concat dimension
    widths: list[int] = field(default_factory=list)   # concat width of each sub-grid
    arrived: list[int] = field(default_factory=list)  # branch order after the exchange
    branch_widths: list[int] = field(default_factory=list)
    passthrough: list[fx.Node] = field(default_factory=list)
    dropped: set = field(default_factory=set)         # nodes a D&SP / sub-grid-0 rank no longer runs
    batched_sides: set = field(default_factory=set)   # side inputs with a row per sample


def _find(gm: fx.GraphModule, rid: str):
    for kind in ("fork_join", "attention"):
        for r in regions(gm, kind):
            if r.id == rid:
                return r
    raise DSPError(f"the plan names region {rid!r}, which analysis did not find in this graph")


def _cut(gm: fx.GraphModule, rid: str, choice: dict, subgrid: int, aliases: dict | None = None) -> _Cut:
    """What splitting region ``rid`` keeps and moves on ``subgrid``. ``aliases``: names
    the analysis gave to nodes an earlier region's split replaced (its join, which is
    the next block's fork where blocks chain), mapped to what replaced them."""
    region = _find(gm, rid)
    table = {n.name: n for n in gm.graph.nodes} | dict(aliases or {})
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    g = choice["subgrids"]
    if region.kind == "attention":
        return _cut_heads(region, choice, subgrid, table, order)
    d = region.details
    assignment = choice["assignment"]
    own = [b for b, owner in enumerate(assignment) if owner == subgrid]
    if not own:
        raise DSPError(f"region {rid}: sub-grid {subgrid} has no branch; choose fewer sub-grids")
    outputs = []
    for b, names in enumerate(d["branch_outputs"]):
        if len(names) != 1:
            raise DSPError(f"region {rid}: branch {b} has {len(names)} outputs; D&SP splits "
                                        f"branches with one output")
        outputs.append(table[names[0]])
    cut = _Cut(rid, False, [table[d["fork"]]], [],
               sorted((table[n] for b in own for n in d["branches"][b]), key=order.__getitem__),
               [outputs[b] for b in own], table[d["join"]], d["join_op"],
               passthrough=[table[n] for n in d["passthrough"]])
    cut.dropped = {table[n] for n in d["join_nodes"]}
    for b, owner in enumerate(assignment):
        if owner != subgrid:
            cut.dropped.update(table[n] for n in d["branches"][b])
    if d["join_op"] == "concat":
        cut.dim = d["concat_dim"]
        cut.branch_widths = [tensor_spec(o).shape[cut.dim] for o in outputs]
        cut.widths = [sum(cut.branch_widths[b] for b, o in enumerate(assignment) if o == s) for s in range(g)]
        cut.arrived = [b for s in range(g) for b, o in enumerate(assignment) if o == s]
    return cut


def heads_cut(region, table) -> tuple[list, list, list, set]:
    """What splitting attention ``region``'s heads over sub-grids moves: (its core, the
    core's inputs, the values the core reads from outside it, those of them with a row
    per sample); raises :class:`DSPError` where
    this version cannot split them (the planner asks first, :func:`heads_unsplittable`)."""
    d = region.details
    core = [table[n] for n in d["core"]]
    inputs = [table[n] for n in d["core_inputs"]]
    for x in inputs:
        spec = tensor_spec(x)
        if spec is None or len(spec.shape) != 4 or spec.shape[1] != d["heads"]:
            raise DSPError(f"region {region.id}: the attention core reads {x.name} of shape "
                                        f"{spec}; D&SP of heads needs [B, heads={d['heads']}, .., ..]")
    if d["kv_heads"] != d["heads"]:
        raise DSPError(f"region {region.id}: {d['kv_heads']} key/value heads for {d['heads']} query "
                                    f"heads (grouped-query attention); D&SP splits equal head counts only")
    if d.get("sinks"):
        raise DSPError(f"region {region.id}: attention sinks ({d['sinks']}, a logit per head joined to "
                                    f"the scores); D&SP of heads splits only the query, key and value in this version")
    core_set = set(core)
    for node in core:
        if node.name == d["core"][-1]:
            continue
        outside = [u.name for u in node.users if u not in core_set]
        if outside:
            raise DSPError(f"region {region.id}: the core value {node.name} is also read by {outside}; "
                                        f"D&SP cannot move it to another sub-grid")
    sides, batched = [], set()
    rows = tensor_spec(inputs[0]).shape[0]
    for node in core:
        for a in node.all_input_nodes:
            if a in core_set or a in inputs or a in sides:
                continue
            spec = a.meta.get(SPEC)
            if isinstance(spec, TensorSpec) and len(spec.shape) >= 3:
                if spec.shape[1] != 1:
                    raise DSPError(
                        f"region {region.id}: the attention core reads {a.name} of shape {spec}, which has a row per "
                        f"head (a position bias per head); D&SP of heads splits only the query, key and value in "
                        f"this version")
                if spec.shape[0] == rows:  # a mask per sample: gathered with the rows in D&SP
                    batched.add(a)
                elif spec.shape[0] != 1:
                    raise DSPError(f"region {region.id}: the attention core reads {a.name} of shape "
                                                f"{spec}, neither per sample ({rows} rows) nor broadcast")
            sides.append(a)
    return core, inputs, sides, batched


def heads_unsplittable(region, table) -> str | None:
    """Why D&SP cannot split attention ``region``'s heads in this version (None: it can)."""
    try:
        heads_cut(region, table)
    except DSPError as e:
        return str(e)
    return None


def _cut_heads(region, choice: dict, subgrid: int, table, order) -> _Cut:
    d = region.details
    core, inputs, sides, batched = heads_cut(region, table)
    core = sorted(core, key=order.__getitem__)
    widths = head_widths(d["heads"], choice["subgrids"])
    last = core[-1]
    return _Cut(region.id, True, inputs, sorted(sides, key=order.__getitem__), core, [last], last, "concat",
                dim=1, widths=widths, arrived=list(range(choice["subgrids"])), branch_widths=widths,
                batched_sides=batched)


# ---------------------------------------------------------------- emitting the transitions


def _call(graph: fx.Graph, fn, args, spec=None) -> fx.Node:
    node = graph.call_function(fn, args)
    node.meta[SPEC] = spec
    return node


def _bundle_layout(cut: _Cut) -> list[tuple[int, ...]]:
    """The trailing shape of each of the query, key and value (dims 2..)."""
    return [tuple(tensor_spec(x).shape[2:]) for x in cut.fork_inputs]


def _emit_fork(graph: fx.Graph, cut: _Cut, values: list[fx.Node], mode: str, group: str) -> list[fx.Node]:
    """The fork collective(s); ``values`` are the fork inputs (or, off sub-grid 0 in cSub,
    one placeholder of the fork's / bundle's shape). Returns what the kept nodes read in
    place of each fork input."""
    if not cut.heads:
        fn = {"dsp": segmented.segmented_all_gather, "csub": segmented.segmented_broadcast, "tensor": collectives.copy_to_tensor_region}[mode]
        return [_call(graph, fn, (values[0], group))]
    if mode == "tensor":
        raise DSPError(f"region {cut.region}: attention heads over the tensor group are Megatron's "
                                    f"split (strategy 'megatron'), not D&SP")
    tails = _bundle_layout(cut)
    if len(values) == 1:
        bundle = values[0]
    else:
        flat = [graph.call_method("flatten", (x, 2)) for x in values]
        bundle = _call(graph, torch.cat, (flat, 2))
    fn = segmented.segmented_all_to_all_slice if mode == "dsp" else segmented.segmented_scatter
    sliced = _call(graph, fn, (bundle, 1, cut.widths, group))
    pieces = graph.call_method("split", (sliced, [math.prod(t) for t in tails], 2))
    received = []
    for i, tail in enumerate(tails):
        item = graph.call_function(operator.getitem, (pieces, i))
        received.append(graph.call_method("unflatten", (item, 2, tail)))
    return received


def _emit_join(graph: fx.Graph, cut: _Cut, outputs: list[fx.Node], mode: str, group: str, root: bool) -> fx.Node:
    if cut.join_op == "sum":
        local = outputs[0]
        for value in outputs[1:]:
            local = _call(graph, operator.add, (local, value))
        fn = {"dsp": segmented.segmented_reduce_scatter, "csub": segmented.segmented_reduce,
              "tensor": collectives.reduce_from_tensor_region}[mode]
        result = _call(graph, fn, (local, group))
        if root:
            for value in cut.passthrough:
                result = _call(graph, operator.add, (result, value))
        return result
    local = outputs[0] if len(outputs) == 1 else _call(graph, torch.cat, (outputs, cut.dim))
    fn = {"dsp": segmented.segmented_all_to_all, "csub": segmented.segmented_gather, "tensor": segmented.branch_all_gather}[mode]
    result = _call(graph, fn, (local, cut.dim, cut.widths, group))
    if root and cut.arrived != sorted(cut.arrived):  # back to the original branch order
        pieces = graph.call_function(torch.split, (result, [cut.branch_widths[b] for b in cut.arrived], cut.dim))
        items = {b: graph.call_function(operator.getitem, (pieces, i)) for i, b in enumerate(cut.arrived)}
        result = _call(graph, torch.cat, ([items[b] for b in range(len(cut.arrived))], cut.dim))
    return result


# ---------------------------------------------------------------- D&SP, and sub-grid 0 of cSub


def dsp_pass(gm: fx.GraphModule, *, dsp_regions: dict[str, dict], subgrid: int,
             group: str = MeshAxis.SEGMENT, csub: bool = False, over_tensor: bool = False) -> fx.GraphModule:
    """Keep sub-grid ``subgrid``'s branches of each region in ``dsp_regions`` (region id →
    the plan's details: ``subgrids``, ``assignment``) and insert the transitions: D&SP's
    segmented collectives, with ``csub`` those of D&SP-cSub on sub-grid 0, or with
    ``over_tensor`` (a mixed plan: each rank of the tensor group ``group`` a sub-grid,
    the fork and join values replicated over it) Megatron's f and g around the branches
    and :func:`~autopar.strategies.dsp.collectives.branch_all_gather` for a concat."""
    if not dsp_regions:
        return gm
    if csub and subgrid != 0:
        raise DSPError(f"D&SP-cSub: sub-grid {subgrid} runs csub_branch_program, not this pass")
    mode = "tensor" if over_tensor else "csub" if csub else "dsp"
    aliases: dict[str, fx.Node] = {}
    for rid, choice in dsp_regions.items():
        cut = _cut(gm, rid, choice, subgrid, aliases)
        aliases[cut.join.name] = _split_region(gm, cut, mode, group)
    gm.graph.lint()
    gm.recompile()
    return gm


def _split_region(gm: fx.GraphModule, cut: _Cut, mode: str, group: str) -> fx.Node:
    """Split one region on this rank; returns the node that replaced its join."""
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    # the transitions go after the last value they send; kept nodes above that point
    # (a scores matmul computed before the mask) move below them
    anchor = max(cut.fork_inputs + cut.side_inputs, key=order.__getitem__)
    with graph.inserting_before(anchor.next):  # in the order csub_branch_program receives them
        if mode == "csub":  # the other sub-grids receive every side input
            shared = {a: _call(graph, segmented.segment_share, (a, group), a.meta.get(SPEC)) for a in cut.side_inputs}
        elif mode == "tensor":  # every rank holds every row: nothing to share
            shared = {}
        else:  # D&SP: the kept nodes see g times the rows; per-sample side inputs follow
            shared = {a: _call(graph, segmented.segment_gather_rows, (a, group)) for a in cut.side_inputs
                      if a in cut.batched_sides}
        received = _emit_fork(graph, cut, cut.fork_inputs, mode, group)
    cursor = received[-1]
    for node in cut.own:
        if order.get(node, len(order)) < order[anchor]:
            cursor.append(node)
            cursor = node
    replace = dict(zip(cut.fork_inputs, received)) | shared
    for node in cut.own:
        for old, new in replace.items():
            node.replace_input_with(old, new)
    with graph.inserting_before(cut.own[-1].next if cut.heads else cut.join):
        result = _emit_join(graph, cut, cut.outputs, mode, group, root=True)
    # for heads the join is the core's last node and the emitted all-to-all/gather reads it
    cut.join.replace_all_uses_with(result, delete_user_cb=lambda user: user is not result)
    # the join and the other sub-grids' branches: gone from this rank
    for node in reversed(list(graph.nodes)):
        if node in cut.dropped:
            if node.users:
                raise DSPError(f"region {cut.region}: {node.format_node()} is used outside its "
                                            f"branch; D&SP cannot drop it")
            graph.erase_node(node)
    return result


# ---------------------------------------------------------------- cSub: the other sub-grids


def csub_branch_program(gm: fx.GraphModule, *, dsp_regions: dict[str, dict], subgrid: int,
                        group: str = MeshAxis.SEGMENT) -> fx.GraphModule:
    """The program of a rank of sub-grid ``subgrid`` > 0 in D&SP-cSub (SUPER §III-C): for
    each region in graph order, receive the fork value (broadcast) or this sub-grid's
    heads (scatter) and the shared side inputs from sub-grid 0, run the own branches, and
    send their sum (reduce) or pieces (gather) back. It takes no inputs and returns the
    last region's join result (zeros here); ``backward`` from it runs every region's
    backward collectives, chained by ``csub_placeholder(after=...)``.

    ``gm`` is the model captured at sub-grid 0's local batch (the rows its branches see)."""
    if subgrid == 0:
        raise DSPError("D&SP-cSub: sub-grid 0 runs the common layers (dsp_pass)")
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    cuts = sorted((_cut(gm, rid, choice, subgrid) for rid, choice in dsp_regions.items()),
                  key=lambda c: order[c.own[0]])
    graph = fx.Graph()
    previous = None
    for cut in cuts:
        env: dict[fx.Node, fx.Node] = {}
        for a in cut.side_inputs:
            spec = a.meta.get(SPEC)
            like = ("tensor", list(spec.shape), spec.dtype) if isinstance(spec, TensorSpec) else ("scalar",)
            env[a] = _call(graph, segmented.segment_share, (None, group, like), spec)
        if cut.heads:
            first = tensor_spec(cut.fork_inputs[0])
            shape = [first.shape[0], sum(cut.widths), sum(math.prod(t) for t in _bundle_layout(cut))]
        else:
            first = tensor_spec(cut.fork_inputs[0])
            shape = list(first.shape)
        placeholder = _call(graph, segmented.csub_placeholder, (shape, first.dtype, previous))
        env.update(zip(cut.fork_inputs, _emit_fork(graph, cut, [placeholder], "csub", group)))
        for node in cut.own:
            env[node] = graph.node_copy(node, lambda a: _constant_input(graph, env, a, cut))
        previous = _emit_join(graph, cut, [env[o] for o in cut.outputs], "csub", group, root=False)
    graph.output(previous)
    program = fx.GraphModule(gm, graph, class_name="CSubBranches")
    program.meta.update({k: v for k, v in gm.meta.items() if k != REGIONS})
    # what sub-grid 0's program returns (the loss, when training), which it sends here
    returned = next(iter(gm.graph.find_nodes(op="output"))).args[0]
    if isinstance(returned, (tuple, list)) and len(returned) == 1:  # torch.export returns a flat list
        returned = returned[0]
    program.meta[ROOT_OUTPUT] = returned.meta.get(SPEC) if isinstance(returned, fx.Node) else None
    program.graph.lint()
    return program


def _constant_input(graph: fx.Graph, env: dict, node: fx.Node, cut: _Cut) -> fx.Node:
    """A value a kept node reads: already received or computed here, or a parameter or
    constant (``get_attr``, copied with what it derives from); anything else comes from
    the common layers, which this sub-grid does not run."""
    if node in env:
        return env[node]
    if node.op == "get_attr" or (node.op == "call_function" and node.all_input_nodes and all(
            a.op == "get_attr" or a in env for a in node.all_input_nodes)):
        env[node] = graph.node_copy(node, lambda a: _constant_input(graph, env, a, cut))
        return env[node]
    raise DSPError(f"region {cut.region}: a branch reads {node.name} from the common layers, which "
                                f"D&SP-cSub does not send to the other sub-grids; use D&SP (csub off)")
