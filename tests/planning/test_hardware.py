"""Hardware presets: JSON round trips, the documented node shapes, and the cost model on each."""
from __future__ import annotations

import dataclasses
import json

import pytest

from autopar.cost import model as cost
from autopar.cost.hardware import PRESETS, Hardware, get_hardware

# devices per node as the module docstring and docs/guide/hardware.md state them
DEVICES_PER_NODE = {
    "cpu-gloo": 2,
    "a100-selene": 8,
    "a100": 8,
    "v100-lassen": 4,
    "a100-perlmutter": 4,
    "mi250x-frontier": 8,  # 4 MI250X of 2 GCDs, one device per GCD
    "h100": 8,
    "h200": 8,
    "b200": 8,
    "mi300x": 8,
}

GPU_PRESETS = [n for n in DEVICES_PER_NODE if n != "cpu-gloo"]


def test_presets_are_the_documented_ones():
    assert sorted(PRESETS) == sorted(DEVICES_PER_NODE)
    for name, hw in PRESETS.items():
        assert hw.name == name


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_round_trip(name):
    hw = PRESETS[name]
    d = hw.to_json()
    assert set(d) == {f.name for f in dataclasses.fields(Hardware)}
    assert Hardware.from_json(d) == hw
    assert Hardware.from_json(json.loads(json.dumps(d))) == hw
    assert get_hardware(name) is hw


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_node_shape_and_links(name):
    hw = PRESETS[name]
    assert hw.devices_per_node == DEVICES_PER_NODE[name]
    assert 0 < hw.inter_node_bandwidth < hw.intra_node_bandwidth
    assert 0 < hw.intra_node_latency_s <= hw.inter_node_latency_s
    assert 0 < hw.matmul_efficiency <= 1
    assert hw.peak_flops > 0 and hw.memory_bandwidth > 0 and hw.memory_bytes > 0
    assert hw.description and not hw.measured


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_gpu_presets_say_what_is_estimated(name):
    assert "estimate" in PRESETS[name].description


def test_paper_figures():
    # AxoNN §VI / §VI-C: 312 TFLOP/s per A100 and 192 per GCD; 40 GB A100s, 128 GB MI250X
    # (64 GB per GCD); four 200 Gb/s Slingshot-11 NICs per node
    perlmutter, frontier = PRESETS["a100-perlmutter"], PRESETS["mi250x-frontier"]
    assert (perlmutter.peak_flops, frontier.peak_flops) == (312e12, 192e12)
    assert (perlmutter.memory_bytes, frontier.memory_bytes) == (40 * 2**30, 64 * 2**30)
    for hw in (perlmutter, frontier):
        assert hw.inter_node_bandwidth * hw.devices_per_node == 4 * 200e9 / 8
    # SUPER §VI-A: 4 V100 16 GB per Lassen node
    assert PRESETS["v100-lassen"].memory_bytes == 16 * 2**30
    # DGX H100: one 400 Gb/s NDR port per GPU; NVLink 4 900 GB/s both directions
    h100 = PRESETS["h100"]
    assert (h100.inter_node_bandwidth, 2 * h100.intra_node_bandwidth) == (400e9 / 8, 900e9)
    # H200: the H100's compute and links, 141 GB of HBM3e at 4.8 TB/s; B200 2.25 PFLOP/s,
    # NVLink 5 1.8 TB/s both directions; MI300X 1,307.4 TFLOP/s, 192 GB at 5.3 TB/s
    h200, b200, mi300x = PRESETS["h200"], PRESETS["b200"], PRESETS["mi300x"]
    assert (h200.peak_flops, h200.memory_bytes, h200.memory_bandwidth) == (989e12, 141 * 2**30, 4.8e12)
    assert (h200.intra_node_bandwidth, h200.inter_node_bandwidth) == (450e9, 50e9)
    assert (b200.peak_flops, 2 * b200.intra_node_bandwidth, b200.memory_bytes) == (2250e12, 1.8e12, 180 * 2**30)
    assert (mi300x.peak_flops, mi300x.memory_bytes, mi300x.memory_bandwidth) == (1307.4e12, 192 * 2**30, 5.3e12)


def test_hopper_gemm_fit_reproduces_the_measured_table_points():
    # XLA's sm_90 bf16 table: 4096^3 at 783 TFLOP/s, 1024 x 2048 x 2048 at 524; the fit
    # R·f/(f + S), R = 0.766 x 989, S = 4.75 GFLOP, within 10 % of both
    h100 = PRESETS["h100"]
    for (m, n, k), measured in (((4096, 4096, 4096), 783.3e12), ((1024, 2048, 2048), 524.3e12)):
        flops = 2 * m * n * k
        rate = flops / (cost.matmul_time(flops, h100) - h100.kernel_launch_s)
        assert abs(rate / measured - 1) < 0.10, (m, n, k, rate)


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("nbytes", [4.0, 1 << 20, 1 << 30])
def test_all_reduce_within_a_node_beats_crossing_nodes(name, nbytes):
    hw = PRESETS[name]
    node = hw.devices_per_node
    within = cost.all_reduce_time(node, nbytes, hw, stride=1)
    across = cost.all_reduce_time(2 * node, nbytes, hw, stride=1)
    assert 0 < within < across


def _ring_all_reduce(g, m, alpha, beta):
    return 2 * (g - 1) * alpha + 2 * (g - 1) / g * m / beta


def test_measured_entries_round_trip_and_replace_the_placement_model():
    base = PRESETS["a100-selene"]
    d = base.to_json()
    d["measured"] = {"all_reduce": {"4": [7e-6, 120e9], "16": [20e-6, 30e9]},
                     "all_gather": {"4": [9e-6, 80e9]}}
    hw = Hardware.from_json(json.loads(json.dumps(d)))
    assert hw.measured == d["measured"]
    assert hw.to_json() == d
    assert Hardware.from_json(hw.to_json()) == hw
    assert hw.link("all_reduce", 4) == (120e9, 7e-6)
    assert hw.link("all_reduce", 8) is None

    m = 64 * 2**20
    for g, (alpha, beta) in ((4, (7e-6, 120e9)), (16, (20e-6, 30e9))):
        expected = _ring_all_reduce(g, m, alpha, beta)
        assert cost.all_reduce_time(g, m, hw, stride=1) == pytest.approx(expected, rel=1e-12)
        # the fit ignores placement: the stride does not change it
        assert cost.all_reduce_time(g, m, hw, stride=2) == pytest.approx(expected, rel=1e-12)
        assert cost.all_reduce_time(g, m, hw) != pytest.approx(cost.all_reduce_time(g, m, base))
    # a group size without a fit keeps the placement model of the preset
    assert cost.all_reduce_time(8, m, hw) == cost.all_reduce_time(8, m, base)
    b8, a8 = cost.group_link(8, 1, base)
    expected = _ring_all_reduce(8, m, a8, b8)
    assert cost.all_reduce_time(8, m, hw) == pytest.approx(expected, rel=1e-12)
