"""The a100-selene preset's fitted figures (autopar/cost/hardware.py) and the new
``Hardware.memory_efficiency`` term, checked by hand: behaviour, never timing."""
import dataclasses

from autopar.cost import model as cost
from autopar.cost.hardware import PRESETS, Hardware, get_hardware

SELENE = get_hardware("a100-selene")


def test_selene_figures_are_the_cited_ones():
    # NCCL bus bandwidth (235 GB/s on an A100 node, 0.78 of 300; the same fraction of a
    # 25 GB/s HDR HCA), matmul efficiency fitted to Table 2, memory-bound efficiency to §5.8
    assert (SELENE.intra_node_bandwidth, SELENE.inter_node_bandwidth) == (235e9, 20e9)
    assert (SELENE.matmul_efficiency, SELENE.memory_efficiency) == (0.76, 0.16)
    assert (SELENE.peak_flops, SELENE.memory_bandwidth, SELENE.saturation_flops) == (312e12, 2039e9, 2e9)
    for cited in ("Table 2", "§5.8", "ml-engineering"):
        assert cited in SELENE.description


def test_selene_matmul_at_a_megatron_size():
    # GPT-3 175B's MLP up-projection at t = 8, microbatch 1: 2·2048·12288·6144 FLOPs
    flops = 2 * 2048 * 12288 * 6144
    rate = 312e12 * 0.76 * flops / (flops + 2e9)  # the saturating rate of cost.MATMUL_TIME
    assert abs(cost.matmul_time(flops, SELENE) - (flops / rate + 5e-6)) < 1e-12
    # = 1.3176 ms: 3.09e11 FLOPs at 235.6 TFLOP/s (0.994 of 0.76 x 312) plus the launch
    assert abs(cost.matmul_time(flops, SELENE) - 1.31757e-3) < 1e-8


def test_memory_efficiency_scales_memory_bound_kernels_only():
    # a 201 MB softmax chain (12 heads x 2048² fp16 scores, read and written): at
    # 2039 GB/s x 0.16 = 326.24 GB/s, 0.6171 ms plus the 5 us launch
    nbytes = 12 * 2048 * 2048 * 2 * 2
    assert abs(cost.memory_bound_time(nbytes, SELENE) - (nbytes / 326.24e9 + 5e-6)) < 1e-12
    assert abs(cost.memory_bound_time(nbytes, SELENE) - 6.2211e-4) < 1e-8
    full = dataclasses.replace(SELENE, memory_efficiency=1.0)
    assert abs(cost.memory_bound_time(nbytes, full) - (nbytes / 2039e9 + 5e-6)) < 1e-12
    # matmuls and collectives do not see it
    assert cost.matmul_time(1e12, full) == cost.matmul_time(1e12, SELENE)
    assert cost.all_reduce_time(8, 1e8, full) == cost.all_reduce_time(8, 1e8, SELENE)


def test_memory_efficiency_is_neutral_elsewhere():
    # every other preset keeps the datasheet rate; a profile written before the field reads back at 1
    for name, hw in PRESETS.items():
        if name != "a100-selene":
            assert hw.memory_efficiency == 1.0, name
    old = {k: v for k, v in PRESETS["cpu-gloo"].to_json().items() if k != "memory_efficiency"}
    assert Hardware.from_json(old).memory_efficiency == 1.0
    assert Hardware.from_json(SELENE.to_json()) == SELENE


def test_selene_nccl_links_in_the_placement_model():
    # a whole node: NVLink's bus bandwidth; two nodes, one ring: the node's 8 HCAs (8 x 20 GB/s)
    assert cost.group_link(8, 1, SELENE) == (235e9, 2e-6)
    assert cost.group_link(16, 1, SELENE) == (160e9, 5e-6)
    # Megatron's tensor all-reduce of one 2048 x 12288 fp16 activation over t = 8:
    # 2·7/8·50331648 B / 235 GB/s + 14 x 2 us = 0.40281 ms
    t = cost.all_reduce_time(8, 2048 * 12288 * 2, SELENE)
    assert abs(t - (2 * 7 / 8 * 2048 * 12288 * 2 / 235e9 + 14 * 2e-6)) < 1e-12
    assert abs(t - 4.0281e-4) < 1e-8
