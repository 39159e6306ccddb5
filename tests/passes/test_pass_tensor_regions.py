"""Tier 1: the vocab, attention and linear-chain analysis passes on small graphs.

Each test captures a tiny module (or builds a graph by hand), runs one pass, and checks
the regions it recorded and that the graph is unchanged.
"""
import math

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.trace.capture import capture, propagate_specs
from autopar.ir import REGION_OF, regions
from autopar.passes.analysis.analyse import analyse
from autopar.passes.analysis.attention import find_attention_regions_pass
from autopar.passes.analysis.linear_chains import find_linear_chains_pass
from autopar.passes.analysis.vocab import find_vocab_region_pass
from examples.models import TinyTransformer, gpt2


def _only(gm, kind):
    found = regions(gm, kind)
    return {r.id: r.details for r in found}


def _unchanged(gm, fn):
    before = gm.code
    fn(gm)
    gm.graph.lint()
    assert gm.code == before


class GatedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3, self.w2 = nn.Linear(8, 16, bias=False), nn.Linear(8, 16, bias=False), nn.Linear(16, 8)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class FunctionalMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(8, 16))
        self.b = nn.Parameter(torch.randn(16, 8))

    def forward(self, x):
        return torch.relu(x @ self.a) @ self.b


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export"])
def test_linear_chain_nn_linear(tracer):
    gm = capture(nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)), (torch.randn(2, 8),), tracer=tracer)
    _unchanged(gm, find_linear_chains_pass)
    (details,) = _only(gm, "linear_chain").values()
    assert details["hidden"] == 32 and len(details["column"]) == 1 and details["pointwise"]


def test_linear_chain_gated_mlp_has_two_columns():
    gm = capture(GatedMLP(), (torch.randn(2, 8),))
    find_linear_chains_pass(gm)
    assert _only(gm, "linear_chain") == {
        "linear_chain:w1": {"column": ["model_w1", "model_w3"], "row": "model_w2", "hidden": 16,
                            "pointwise": ["silu", "mul"]}}


def test_linear_chain_matmul_spelling():
    gm = capture(FunctionalMLP(), (torch.randn(2, 8),))
    find_linear_chains_pass(gm)
    assert list(_only(gm, "linear_chain").values()) == [
        {"column": ["matmul"], "row": "matmul_1", "hidden": 16, "pointwise": ["relu"]}]


def test_linear_chain_needs_a_private_intermediate():
    class Leaky(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return self.b(h) + h  # h escapes: splitting it would need a gather

    gm = capture(Leaky(), (torch.randn(2, 4),))
    find_linear_chains_pass(gm)
    assert _only(gm, "linear_chain") == {}


def test_linear_chain_on_a_hand_built_aten_graph():
    graph = fx.Graph()
    x = graph.placeholder("x")
    w1, b1, w2 = graph.get_attr("w1"), graph.get_attr("b1"), graph.get_attr("w2")
    h = graph.call_function(torch.ops.aten.addmm.default, (b1, x, w1))
    a = graph.call_function(torch.ops.aten.relu.default, (h,))
    y = graph.call_function(torch.ops.aten.mm.default, (a, w2))
    graph.output(y)
    root = nn.Module()
    root.w1, root.b1, root.w2 = nn.Parameter(torch.randn(4, 6)), nn.Parameter(torch.randn(6)), nn.Parameter(torch.randn(6, 4))
    gm = fx.GraphModule(root, graph)
    propagate_specs(gm, (torch.randn(3, 4),))
    find_linear_chains_pass(gm)
    assert _only(gm, "linear_chain") == {
        "linear_chain:addmm_default": {"column": ["addmm_default"], "row": "mm_default", "hidden": 6,
                                       "pointwise": ["relu_default"]}}


class SeparateQKV(nn.Module):
    def __init__(self, width=16, heads=4):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.heads = heads

    def forward(self, x):
        B, T, C = x.shape
        q = self.q(x).view(B, T, 4, C // 4).transpose(1, 2)
        k = self.k(x).view(B, T, 4, C // 4).transpose(1, 2)
        v = self.v(x).view(B, T, 4, C // 4).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export"])
def test_attention_separate_projections_sdpa(tracer):
    gm = capture(SeparateQKV(), (torch.randn(2, 5, 16),), tracer=tracer)
    _unchanged(gm, find_attention_regions_pass)
    (details,) = _only(gm, "attention").values()
    assert (details["heads"], details["head_dim"], details["hidden"]) == (4, 4, 16)
    assert not details["fused_qkv"] and details["qkv_blocks"] == 1
    assert len({details["q_proj"], details["k_proj"], details["v_proj"]}) == 3
    if tracer == "symbolic_trace":  # the literal 4 heads baked into the views
        assert details["head_count_views"] == ["view", "view_1", "view_2"]


def test_attention_fused_qkv_with_explicit_softmax():
    gm = capture(TinyTransformer(layers=1), (torch.randint(0, 64, (2, 8)),))
    find_attention_regions_pass(gm)
    assert {k: v for k, v in _only(gm, "attention")["attention:blocks.0.attn"].items() if k != "core"} == {
        "q_proj": "model_blocks_0_attn_qkv", "k_proj": "model_blocks_0_attn_qkv", "v_proj": "model_blocks_0_attn_qkv",
        "out_proj": "model_blocks_0_attn_proj", "fused_qkv": True, "qkv_blocks": 3, "heads": 4, "kv_heads": 4,
        "head_dim": 8, "hidden": 32, "head_count_views": ["view", "view_1", "view_2"],
        "core_inputs": ["transpose", "transpose_3", "transpose_2"]}  # query, transposed key, value


def test_regions_on_hugging_face_gpt2():
    torch.manual_seed(0)
    gm = analyse(capture(gpt2(layers=2), (torch.randint(0, 64, (2, 8)),)))
    kinds = [r.kind for r in regions(gm)]
    assert kinds.count("attention") == 2 and kinds.count("linear_chain") == 2 and kinds.count("vocab") == 1
    vocab = regions(gm, "vocab")[0].details
    assert vocab["tied"] and vocab["vocab_size"] == 64
    # every projection belongs to exactly one tensor region
    for node in gm.graph.nodes:
        tags = node.meta.get(REGION_OF, {})
        assert len({"attention", "linear_chain", "vocab"} & set(tags)) <= 1


def test_vocab_region_untied_head():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(50, 8), nn.Linear(8, 50)

        def forward(self, ids):
            return self.head(torch.tanh(self.emb(ids)))

    gm = capture(LM(), (torch.randint(0, 50, (2, 3)),))
    _unchanged(gm, find_vocab_region_pass)
    assert _only(gm, "vocab") == {"vocab:emb": {
        "embeddings": ["model_emb"], "head": "model_head", "weight": "model.emb.weight",
        "head_weight": "model.head.weight", "tied": False, "vocab_size": 50, "hidden": 8}}


def test_attention_scale_from_size_is_not_a_projection():
    class Scaled(SeparateQKV):
        def forward(self, x):
            B, T, C = x.shape
            q = self.q(x).view(B, T, 4, 4).transpose(1, 2)
            k = self.k(x).view(B, T, 4, 4).transpose(1, 2)
            v = self.v(x).view(B, T, 4, 4).transpose(1, 2)
            att = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(4), dim=-1)
            return self.o((att @ v).transpose(1, 2).reshape(B, T, C))

    gm = capture(Scaled(), (torch.randn(2, 5, 16),))
    find_attention_regions_pass(gm)
    (details,) = _only(gm, "attention").values()
    assert details["out_proj"] == "model_o" and details["heads"] == 4
