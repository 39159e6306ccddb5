"""Rewrite pass: D&SP for fork/join regions (SUPER §III-B, §IV-B/C).

Reads the fork/join regions written by analysis and the plan's D&SP choices. On the rank
at position ``p`` of sub-grid ``s`` (common layers hold batch chunk ``p·g + s``, see
``docs/dsp_design.md``), for each region:

* the fork value is all-gathered over the segment group (``segmented_all_gather``): the
  sub-grid's ``B·g/n`` rows, whose backward reduce-scatters the branches' gradient sum;
* only the branches assigned to sub-grid ``s`` stay in the graph, reading the gathered
  value; the others, and their parameters, are gone from this rank's program;
* a sum join becomes the sum of the own branches, reduce-scattered back to the common
  rows (``segmented_reduce_scatter``), plus any value the sum takes that no branch
  computes; a concat join becomes the own branches' concat, exchanged with
  ``segmented_all_to_all`` so every rank gets every branch for its own rows, reordered
  into the original branch order when the assignment interleaves branches.

Example (an Inception block, branches b1 | b2 | b3 joined by ``cat(dim=1)``, g = 2,
branch 1 on sub-grid 0)::

    segmented_all_gather = segmented_all_gather(relu, 'segment')
    model_b2_0 = self.model.b2.0(segmented_all_gather) ... model_b2_2 = ...
    segmented_all_to_all = segmented_all_to_all(model_b2_2, 1, [6, 6], 'segment')
    split = torch.split(segmented_all_to_all, [6, 4, 2], 1)  # sub-grid order: b2 | b1, b3
    cat = torch.cat([split[1], split[0], split[2]], 1)       # original order: b1, b2, b3
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from autopar.ir import SPEC, regions, tensor_spec
from autopar.runtime import subgraph_collectives as S


class SubgraphParallelError(ValueError):
    """A region cannot be split as the plan says; the message names it."""


def subgraph_parallel_pass(gm: fx.GraphModule, *, dsp_regions: dict[str, dict], subgrid: int,
                           group: str = "segment") -> fx.GraphModule:
    """Keep sub-grid ``subgrid``'s branches of each region in ``dsp_regions`` (region id →
    the plan's details: ``subgrids``, ``assignment``) and insert the segmented collectives."""
    if not dsp_regions:
        return gm
    known = {r.id: r for r in regions(gm, "fork_join")}
    for rid, choice in dsp_regions.items():
        if rid not in known:
            raise SubgraphParallelError(f"the plan names region {rid!r}, which analysis did not find in this graph")
        _split_region(gm, known[rid], choice["assignment"], choice["subgrids"], subgrid, group)
    gm.graph.lint()
    gm.recompile()
    return gm


def _call(graph: fx.Graph, fn, args, spec_from: fx.Node) -> fx.Node:
    node = graph.call_function(fn, args)
    node.meta[SPEC] = spec_from.meta.get(SPEC)
    return node


def _split_region(gm: fx.GraphModule, region, assignment: list[int], g: int, subgrid: int, group: str) -> None:
    graph, d = gm.graph, region.details
    table = {n.name: n for n in graph.nodes}
    branches = d["branches"]
    own = [b for b, owner in enumerate(assignment) if owner == subgrid]
    if not own:
        raise SubgraphParallelError(f"region {region.id}: sub-grid {subgrid} has no branch; choose fewer sub-grids")
    outputs = []
    for b in range(len(branches)):
        names = d["branch_outputs"][b]
        if len(names) != 1:
            raise SubgraphParallelError(f"region {region.id}: branch {b} has {len(names)} outputs; D&SP splits "
                                        f"branches with one output")
        outputs.append(table[names[0]])
    fork, join = table[d["fork"]], table[d["join"]]

    with graph.inserting_after(fork):
        gathered = _call(graph, S.segmented_all_gather, (fork, group), fork)
    for b in own:
        for name in branches[b]:
            table[name].replace_input_with(fork, gathered)

    with graph.inserting_before(join):
        mine = [outputs[b] for b in own]
        if d["join_op"] == "sum":
            local = mine[0]
            for value in mine[1:]:
                local = _call(graph, operator.add, (local, value), join)
            result = _call(graph, S.segmented_reduce_scatter, (local, group), join)
            for name in d["passthrough"]:
                result = _call(graph, operator.add, (result, table[name]), join)
        else:
            dim = d["concat_dim"]
            widths = [tensor_spec(o).shape[dim] for o in outputs]
            local = mine[0] if len(mine) == 1 else _call(graph, torch.cat, (mine, dim), join)
            per_subgrid = [sum(widths[b] for b, o in enumerate(assignment) if o == s) for s in range(g)]
            result = _call(graph, S.segmented_all_to_all, (local, dim, per_subgrid, group), join)
            arrived = [b for s in range(g) for b, o in enumerate(assignment) if o == s]
            if arrived != sorted(arrived):
                pieces = _call(graph, torch.split, (result, [widths[b] for b in arrived], dim), join)
                pieces.meta[SPEC] = None
                items = {}
                for index, b in enumerate(arrived):
                    items[b] = graph.call_function(operator.getitem, (pieces, index))
                result = _call(graph, torch.cat, ([items[b] for b in range(len(branches))], dim), join)
    join.replace_all_uses_with(result)

    # what this rank no longer computes: the join and the other sub-grids' branches
    doomed = {table[name] for name in d["join_nodes"]}
    for b, owner in enumerate(assignment):
        if owner != subgrid:
            doomed.update(table[name] for name in branches[b])
    for node in reversed(list(graph.nodes)):
        if node in doomed:
            if node.users:
                raise SubgraphParallelError(f"region {region.id}: {node.format_node()} is used outside its branch; "
                                            f"D&SP cannot drop it")
            graph.erase_node(node)
