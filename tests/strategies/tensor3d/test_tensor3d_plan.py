"""Planning 3D/4D grids: forced grids, the planner's ranking, ``--top K``, and bad input.

Bad input is refused with a message naming the region, linear or argument: sizes a grid
dimension does not divide (for a forced grid; the automatic search excludes such a grid
and says why), a grid whose size is not the world, a batch that z × data does not divide,
a grid mixed with a tensor degree, and a model with nothing a grid can split. Bian's
cube: a world that is not p³ × data, a batch whose chunks the cube's x and y do not
divide, and the planner offering the cube only where the world holds one.
"""
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
from autopar.cli import main
from autopar.grid import Grid3D
from autopar.strategies.shared.grid3d.cost import grids_of
from examples.factories import gpt2, mlp, transformer


def _plan(factory, world, strategy="auto", hardware=None):
    model, inputs, loss_fn, target = factory()
    return autopar.plan(model, world, inputs, loss_fn, strategy, example_target=target, hardware=hardware)


def test_forced_grid_splits_chains_and_attention_and_lays_ranks_out_x_first():
    plan = _plan(transformer, 8, {"x": 2, "y": 2, "z": 2})
    assert plan.mesh == {"data": 1, "z": 2, "y": 2, "x": 2}
    assert plan.grid == Grid3D(2, 2, 2, 1)
    assert {r.kind: r.strategy for r in plan.regions if r.kind != "-"} == {
        "vocab": "replicate", "attention": "tensor3d", "linear_chain": "tensor3d"}
    # rank = ((d*Gz + z)*Gy + y)*Gx + x; rows split over z and data
    assert plan.rank_coordinates(6) == {"data": 0, "z": 1, "y": 1, "x": 0, "tensor": 0}
    assert plan.batch_parts() == 2 and plan.batch_chunk(6) == 1
    attention = next(r for r in plan.regions if r.kind == "attention")
    assert [layer["orientation"] for layer in attention.details["layers"]] == [
        "plain (in y, out x)", "transposed (in x, out y)"]
    assert set(plan.total.comm_s) == {"x", "y", "z", "data"}
    again = autopar.Plan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json() and again.grid == plan.grid


def test_4d_grid_splits_rows_over_z_and_data():
    plan = _plan(gpt2, 8, {"x": 1, "y": 2, "z": 2, "data": 2})
    assert plan.batch_parts() == 4
    assert sorted({plan.batch_chunk(r) for r in range(8)}) == [0, 1, 2, 3]


def test_grids_of_lists_every_factorisation_once():
    found = grids_of(8)
    assert len(found) == len(set(found)) == 19  # ordered 4-factorisations of 8, less the all-data one
    assert all(g.size == 8 for g in found) and Grid3D(1, 1, 1, 8) not in found


def test_auto_weighs_grids_and_excludes_those_that_do_not_divide():
    plan = _plan(gpt2, 8, hardware="a100-selene")
    grids = [c for c in plan.candidates if "x" in c.mesh and c.form == ""]
    assert len(grids) == 19
    # a grid that does not divide a region leaves it replicated (with the reason); one that
    # divides no region is excluded, saying why (on 3 ranks nothing else fits: auto replicates)
    three = _plan(mlp, 3)
    assert three.form == "replicate"
    assert any(c.mesh.get("x") == 3 and not c.feasible and re.search(
        r"no region split over the grid: region linear_chain:body: hidden width = 64 is not divisible by Gx = 3",
        c.reason) for c in three.candidates)
    batch = next(c for c in grids if c.mesh["z"] * c.mesh["data"] == 8)
    assert not batch.feasible and "not divisible by Gz x Gdata = 8" in batch.reason
    assert any(c.feasible for c in grids)
    top = plan.top(4)
    lines = top.splitlines()
    assert lines[0].startswith("the 4 best of") and "comm x" in lines[1] and "comm tensor" in lines[1]
    feasible = sorted(c.step_s for c in plan.candidates if c.feasible)
    assert [f"{s * 1e3:.3f} ms" for s in feasible[:4]] == [
        next(part for part in line.split("  ") if part.endswith(" ms")) for line in lines[3:]]


def test_cli_top_k(tmp_path, capsys):
    assert main(["plan", "examples/factories.py:mlp", "--world", "8", "--top", "3", "--out", str(tmp_path / "p"),
                 "--ranks", "1"]) == 0
    out = capsys.readouterr().out
    assert "the 3 best of" in out and "3D x=" in out


def test_forced_grid_a_size_does_not_divide_names_the_region():
    with pytest.raises(autopar.PlanError, match=r"region attention:\S+: attention heads = 4 is not divisible by "
                                                r"Gx = 8"):
        _plan(transformer, 8, {"x": 8, "y": 1, "z": 1})
    with pytest.raises(autopar.PlanError, match=r"grid 1x3x1x1: region linear_chain:body, linear "
                                                r"model_body_0 \(32 -> 64\): as a plain layer its output features "
                                                r"must divide by Gx = 1 and its input features by Gy = 3"):
        _plan(mlp, 3, {"x": 1, "y": 3, "z": 1})


