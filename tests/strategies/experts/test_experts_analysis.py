"""The analysis of routed mixture-of-experts layers (autopar/passes/analysis/experts.py) on
Hugging Face models captured as a user's would be: Mixtral (top-2 of 4, renormalised
weights) and Qwen2-MoE (top-2 of 8, with a gated shared expert beside the routed ones),
DeepSeek-V3's routing, GPT-OSS (a router with a bias and the softmax of the top-k logits,
experts with biases and the clamped SwiGLU on alternating gate and up columns, attention
sinks) and the activations the expert-parallel call computes, checked on the captured
ops; a layer whose router it cannot read keeps no region, says so, and still plans."""
import logging

import pytest
import torch
import torch.nn as nn

from autopar.passes.analysis.analyse import analyse
from autopar.trace.capture import capture
from autopar.ir import regions, tensor_spec


def _analysed(model, ids):
    return analyse(capture(model, (ids,)))


def test_mixtral_layers_are_routed_expert_regions():
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(0)
    model = MixtralForCausalLM(MixtralConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=16, num_local_experts=4, num_experts_per_tok=2, use_cache=False))
    gm = _analysed(model, torch.randint(0, 64, (2, 8)))
    found = {r.id: r.details for r in regions(gm, "experts")}
    assert set(found) == {"experts:model.layers.0.mlp", "experts:model.layers.1.mlp"}
    layer = found["experts:model.layers.0.mlp"]
    assert {k: layer[k] for k in ("experts", "top_k", "scores", "normalized", "chain", "shared")} == {
        "experts": 4, "top_k": 2, "scores": "softmax", "normalized": True,
        "chain": "linear_chain:model.layers.0.mlp.experts", "shared": []}
    assert layer["router_weight"] == "model.model.layers.0.mlp.gate.weight"
    nodes = {n.name: n for n in gm.graph.nodes}
    region = regions(gm, "experts")[0]
    assert layer["router"] in region.nodes and layer["combine"] in region.nodes
    # the combine is the sum over the 2 slots of [tokens, 2, hidden]
    assert tuple(tensor_spec(nodes[layer["combine"]]).shape) == (16, 32)


def test_qwen2_moe_shared_expert_is_a_parallel_branch():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    torch.manual_seed(0)
    model = Qwen2MoeForCausalLM(Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, moe_intermediate_size=16, shared_expert_intermediate_size=48, num_experts=8,
        num_experts_per_tok=2, max_position_embeddings=16, use_cache=False, decoder_sparse_step=1))
    gm = _analysed(model, torch.randint(0, 64, (2, 8)))
    (region,) = regions(gm, "experts")
    assert region.details["experts"] == 8 and region.details["top_k"] == 2
    assert region.details["normalized"] is False   # Qwen2-MoE's norm_topk_prob defaults to False
    assert region.details["shared"] == ["linear_chain:model.layers.0.mlp.shared_expert"]


class HashRouted(nn.Module):
    """Mixtral's experts (grouped matmul) routed by the token id, not by a learned
    router: nothing for expert parallelism's planner to read."""

    def __init__(self):
        super().__init__()
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts
        config = MixtralConfig(hidden_size=16, intermediate_size=32, num_local_experts=4)
        config._experts_implementation = "grouped_mm"
        self.embed = nn.Embedding(64, 16)
        self.experts = MixtralExperts(config)
        self.head = nn.Linear(16, 64)

    def forward(self, ids):
        hidden = self.embed(ids).view(-1, 16)
        flat = ids.reshape(-1)
        index = torch.stack([flat % 4, (flat + 1) % 4], -1)
        out = self.experts(hidden, index, torch.full(index.shape, 0.5))
        return self.head(out).view(*ids.shape, 64)


def test_a_router_the_analysis_cannot_read_leaves_the_layer_to_its_plan(caplog):
    import autopar
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8))
    with caplog.at_level(logging.WARNING, logger="autopar.analysis.experts"):
        gm = _analysed(HashRouted(), ids)
    assert not regions(gm, "experts")
    chain = next(r for r in regions(gm, "linear_chain") if r.details.get("experts"))
    assert f"{chain.id} has 4 experts but no router the analysis can read" in caplog.text
    assert "stays in its data or tensor plan" in caplog.text
    plan = autopar.plan(HashRouted(), 2, (ids,), lambda out, t: out.float().mean(), "data", example_target=ids)
    assert dict(plan.mesh) == {"data": 2, "tensor": 1}


