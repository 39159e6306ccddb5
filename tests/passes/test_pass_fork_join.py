"""Tests for the fork/join analysis pass on small hand-built graphs, under both tracers."""
from __future__ import annotations

import operator

import expecttest
import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.trace.capture import propagate_specs
from autopar.ir import REGION_OF, regions
from autopar.passes.analysis.fork_join import find_fork_join_regions_pass, format_regions

from analysis_helpers import run_analysis_pass

TRACERS = ["symbolic_trace", "export"]


def run_pass(model: nn.Module, *inputs: torch.Tensor, tracer: str = "symbolic_trace") -> fx.GraphModule:
    return run_analysis_pass(find_fork_join_regions_pass, "fork_join", model, *inputs, tracer=tracer)


def only_region(gm: fx.GraphModule):
    found = regions(gm, "fork_join")
    assert len(found) == 1, format_regions(gm)
    return found[0]


class Inception(nn.Module):
    def __init__(self):
        super().__init__()
        self.b1 = nn.Conv2d(3, 4, 1)
        self.b2a = nn.Conv2d(3, 4, 1)
        self.b2b = nn.Conv2d(4, 4, 3, padding=1)
        self.b3 = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        pooled = F.max_pool2d(x, 3, 1, 1)
        return torch.cat([self.b1(x), self.b2b(F.relu(self.b2a(x))), self.b3(pooled)], dim=1)


class TwoLinearSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(4, 8, bias=False)

    def forward(self, x):
        return self.a(x) + torch.relu(self.b(x))


class Heads(nn.Module):
    def __init__(self, stacked: bool = False):
        super().__init__()
        self.heads = nn.ModuleList(nn.Sequential(nn.Linear(4, 6), nn.GELU(), nn.Linear(6, 4)) for _ in range(3))
        self.stacked = stacked

    def forward(self, x):
        if self.stacked:
            return torch.stack([h(x) for h in self.heads]).sum(0)
        return sum(h(x) for h in self.heads)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        return x + self.mlp(x)


class Attention(nn.Module):
    def __init__(self, residual: bool):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(8, 8) for _ in range(4))
        self.residual = residual

    def forward(self, x):
        weights = torch.softmax(self.q(x) @ self.k(x).transpose(-2, -1) / 8 ** 0.5, dim=-1)
        out = self.o(weights @ self.v(x))
        return x + out if self.residual else out


class Nested(nn.Module):
    """fork x -> [stem -> (inner fork) -> cat(c1, c2) -> proj] + [side]; sum."""

    def __init__(self):
        super().__init__()
        self.stem, self.c1, self.c2 = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 2)
        self.proj, self.side = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        return self.proj(torch.cat([self.c1(h), self.c2(h)], dim=-1)) + self.side(x)


