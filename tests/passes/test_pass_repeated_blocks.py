"""Tests for the repeated-blocks analysis pass: small models, GPT-2, a hand-built graph."""
from __future__ import annotations


import expecttest
import pytest
import torch
import torch.fx as fx
import torch.nn as nn

from autopar.trace.capture import propagate_specs
from autopar.ir import REGION_OF, regions
from autopar.passes.analysis.repeated_blocks import find_repeated_blocks_pass, format_regions

from analysis_helpers import run_analysis_pass

TRACERS = ["symbolic_trace", "export"]


def run_pass(model: nn.Module, *inputs: torch.Tensor, tracer: str = "auto") -> fx.GraphModule:
    return run_analysis_pass(find_repeated_blocks_pass, "block", model, *inputs, tracer=tracer)


def block_paths(gm: fx.GraphModule) -> list[str]:
    return [r.details["module_path"] for r in regions(gm, "block")]


class Layer(nn.Module):
    """A transformer-ish layer: single-head attention and an MLP, each with a residual."""

    def __init__(self, d: int = 8, hidden: int = 16):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        x = x + self.proj(weights @ v)
        return x + self.mlp(self.ln2(x))


class Stack(nn.Module):
    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class ParallelHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        return sum(h(x) for h in self.heads)


class Down(nn.Module):
    """A stage's first block, which changes the width (as a ResNet downsample does)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.skip = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) + self.skip(x)


class MlpLayer(nn.Module):
    """An MLP-only layer with its residual: unlike :class:`Layer`, for stacks of period 2."""

    def __init__(self, d: int = 8, hidden: int = 16):
        super().__init__()
        self.ln, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))

    def forward(self, x):
        return x + self.mlp(self.ln(x))


def gpt2():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                     use_cache=False)
    return transformers.GPT2LMHeadModel(config).eval()


class GoldenText(expecttest.TestCase):
    def test_three_layer_stack(self):
        gm = run_pass(Stack([Layer() for _ in range(3)]), torch.randn(2, 5, 4), tracer="symbolic_trace")
        self.assertExpectedInline(format_regions(gm), """\
block:layers.0: Layer group=model.layers index=0 signature=41cf88e0e6b7 nodes=17 params=600 flops=11840
block:layers.1: Layer group=model.layers index=1 signature=41cf88e0e6b7 nodes=17 params=600 flops=11840
block:layers.2: Layer group=model.layers index=2 signature=41cf88e0e6b7 nodes=17 params=600 flops=11840""")

    def test_gpt2_layers(self):
        gm = run_pass(gpt2(), torch.randint(0, 64, (2, 8)))
        self.assertExpectedInline(format_regions(gm), """\