def test_a_module_list_of_experts_is_a_routed_layer():
    """Experts written as a ``ModuleList`` of standard layers with a loop over them
    (``examples/models.ListMoE``): one region per layer, its experts' chains and modules in
    expert order, no shared expert (the experts' own chains read the router's input too)."""
    from examples.models import ListMoETransformer
    torch.manual_seed(0)
    gm = _analysed(ListMoETransformer(), torch.randint(0, 64, (2, 8)))
    found = {r.id: r.details for r in regions(gm, "experts")}
    assert set(found) == {"experts:moe.0", "experts:moe.1"}
    layer = found["experts:moe.1"]
    assert layer["form"] == "module_list" and layer["experts"] == 4 and layer["top_k"] == 2
    assert layer["modules"] == [f"model.moe.1.experts.{e}" for e in range(4)]
    assert layer["chains"] == [f"linear_chain:moe.1.experts.{e}" for e in range(4)]
    assert layer["router_weight"] == "model.moe.1.gate.weight" and layer["normalized"] and layer["shared"] == []


class TopkMetric(nn.Module):
    """Not a mixture of experts: a top-k over softmax scores feeding a summed loss and a
    count (a top-k accuracy): nothing for the router statistics to synchronise."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 8)

    def forward(self, x, target):
        scores = self.head(x).softmax(-1)
        _, top = scores.topk(2, -1)
        hits = (top == target[:, None]).float().sum()
        return (scores ** 2).sum() + 0.0 * hits


def test_router_statistics_are_the_load_balancing_losss_only():
    """The statistics a load-balancing loss reduces over the tokens (one value per expert,
    and the count of unmasked tokens they are divided by) are found in Mixtral's graph;
    nothing in a model whose top-k feeds a summed loss, nor the combine of a layer of
    expert modules where the example routes no token to an expert."""
    from autopar.passes.analysis.experts import router_statistics
    from examples.factories import moe_model
    from examples.models import ListMoETransformer
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    gm = analyse(capture(moe_model("mixtral", aux=True), (), example_kwargs={
        "input_ids": ids, "attention_mask": mask, "labels": ids}, model_loss="required"))
    names = router_statistics(gm)
    nodes = {n.name: n for n in gm.graph.nodes}
    kinds = sorted({nodes[n].target.overloadpacket.__name__ for n in names})
    assert len(names) == 6 and kinds == ["scatter_add_", "sum"], (names, kinds)   # 2 layers x (count, prob, mask)
    metric = analyse(capture(TopkMetric(), (torch.randn(8, 16), torch.randint(0, 8, (8,)))))
    assert router_statistics(metric) == []
    model = ListMoETransformer(experts=8)
    sparse = analyse(capture(model, (torch.randint(0, 64, (1, 2)),)))   # 4 (token, slot) pairs for 8 experts
    assert router_statistics(sparse) == []


def test_deepseek_v3_sigmoid_router_with_group_limited_routing():
    """DeepSeek-V3 picks its experts by sigmoid scores plus a correction bias among the
    best groups (a masked_fill), weights them by the uncorrected scores gathered at the
    picks, renormalised and scaled, and computes its router in float32 (a cast weight)."""
    from examples.factories import moe_model
    torch.manual_seed(0)
    gm = _analysed(moe_model("deepseek_v3"), torch.randint(0, 64, (2, 8)))
    found = regions(gm, "experts")   # layers 1 and 2: the first is dense
    assert [r.id for r in found] == ["experts:model.layers.1.mlp", "experts:model.layers.2.mlp"]
    region = found[0]
    d = region.details
    assert region.id == "experts:model.layers.1.mlp" and d["experts"] == 8 and d["top_k"] == 2
    assert d["scores"] == "sigmoid" and d["normalized"] is True
    assert d["router_weight"] == "model.model.layers.1.mlp.gate.weight"
    nodes = {n.name: n for n in gm.graph.nodes}
    assert any(getattr(n.target, "__name__", "") == "gather" or "gather" in str(n.target)
               for n in [nodes[d["weights"]], *nodes[d["weights"]].all_input_nodes,
                         *[a for b in nodes[d["weights"]].all_input_nodes for a in b.all_input_nodes]])
    assert d["shared"] == ["linear_chain:model.layers.1.mlp.shared_experts"]


# ---------------------------------------------------------------- GPT-OSS

_GPT_OSS = {}


def _gpt_oss_graph():
    """Hugging Face GPT-OSS (examples/factories.gpt_oss_model: top-2 of 4 experts with
    biases, the clamped SwiGLU, attention sinks), captured and analysed once."""
    if "gm" not in _GPT_OSS:
        from examples.factories import moe_model
        torch.manual_seed(0)
        _GPT_OSS["gm"] = _analysed(moe_model("gpt_oss"), torch.randint(0, 64, (2, 8)))
    return _GPT_OSS["gm"]


def test_gpt_oss_layers_are_routed_expert_regions():
    """GPT-OSS picks the top-2 of its router's logits (a linear with a bias) and weights
    them by their softmax over the 2 slots; its experts add a bias after each grouped
    matmul and apply the clamped SwiGLU to alternating gate and up columns: each read."""
    from autopar.passes.analysis.ops import call_name
    gm = _gpt_oss_graph()
    found = {r.id: r.details for r in regions(gm, "experts")}
    assert set(found) == {"experts:model.layers.0.mlp", "experts:model.layers.1.mlp"}
    layer = found["experts:model.layers.1.mlp"]
    mlp = "model.model.layers.1.mlp."
    assert {k: layer[k] for k in ("experts", "top_k", "scores", "normalized", "router_weight", "router_bias",
                                  "gate_up_bias", "down_bias", "activation", "interleaved", "unread", "shared")} == {
        "experts": 4, "top_k": 2, "scores": "none", "normalized": True, "router_weight": mlp + "router.weight",
        "router_bias": mlp + "router.bias", "gate_up_bias": mlp + "experts.gate_up_proj_bias",
        "down_bias": mlp + "experts.down_proj_bias",
        "activation": {"name": "clamped_swiglu", "alpha": 1.702, "limit": 0.3}, "interleaved": True, "unread": None,
        "shared": []}
    nodes = {n.name: n for n in gm.graph.nodes}
    assert call_name(nodes[layer["weights"]]) == "softmax"   # over the top-k logits, not the logits themselves
    chain = next(r for r in regions(gm, "linear_chain") if r.id == layer["chain"]).details
    assert (chain["blocks"], chain["interleaved"], chain["hidden"]) == (2, True, 32)
    assert chain["column_bias"] == mlp + "experts.gate_up_proj_bias"


def test_gpt_oss_attention_sinks_are_per_head_parameters_of_the_attention():
    """The attention (sliding window in layer 0, full in layer 1) joins a learned logit per
    head to the scores before the softmax: the region names that parameter, and Megatron
    cuts it with the heads (as the experts' column bias with their columns: one cut for the
    alternating gate and up columns), with no op left without a split rule."""
    from autopar.strategies.megatron.rewrite import planned_param_shards
    from autopar.strategies.shared.tensor_rewrite import ParamShard, regions_without_rules
    gm = _gpt_oss_graph()
    attention = {r.id: r.details for r in regions(gm, "attention")}
    assert set(attention) == {"attention:model.layers.0.self_attn", "attention:model.layers.1.self_attn"}
    for i in (0, 1):
        d = attention[f"attention:model.layers.{i}.self_attn"]
        assert (d["heads"], d["kv_heads"], d["head_dim"]) == (4, 2, 16)
        assert d["sinks"] == f"model.model.layers.{i}.self_attn.sinks"
    split = [r.id for r in regions(gm) if r.kind in ("attention", "linear_chain")]
    assert regions_without_rules(gm, split, 2) == {}
    shards = planned_param_shards(gm, megatron_regions=split, degree=2)
    layer = "model.model.layers.0."
    assert shards[layer + "self_attn.sinks"] == ParamShard(0)
    assert shards[layer + "mlp.experts.gate_up_proj"] == ParamShard(2)       # [E, H, 2I]: contiguous
    assert shards[layer + "mlp.experts.gate_up_proj_bias"] == ParamShard(1)  # [E, 2I]
    assert shards[layer + "mlp.experts.down_proj"] == ParamShard(1)          # [E, I, H]: its rows
    assert layer + "mlp.experts.down_proj_bias" not in shards                # added once, after the reduction


def test_the_clamped_swiglu_is_hugging_faces():
    """What the expert-parallel call computes between the projections is GPT-OSS's own
    ``_apply_gate``, bit for bit; and the rank's experts (their biases, both projections)
    are the Hugging Face experts' on the rows routed to them."""
    from autopar.passes.analysis.experts import gated
    from autopar.strategies.experts.rewrite import local_experts
    from examples.factories import moe_model
    torch.manual_seed(0)
    experts = moe_model("gpt_oss").model.layers[0].mlp.experts
    g = torch.Generator().manual_seed(1)
    h = torch.randn(32, 64, generator=g)
    activation = ("clamped_swiglu", experts.alpha, experts.limit)
    assert torch.equal(gated(h, activation, interleaved=True), experts._apply_gate(h))
    x, ids = torch.randn(12, 64, generator=g), torch.randint(0, 4, (12,), generator=g)
    with torch.no_grad():
        want = experts(x, ids[:, None], torch.ones(12, 1))
        got = local_experts(x, ids, experts.gate_up_proj, experts.down_proj, activation,
                            ("experts_in_out", "experts_in_out"), experts.gate_up_proj_bias, experts.down_proj_bias,
                            interleaved=True)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_experts_biases_are_cut_with_them():
    """Expert parallelism's layout: each bias ``[E, width]`` is cut on the experts with its
    weight; with a tensor group inside, the gated projection's bias also on its columns
    (contiguously, as its weight: gate and up alternate), the down projection's whole."""
    from autopar.runtime.layout import Seat
    from autopar.strategies.experts.layout import ExpertShard
    from autopar.strategies.experts.rewrite import expert_shards
    gm = _gpt_oss_graph()
    region = next(r for r in regions(gm, "experts") if r.id == "experts:model.layers.0.mlp")
    mlp = "model.model.layers.0.mlp.experts."
    assert expert_shards(gm, region, tensor=False) == {
        mlp + "gate_up_proj": ExpertShard(), mlp + "down_proj": ExpertShard(),
        mlp + "gate_up_proj_bias": ExpertShard(), mlp + "down_proj_bias": ExpertShard()}
    cut = expert_shards(gm, region, tensor=True)
    assert cut == {mlp + "gate_up_proj": ExpertShard(2), mlp + "down_proj": ExpertShard(1),
                   mlp + "gate_up_proj_bias": ExpertShard(1), mlp + "down_proj_bias": ExpertShard()}
    full = torch.arange(4 * 64.0).view(4, 64)
    seat = Seat({"experts": 1, "tensor": 1}, {"experts": 2, "tensor": 2})
    assert torch.equal(cut[mlp + "gate_up_proj_bias"].local(full, seat), full[2:4, 32:64])
    assert torch.equal(cut[mlp + "down_proj_bias"].local(full, seat), full[2:4])


