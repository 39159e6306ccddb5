"""A family written outside autopar (examples/custom_family.py) registered with
``autopar.register_family``: it plans, explains, saves, loads and runs equal to the
single device; registration refuses what it cannot use."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import autopar
from autopar.planning.strategy import PlanError, Strategy
from autopar.runtime.launcher import launch
from autopar.strategies.family import CompileHooks
from autopar.strategies.registry import FAMILIES, unregister_family

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.multiprocess
def test_the_example_plans_explains_saves_and_runs_equal_on_two_ranks():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "custom_family.py")], capture_output=True,
                          text=True, timeout=400, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "after_backward: lost: its best, data=2 x tensor=1, after_backward" in out   # weighed under "auto"
    assert "family: after_backward (registered)" in out and "after backward, in one pass" in out
    assert "plan.json read back: family after_backward" in out
    assert "EQUAL: 2 ranks under after_backward" in out


def _buckets_job() -> list:
    import examples.custom_family as custom   # registers the family on this rank
    ids, target = custom.batch()
    out = []
    for strategy in ("after_backward", "data"):
        torch.manual_seed(0)
        pm = autopar.compile(custom.Net(), None, example_inputs=(ids,), loss_fn=custom.loss_fn, example_target=target,
                             strategy=strategy)
        pm.step(ids, target=target)
        buckets = list(pm._state.buckets.values())
        out.append((pm.plan.family, sum(b.launched_in_backward for b in buckets), len(buckets)))
    return out


@pytest.mark.multiprocess
def test_its_gradients_are_averaged_after_backward_and_data_parallels_during():
    for rank in launch(_buckets_job, 2, timeout_s=300):
        (family, during, buckets), (builtin, data_during, _) = rank
        assert family == "after_backward" and buckets >= 1 and during == 0
        assert builtin == "" and data_during >= 1


class _Lacking:
    name = "lacking"

    def candidates(self, ctx):
        return []


class _Quiet(CompileHooks):
    """A family that offers nothing (registered and taken out again here)."""

    name = "quiet"

    def regions(self, model):
        return []

    def candidates(self, ctx):
        return []

    def price(self, ctx, config):
        raise AssertionError("never priced")

    def to_plan(self, ctx, priced):
        raise AssertionError("never planned")


@pytest.fixture
def quiet():
    family = autopar.register_family(_Quiet(), keys=("level",))
    try:
        yield family
    finally:
        unregister_family("quiet")


def test_registration_refuses_what_it_cannot_use(quiet):
    with pytest.raises(TypeError, match=r"lacking.*lacks \['regions', 'price', 'to_plan'"):
        autopar.register_family(_Lacking())
    with pytest.raises(ValueError, match="already registered"):
        autopar.register_family(_Quiet())
    assert autopar.register_family(quiet) is quiet   # the same object again: nothing happens
    with pytest.raises(ValueError, match="taken by a built-in strategy"):
        autopar.register_family(type("Mesh", (_Quiet,), {"name": "mesh"})())
    assert [f.name for f in FAMILIES][-2:] == ["quiet", "replicate"]   # before the last resort


def test_a_registered_family_is_forced_by_name_with_its_options(quiet):
    assert Strategy.parse("quiet").kind() == "quiet"
    forced = Strategy.parse({"family": "quiet", "level": [3, 4]})
    assert forced.kind() == "quiet" and forced.option("level") == [3, 4] and forced.option("other", 7) == 7
    hash(forced)   # options held as JSON text: the strategy stays hashable, and plan.json can hold them
    with pytest.raises(PlanError, match=r"\['depth'\] are not options of the family 'quiet'"):
        Strategy.parse({"family": "quiet", "depth": 2})
    with pytest.raises(PlanError, match=r"\['zero'\] are not options"):   # levers only where the family takes them
        Strategy.parse({"family": "quiet", "zero": 1})
    with pytest.raises(PlanError, match="options are saved in plan.json"):
        Strategy.parse({"family": "quiet", "level": {1, 2}})
    with pytest.raises(PlanError, match="no family of that name is registered"):
        Strategy.parse({"family": "nameless"})
    from autopar.cli import _parse_strategy
    assert Strategy.parse(_parse_strategy("quiet")).kind() == "quiet"   # autopar plan --strategy quiet


def _tiny():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    return model, torch.randn(4, 8), torch.randn(4, 4)


def test_a_forced_family_that_offers_nothing_says_so(quiet):
    model, x, y = _tiny()
    with pytest.raises(PlanError, match=r"no family offered a configuration of the forced strategy \(quiet\)"):
        autopar.plan(model, 2, (x,), torch.nn.functional.mse_loss, "quiet", example_target=y, hardware="cpu-gloo")


def test_a_plan_of_a_family_this_process_has_not_registered_is_refused(tmp_path):
    from autopar.agreement import reviewed_or_planned  # noqa: F401 (the check compile runs)
    from autopar.planning.reviewed import differences
    model, x, y = _tiny()
    plan = autopar.plan(model, 2, (x,), torch.nn.functional.mse_loss, "data", example_target=y, hardware="cpu-gloo")
    plan.family = "elsewhere"
    again = autopar.Plan.from_json(plan.to_json())
    assert again.family == "elsewhere" and "family: elsewhere (registered)" in again.explain()
    found = differences(again, world=2, model_name=again.model, global_batch=again.global_batch, regions=[],
                        couplings=[], hardware=None)
    assert any("has not registered" in line for line in found), found


def test_unregistered_it_is_gone_and_builtins_stay():
    family = autopar.register_family(_Quiet())
    unregister_family("quiet")
    assert family not in FAMILIES
    with pytest.raises(PlanError):
        Strategy.parse({"family": "quiet"})
    with pytest.raises(ValueError, match="built-in"):
        unregister_family("data")


def test_rank_passes_are_ordered_by_named_stages_and_constraints():
    from autopar.strategies.family import PASS_STAGES, RankPass, order_passes

    def step(stage, name, after=()):
        return RankPass(stage, name, None, {}, after)

    given = [step("data", "data_parallel"), step("split", "mine", after=("tensor_parallel",)),
             step("split", "tensor_parallel"), step("branches", "dsp"), step("zero", "zero")]
    assert [p.name for p in order_passes(given)] == ["dsp", "tensor_parallel", "mine", "zero",
                                                     "data_parallel"]
    # a name that is not among the passes constrains nothing; the registry's order is kept otherwise
    assert [p.name for p in order_passes([step("split", "b", after=("absent",)), step("split", "a")])] == ["b", "a"]
    with pytest.raises(ValueError, match="form a circle"):
        order_passes([step("split", "a", after=("b",)), step("split", "b", after=("a",))])
    with pytest.raises(ValueError, match=re.escape(f"stage 'late' is none of {PASS_STAGES}")):
        order_passes([step("late", "a")])
