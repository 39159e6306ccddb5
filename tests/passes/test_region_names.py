"""Region ids are ``<kind>:<module path>`` in the model's own names (autopar/passes/analysis/naming.py).

Users read plans, and match region names with patterns, against the model they know:
``linear_chain:transformer.h.0.mlp``, not ``linear_chain:addmm_2``; the capture wrapper's
``model.`` prefix is not theirs. The ids must also be the same in every capture of one
model (both tracers, any batch size), since each rank finds the plan's regions by id in
its own capture.
"""
from fnmatch import fnmatch

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.passes.analysis.analyse import analyse
from autopar.passes.analysis.linear_chains import find_linear_chains_pass
from autopar.trace.capture import capture, propagate_specs
from autopar.ir import regions
from examples import factories
from examples.models import MLP


def _ids(gm, kind=None):
    return [r.id for r in regions(gm, kind)]


def _hf_gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def _lm_loss(output, target):
    return F.cross_entropy(output.logits.flatten(0, -2), target.flatten())


def test_hugging_face_gpt2_regions_are_named_by_its_modules():
    model = _hf_gpt2()
    ids = torch.randint(0, 64, (2, 8))
    gm = analyse(capture(model, (ids,), _lm_loss, ids))
    assert _ids(gm, "vocab") == ["vocab:transformer.wte"]  # the token embedding, not the tied head
    assert _ids(gm, "attention") == ["attention:transformer.h.0.attn", "attention:transformer.h.1.attn"]
    assert _ids(gm, "linear_chain") == ["linear_chain:transformer.h.0.mlp", "linear_chain:transformer.h.1.mlp"]
    assert _ids(gm, "block") == ["block:transformer.h.0", "block:transformer.h.1"]
    # every name is a module of the user's model, reachable by its own name
    for rid in _ids(gm):
        model.get_submodule(rid.split(":", 1)[1])
    assert [rid for rid in _ids(gm) if fnmatch(rid, "linear_chain:transformer.h.*.mlp")] == _ids(gm, "linear_chain")


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export"])
def test_example_transformer_names_under_both_tracers(tracer):
    model, inputs, loss, target = factories.transformer()
    gm = analyse(capture(model, inputs, loss, target, tracer=tracer))
    assert _ids(gm, "vocab") == ["vocab:tok"]
    assert _ids(gm, "attention") == ["attention:blocks.0.attn", "attention:blocks.1.attn"]
    # fc and proj sit directly in the block: the block holds the chain
    assert _ids(gm, "linear_chain") == ["linear_chain:blocks.0", "linear_chain:blocks.1"]
    assert _ids(gm, "block") == ["block:blocks.0", "block:blocks.1"]


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export"])
def test_inception_branches_meeting_in_the_root_take_the_first_branch_module(tracer):
    model, inputs, loss, target = factories.inception()
    gm = analyse(capture(model, inputs, loss, target, tracer=tracer))
    assert _ids(gm, "fork_join") == ["fork_join:b1"]


def test_two_chains_in_one_module_are_told_apart_in_graph_order():
    model, inputs, loss, target = factories.mlp()
    gm = analyse(capture(model, inputs, loss, target))
    assert _ids(gm, "linear_chain") == ["linear_chain:body", "linear_chain:body#1"]
    first, second = regions(gm, "linear_chain")
    assert first.details["column"] == ["model_body_0"] and second.details["column"] == ["model_body_3"]


class _TwoChains(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        return self.d(torch.relu(self.c(self.b(torch.relu(self.a(x))))))


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ffn = _TwoChains()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.ffn(x))


def test_suffixes_in_a_nested_module_and_the_same_ids_at_another_batch():
    names = ["linear_chain:ffn", "linear_chain:ffn#1"]
    for batch, tracer in ((4, "symbolic_trace"), (2, "symbolic_trace"), (4, "export")):
        gm = analyse(capture(_Block(), (torch.randn(batch, 8),), tracer=tracer))
        assert _ids(gm, "linear_chain") == names, (batch, tracer)


class _Holder(nn.Module):
    """A user model whose own attribute is called ``model`` (as Hugging Face's Llama's)."""

    def __init__(self):
        super().__init__()
        self.model = MLP()

    def forward(self, x):
        return self.model(x)


def test_only_the_capture_wrapper_prefix_is_taken_off():
    x = torch.randn(8, 32)
    captured = analyse(capture(_Holder(), (x,)))
    assert _ids(captured, "linear_chain") == ["linear_chain:model.body", "linear_chain:model.body#1"]
    traced = fx.symbolic_trace(_Holder())  # no capture wrapper: the paths are the graph's own
    propagate_specs(traced, (x,))
    find_linear_chains_pass(traced)
    assert _ids(traced, "linear_chain") == ["linear_chain:model.body", "linear_chain:model.body#1"]


def test_a_region_of_the_root_functional_code_falls_back_to_a_node_name():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Parameter(torch.randn(8, 16)), nn.Parameter(torch.randn(16, 8))

        def forward(self, x):
            return torch.relu(x @ self.a) @ self.b

    gm = analyse(capture(Functional(), (torch.randn(2, 8),)))
    assert _ids(gm, "linear_chain") == ["linear_chain:matmul"]


class _PipelineBlock(nn.Module):
    def __init__(self, w: int = 32):
        super().__init__()
        self.ln, self.fc, self.proj = nn.LayerNorm(w), nn.Linear(w, 4 * w), nn.Linear(4 * w, w)

    def forward(self, x):
        return x + self.proj(F.gelu(self.fc(self.ln(x))))


class _Encoder(nn.Module):
    """A chain before the blocks and one after, both held by ``enc`` itself."""

    def __init__(self, w: int = 32):
        super().__init__()
        self.pre1, self.pre2 = nn.Linear(w, 2 * w), nn.Linear(2 * w, w)
        self.blocks = nn.ModuleList([_PipelineBlock(w) for _ in range(2)])
        self.post1, self.post2 = nn.Linear(w, 2 * w), nn.Linear(2 * w, w)

    def forward(self, x):
        x = self.pre2(torch.tanh(self.pre1(x)))
        for block in self.blocks:
            x = block(x)
        return self.post2(torch.tanh(self.post1(x)))


class _WithEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.head = _Encoder(), nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.enc(x))


def test_a_pipeline_stage_keeps_the_whole_graph_ids():
    """The last stage holds ``linear_chain:enc#1`` without ``linear_chain:enc``: its own
    analysis would call it ``linear_chain:enc``, and the plan's Megatron split for the
    stage would name a region the stage does not have."""
    import autopar
    from autopar.driver.rank_program import rewrite
    from autopar.strategies.pipeline.program import stage_graphs
    torch.manual_seed(0)
    x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
    plan = autopar.plan(_WithEncoder(), 4, (x,), F.cross_entropy, {"pipeline": 2, "tensor": 2}, example_target=y)
    split = {r.region for r in plan.regions if r.strategy == "megatron"}
    assert {"linear_chain:enc", "linear_chain:enc#1"} <= split, plan.explain()
    last_rank = plan.world_size - 1
    built, _, _ = stage_graphs(_WithEncoder(), plan, last_rank, (x,), F.cross_entropy, y, rewrite=rewrite)
    (stage,) = built.values()
    assert _ids(stage[0], "linear_chain") == ["linear_chain:enc.blocks.1", "linear_chain:enc#1"]
