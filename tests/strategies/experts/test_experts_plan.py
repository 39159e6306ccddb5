"""Planning expert parallelism (autopar/strategies/experts/planner.py): the strategies a
user writes, the plan they give (mesh, expert groups, the MoE regions' rows, the rank
grid's groups, the layout's cut), "auto" weighing expert degrees beside data and tensor
parallelism, and the errors for what cannot run. Planning only: no process starts."""
import pytest
import torch

import autopar
from autopar.planning.strategy import PlanError, Strategy
from examples.factories import moe_model
from examples.zoo import logits_loss
from test_experts_analysis import HashRouted


def _plan(world, strategy, name="mixtral", hardware="cpu-gloo", batch=4, seq=8):
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (batch, seq))
    return autopar.plan(moe_model(name), world, (ids,), logits_loss, strategy, example_target=ids,
                        hardware=hardware)


def test_strategy_forms_of_expert_parallelism():
    forced = Strategy.parse({"data": 4, "experts": 2})
    assert (forced.kind(), forced.data, forced.experts, forced.base().kind()) == ("experts", 4, 2, "mesh")
    pinned = Strategy.parse({"regions": {"kind:experts": {"experts": 4}}})
    assert (pinned.kind(), pinned.experts, pinned.expert_pins) == ("experts", 4, (("kind:experts", 4),))
    assert Strategy.parse({"pipeline": 2, "data": 2, "experts": 2}).base().kind() == "pipeline"
    kept = Strategy.parse({"regions": {"kind:experts": "replicate"}})
    assert kept.levers_only and kept.experts == 1 and kept.kind() == "mesh"


@pytest.mark.parametrize("strategy, message", [
    ({"data": 4, "experts": 0}, "experts=0"),
    ({"data": 4, "experts": 2, "regions": {"kind:experts": {"experts": 4}}}, "expert degrees [2, 4]"),
    ({"subgrids": 2, "experts": 2}, "not with 'dsp'"),
    ({"regions": {"kind:experts": "megatron"}}, "pinned to {'experts': E} or 'replicate'"),
])
def test_strategies_that_cannot_be_read_name_the_argument(strategy, message):
    with pytest.raises(PlanError, match=message.replace("[", r"\[").replace("{", r"\{")):
        Strategy.parse(strategy)


def test_forced_expert_parallelism_plans_every_moe_region_and_its_groups():
    plan = _plan(4, {"data": 4, "experts": 2})
    assert plan.experts == 2 and plan.mesh == {"data": 4, "tensor": 1} and plan.form == "experts 2"
    assert plan._chosen_candidate() is not None
    rows = {r.region: r for r in plan.regions}
    layer = rows["experts:model.layers.0.mlp"]
    assert layer.strategy == "experts" and layer.kind == "experts"
    assert layer.details["placement"] == [[0, 2], [2, 4]] and layer.details["experts_per_rank"] == 2
    assert layer.details["tokens_per_rank"] == 8 * 2   # 8 tokens per data rank, top-2: uniform routing
    assert layer.cost.comm_s["experts"] > 0
    assert rows["linear_chain:model.layers.0.mlp.experts"].strategy == "experts"   # Megatron leaves it alone
    # the rank grid: data = replica x experts, expert groups of consecutive data ranks
    groups = plan.rank_grid().groups(plan.group_specs()["experts"].dims)
    assert groups == [[0, 1], [2, 3]]
    assert plan.rank_grid().groups(plan.group_specs()["expert_replica"].dims) == [[0, 2], [1, 3]]
    assert plan.rank_grid().groups(plan.group_specs()["data"].dims) == [[0, 1, 2, 3]]
    text = plan.explain()
    assert "expert groups of 2 consecutive data ranks" in text and "place 1: experts 2..3" in text
    again = autopar.Plan.from_json(plan.to_json())
    assert again.experts == 2 and again.to_json() == plan.to_json()


def test_tensor_parallelism_inside_the_expert_groups():
    plan = _plan(4, {"data": 2, "tensor": 2, "experts": 2})
    assert plan.mesh == {"data": 2, "tensor": 2}
    layer = next(r for r in plan.regions if r.kind == "experts")
    assert layer.details["tensor_inside"] is True
    assert plan.rank_grid().groups(plan.group_specs()["experts"].dims) == [[0, 2], [1, 3]]  # same tensor index
    assert "experts Megatron-split over the tensor group inside" in plan.explain()


