"""What a multi-branch region's branches cost on the ranks that run them, as D&SP
(:mod:`autopar.strategies.dsp.cost`: its sub-grids of the data ranks) and mixed plans
(:func:`dsp_tensor_cost`: the tensor group's ranks) price them: the balanced assignment of
branches to sub-grids (:func:`assign_branches`), a region's cost (:class:`SubgraphCost`)
and one rank's share of the branches' work (:func:`scaled_works`)."""
from __future__ import annotations

from dataclasses import dataclass

from autopar.cost import model as cost_model
from autopar.grid import MeshAxis
from autopar.passes.analysis.flops import NodeWork


def assign_branches(costs: list[float], g: int) -> list[int]:
    """The sub-grid of each branch: longest processing time first (sort branches by
    predicted cost, give each to the least loaded sub-grid), so branches of unequal
    cost, or a count ``g`` does not divide, still balance. Ties go to the lower branch
    and sub-grid index: the same costs always give the same assignment.

    >>> assign_branches([3.0, 5.0, 3.0, 4.0], 2)   # 5 and 3 on one, 4 and 3 on the other
    [1, 0, 0, 1]
    """
    if g < 1:
        raise ValueError(f"the number of sub-grids must be positive, got {g}")
    if len(costs) < g:
        raise ValueError(f"{len(costs)} branches cannot fill {g} sub-grids: each sub-grid needs a branch; "
                         f"choose g <= {len(costs)}")
    load = [0.0] * g
    owner = [0] * len(costs)
    for branch in sorted(range(len(costs)), key=lambda b: (-costs[b], b)):
        target = min(range(g), key=lambda s: (load[s], s))
        owner[branch] = target
        load[target] += costs[branch]
    return owner


@dataclass(frozen=True)
class SubgraphCost:
    """Predicted per-step cost of one fork/join region on one rank under D&SP.

    ``compute_s`` is the slowest sub-grid's (the join waits for it); ``comm_s`` splits the
    segmented split/join collectives (``"segment"``) from the branch parameters'
    gradient all-reduce inside the sub-grid (``"subgrid"``)."""

    compute_s: float
    comm_s: dict
    assignment: tuple[int, ...]
    branch_param_elems_per_rank: int


def dsp_tensor_cost(branch_works: list[list], branch_params: list[int], fork_bytes: float, join_bytes: float,
                    join_op: str, data: int, t: int, hw) -> SubgraphCost:
    """Price a fork/join region in a mixed plan: its branches spread over the ``t`` ranks
    of the tensor group (each rank a sub-grid of one, SUPER §III-B with ``g = t`` inside
    the model-parallel group), every rank on its data replica's ``B/data`` rows, the
    activations replicated over the group on both sides of the region (where Megatron's
    and the 3D regions meet, ``docs/mixed_plans.md``). Communication on the tensor
    group (stride 1), by the same ring formulas (axonn eqs 1-3):

    * fork: nothing forward (every rank holds the value); backward, each rank holds the
      gradient of its own branches only: an all-reduce of the ``B/data``-row fork value
      (Megatron's f, megatron §2.3);
    * sum join: an all-reduce of the partial sums forward (Megatron's g), nothing backward;
    * concat join: an all-gather of each rank's branch outputs forward (padded to the
      widest rank's width), backward each rank keeps its own columns.

    Branch parameters live on the rank that runs them; their gradients are averaged over
    the data ranks only (priced with the rest by the data-parallel term)."""
    branch_costs = [sum(cost_model.node_time(w, hw) * cost_model.passes_per_step(w) for w in scaled_works(works, data))
                    for works in branch_works]
    assignment = assign_branches(branch_costs, t)
    per_rank, params = [0.0] * t, [0] * t
    for branch, s in enumerate(assignment):
        per_rank[s] += branch_costs[branch]
        params[s] += branch_params[branch]
    fork = cost_model.all_reduce_time(t, fork_bytes / data, hw)
    if join_op == "sum":
        join = cost_model.all_reduce_time(t, join_bytes / data, hw)
    else:
        join = cost_model.all_gather_time(t, join_bytes / data / t, hw)
    return SubgraphCost(max(per_rank), {MeshAxis.TENSOR: fork + join}, tuple(assignment), max(params))


def scaled_works(works, rows_divisor: int):
    """NodeWork of one rank processing 1/rows_divisor of the batch."""
    for w in works:
        yield NodeWork(w.flops // rows_divisor, w.bytes_moved // rows_divisor, w.is_matmul, w.is_kernel, w.is_view,
                       w.special // rows_divisor)
