"""Fusion pass: the pointwise chains and row-wise reductions of a rank's graph become
generated Triton kernels (megatron §4.2, §5.8: fused bias+GeLU, bias+dropout+add and
scale+mask+softmax gained 11-19% throughput).

It runs last, on each rank's rewritten graph, so collectives and matmuls are already in
place and bound every chain. Steps:

1. **Classify** every node (:func:`.fusible.recognise`): a fusible op (pointwise
   arithmetic and activations, casts, views with literal shapes, masked_fill, softmax,
   layer norm and RMS norm over the last dimension, means and sums over it that keep it
   (row values: Llama's RMS norm written out), rotary embeddings' ``rotate_half``,
   autopar's rank-aware dropout) or not. Matmuls, collectives, plain ``F.dropout`` (not
   rank-aware) and everything else are boundaries.
2. **Split biases** off linears whose output only feeds fusible ops, so the bias add
   moves into the kernel (Megatron's ``skip_bias_add``): ``addmm(b, x, w)`` becomes
   ``mm(x, w) + b``.
3. **Grow chains** in graph order (:class:`.fusible.Chains`): a fusible node joins the
   chains of its fusible producers when it has as many elements (or one per row: a row
   reduction and what reads it) and the merged chain
   can still be placed: every input of the chain (and every dropout site's seed) is
   computed before the first node outside the chain that reads one of its values. That
   one test keeps the graph acyclic (a path chain → outside → chain would break it) and
   respects every other consumer: any value read outside the chain is an output of the
   kernel.
4. **Generate** each chain with at least two real ops (its IR from
   :class:`.chain_builder.ChainBuilder`, its kernels from ``autopar.passes.fusion``), or log
   why it stays unfused: an unsupported dtype, broadcast, exponent or row length.
5. **Rewrite**: each dropout site keeps a ``dropout_seed`` node where it stood (so seeds
   are drawn in the unfused order and masks are equal), one ``fused_kernel`` call
   replaces the chain, and ``getitem`` nodes hand its outputs to their readers; the
   slices and negation a ``rotate_half`` absorbed are erased once nothing reads them.

What was fused and what was not, with reasons, is in ``gm.meta[FUSION]``.
"""
from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.ir import FUSION, SPEC, TensorSpec, tensor_spec
from autopar.passes.fusion import codegen
from autopar.passes.fusion.chain_builder import ChainBuilder
from autopar.passes.fusion.fusible import Chains, drop_leading_views, recognise, recognise_all, worth
from autopar.passes.fusion.launch import fused_kernel, register
from autopar.runtime import rng

log = logging.getLogger("autopar.fusion")


@dataclass
class FusionReport:
    kernels: list = field(default_factory=list)      # distinct FusedKernel objects, in graph order
    uses: list = field(default_factory=list)         # (kernel name, the fx node names it replaces)
    skipped: list = field(default_factory=list)      # (fx node names, reason)
    biases_split: int = 0

    def skip(self, nodes: list[fx.Node], reason) -> None:
        """Record (and log) that ``nodes`` stay unfused, and why."""
        names = [n.name for n in nodes]
        log.info("fusion: %s stay unfused: %s", ", ".join(names), reason)
        self.skipped.append((names, str(reason)))

    def summary(self) -> str:
        lines = [f"fusion: {len(self.uses)} chain(s) run by {len(self.kernels)} generated kernel(s); "
                 f"{self.biases_split} bias add(s) moved into them"]
        for name, nodes in self.uses:
            lines.append(f"  {name}: {', '.join(nodes)}")
        for names, reason in self.skipped:
            lines.append(f"  unfused {', '.join(names)}: {reason}")
        return "\n".join(lines)


# ------------------------------------------------------------------ bias split

def _give_parameter_spec(gm: fx.GraphModule, node: fx.Node) -> None:
    """Write SPEC on a ``get_attr`` of a parameter that has none (added by a rewrite pass)."""
    if node.op != "get_attr" or node.meta.get(SPEC) is not None:
        return
    try:
        value = gm.get_parameter(node.target)
    except AttributeError:
        return
    node.meta[SPEC] = TensorSpec(tuple(value.shape), value.dtype)


