"""A drawing of a graph's regions in Graphviz DOT: one cluster per region, colour by kind.

Every node of the captured graph is drawn, grouped in a cluster per region (the
innermost one when regions nest); edges follow the data flow. ``dot -Tsvg`` renders it
(``Plan.save`` does when graphviz is installed). Parameters are left out to keep the
drawing about computation.
"""
from __future__ import annotations

import torch.fx as fx

from autopar.ir import REGION_OF, regions, tensor_spec

_COLOURS = {"vocab": "#fde0c5", "attention": "#c6dbef", "linear_chain": "#c7e9c0", "fork_join": "#f2d0f2",
            "block": "#f0f0f0"}
_PRIORITY = ("attention", "linear_chain", "vocab", "fork_join", "block")


def _quote(text: str) -> str:
    """A DOT string literal: quotes and backslashes escaped, line breaks as DOT's \\n."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n") + '"'


def regions_dot(gm: fx.GraphModule, strategies: dict[str, str] | None = None, title: str = "") -> str:
    """DOT source for ``gm`` with its regions as clusters labelled with their strategy."""
    strategies = strategies or {}
    drawn = [n for n in gm.graph.nodes if n.op != "get_attr"]
    owner: dict[str, str] = {}
    for node in drawn:
        tags = node.meta.get(REGION_OF, {})
        kind = next((k for k in _PRIORITY if k in tags), None)
        if kind is not None:
            owner[node.name] = tags[kind]
    lines = ["digraph regions {", "  rankdir=TB;", '  node [shape=box, fontsize=10, fontname="monospace"];']
    if title:
        lines.append(f"  label={_quote(title)}; labelloc=t;")
    by_region: dict[str, list[fx.Node]] = {}
    for node in drawn:
        by_region.setdefault(owner.get(node.name, ""), []).append(node)
    known = {r.id: r for r in regions(gm)}
    for index, (rid, nodes) in enumerate(by_region.items()):
        indent = "  "
        if rid:
            region = known[rid]
            label = f"{rid}" + (f"\n{strategies[rid]}" if rid in strategies else "")
            lines.append(f"  subgraph cluster_{index} {{")
            lines.append(f"    label={_quote(label)}; style=filled; color={_quote(_COLOURS.get(region.kind, '#eeeeee'))};")
            indent = "    "
        for node in nodes:
            spec = tensor_spec(node)
            text = f"{node.name}\n{node.op if node.op != 'call_function' else getattr(node.target, '__name__', node.target)}"
            if spec is not None:
                text += f"\n{spec}"
            lines.append(f"{indent}{_quote(node.name)} [label={_quote(text)}];")
        if rid:
            lines.append("  }")
    for node in drawn:
        for arg in node.all_input_nodes:
            if arg.op != "get_attr":
                lines.append(f"  {_quote(arg.name)} -> {_quote(node.name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"
