"""The rank grid (autopar/grid.py): coordinates and group memberships of every family's
layout, from one place. The group lists are written out by hand from the papers'
placements; the multi-rank tests check that the process groups made from them carry
the right numerics."""
import pytest

import shared_ranks

from autopar.grid import GroupSpec, RankGrid, subgrid_dims
from autopar.grid import Grid3D
from autopar.planning.plan import Cost, Plan


def _plan(mesh, world, **kw):
    return Plan("m", world, mesh, "cpu-gloo", 8, [], Cost(), 0.0, **kw)


def _members(plan, specs=None):
    grid = plan.rank_grid()
    specs = specs if specs is not None else plan.group_specs()
    return {name: (None if spec is None else grid.groups(spec.dims, spec.only)) for name, spec in specs.items()}


def test_coordinates_and_groups_of_a_grid():
    g = RankGrid({"pipeline": 2, "data": 2, "tensor": 2})
    assert g.coordinates(5) == {"pipeline": 1, "data": 0, "tensor": 1}
    assert g.index(pipeline=1, tensor=1) == 5
    assert g.groups(("tensor",)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g.groups(("pipeline",)) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g.groups(("data", "tensor")) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert g.groups(("tensor", "data")) == [[0, 2, 1, 3], [4, 6, 5, 7]]  # the first dimension outermost
    # members: the user's mesh's ranks in grid order
    assert RankGrid({"data": 2, "tensor": 2}, [4, 6, 5, 7]).groups(("data",)) == [[4, 5], [6, 7]]
    with pytest.raises(ValueError, match=r"holds 4 ranks, 3 members"):
        RankGrid({"data": 2, "tensor": 2}, [0, 1, 2])
    with pytest.raises(ValueError, match=r"rank 4 is outside a grid of 4 ranks"):
        RankGrid({"data": 2, "tensor": 2}).coordinates(4)
    with pytest.raises(ValueError, match=r"are not distinct dimensions"):
        g.groups(("x",))


def test_megatron_tensor_groups_are_adjacent_ranks():
    assert _members(_plan({"data": 2, "tensor": 2}, 4)) == {"data": [[0, 2], [1, 3]], "tensor": [[0, 1], [2, 3]]}


def test_pipeline_groups_and_the_tied_group_of_the_first_and_last_stage():
    plan = _plan({"pipeline": 4, "data": 1, "tensor": 2}, 8, pipeline={"stages": 4})
    members = _members(plan, plan.group_specs([{0, 3}, {1}]))
    assert members["pipeline"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert members["tensor"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert members["tied:0,3"] == [[0, 6], [1, 7]]
    assert not any(name.startswith("tied:1") for name in members)  # a weight on one stage has no group


def test_grid3d_axes_and_replicas_in_batch_chunk_order():
    plan = _plan({"data": 2, "z": 2, "y": 1, "x": 2}, 8)
    members = _members(plan)
    assert members["x"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert members["z"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert members["data"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert members["replica"] == [[0, 2, 4, 6], [1, 3, 5, 7]]  # data·Gz + z
    assert members["tensor"] is None
    grid = Grid3D(2, 1, 2, 2)
    assert [grid.coordinates(r) for r in (0, 5)] == [{"x": 0, "y": 0, "z": 0, "data": 0},
                                                    {"x": 1, "y": 0, "z": 0, "data": 1}]
    assert all(grid.rank(**grid.coordinates(r)) == r for r in range(grid.size))


@pytest.mark.parametrize("topology_aware", [True, False])
@pytest.mark.parametrize("csub", [False, True])
def test_dsp_segments_subgrids_and_the_data_group_in_batch_chunk_order(topology_aware, csub):
    plan = _plan({"data": 8}, 8, subgrids=2, topology_aware=topology_aware, csub=csub)
    members = _members(plan)
    if topology_aware:  # sub-grids interleave: rank p·g + s
        assert members["segment"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert members["subgrid"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    else:  # contiguous sub-grids: rank s·n/g + p
        assert members["segment"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
        assert members["subgrid"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    if csub:
        assert members["data"] == members["subgrid"]
    else:  # one group of every rank, in the order of the batch chunks they take
        (data,) = members["data"]
        assert [plan.batch_chunk(r) for r in data] == list(range(8))
    assert [plan.subgrid_coordinates(r) for r in (1, 4)] == (
        [(1, 0), (0, 2)] if topology_aware else [(0, 1), (1, 0)])


def test_a_spec_restricted_to_some_coordinates():
    g = RankGrid(subgrid_dims(8, 4, True))
    assert g.groups(("subgrid",), ("subgrid", (0, 3))) == [[0, 3], [4, 7]]
    assert GroupSpec(("subgrid",), ("subgrid", (0, 3))) != GroupSpec(("subgrid",))
    with pytest.raises(ValueError, match=r"3 sub-grids do not divide 8 ranks"):
        subgrid_dims(8, 3, True)


# ----------------------------------------------------------------- groups made once per process

def recompile_job():
    """Compile the same model three times under two layouts on 4 ranks: the second and
    third compiles of a layout find the process groups the first made (autopar.grid's
    cache), so no new gloo group (and none of its threads) is made, and each compile
    still trains like the first."""
    import os

    import torch
    import torch.nn as nn

    import autopar

    def threads():
        return len(os.listdir("/proc/self/task"))

    def build():
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)) for _ in range(2)])

    x, y = torch.randn(8, 8), torch.randn(8, 8)
    out = []
    for strategy in ({"data": 2, "tensor": 2}, {"pipeline": 2, "data": 2}):
        groups, losses, counts = [], [], []
        for _ in range(3):
            pm = autopar.compile(build(), None, example_inputs=(x,), loss_fn=nn.functional.mse_loss,
                                 example_target=y, strategy=strategy)
            losses.append(float(pm.step(x, target=y)))
            groups.append({k: id(v) for k, v in pm._state.groups.items() if v is not None})
            counts.append(threads())
            del pm
        out.append((groups, losses, counts))
    return out


_RECOMPILE = shared_ranks.register(4, __name__ + ".recompile", recompile_job, (), timeout_s=300)


def test_recompiling_reuses_the_process_groups():
    for rank, layouts in enumerate(_RECOMPILE()):
        for groups, losses, counts in layouts:
            assert groups[0], f"rank {rank}: the layout registered no process group"
            assert groups[1] == groups[0] and groups[2] == groups[0], f"rank {rank}: {groups}"
            assert losses[1] == losses[0] and losses[2] == losses[0], f"rank {rank}: {losses}"
            assert counts[2] == counts[1], f"rank {rank}: threads {counts} grew on a recompile"