class ParallelBlock(nn.Module):
    """GPT-J style: attention-ish and MLP branches of one LayerNorm, plus the residual."""

    def __init__(self):
        super().__init__()
        self.ln, self.a, self.b = nn.LayerNorm(8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = self.ln(x)
        return x + self.a(h) + self.b(h)


class ChunkBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        left, right = x.chunk(2, dim=-1)
        return torch.cat([self.a(left), self.b(right)], dim=-1)


class GoldenText(expecttest.TestCase):
    def test_inception_concat_of_three_conv_branches(self):
        gm = run_pass(Inception(), torch.randn(2, 3, 4, 4))
        self.assertExpectedInline(format_regions(gm), """\
fork_join:b1: concat(dim=1) at cat; branches [model_b1] | [model_b2a, relu, model_b2b] | [max_pool2d, model_b3]; flops [768, 9984, 768]; params [16, 164, 16]""")

    def test_nested_regions_outer_then_inner(self):
        gm = run_pass(Nested(), torch.randn(2, 4))
        self.assertExpectedInline(format_regions(gm), """\
fork_join:stem: sum at add; branches [model_stem, relu, model_c1, model_c2, cat, model_proj] | [model_side]; flops [192, 64]; params [60, 20]
fork_join:c1: concat(dim=1) at cat; branches [model_c1] | [model_c2]; flops [32, 32]; params [10, 10]; parent fork_join:stem""")
        # each node's tag names the innermost region holding it
        tags = {n.name: n.meta.get(REGION_OF, {}).get("fork_join") for n in gm.graph.nodes}
        assert tags["model_c1"] == "fork_join:c1" and tags["model_side"] == "fork_join:stem"


@pytest.mark.parametrize("tracer", TRACERS)
def test_inception_under_both_tracers(tracer):
    r = only_region(run_pass(Inception(), torch.randn(2, 3, 4, 4), tracer=tracer))
    d = r.details
    assert (d["fork"], d["join_op"], d["concat_dim"], d["fork_kind"]) == ("input_0", "concat", 1, "replicate")
    assert [len(b) for b in d["branches"]] == [1, 3, 2]
    assert d["branch_flops"] == [768, 9984, 768] and d["branch_params"] == [16, 164, 16]
    assert r.nodes[-1] == d["join"] == "cat" and "input_0" not in r.nodes


@pytest.mark.parametrize("tracer", TRACERS)
def test_two_linear_branches_joined_by_sum(tracer):
    r = only_region(run_pass(TwoLinearSum(), torch.randn(3, 4), tracer=tracer))
    d = r.details
    assert (d["join_op"], d["concat_dim"], d["passthrough"], d["side_inputs"]) == ("sum", None, [], [])
    assert d["branch_flops"] == [2 * 3 * 4 * 8] * 2 and d["branch_params"] == [40, 32]
    assert [len(b) for b in d["branches"]] == [1, 2]  # the second branch ends in its relu


@pytest.mark.parametrize("tracer,stacked", [("symbolic_trace", False), ("export", False), ("export", True)])
def test_module_list_of_heads_joined_by_sum(tracer, stacked):
    r = only_region(run_pass(Heads(stacked), torch.randn(2, 4), tracer=tracer))
    d = r.details
    assert d["join_op"] == "sum" and len(d["branches"]) == 3
    assert all(len(b) == 3 for b in d["branches"]) and d["branch_params"] == [58] * 3
    # (0 + h0) + h1 + h2 from Python's sum(), or stack + sum
    assert len(d["join_nodes"]) == (2 if stacked else 3)
    assert set(d["join_nodes"]) <= set(r.nodes) and r.nodes[-1] == d["join"]


@pytest.mark.parametrize("tracer", TRACERS)
def test_residual_add_is_not_a_fork_join(tracer):
    assert regions(run_pass(Residual(), torch.randn(2, 4), tracer=tracer), "fork_join") == []


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("residual", [False, True])
def test_attention_qkv_fan_out_is_not_a_fork_join(tracer, residual):
    # Q, K and V meet in matmuls, so they are one branch; with the residual the join is
    # a sum of that one branch and the identity.
    gm = run_pass(Attention(residual), torch.randn(2, 5, 8), tracer=tracer)
    assert regions(gm, "fork_join") == []


@pytest.mark.parametrize("tracer", TRACERS)
def test_nested_parent_under_both_tracers(tracer):
    outer, inner = regions(run_pass(Nested(), torch.randn(2, 4), tracer=tracer), "fork_join")
    assert outer.details["parent"] is None and inner.details["parent"] == outer.id
    assert set(inner.nodes) < set(outer.nodes) and inner.details["fork"] in outer.nodes
    assert inner.details["join_op"] == "concat" and inner.details["concat_dim"] == 1


@pytest.mark.parametrize("tracer", TRACERS)
def test_parallel_block_keeps_the_residual_as_passthrough(tracer):
    r = only_region(run_pass(ParallelBlock(), torch.randn(2, 8), tracer=tracer))
    assert r.details["passthrough"] == ["input_0"] and len(r.details["branches"]) == 2
    assert len(r.details["join_nodes"]) == 2


@pytest.mark.parametrize("tracer", TRACERS)
def test_split_fork_is_a_slice(tracer):
    r = only_region(run_pass(ChunkBranches(), torch.randn(2, 8), tracer=tracer))
    assert r.details["fork_kind"] == "slice" and r.details["branch_flops"] == [2 * 2 * 4 * 4] * 2


def test_graph_built_by_hand_with_matmuls_and_a_mask():
    root = nn.Module()
    root.w1 = nn.Parameter(torch.randn(4, 6))
    root.w2 = nn.Parameter(torch.randn(4, 6))
    graph = fx.Graph()
    x, mask = graph.placeholder("x"), graph.placeholder("mask")
    left = graph.call_function(torch.matmul, (x, graph.get_attr("w1")))
    right = graph.call_function(torch.matmul, (x, graph.get_attr("w2")))
    masked = graph.call_function(operator.mul, (right, mask))
    graph.output(graph.call_function(operator.add, (left, masked)))
    gm = fx.GraphModule(root, graph)
    propagate_specs(gm, (torch.randn(3, 4), torch.ones(3, 6)))
    code = gm.code
    find_fork_join_regions_pass(gm)
    find_fork_join_regions_pass(gm)  # a re-run replaces its own results
    assert gm.code == code
    r = only_region(gm)
    assert r.id == "fork_join:matmul" and r.nodes == ["matmul", "matmul_1", "mul", "add"]
    assert r.details["branches"] == [["matmul"], ["matmul_1", "mul"]]
    assert r.details["branch_outputs"] == [["matmul"], ["mul"]]
    assert r.details["branch_flops"] == [2 * 3 * 4 * 6] * 2 and r.details["branch_params"] == [24, 24]
    assert r.details["side_inputs"] == ["mask"]


def test_gpt2_residuals_and_fused_qkv_split_are_not_fork_joins():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                     use_cache=False)
    gm = run_pass(transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 64, (2, 8)), tracer="auto")
    assert regions(gm, "fork_join") == []