def test_forced_grid_bad_sizes_are_named():
    with pytest.raises(autopar.PlanError, match=r"grid 2x2x2x1 has 8 ranks, the world 4"):
        _plan(mlp, 4, {"x": 2, "y": 2, "z": 2})
    with pytest.raises(autopar.PlanError, match=r"batch 4 is not divisible by Gz x Gdata = 8"):
        _plan(transformer, 8, {"x": 1, "y": 1, "z": 2, "data": 4})
    with pytest.raises(autopar.PlanError, match=r"combines only with 'data'; drop \['tensor'\]"):
        _plan(mlp, 4, {"x": 2, "tensor": 2})
    with pytest.raises(autopar.PlanError, match=r"Gz = 0 must be at least 1"):
        _plan(mlp, 4, {"x": 2, "y": 2, "z": 0})


class _Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x).mean((2, 3))


def test_forced_grid_on_a_model_without_linears_says_so():
    with pytest.raises(autopar.PlanError, match=r"a 3D grid needs a linear chain or attention region"):
        autopar.plan(_Convs(), 2, (torch.randn(2, 3, 5, 5),), F.cross_entropy, {"x": 2, "y": 1, "z": 1},
                     example_target=torch.tensor([0, 1]))


# ---------------------------------------------------------------------------- Bian's cube
def _transformer8(batch=8):
    model, _, loss_fn, _ = transformer()
    return model, (torch.randint(0, 64, (batch, 16)),), loss_fn, torch.randint(0, 64, (batch, 16))


def test_forced_cube_splits_every_region_with_diagonal_vectors():
    plan = _plan(_transformer8, 8, {"cube": 2})
    assert plan.mesh == {"data": 1, "z": 2, "y": 2, "x": 2} and plan.form == "cube"
    assert {r.kind: r.strategy for r in plan.regions if r.kind != "-"} == {
        "vocab": "replicate", "attention": "cube", "linear_chain": "cube"}
    text = plan.explain()
    assert "Bian cube Gx=2 Gy=2 Gz=2" in text and "biases on the diagonal ranks, Algorithms 7-8" in text
    assert "output all-gathered over y, then x" in text
    # with data: 16 ranks are a 2x2x2 cube times 2
    assert _plan(lambda: _transformer8(16), 16, {"cube": 2}).mesh == {"data": 2, "z": 2, "y": 2, "x": 2}
    again = autopar.Plan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json() and again.form == "cube"


def test_cube_needs_a_cube_world_and_rows_for_its_faces():
    with pytest.raises(autopar.PlanError, match=r"the cube form with p=2 needs p\^3 x data = 8 x d ranks, and the "
                                                r"world has 12, which is not a multiple of it"):
        _plan(_transformer8, 12, {"cube": 2})
    with pytest.raises(autopar.PlanError, match=r"8 x 2 ranks, and the world has 8, which is not that"):
        _plan(_transformer8, 8, {"cube": 2, "data": 2})
    with pytest.raises(autopar.PlanError, match=r"combines only with 'data'; drop \['x'\]"):
        _plan(_transformer8, 8, {"cube": 2, "x": 2})
    with pytest.raises(autopar.PlanError, match=r"edge p must be at least 2"):
        _plan(_transformer8, 1, {"cube": 1})
    # batch 4 on 2x2x2: z leaves 2 rows per rank, which x and y (4 parts) cannot split
    with pytest.raises(autopar.PlanError, match=r"region attention:\S+: the cube splits each rank's rows over x "
                                                r"and y \(p\^2 = 4 parts\), and its input has 2 rows \(dim 0\) per "
                                                r"batch chunk; give a batch that divides by Gz·Gdata·p\^2 = 8"):
        _plan(transformer, 8, {"cube": 2})


def test_auto_offers_the_cube_where_the_world_holds_one():
    plan = _plan(_transformer8, 8)
    cubes = [c for c in plan.candidates if c.form == "cube"]
    assert len(cubes) == 1 and cubes[0].feasible and cubes[0].mesh == {"data": 1, "z": 2, "y": 2, "x": 2}
    assert "3D cube (Bian) p=2 data=1: step" in plan.explain()
    # the cube moves more than AxoNN's grid on the same ranks (A is gathered again in
    # backward, the row reduce-scatters replace all-reduces) and keeps 1/p of the activations
    axonn = next(c for c in plan.candidates if c.mesh == cubes[0].mesh and c.form == "")
    assert sum(cubes[0].comm_s.values()) > sum(axonn.comm_s.values())
    assert cubes[0].memory_bytes < axonn.memory_bytes
    rejected = [c for c in _plan(lambda: _transformer8(6), 6).candidates if c.form == "cube"]
    assert len(rejected) == 1 and not rejected[0].feasible
    assert "Bian's cube form: 6 ranks are no p^3 x data with p >= 2" in rejected[0].reason