def _linear_parts(node: fx.Node, gm: fx.GraphModule):
    """(matmul target, x, w, bias) of an ``addmm(b, x, w)``, ``linear(x, w, b)`` or
    ``nn.Linear`` node (its parameters as new ``get_attr`` nodes)."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        if type(module) is not nn.Linear or module.bias is None or len(node.args) != 1 or node.kwargs:
            return None
        with gm.graph.inserting_before(node):
            w = gm.graph.get_attr(f"{node.target}.weight")
            b = gm.graph.get_attr(f"{node.target}.bias")
        return F.linear, node.args[0], w, b
    if node.op != "call_function" or node.kwargs or len(node.args) != 3:
        return None
    if node.target is torch.ops.aten.addmm.default:
        bias, x, w = node.args
        return torch.ops.aten.mm.default, x, w, bias
    if node.target in (F.linear, torch.ops.aten.linear.default):
        x, w, bias = node.args
        return node.target, x, w, bias
    return None


def split_biases(gm: fx.GraphModule, fusible) -> int:
    """``linear(x, w, b)`` whose only reader (directly, or through one view whose readers
    all are) is fusible becomes ``linear(x, w) + b``, so the bias add joins the chain
    (Megatron's ``skip_bias_add``). Returns how many were split."""
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if node.op not in ("call_module", "call_function") or len(node.users) != 1:
            continue
        reader = next(iter(node.users))
        rec = recognise(reader, gm)
        if rec is None:
            continue
        if rec.kind == "view":
            # the bias [N] broadcasts against the view only if the view keeps the last dimension
            keeps_rows = tensor_spec(reader).shape[-1:] == tensor_spec(node).shape[-1:] if \
                isinstance(node.meta.get(SPEC), TensorSpec) else False
            if not rec.attrs.get("target") or not keeps_rows or not reader.users or \
                    not all(fusible(u) for u in reader.users):
                continue
        elif not fusible(reader):
            continue
        parts = _linear_parts(node, gm)
        if parts is None or not isinstance(parts[3], fx.Node):
            continue
        target, x, w, bias = parts
        with graph.inserting_before(node):
            mm = graph.call_function(target, (x, w))
        mm.meta.update(node.meta)
        node.replace_all_uses_with(mm)
        graph.erase_node(node)
        anchor = reader if rec.kind == "view" else mm
        with graph.inserting_after(anchor):
            add = graph.call_function(torch.ops.aten.add.Tensor, (anchor, bias))
        add.meta[SPEC] = anchor.meta.get(SPEC)
        _give_parameter_spec(gm, bias)
        anchor.replace_all_uses_with(add, delete_user_cb=lambda user: user is not add)
        count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count


def _in_dependency_order(chains: list[list[fx.Node]]) -> tuple[list, list]:
    """``chains`` ordered so that a chain comes after every chain it reads from (each
    kernel's call is placed after its inputs, which may be another kernel's outputs), and
    the chains on a cycle of direct reads, which cannot be fused together."""
    owner = {n: k for k, nodes in enumerate(chains) for n in nodes}
    reads = {k: {owner[a] for n in nodes for a in n.all_input_nodes if a in owner and owner[a] != k}
             for k, nodes in enumerate(chains)}
    done: list[int] = []
    placed: set[int] = set()
    pending = list(range(len(chains)))
    while pending:
        ready = [k for k in pending if reads[k] <= placed]
        if not ready:
            break
        for k in ready:
            done.append(k)
            placed.add(k)
        pending = [k for k in pending if k not in placed]
    # what remains is on a cycle, or reads from one: those read from are left unfused too,
    # so the remaining chains are retried against them as plain nodes next time round
    return [chains[k] for k in done], [chains[k] for k in pending]


# ------------------------------------------------------------------ the pass

def fusible_chains(gm: fx.GraphModule, min_ops: int = 2) -> list[list[fx.Node]]:
    """The chains the pass would fuse in ``gm`` (before checking what codegen supports):
    what the cost model prices as one kernel each. Reads the graph, changes nothing."""
    recs = recognise_all(gm)
    return [nodes for nodes in Chains(gm, drop_leading_views(recs)).grow() if worth(nodes, recs, min_ops)]


def fusion_pass(gm: fx.GraphModule, *, min_ops: int = 2) -> fx.GraphModule:
    """Replace the fusible chains of ``gm`` by generated kernels (see the module docstring)."""
    report = FusionReport()
    for node in gm.graph.nodes:   # parameters read by rewrite passes (a row-parallel bias) carry no spec
        _give_parameter_spec(gm, node)

    recs = recognise_all(gm)
    report.biases_split = split_biases(gm, lambda n: n in recs or recognise(n, gm) is not None)
    recs = drop_leading_views(recognise_all(gm))
    graph = gm.graph
    replaced: dict[fx.Node, fx.Node] = {}   # an earlier kernel's output node -> its getitem
    chains = [nodes for nodes in Chains(gm, recs).grow() if worth(nodes, recs, min_ops)]
    ordered, cyclic = _in_dependency_order(chains)
    for nodes in cyclic:
        report.skip(nodes, "reads and is read by another fused chain (the two kernels would wait on each other)")
    for nodes in ordered:
        while nodes and recs[nodes[-1]].kind == "view":  # a trailing view is left to the graph
            nodes.pop()
        try:
            builder = ChainBuilder(gm, nodes, recs)
            chain, out_nodes = builder.build()
        except codegen.Unsupported as e:
            report.skip(nodes, e)
            continue
        late = _late_input(gm, nodes, builder, replaced)
        if late is not None:
            report.skip(nodes, f"its input {late} (another kernel's output) is computed after a reader of the "
                               f"chain's values")
            continue
        kernel = register(chain)
        if kernel not in report.kernels:
            report.kernels.append(kernel)
        report.uses.append((kernel.name, [n.name for n in nodes]))
        _replace(gm, nodes, builder, out_nodes, kernel.name, fused_kernel, replaced)
        for node in nodes:   # a rotate_half's slices and negation, dead once the kernel replaced it
            for absorbed in recs[node].attrs.get("absorbs", ()):
                if not absorbed.users:
                    graph.erase_node(absorbed)
    graph.lint()
    gm.recompile()
    gm.meta[FUSION] = report
    return gm


def _late_input(gm: fx.GraphModule, nodes: list[fx.Node], builder: ChainBuilder, replaced: dict) -> str | None:
    """The input that would come after a reader of the chain once earlier chains were
    replaced (an input from another kernel is ready only where that kernel's call went),
    or None when the chain can be placed (checked on the graph as it is now)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    inside = set(nodes)
    first_reader = min((order[u] for n in nodes for u in n.users if u not in inside), default=len(order))
    for source in builder.input_nodes + builder.scalar_nodes:
        if isinstance(source, fx.Node) and order[replaced.get(source, source)] >= first_reader:
            return replaced.get(source, source).name
    return None


def _replace(gm: fx.GraphModule, nodes: list[fx.Node], builder: ChainBuilder, out_nodes: list[fx.Node], name: str,
             fused_kernel, replaced: dict) -> None:
    """Put one ``fused_kernel`` call in place of ``nodes``: after its last input (every
    reader of its outputs comes later: :meth:`.fusible.Chains.placeable`)."""
    graph = gm.graph
    seeds = []
    for node, site, layout, like, view, ndim in builder.dropouts:
        with graph.inserting_before(node):   # drawn where the dropout stood (its call's key and rows)
            index = graph.call_function(rng.dropout_index, (site, layout, replaced.get(like, like), view))
            seeds.extend(graph.call_function(operator.getitem, (index, j)) for j in range(1 + 3 * ndim))
    args = []
    for source in builder.input_nodes:
        if isinstance(source, str):   # a LayerNorm module's parameter
            with graph.inserting_before(nodes[0]):
                source = graph.get_attr(source)
        args.append(replaced.get(source, source))
    order = {n: i for i, n in enumerate(graph.nodes)}
    scalars = list(builder.scalar_nodes)
    last = max(args + scalars + seeds, key=order.__getitem__)
    with graph.inserting_after(last):
        call = graph.call_function(fused_kernel, (name, *args, *scalars, *seeds))
    getters = []
    with graph.inserting_after(call):
        for k in reversed(range(len(out_nodes))):   # inserting_after reverses successive inserts
            getters.insert(0, graph.call_function(operator.getitem, (call, k)))
    for node, getter in zip(out_nodes, getters):
        getter.meta[SPEC] = node.meta.get(SPEC)
        node.replace_all_uses_with(getter)
        replaced[node] = getter
    for node in reversed(nodes):
        graph.erase_node(node)