def test_the_layout_cuts_the_experts_and_reduces_them_over_their_replicas():
    from autopar.trace.capture import capture
    from autopar.passes.analysis.analyse import analyse
    from autopar.driver.rank_program import planned_shards
    from autopar.strategies.placement import build_layout
    from autopar.trace.capture import MODEL_PREFIX
    plan = _plan(4, {"data": 4, "experts": 2})
    model = moe_model("mixtral")
    ids = torch.randint(0, 64, (4, 8))
    gm = analyse(capture(model, (ids,)))
    shards = planned_shards(plan, gm)
    name = MODEL_PREFIX + "model.layers.0.mlp.experts.gate_up_proj"
    assert str(shards[name]) == "ExpertShard(dim 0 over experts)"
    layout = build_layout(plan, 3, gm, shards)
    placement = layout.get("model.layers.0.mlp.experts.gate_up_proj")
    assert placement.bucket.group == "expert_replica" and placement.bucket.divisor == 4
    assert placement.norm_groups == ("experts",)
    full = model.model.layers[0].mlp.experts.gate_up_proj
    assert torch.equal(layout.local_part("model.layers.0.mlp.experts.gate_up_proj", full), full[2:4])
    assert layout.get("model.layers.0.mlp.gate.weight").bucket.group == "data"   # the router: data-parallel


def _meta_mixtral(inner, hidden, batch, seq, strategy="auto"):
    from transformers import MixtralConfig, MixtralForCausalLM
    with torch.device("meta"):
        model = MixtralForCausalLM(MixtralConfig(
            vocab_size=256, hidden_size=hidden, intermediate_size=inner, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, use_cache=False))
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return autopar.plan(model, 8, (ids,), logits_loss, strategy, example_target=ids, hardware="a100-selene")


def test_auto_weighs_expert_degrees_and_takes_them_where_they_pay():
    # experts whose weights dwarf the tokens they see (8 experts 256 -> 1024, 128 tokens
    # per step): expert parallelism's smaller gradient all-reduce pays for its all-to-alls
    big = _meta_mixtral(1024, 256, 8, 16)
    forms = {c.form for c in big.candidates if c.feasible}
    assert {"experts 2", "experts 4", "experts 8"} <= forms
    assert big.experts > 1 and big.why_not("experts").startswith("experts: chosen")
    assert "comm experts" in big.top(3)
    # tiny experts: their all-to-alls cost more than the all-reduce they save
    small = _meta_mixtral(48, 32, 8, 4)
    assert small.experts == 1 and small.why_not("experts").startswith("experts: lost")


def test_auto_weighs_experts_inside_the_fastest_pipelines():
    plan = _plan(4, "auto")
    assert any(f.startswith("pipeline ") and f.endswith(", experts 2")
               for f in {c.form for c in plan.candidates if c.feasible})
    forced = _plan(4, {"pipeline": 2, "data": 2, "experts": 2})
    assert forced.form == f"pipeline {forced.pipeline['schedule']}, experts 2" and forced.pipeline["stages"] == 2
    # the plan's step is the one its configuration was weighed at (the runner's fixed cost counted once)
    assert forced._chosen_candidate() is not None
    assert abs(forced.step_s - forced.total.compute_s - sum(forced.total.comm_s.values())) < 1e-9
    assert all(r.details.get("stage") is not None for r in forced.regions if r.kind == "experts")


def test_bad_input_is_refused_with_what_to_do():
    with pytest.raises(PlanError, match="region experts:model.layers.0.mlp: its 4 experts are not divisible by the "
                                        "expert degree 8"):
        _plan(8, {"data": 8, "experts": 8})
    with pytest.raises(PlanError, match="experts=4 does not divide the data degree 2"):
        _plan(4, {"data": 2, "tensor": 2, "experts": 4})
    with pytest.raises(PlanError, match="every MoE region is pinned 'replicate'"):
        _plan(4, {"data": 4, "experts": 2, "regions": {"kind:experts": "replicate"}})
    with pytest.raises(PlanError, match="matches no MoE region"):
        _plan(4, {"data": 4, "regions": {"experts:nowhere": {"experts": 2}}})
    ids = torch.randint(0, 64, (2, 8))
    with pytest.raises(PlanError, match="no routed mixture-of-experts layer the analysis can read"):
        autopar.plan(HashRouted(), 2, (ids,), lambda out, t: out.float().mean(), {"data": 2, "experts": 2},
                     example_target=ids)


def test_one_region_pinned_replicate_keeps_its_experts_whole():
    plan = _plan(4, {"data": 4, "experts": 2, "regions": {"experts:model.layers.0.mlp": "replicate"}})
    rows = {r.region: r for r in plan.regions if r.kind == "experts"}
    assert rows["experts:model.layers.0.mlp"].strategy == "replicate"
    assert rows["experts:model.layers.1.mlp"].strategy == "experts"
    assert Strategy.parse({"experts": 1}).expert_pins == (("kind:experts", 1),)


def test_replicate_pins_keep_the_experts_data_parallel():
    # the model "auto" gives expert parallelism (test_auto_weighs_expert_degrees...), pinned off
    plan = _meta_mixtral(1024, 256, 8, 16, {"regions": {"kind:experts": "replicate"}})
    assert plan.experts == 1 and not any("experts" in c.form for c in plan.candidates)
    assert _meta_mixtral(1024, 256, 8, 16, {"experts": 1}).experts == 1
