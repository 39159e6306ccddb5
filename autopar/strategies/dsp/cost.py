"""Sub-graph parallelism (D&SP) placement and message counts (SUPER §V, eqs 3-7).

With ``n`` ranks in ``g`` sub-grids of ``n_g = n / g`` ranks, the rank at position ``p``
of sub-grid ``s`` exchanges the branch split/join data with the ranks at position ``p``
of every sub-grid: its *segment* group of ``g`` ranks. Two placements of ``(s, p)`` on
global ranks (nodes hold ``n_node`` consecutive ranks):

* **naive**: sub-grids are contiguous blocks, ``rank = s·n_g + p``;
* **topology-aware** (§V, Figure 11): round-robin, ``rank = p·g + s``, so a segment group
  is ``g`` adjacent ranks and stays inside a node when ``g ≤ n_node``.

A segmented all-to-all in one segment group sends ``g²`` messages (each member to each,
itself included), ``n·g`` in all (eq 3: Messages = IntraNode + InterNode). Counting which
of them stay inside a node gives the paper's closed forms::

    naive:  IntraNode = n_node·g  if n_g <= n_node else n          (eq 4, see below)
            InterNode = (n - n_node)·g  if n_g <= n_node else n(g-1)   (eq 5)
    topo:   IntraNode = n·g  if g <= n_node else n·n_node          (eq 6)
            InterNode = 0    if g <= n_node else n(g - n_node)      (eq 7)

**The printed eqs 4 and 5 have their two cases exchanged** (they give ``n`` intra-node
messages when ``n_g ≤ n_node``). That cannot be: with ``n_g < n_node`` a node holds
several members of each segment group, so more than the ``n`` messages a rank sends to
itself stay inside nodes. The forms above are the printed ones with the conditions
swapped; :func:`count_messages` counts them from the placement and the tests check both
agree for every configuration. (Eqs 6 and 7 are right as printed.)

Example: 16 ranks, 4 per node, g = 2 (sub-grids of 8)::

    >>> split_messages(16, 2, 4, topology_aware=False)
    MessageCounts(intra_node=16, inter_node=16)
    >>> split_messages(16, 2, 4, topology_aware=True)
    MessageCounts(intra_node=32, inter_node=0)
"""
from __future__ import annotations

from dataclasses import dataclass

from autopar.grid import MeshAxis, RankGrid, subgrid_dims
from autopar.cost import model as cost_model
from autopar.strategies.shared.branch_cost import SubgraphCost, assign_branches, scaled_works


@dataclass(frozen=True)
class MessageCounts:
    """Messages of one segmented all-to-all (a branch split or join) across the ranks."""

    intra_node: int
    inter_node: int

    @property
    def total(self) -> int:
        return self.intra_node + self.inter_node


def _check(n: int, g: int, n_node: int) -> int:
    if g < 1 or n % g:
        raise ValueError(f"{g} sub-grids do not divide {n} ranks; choose g dividing the number of ranks")
    if n_node < 1:
        raise ValueError(f"ranks per node must be positive, got {n_node}")
    return n // g


def rank_of(s: int, p: int, n: int, g: int, topology_aware: bool) -> int:
    """The global rank holding position ``p`` of sub-grid ``s`` (:func:`autopar.grid.subgrid_dims`)."""
    return RankGrid(subgrid_dims(n, g, topology_aware)).index(subgrid=s, position=p)


def subgrid_coordinates(rank: int, n: int, g: int, topology_aware: bool) -> tuple[int, int]:
    """``(s, p)``: the sub-grid of ``rank`` and its position inside it."""
    coords = RankGrid(subgrid_dims(n, g, topology_aware)).coordinates(rank)
    return coords[MeshAxis.SUBGRID], coords[MeshAxis.POSITION]


def subgrid_groups(n: int, g: int, topology_aware: bool) -> tuple[list[list[int]], list[list[int]]]:
    """``(segment groups, sub-grids)`` as lists of global ranks.

    Segment group ``p`` holds position ``p`` of every sub-grid, in sub-grid order; sub-grid
    ``s`` holds its ranks in position order (its data-parallel group)."""
    grid = RankGrid(subgrid_dims(n, g, topology_aware))
    return grid.groups((MeshAxis.SUBGRID,)), grid.groups((MeshAxis.POSITION,))  # in order of the other coordinate


def count_messages(n: int, g: int, n_node: int, topology_aware: bool) -> MessageCounts:
    """Count the messages of a segmented all-to-all over the placement (ground truth)."""
    _check(n, g, n_node)
    segments, _ = subgrid_groups(n, g, topology_aware)
    intra = inter = 0
    for group in segments:
        for sender in group:
            for receiver in group:
                if sender // n_node == receiver // n_node:
                    intra += 1
                else:
                    inter += 1
    return MessageCounts(intra, inter)


def split_messages(n: int, g: int, n_node: int, topology_aware: bool) -> MessageCounts:
    """The closed forms of SUPER eqs 4-7 (eqs 4-5 with their cases exchanged, see the
    module docstring); valid when ``n_node`` divides ``n`` and ``n_g``/``g`` and
    ``n_node`` divide one another, as on real machines."""
    n_g = _check(n, g, n_node)
    if topology_aware:
        if g <= n_node:
            return MessageCounts(n * g, 0)                          # eqs 6, 7
        return MessageCounts(n * n_node, n * (g - n_node))
    if n_g <= n_node:
        return MessageCounts(n_node * g, (n - n_node) * g)          # eqs 4, 5 (cases exchanged)
    return MessageCounts(n, n * (g - 1))


# ---------------------------------------------------------------- branch assignment
# (the balanced assignment of branches to sub-grids, which mixed plans use too, is
# :func:`autopar.strategies.shared.branch_cost.assign_branches`)


