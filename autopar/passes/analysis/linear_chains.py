"""Analysis pass: linear chains (matmul → pointwise ops → matmul), i.e. MLPs.

Megatron splits the first matmul by columns and the second by rows so the pointwise
ops in between run on a shard with no communication (megatron §2.3, Figure 5a). The
pass finds, whatever the op spelling (``nn.Linear``, ``F.linear``, ``x @ W``,
``aten.addmm``/``aten.linear``):

* the *column* linears: one, or several sharing an input whose outputs are combined
  pointwise (gated MLPs: ``silu(w1(x)) * w3(x)``);
* the pointwise/view nodes between them and the *row* linear;
* the row linear, whose input is reached only through those nodes.

A column whose output is cut right away into k equal pieces (``gate, up =
gate_up_proj(x).chunk(2, -1)``) holds k blocks (``details["blocks"]``), split block by
block. The experts of a mixture-of-experts layer stored as 3-D weights and applied by a
grouped matmul (Hugging Face Mixtral: ``gate_up_proj [E, 2I, H]``, ``down_proj [E, H,
I]``) form such a chain too (``details["experts"] = E``): every expert's gate/up
projection is split by columns and its down projection by rows, as Megatron splits an
MLP; the router stays outside (replicated), so every tensor rank routes alike. Experts
with biases add each row's expert's bias after the grouped matmul (``out +
bias[expert_ids]``, Hugging Face GPT-OSS): the gated projection's bias is part of the
chain (``details["column_bias"]``, cut with its columns); the down projection's is added
after the row, to the reduced sum. A gated projection whose gate and up columns
alternate (GPT-OSS: ``gate, up = x[..., ::2], x[..., 1::2]``) holds 2 blocks too,
``details["interleaved"]``: each gate beside its up, so a contiguous cut of the columns
keeps both halves of every unit together.

Linears already claimed by an attention or vocabulary region are skipped, so run
:mod:`autopar.passes.analysis.attention` and :mod:`autopar.passes.analysis.vocab` first.

Example (``nn.Sequential(Linear(8, 32), GELU(), Linear(32, 8))``; the chain spans the
model's root, so it is named after its first layer, see :mod:`autopar.passes.analysis.naming`)::

    linear_chain:0  column=[model_0] row=model_2 hidden=32 pointwise=[model_1]
"""
from __future__ import annotations

import logging

import torch.fx as fx

from autopar.ir import REGION_OF, SPEC, Region, add_region, clear_regions, node_index, tensor_spec
from autopar.passes.manager import examining
from autopar.passes.analysis.naming import RegionNames
from autopar.passes.analysis.ops import SLICE_FUNCTIONS, call_name, is_pointwise, is_view_like, match_linear

log = logging.getLogger("autopar.analysis.linear_chains")


def _claimed(node: fx.Node) -> bool:
    tags = node.meta.get(REGION_OF, {})
    return "attention" in tags or "vocab" in tags or "linear_chain" in tags


def find_linear_chains_pass(gm: fx.GraphModule) -> fx.GraphModule:
    """Record one ``linear_chain`` region per column→pointwise→row pattern in ``gm``.

    ``details``: ``column`` (node names of the column-split linears), ``row`` (the
    row-split linear), ``hidden`` (the intermediate width that gets split),
    ``pointwise`` (node names in between). The graph is not changed. Ids name the
    module holding the chain (``linear_chain:transformer.h.0.mlp``; a second chain in
    one module is ``#1``), see :mod:`autopar.passes.analysis.naming`.
    """
    clear_regions(gm, "linear_chain")
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    index = node_index(gm)
    names = RegionNames("linear_chain")
    for node in gm.graph.nodes:
        with examining("linear_chains", node, "linear"):
            first = match_linear(node, gm)
            if first is None or _claimed(node):
                continue
            found = _chain_from(gm, first, order)
            if found is None:
                continue
            columns, interior, row, blocks, extra = found
            members = sorted(set(columns) | set(interior) | {row.node}, key=order.__getitem__)
            details = {
                "column": [c.name for c in sorted(columns, key=order.__getitem__)],
                "row": row.node.name,
                "hidden": first.out_features // blocks,
                "pointwise": [n.name for n in sorted(interior, key=order.__getitem__)],
            }
            if blocks > 1:
                details["blocks"] = blocks
            if first.experts:
                details["experts"] = first.experts
            details.update(extra)
            add_region(gm, Region(id=names.of(gm, members), kind="linear_chain",
                                  nodes=[n.name for n in members], details=details), index)
    return gm