@pytest.mark.parametrize("act, name", [("gelu_pytorch_tanh", "gelu_tanh"), ("gelu", "gelu"), ("relu", "relu")])
def test_the_experts_activation_is_read_and_checked(act, name):
    """Gated experts whose activation is GeLU (exact or tanh) or ReLU are read as such: the
    captured ops between the projections are run against each candidate."""
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(0)
    model = MixtralForCausalLM(MixtralConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, max_position_embeddings=16, num_local_experts=4, num_experts_per_tok=2,
        hidden_act=act, use_cache=False))
    (region,) = regions(_analysed(model, torch.randint(0, 64, (2, 8))), "experts")
    assert region.details["activation"] == {"name": name} and region.details["unread"] is None


def test_an_activation_the_call_does_not_compute_is_refused_with_its_reason():
    """A variant of GPT-OSS's SwiGLU (``(up + 2)`` for ``(up + 1)``) matches none of the
    activations the expert-parallel call computes: the layer keeps its region, says why,
    and forcing expert parallelism names it."""
    import types

    import autopar
    from autopar.planning.strategy import PlanError
    from examples.factories import moe_model
    from examples.zoo import logits_loss

    def variant(self, gate_up):
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        gate = gate.clamp(min=None, max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 2) * (gate * torch.sigmoid(gate * self.alpha))

    torch.manual_seed(0)
    model = moe_model("gpt_oss")
    for layer in model.model.layers:
        layer.mlp.experts._apply_gate = types.MethodType(variant, layer.mlp.experts)
    ids = torch.randint(0, 64, (4, 8))
    found = regions(_analysed(model, ids), "experts")
    assert len(found) == 2 and all(r.details["activation"] is None for r in found)
    assert "compute no activation this rewrite knows" in found[0].details["unread"]
    with pytest.raises(PlanError, match="compute no activation this rewrite knows"):
        autopar.plan(model, 4, (ids,), logits_loss, {"data": 4, "experts": 4}, example_target=ids)