def head_widths(heads: int, g: int) -> list[int]:
    """Attention heads per sub-grid: contiguous ranges as even as the count allows (heads
    cost the same, so this is the balanced assignment; sub-grid ``s`` gets the next range).

    >>> head_widths(6, 4)
    [2, 2, 1, 1]
    """
    if g < 1 or heads < g:
        raise ValueError(f"{heads} heads cannot fill {g} sub-grids; choose g <= {heads}")
    return [heads // g + (1 if s < heads % g else 0) for s in range(g)]


# ---------------------------------------------------------------- cost of a D&SP region


def dsp_region_cost(branch_works: list[list], branch_params: list[int], fork_bytes: float, join_bytes: float,
                    join_op: str, n: int, g: int, hw, *, topology_aware: bool = True,
                    csub: bool = False) -> SubgraphCost:
    """Price a fork/join region under D&SP with ``g`` sub-grids of ``n / g`` ranks.

    ``branch_works`` are each branch's :class:`~autopar.passes.analysis.flops.NodeWork` at the
    global batch; ``fork_bytes`` / ``join_bytes`` the global-batch sizes of the value
    entering the branches and of the join's result. Per SUPER §III-B a sub-grid runs
    its branches on ``B·g/n`` rows — fewer, larger kernels per rank than data
    parallelism's ``B/n`` rows of every branch, which is where D&SP wins when kernel
    launch latency dominates. Communication (§IV-B/C, on the segment group of ``g``
    ranks; stride 1 in the topology-aware order, ``n/g`` in the naive one, priced by
    :func:`autopar.cost.model.group_link`, AxoNN eq 10):

    * split: all-gather of the ``B/n``-row fork value forward, reduce-scatter backward;
    * sum join: reduce-scatter of the ``B·g/n``-row partial sum forward, all-gather backward;
    * concat join: all-to-all forward and backward.

    Branch parameters are all-reduced over the sub-grid (``n/g`` ranks) instead of all
    ``n`` ranks.

    ``csub`` (D&SP-cSub, §III-C): the common layers run on sub-grid 0 at ``B·g/n`` rows,
    so the fork and join values already have the branches' rows and the transitions are
    rooted: broadcast / reduce for split and sum, scatter / gather for concat.
    """
    n_g = _check(n, g, 1)
    branch_costs = [sum(cost_model.node_time(w, hw) * cost_model.passes_per_step(w) for w in scaled_works(works, n_g))
                    for works in branch_works]
    assignment = assign_branches(branch_costs, g)
    per_subgrid = [0.0] * g
    params = [0] * g
    for branch, s in enumerate(assignment):
        per_subgrid[s] += branch_costs[branch]
        params[s] += branch_params[branch]
    stride = 1 if topology_aware else n_g
    rows_common, rows_branch = fork_bytes / n, fork_bytes / n_g
    if csub:
        split = 2 * cost_model.broadcast_time(g, rows_branch, hw, stride)  # broadcast, and reduce in backward
        if join_op == "sum":
            join = 2 * cost_model.broadcast_time(g, join_bytes / n_g, hw, stride)
        else:
            join = 2 * cost_model.scatter_time(g, join_bytes / n_g, hw, stride)
    else:
        split = cost_model.all_gather_time(g, rows_common, hw, stride) + cost_model.reduce_scatter_time(g, rows_branch, hw, stride)
        if join_op == "sum":
            join = (cost_model.reduce_scatter_time(g, join_bytes / n_g, hw, stride)
                    + cost_model.all_gather_time(g, join_bytes / n, hw, stride))
        else:
            join = 2 * cost_model.all_to_all_time(g, join_bytes / n_g / g, hw, stride)
    subgrid_stride = g if topology_aware else 1
    gradients = cost_model.all_reduce_time(n_g, max(params) * 4, hw, subgrid_stride)
    return SubgraphCost(max(per_subgrid), {MeshAxis.SEGMENT: split + join, MeshAxis.SUBGRID: gradients},
                        tuple(assignment), max(params))


def dsp_heads_cost(core_works: list, bundle_bytes: float, out_bytes: float, n: int, g: int, hw, *,
                   topology_aware: bool = True, csub: bool = False) -> SubgraphCost:
    """Price attention heads as D&SP branches (SUPER Fig. 5): ``g`` sub-grids each run
    ``H/g`` heads on ``B·g/n`` rows. ``core_works`` is the per-head core (scores, mask,
    softmax, context) at the global batch, ``bundle_bytes`` the query, key and value
    together and ``out_bytes`` the context, both at the global batch.

    When the heads run in one batched kernel per op (as in every model written with
    ``view(B, T, H, d)``), a rank launches as many kernels as under data parallelism,
    each on ``1/n`` of the work: the launch saving that makes explicit branches win
    (SUPER measures heads as separate kernels) is absent, and the slice and concat
    exchanges — all-to-alls in D&SP, scatter and gather in cSub — come on top. The
    planner weighs it and, with batched heads, prefers data parallelism.
    """
    n_g = _check(n, g, 1)
    compute = sum(cost_model.node_time(w, hw) * cost_model.passes_per_step(w) for w in scaled_works(core_works, n))
    stride = 1 if topology_aware else n_g
    if csub:
        comm = 2 * cost_model.scatter_time(g, bundle_bytes / n_g, hw, stride) + 2 * cost_model.scatter_time(g, out_bytes / n_g, hw,
                                                                                          stride)
    else:
        comm = 2 * cost_model.all_to_all_time(g, bundle_bytes / n, hw, stride) + 2 * cost_model.all_to_all_time(g, out_bytes / n,
                                                                                              hw, stride)
    return SubgraphCost(compute, {MeshAxis.SEGMENT: comm, MeshAxis.SUBGRID: 0.0}, (), 0)
