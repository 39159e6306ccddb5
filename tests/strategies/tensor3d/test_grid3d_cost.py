"""AxoNN's 3D grid: rank layout, groups, and the communication model of eqs 4-10."""
import dataclasses

import pytest

from autopar.grid import Grid3D
from autopar.strategies.cube.cost import cube_layer_comm, cube_volumes
from autopar.strategies.shared.grid3d.cost import group_bandwidth, layer_comm, layer_volumes
from autopar.cost.hardware import get_hardware

# a cluster of 4 devices per node; no latency, as the paper's assumption 3 has it
CLUSTER = dataclasses.replace(get_hardware("a100-selene"), devices_per_node=4, intra_node_latency_s=0.0,
                              inter_node_latency_s=0.0, intra_node_bandwidth=100e9, inter_node_bandwidth=10e9)


def test_rank_layout_follows_the_x_y_z_data_hierarchy():
    grid = Grid3D(2, 2, 2, 2)  # the example of axonn §V-B
    assert grid.groups("x")[:4] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("y")[:4] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("z")[:2] == [[0, 4], [1, 5]]
    assert grid.groups("data")[0] == [0, 8]
    assert grid.coordinates(13) == {"x": 1, "y": 0, "z": 1, "data": 1} and grid.rank(1, 0, 1, 1) == 13
    assert grid.swapped() == Grid3D(2, 2, 2, 2) and Grid3D(1, 2, 4).swapped() == Grid3D(2, 1, 4)
    with pytest.raises(ValueError, match="Gz = 0 must be at least 1"):
        Grid3D(2, 2, 0)


def test_one_transformer_layer_matches_eqs_4_to_8_by_hand():
    # the fused QKV projection of a layer of hidden size 1024, 2048 tokens per replica, 2x2x2 grid, data 2
    m, k, n, grid = 2048, 1024, 3 * 1024, Grid3D(2, 2, 2, 2)
    volumes = layer_volumes(m, k, n, grid)
    assert volumes == {"all_gather_z": 1024 * 3072 / 8, "reduce_scatter_z": 1024 * 3072 / 4,
                       "all_reduce_y": 2048 * 3072 / 4, "all_reduce_x": 2048 * 1024 / 4,
                       "all_reduce_data": 1024 * 3072 / 8}
    t = layer_comm(m, k, n, grid, CLUSTER, element_bytes=2)
    intra, inter = 100e9, 4 * 10e9 / 4  # eq 10: x and y inside a node; z (stride 4) and data (stride 8) cross
    assert t.all_gather_z == pytest.approx((2 - 1) * 1024 * 3072 / 8 * 2 / inter)              # eq 4
    assert t.reduce_scatter_z == pytest.approx((2 - 1) / 2 * 1024 * 3072 / 4 * 2 / inter)      # eq 5
    assert t.all_reduce_y == pytest.approx(2 * (2 - 1) / 2 * 2048 * 3072 / 4 * 2 / intra)      # eq 6
    assert t.all_reduce_x == pytest.approx(2 * (2 - 1) / 2 * 2048 * 1024 / 4 * 2 / intra)      # eq 7
    assert t.all_reduce_data == pytest.approx(2 * (2 - 1) / 2 * 1024 * 3072 / 8 * 2 / inter)   # eq 8
    assert t.total == pytest.approx(sum(t.by_group().values()))                                # eq 9


def test_the_asynchronous_collectives_count_their_exposed_fraction():
    """The runtime issues eqs 4, 5 and 7 asynchronously (axonn §IV): with several in
    flight a step waits for ``async_exposed`` of their time (measured by calibrate); the
    forward all-reduce (eq 6) and the data all-reduce (eq 8, priced as data parallelism's
    exposed part) are unchanged. 1 in the presets."""
    m, k, n, grid = 2048, 1024, 3 * 1024, Grid3D(2, 2, 2, 2)
    assert get_hardware("a100-selene").async_exposed == 1.0 and get_hardware("cpu-gloo").async_exposed == 1.0
    full = layer_comm(m, k, n, grid, CLUSTER)
    half = layer_comm(m, k, n, grid, dataclasses.replace(CLUSTER, async_exposed=0.5))
    for name in ("all_gather_z", "reduce_scatter_z", "all_reduce_x"):
        assert getattr(half, name) == pytest.approx(getattr(full, name) / 2) and getattr(full, name) > 0
    assert half.all_reduce_y == full.all_reduce_y and half.all_reduce_data == full.all_reduce_data


def test_a_transposed_layer_swaps_x_and_y():
    # the output projection after QKV: its input is split over x, so x and y exchange roles
    m, k, n = 2048, 1024, 1024
    grid = Grid3D(4, 1, 2)
    plain, transposed = layer_comm(m, k, n, grid, CLUSTER), layer_comm(m, k, n, grid, CLUSTER, transposed=True)
    # plain: the output all-reduce runs over y (size 1): free; transposed: over x (size 4)
    assert plain.all_reduce_y == 0.0 and transposed.all_reduce_y > 0.0
    assert transposed.all_reduce_x == 0.0 and plain.all_reduce_x > 0.0
    assert layer_volumes(m, k, n, grid, transposed=True)["all_reduce_y"] == m * n / (2 * 1)


def test_eq10_bandwidth_of_each_group_with_4_devices_per_node():
    grid = Grid3D(2, 2, 2, 2)  # 16 ranks on 4 nodes
    assert group_bandwidth(grid, "x", CLUSTER) == 100e9     # {0, 1}: inside a node
    assert group_bandwidth(grid, "y", CLUSTER) == 100e9     # {0, 2}: Gx*Gy = 4 <= 4
    assert group_bandwidth(grid, "z", CLUSTER) == 10e9      # {0, 4}: 4 rings share the node pair: 40e9 / 4
    assert group_bandwidth(grid, "data", CLUSTER) == 10e9   # {0, 8}: min(4, 8) = 4 rings share it
    wide = Grid3D(2, 1, 1, 8)                               # data stride 2: 2 rings per node pair
    assert group_bandwidth(wide, "data", CLUSTER) == 20e9


def test_cube_layer_volumes_follow_bian_3_1_2():
    # Bian §3.1.2: each forward moves (MN + NK + MK)/p^3 per rank over p ranks
    m, k, n, p = 2048, 1024, 4096, 2
    v = cube_volumes(m, k, n, p, bias=True)
    received = v["all_gather_rows_out"] + v["all_gather_z"] + v["reduce_scatter_rows_in"] / p
    assert received == (m * k + k * n + m * n) / p ** 3
    # backward: dC gathered over the in axis, A again over the out axis, dA and dB reduce-scattered
    assert v["all_gather_rows_in"] == m * n / 8 and v["reduce_scatter_rows_out"] == m * k / 4
    assert v["reduce_scatter_z"] == k * n / 4 and v["vector_in"] == v["vector_z"] == n / 4
    # by group: a plain layer's out axis is x (stride 1, inside a node of 4), its in axis y
    t = cube_layer_comm(m, k, n, Grid3D(2, 2, 2, 1), CLUSTER, element_bytes=2)
    beta = CLUSTER.intra_node_bandwidth
    assert t["x"] == pytest.approx((2 * (m * k / 8) + (m * k / 4) / 2) * 2 / beta)
    swapped = cube_layer_comm(m, k, n, Grid3D(2, 2, 2, 1), CLUSTER, element_bytes=2, transposed=True)
    assert swapped["y"] == pytest.approx(t["x"]) and swapped["x"] == pytest.approx(t["y"])
