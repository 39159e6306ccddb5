"""SUPER §V: message counts of the branch split/join for both rank orders (eqs 3-7)."""
import pytest

from autopar.strategies.dsp.cost import (count_messages, split_messages, subgrid_coordinates, subgrid_groups,
                                       rank_of)


@pytest.mark.parametrize("topology_aware", [False, True])
@pytest.mark.parametrize("g", [2, 4, 8])
def test_counted_messages_equal_the_closed_forms_on_16_ranks_4_per_node(g, topology_aware):
    counted = count_messages(16, g, 4, topology_aware)
    assert counted == split_messages(16, g, 4, topology_aware)
    assert counted.total == 16 * g  # eq 3: every member of a segment group sends to every member


@pytest.mark.parametrize("n, n_node", [(8, 4), (16, 4), (32, 8), (64, 8), (64, 4)])
def test_closed_forms_hold_wherever_the_sizes_divide(n, n_node):
    for g in (d for d in range(1, n + 1) if n % d == 0):
        n_g = n // g
        if (n_g % n_node and n_node % n_g) or (g % n_node and n_node % g):
            continue
        for topology_aware in (False, True):
            assert count_messages(n, g, n_node, topology_aware) == split_messages(n, g, n_node, topology_aware), \
                (n, g, n_node, topology_aware)


def test_paper_values_for_the_topology_aware_order():
    # eqs 6-7: no inter-node message while the sub-grid count fits in a node
    assert split_messages(16, 4, 4, True).inter_node == 0
    assert split_messages(16, 8, 4, True).inter_node == 16 * (8 - 4)
    assert split_messages(16, 8, 4, True).intra_node == 16 * 4


def test_printed_eq4_cases_are_exchanged():
    # n = 16, n_node = 4, g = 8 (n_g = 2 <= n_node): the printed eq 4 gives n = 16 intra-node
    # messages, but each node holds 2 members of each of the 2 segment groups: 4 x 2 x 2 x 2 = 32
    assert count_messages(16, 8, 4, False).intra_node == 32 == 4 * 8


def test_orders_and_groups():
    assert [rank_of(s, 0, 8, 2, False) for s in range(2)] == [0, 4]
    assert [rank_of(s, 0, 8, 2, True) for s in range(2)] == [0, 1]
    segments, subgrids = subgrid_groups(8, 2, True)
    assert segments == [[0, 1], [2, 3], [4, 5], [6, 7]] and subgrids == [[0, 2, 4, 6], [1, 3, 5, 7]]
    for rank in range(8):
        s, p = subgrid_coordinates(rank, 8, 2, True)
        assert rank_of(s, p, 8, 2, True) == rank
    with pytest.raises(ValueError, match="3 sub-grids do not divide 8 ranks"):
        subgrid_groups(8, 3, False)


# ---------------------------------------------------------------- branch assignment and cost

from autopar.cost import model as cm  # noqa: E402
from autopar.passes.analysis.flops import NodeWork  # noqa: E402
from autopar.cost.hardware import get_hardware  # noqa: E402
from autopar.strategies.dsp.cost import dsp_region_cost  # noqa: E402
from autopar.strategies.shared.branch_cost import assign_branches  # noqa: E402


def test_assignment_balances_unequal_branches_and_uneven_counts():
    assert assign_branches([3.0, 5.0, 3.0, 4.0], 2) == [1, 0, 0, 1]    # loads 8 and 7
    owner = assign_branches([1.0, 1.0, 1.0], 2)                       # 3 branches, 2 sub-grids
    assert sorted(owner.count(s) for s in range(2)) == [1, 2]
    assert assign_branches([2.0, 2.0, 2.0, 2.0], 4) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="3 branches cannot fill 4 sub-grids"):
        assign_branches([1.0, 1.0, 1.0], 4)


def _branch(flops, kernels=6):
    # a branch of small matmuls and pointwise kernels at the global batch
    return [NodeWork(flops, flops // 4, True, True) for _ in range(kernels // 2)] + \
        [NodeWork(0, flops // 8, False, True) for _ in range(kernels // 2)]


def _data_parallel_compute(branches, n, hw):
    return sum(cm.node_time(NodeWork(w.flops // n, w.bytes_moved // n, w.is_matmul, w.is_kernel), hw)
               * cm.passes_per_step(w) for works in branches for w in works)


def test_dsp_beats_data_parallel_when_launches_dominate():
    # 4 small branches on 4 ranks of one A100 node: data parallelism launches every
    # branch's kernels on every rank; D&SP with g = 4 launches one branch per rank
    hw = get_hardware("a100-selene")
    branches = [_branch(2 * 64 * 64 * 64) for _ in range(4)]
    dsp = dsp_region_cost(branches, [4096] * 4, fork_bytes=64 * 64 * 4, join_bytes=64 * 64 * 4, join_op="sum",
                          n=4, g=4, hw=hw)
    assert dsp.compute_s < _data_parallel_compute(branches, 4, hw) / 2
    assert dsp.assignment == (0, 1, 2, 3)


def test_topology_aware_order_keeps_segment_traffic_in_the_node():
    hw = get_hardware("a100-selene")  # 8 GPUs per node
    branches = [_branch(2 * 256 ** 3) for _ in range(2)]
    args = dict(branch_params=[65536] * 2, fork_bytes=2 ** 24, join_bytes=2 ** 24, join_op="concat", n=16, g=2, hw=hw)
    topo = dsp_region_cost(branches, topology_aware=True, **args)
    naive = dsp_region_cost(branches, topology_aware=False, **args)
    assert topo.comm_s["segment"] < naive.comm_s["segment"]
    assert topo.compute_s == naive.compute_s


def test_plan_reports_the_message_counts_of_its_placement():
    # a simulated cluster: 16 ranks in nodes of 4, a model with 8 parallel branches
    import dataclasses

    import torch
    import torch.nn as nn

    import autopar

    class EightTowers(nn.Module):
        def __init__(self):
            super().__init__()
            self.towers = nn.ModuleList(nn.Linear(8, 8) for _ in range(8))

        def forward(self, x):
            out = self.towers[0](x)
            for tower in self.towers[1:]:
                out = out + tower(x)
            return out

    hw = dataclasses.replace(get_hardware("a100-selene"), name="nodes-of-4", devices_per_node=4)
    for g in (2, 4, 8):
        for topology_aware in (False, True):
            plan = autopar.plan(EightTowers(), 16, (torch.randn(16, 8),), hardware=hw,
                                strategy={"data": 16, "subgrids": g, "topology_aware": topology_aware})
            (choice,) = [r for r in plan.regions if r.strategy == "dsp"]
            expected = split_messages(16, g, 4, topology_aware)
            assert (choice.details["intra_node_messages"], choice.details["inter_node_messages"]) == \
                (expected.intra_node, expected.inter_node) == astuple(count_messages(16, g, 4, topology_aware))
            assert f"{expected.intra_node} intra-node, {expected.inter_node} inter-node" in plan.explain()


def astuple(counts):
    return counts.intra_node, counts.inter_node
