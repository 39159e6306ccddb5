"""Expert parallelism's cost terms (autopar/strategies/experts/cost.py) on hand-computed
cases: one node of 8 devices whose links and matmuls have round figures."""
import pytest

from autopar.cost.hardware import Hardware
from autopar.strategies.experts.cost import MoELayer, expert_layer_numbers

BETA, ALPHA, PEAK = 1e9, 1e-5, 1e12
HW = Hardware(name="round", description="round figures for hand computation", peak_flops=PEAK,
              matmul_efficiency=1.0, saturation_flops=0.0, memory_bandwidth=1e12, kernel_launch_s=0.0,
              devices_per_node=8, intra_node_bandwidth=BETA, inter_node_bandwidth=BETA, intra_node_latency_s=ALPHA,
              inter_node_latency_s=ALPHA, memory_bytes=80e9)
LAYER = MoELayer(tokens=1024, hidden=512, inner=1024, experts=8, top_k=2)   # gated: gate, up, down


def test_data_parallelism_holds_every_expert_and_all_reduces_them_over_the_data_group():
    n = expert_layer_numbers(LAYER, 1, 4, HW)
    rows = 1024 * 2
    assert n.rows == rows
    # forward 2·rows·(3·H·I) FLOPs, backward twice that, at 1e12 FLOP/s
    assert n.compute_s == pytest.approx(3 * 2 * rows * 3 * 512 * 1024 / PEAK)
    assert n.all_to_all_s == 0.0
    grads = 8 * 3 * 512 * 1024 * 4   # every expert, fp32
    assert n.gradient_s == pytest.approx(2 * 3 / 4 * grads / BETA + 2 * 3 * ALPHA)   # ring all-reduce over 4
    assert n.params_per_rank == 8 * 3 * 512 * 1024


def test_expert_parallelism_over_the_whole_data_group_trades_the_all_reduce_for_four_all_to_alls():
    n = expert_layer_numbers(LAYER, 4, 4, HW)
    buffer = 1024 * 2 * 512 * 4   # T·k rows of H fp32 on each rank
    assert n.all_to_all_bytes == buffer
    assert n.all_to_all_s == pytest.approx(4 * (3 / 4 * buffer / BETA + 3 * ALPHA))
    assert n.gradient_s == 0.0   # no other rank holds these experts
    assert n.params_per_rank == 2 * 3 * 512 * 1024
    assert n.compute_s == pytest.approx(expert_layer_numbers(LAYER, 1, 4, HW).compute_s)   # uniform routing


def test_expert_groups_inside_the_data_group_reduce_over_the_ranks_holding_the_same_experts():
    n = expert_layer_numbers(LAYER, 2, 4, HW)
    grads = 4 * 3 * 512 * 1024 * 4   # 4 experts per rank, replicated on 2 ranks
    assert n.gradient_s == pytest.approx(2 * 1 / 2 * grads / BETA + 2 * 1 * ALPHA)
    assert n.all_to_all_s == pytest.approx(4 * (1 / 2 * n.all_to_all_bytes / BETA + ALPHA))
    assert n.memory_bytes < expert_layer_numbers(LAYER, 1, 4, HW).memory_bytes


@pytest.mark.parametrize("degree, data", [(3, 6), (4, 2)])
def test_a_degree_that_divides_neither_the_experts_nor_the_data_group_is_refused(degree, data):
    with pytest.raises(ValueError, match=f"expert degree {degree}: it must divide the 8 experts and the data "
                                         f"degree {data}"):
        expert_layer_numbers(LAYER, degree, data, HW)