def _chain_from(gm: fx.GraphModule, first, order):
    """Grow the pointwise sub-graph after ``first``; return (columns, interior, row) or None.

    Two phases: collect everything reachable from ``first`` through pointwise and view
    ops (stopping at linears), then check that each collected node reads only from the
    chain, from parameters, or from a sibling column linear on the same input.
    """
    interior: set[fx.Node] = set()
    rows: set[fx.Node] = set()
    extra: dict = {}
    bias = expert_bias(first) if first.experts else None
    outside: set[fx.Node] = set()   # inputs from outside the chain it may read: the bias's gather
    out = first.node                 # the gated projection's output, its bias added
    if bias is not None:
        extra["column_bias"], out, gathered = bias
        interior.add(out)
        outside.add(gathered)
    halves = _interleaved(out)
    if halves:
        interior.update(halves)
    frontier = [first.node, *interior]
    while frontier:
        current = frontier.pop()
        for user in current.users:
            if user in interior or user in rows:
                continue
            if match_linear(user, gm) is not None:
                rows.add(user)
            elif is_pointwise(user, gm) or is_view_like(user):
                interior.add(user)
                frontier.append(user)
            else:
                return None  # the intermediate escapes into something else
    if len(rows) != 1:
        return None
    row = match_linear(next(iter(rows)), gm)
    blocks = 2 if halves and 2 * row.in_features == first.out_features else _blocks(first, row, out)
    if halves:
        extra["interleaved"] = True
    if _claimed(row.node) or blocks is None or first.experts != row.experts:
        return None
    if row.input not in interior and row.input is not first.node:
        return None
    columns = {first.node}
    for node in interior:
        for arg in node.all_input_nodes:
            if arg in interior or arg in columns or arg in outside or arg.op == "get_attr":
                continue
            sibling = match_linear(arg, gm)
            if sibling is not None and sibling.input is first.input and not _claimed(arg) and blocks == 1 \
                    and sibling.out_features == first.out_features and not _sibling_escapes(arg, interior):
                columns.add(arg)
                continue
            return None
    return columns, interior, row, blocks, extra


def expert_bias(first) -> tuple[str, fx.Node, fx.Node] | None:
    """``(bias parameter, the add, the bias's gather)`` when the grouped matmul ``first``'s
    only user adds each row's expert's bias (``out + bias[expert_ids]``, ``bias [E,
    out]``: Hugging Face's experts with ``has_bias``), else None."""
    users = list(first.node.users)
    if len(users) != 1 or call_name(users[0]) not in ("add", "add_") or len(users[0].args) != 2 \
            or users[0].args[0] is not first.node:
        return None
    add, gathered = users[0], users[0].args[1]
    if not isinstance(gathered, fx.Node) or call_name(gathered) != "index" or len(gathered.args) != 2:
        return None
    param, index = gathered.args
    spec = tensor_spec(param) if isinstance(param, fx.Node) and param.op == "get_attr" else None
    if spec is None or tuple(spec.shape) != (first.experts, first.out_features) or not (
            isinstance(index, (list, tuple)) and len(index) == 1 and isinstance(index[0], fx.Node)):
        return None
    return str(param.target), add, gathered


def _interleaved(out: fx.Node) -> list[fx.Node]:
    """The two slices that take a gated projection's output ``out`` apart when its gate
    and up columns alternate (``out[..., ::2]``, ``out[..., 1::2]``: Hugging Face
    GPT-OSS), gate first; ``[]`` for any other use."""
    users = list(out.users)
    spec = tensor_spec(out)
    if len(users) != 2 or spec is None or not spec.shape:
        return []
    ndim, width = len(spec.shape), spec.shape[-1]
    starts = {}
    for user in users:
        if not (user.op == "call_function" and user.target in SLICE_FUNCTIONS and call_name(user) == "slice"):
            return []
        dim, start, end, step = (list(user.args[1:]) + [0, None, None, 1])[:4]
        if dim not in (-1, ndim - 1) or step != 2 or start not in (0, 1) or (end is not None and end < width):
            return []
        starts[start] = user
    return [starts[0], starts[1]] if len(starts) == 2 else []


def _blocks(first, row, out: fx.Node | None = None) -> int | None:
    """How many blocks the column's output holds: 1 when the row reads all of its width;
    k when one fused column (``gate_up_proj``) is split into k equal pieces along its last
    dimension right away (``chunk(2, -1)``, after the experts' bias when they have one:
    ``out``), each as wide as the row's input. A Megatron split then cuts each block (rank
    r keeps gate_r and up_r). None: no chain."""
    if row.in_features == first.out_features:
        return 1
    out = out if out is not None else first.node
    users = list(out.users)
    if len(users) != 1 or not is_view_like(users[0]):
        return None
    pieces, out = users[0].meta.get(SPEC), tensor_spec(first.node)
    if not isinstance(pieces, tuple) or out is None or len(pieces) < 2:
        return None
    if all(p is not None and p.shape[:-1] == out.shape[:-1] and p.shape[-1] == row.in_features for p in pieces) \
            and len(pieces) * row.in_features == first.out_features:
        return len(pieces)
    return None


def _sibling_escapes(sibling: fx.Node, interior: set) -> bool:
    return any(u not in interior for u in sibling.users)
