"""The analysis of routed mixture-of-experts layers (autopar/analysis/experts.py) on
Hugging Face models captured as a user's would be: Mixtral (top-2 of 4, renormalised
weights) and Qwen2-MoE (top-2 of 8, with a gated shared expert beside the routed ones);
a layer whose router it cannot read keeps no region, says so, and still plans."""
import logging

import torch
import torch.nn as nn

from autopar.analysis.analyse import analyse
from autopar.capture import capture
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
    from autopar.analysis.experts import router_statistics
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
