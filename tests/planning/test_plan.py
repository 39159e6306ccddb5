"""Tier 1: the plan as data — JSON round trip, determinism, the saved directory, the command."""
import json
import os
import subprocess
import sys

import pytest
import torch

import autopar
from autopar.planning.plan import Plan
from examples.factories import gpt2, transformer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _plan(factory=transformer, world=4, strategy="auto", hardware=None):
    model, inputs, loss, target = factory()
    return autopar.plan(model, world, inputs, loss, strategy, example_target=target, hardware=hardware)


@pytest.mark.parametrize("strategy", [{"data": 2, "tensor": 2}, {"pipeline": 2, "tensor": 2}])
def test_json_round_trip_is_exact(strategy):
    """What rank 0 broadcasts reads back the same on every rank (its explain too: the meshes
    weighed keep their order, which JSON's sorted keys would lose)."""
    plan = _plan(strategy=strategy)
    again = Plan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json()
    assert again.explain() == plan.explain()
    assert again.rank_coordinates(3) == ({"data": 1, "tensor": 1} if "data" in strategy else
                                         {"pipeline": 1, "data": 0, "tensor": 1})


def test_same_inputs_give_byte_identical_json():
    assert _plan().to_json() == _plan().to_json()


def test_save_writes_plan_rank_graphs_and_drawing(tmp_path):
    plan = _plan(gpt2, strategy={"data": 2, "tensor": 2})
    plan.save(str(tmp_path))
    names = sorted(os.listdir(tmp_path))
    assert {"plan.json", "plan.txt", "regions.dot", "rank0.py", "rank3.py"} <= set(names)
    assert Plan.load(str(tmp_path)).to_json() == plan.to_json()
    rank1 = (tmp_path / "rank1.py").read_text()
    assert rank1.startswith("# rank 1 of 4 (data=0, tensor=1); built by passes: analysis -> tensor_parallel")
    assert "vocab_parallel_cross_entropy" in rank1 and "reduce_from_tensor_region" in rank1
    dot = (tmp_path / "regions.dot").read_text()
    assert dot.startswith("digraph regions {") and "cluster_" in dot and "megatron (tensor 2)" in dot


def test_a100_preset_prefers_tensor_parallelism_for_a_wide_model():
    # Inside an NVLink node, splitting wide layers beats an all-reduce of every gradient.
    from examples.models import TinyTransformer, lm_loss
    torch.manual_seed(0)
    model = TinyTransformer(vocab=512, width=1024, heads=16, layers=1, block=64)
    ids = torch.randint(0, 512, (8, 64))
    plan = autopar.plan(model, 8, (ids,), lm_loss, example_target=ids, hardware="a100-selene")
    # Megatron's tensor group or AxoNN's x·y (the 3D grid's z shards the weights too)
    assert plan.degree("tensor") * plan.degree("x") * plan.degree("y") > 1, plan.explain()
    assert all(r.strategy in ("megatron", "tensor3d") for r in plan.regions if r.kind == "linear_chain")


def test_command_prints_and_saves(tmp_path):
    out = tmp_path / "p"
    result = subprocess.run([sys.executable, "-m", "autopar.cli", "plan", "examples/factories.py:mlp", "--world", "2",
                             "--strategy", "tensor", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "autopar plan: MLP on 2 rank(s)" in result.stdout
    assert json.loads((out / "plan.json").read_text())["mesh"] == {"data": 1, "tensor": 2}


def test_command_reports_plan_errors(tmp_path):
    result = subprocess.run([sys.executable, "-m", "autopar.cli", "plan", "examples/factories.py:mlp", "--world", "3",
                             "--strategy", "data=2,tensor=2", "--out", str(tmp_path / "p")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "do not match the world size 3" in result.stderr


def test_planner_offers_dsp_beside_data_and_tensor():
    from examples.factories import inception
    model, inputs, loss, target = inception()
    a100 = autopar.plan(model, 4, inputs, loss, example_target=target, hardware="a100-selene")
    # launch-bound: fewer, larger kernels; D&SP over 2 sub-grids of the data ranks, or (a
    # mixed plan, ahead by the per-step count of the targets a data split all-reduces)
    # of the tensor group
    assert (a100.subgrids == 2 and a100.topology_aware) or a100.tensor_subgrids == 2, a100.explain()
    offered = {(c.subgrids, c.topology_aware, c.csub) for c in a100.candidates if c.feasible}
    assert offered == {(1, True, False)} | {(2, t, c) for t in (True, False) for c in (True, False)}, offered
    for plan in (a100, autopar.plan(model, 4, inputs, loss, example_target=target, hardware="cpu-gloo")):
        fastest = min(c.step_s for c in plan.candidates if c.feasible)
        assert plan.step_s == fastest, plan.explain()
        assert "D&SP-cSub 2 sub-grids (naive)" in plan.explain()
    assert Plan.from_json(a100.to_json()).to_json() == a100.to_json()


def test_planner_offers_heads_as_branches_and_explains_why_not():
    from examples.factories import transformer
    model, inputs, loss, target = transformer()
    plan = autopar.plan(model, 4, inputs, loss, example_target=target, hardware="a100-selene")
    text = plan.explain()
    # heads run in one batched kernel: splitting them saves no launch and adds exchanges
    assert plan.subgrids == 1, text
    assert "D&SP 2 sub-grids (topology-aware)" in text and "D&SP-cSub 4 sub-grids" in text, text
    forced = autopar.plan(model, 4, inputs, loss, {"data": 4, "subgrids": 2, "csub": True}, example_target=target)
    assert "branches s0:heads 0-1, s1:heads 2-3" in forced.explain()
    assert forced.region_details("dsp")["attention:blocks.0.attn"]["heads"] == [2, 2]