block:transformer.h.0: GPT2Block group=model.transformer.h index=0 signature=413c1a82c310 nodes=52 params=12704 flops=409600
block:transformer.h.1: GPT2Block group=model.transformer.h index=1 signature=413c1a82c310 nodes=52 params=12704 flops=409600""")


@pytest.mark.parametrize("tracer", TRACERS)
def test_three_layer_stack_under_both_tracers(tracer):
    gm = run_pass(Stack([Layer() for _ in range(3)]), torch.randn(2, 5, 4), tracer=tracer)
    found = regions(gm, "block")
    assert [r.id for r in found] == ["block:layers.0", "block:layers.1", "block:layers.2"]
    assert [r.details["index"] for r in found] == [0, 1, 2]
    assert {r.details["group"] for r in found} == {"model.layers"}
    assert len({r.details["signature"] for r in found}) == 1
    per_layer = sum(p.numel() for p in Layer().parameters())
    assert all(r.details["params"] == per_layer for r in found)
    # qkv 2*10*8*24, q@kT 2*10*5*8, weights@v 2*10*5*8, proj, mlp 2*10*8*16 twice
    assert all(r.details["flops"] == 3840 + 800 + 800 + 1280 + 2560 + 2560 for r in found)
    # the layers do not overlap and each node is tagged with its own block
    names = [set(r.nodes) for r in found]
    assert not (names[0] & names[1]) and not (names[1] & names[2])
    tagged = {n.name: n.meta.get(REGION_OF, {}).get("block") for n in gm.graph.nodes}
    assert all(tagged[name] == r.id for r in found for name in r.nodes)


def test_gpt2_has_two_identical_layers():
    gm = run_pass(gpt2(), torch.randint(0, 64, (2, 8)))
    first, second = regions(gm, "block")
    assert (first.id, second.id) == ("block:transformer.h.0", "block:transformer.h.1")
    assert first.details["signature"] == second.details["signature"]
    assert first.details["module_class"] == "GPT2Block" and first.details["group"] == "model.transformer.h"
    # 4·d² + ... per layer: ln 2·2d, attn 3d²+3d + d²+d, mlp 4d²+4d + 4d²+d
    d = 32
    assert first.details["params"] == 2 * 2 * d + 4 * d * d + 4 * d + 8 * d * d + 5 * d


@pytest.mark.parametrize("tracer", TRACERS)
def test_non_identical_siblings_give_no_blocks(tracer):
    gm = run_pass(Stack([Layer(hidden=16), Layer(hidden=24), Layer(hidden=32)]), torch.randn(2, 5, 4),
                  tracer=tracer)
    assert regions(gm, "block") == []


def test_parallel_heads_are_not_blocks():
    # identical children, but none reads the previous one's output: a fork/join, not a pipeline
    assert regions(run_pass(ParallelHeads(), torch.randn(2, 8)), "block") == []


@pytest.mark.parametrize("tracer", TRACERS)
def test_run_after_a_different_first_block(tracer):
    gm = run_pass(nn.Sequential(Down(), Layer(), Layer()), torch.randn(2, 5, 8), tracer=tracer)
    assert block_paths(gm) == ["model.1", "model.2"]
    assert [r.details["index"] for r in regions(gm, "block")] == [1, 2]


def test_only_outermost_groups_are_recorded():
    # each layer holds a Sequential of identical linears; the layers are the blocks
    inner = [nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)) for _ in range(2)]
    gm = run_pass(nn.Sequential(nn.Linear(8, 8), nn.Sequential(*inner)), torch.randn(2, 8))
    assert block_paths(gm) == ["model.1.0", "model.1.1"]


def test_graph_built_by_hand():
    root = nn.Module()
    root.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
    graph = fx.Graph()
    value = graph.placeholder("x")
    for i in range(3):
        value = graph.call_function(torch.relu, (graph.call_module(f"layers.{i}", (value,)),))
    graph.output(value)
    gm = fx.GraphModule(root, graph)
    propagate_specs(gm, (torch.randn(2, 4),))
    find_repeated_blocks_pass(gm)
    find_repeated_blocks_pass(gm)  # a re-run replaces its own results
    found = regions(gm, "block")
    # without nn_module_stack only the call_module nodes are known to be inside a layer
    assert [r.nodes for r in found] == [["layers_0"], ["layers_1"], ["layers_2"]]
    assert [r.details["flops"] for r in found] == [2 * 2 * 4 * 4] * 3
    assert all(r.details["module_class"] == "Linear" and r.details["params"] == 20 for r in found)


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_stack_of_period_two_gives_one_block_per_unit(tracer):
    gm = run_pass(Stack([Layer(), MlpLayer(), Layer(), MlpLayer(), Layer(), MlpLayer()]), torch.randn(2, 5, 4),
                  tracer=tracer)
    found = regions(gm, "block")
    assert [r.id for r in found] == ["block:layers.0-1", "block:layers.2-3", "block:layers.4-5"]
    assert [r.details["index"] for r in found] == [0, 2, 4]
    assert all(r.details["period"] == 2 and r.details["module_class"] == "Layer+MlpLayer" for r in found)
    assert found[2].details["layers"] == ["model.layers.4", "model.layers.5"]
    assert len({r.details["signature"] for r in found}) == 1
    per_unit = sum(p.numel() for m in (Layer(), MlpLayer()) for p in m.parameters())
    assert all(r.details["params"] == per_unit for r in found)
    # Layer's flops (test above) and MlpLayer's: mlp 2*10*8*16 twice
    assert all(r.details["flops"] == 3840 + 800 + 800 + 1280 + 2560 + 2560 + 2560 + 2560 for r in found)
    names = [set(r.nodes) for r in found]
    assert not (names[0] & names[1]) and not (names[1] & names[2])
    tagged = {n.name: n.meta.get(REGION_OF, {}).get("block") for n in gm.graph.nodes}
    assert all(tagged[name] == r.id for r in found for name in r.nodes)


@pytest.mark.parametrize("tracer", TRACERS)
def test_period_three_and_a_last_layer_short_of_a_unit(tracer):
    # Layer, MlpLayer, MlpLayer twice, then a Layer: period 3 covers 6 layers (the two
    # MlpLayers in a row are a run of 2 only); the last Layer is in no block
    stack = [Layer(), MlpLayer(), MlpLayer()] * 2 + [Layer()]
    gm = run_pass(Stack([type(m)() for m in stack]), torch.randn(2, 5, 4), tracer=tracer)
    assert [r.id for r in regions(gm, "block")] == ["block:layers.0-2", "block:layers.3-5"]


def test_no_unit_repeats_twice():
    from autopar.passes.analysis.repeated_blocks import describe_stacks
    gm = run_pass(Stack([Layer(), MlpLayer(), Layer()]), torch.randn(2, 5, 4))
    assert regions(gm, "block") == []
    assert describe_stacks(gm) == "layers: Layer, MlpLayer, Layer"


def test_a_unit_of_an_activation_is_no_unit():
    # Linear, Tanh, Linear, Tanh: period 2, but Tanh holds no parameter (part of a layer)
    gm = run_pass(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh()), torch.randn(2, 8))
    assert regions(gm, "block") == []
