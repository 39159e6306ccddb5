"""Repeated layers exported once (autopar/trace/stacks.py, stamping.py, loop_check.py):
a stack of repeated layers is exported a few layers deep (three for a stack of copies)
and the other layers stamped from the last unit exported. The graph is the whole
model's export node for node (names, operations, arguments, specs, module paths), the
rank programs built from it are the same, and a stack whose layers are not copies of one
another, whose layers compute with their own index, or whose model runs code of its
own at a depth the shallow export does not reach is exported whole."""
import logging

import pytest
import torch
import torch.nn as nn

import autopar
from autopar.ir import SPEC
from autopar.engine.executable import rank_graph_code
from autopar.trace.capture import CaptureError, capture
from autopar.trace.memo import EXPORTS
from autopar.trace.stamping import Stack, find_stack
from examples.factories import moe_model
from examples.models import gpt2


def _llama(layers):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                        use_cache=False))


def _gpt2(layers):
    torch.manual_seed(0)
    return gpt2(layers)


def _mixtral(layers):
    torch.manual_seed(0)
    return moe_model("mixtral", layers)


def _batch():
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def _facts(gm):
    return [(n.op, n.name, str(n.target), str(n.args), str(n.kwargs), n.meta.get(SPEC),
             str(n.meta.get("nn_module_stack"))) for n in gm.graph.nodes]


def _whole(monkeypatch, model, inputs=(), **kw):
    monkeypatch.setenv("AUTOPAR_STAMP_LAYERS", "0")
    try:
        return capture(model, inputs, **kw)
    finally:
        monkeypatch.delenv("AUTOPAR_STAMP_LAYERS")


@pytest.mark.parametrize("factory,path", [(_llama, "model.layers"), (_gpt2, "transformer.h"),
                                          (_mixtral, "model.layers")])
def test_a_stamped_export_is_the_whole_export(factory, path, monkeypatch, caplog):
    model = factory(5)
    assert find_stack(model) == Stack(path, 5)
    with caplog.at_level(logging.INFO, "autopar.capture"):
        stamped = capture(model, (), example_kwargs=_batch(), model_loss="required")
    assert "exported with its first 3 of 5 layers" in caplog.text
    whole = _whole(monkeypatch, factory(5), example_kwargs=_batch(), model_loss="required")  # a model of its own
    assert _facts(stamped) == _facts(whole)
    assert stamped.code == whole.code
    last = f"model.{path}.4"
    assert dict(stamped.get_submodule(last).named_parameters()).keys() == \
        dict(whole.get_submodule(last).named_parameters()).keys()
    # the stamped layers read the model's own parameters, as an export does
    name, param = next(iter(model.get_submodule(f"{path}.4").named_parameters()))
    assert stamped.get_parameter(f"{last}.{name}") is param
    # a replay of the kept export stamps again, a module of its own
    hits = EXPORTS.hits
    again = capture(model, (), example_kwargs=_batch(), model_loss="required")
    assert EXPORTS.hits == hits + 1 and again.graph is not stamped.graph and _facts(again) == _facts(stamped)


def _gemma3(layers, every=3):
    """Gemma 3's stack: local (sliding-window) layers and a global one every ``every``
    (the published 27B has 5 + 1), an activation made per layer (``partial(gelu)``)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    torch.manual_seed(0)
    return Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=4, max_position_embeddings=32,
        layer_types=["full_attention" if i % every == every - 1 else "sliding_attention" for i in range(layers)],
        use_cache=False))


def _gpt_oss(layers):
    from examples.factories import gpt_oss_model
    torch.manual_seed(0)
    return gpt_oss_model(layers)


def _deepseek_v3(layers):
    """DeepSeek-V3's stack: dense layers first (``first_k_dense_replace``), then routed experts."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    torch.manual_seed(0)
    return DeepseekV3ForCausalLM(DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
        first_k_dense_replace=2, n_group=2, topk_group=1, q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8,
        qk_rope_head_dim=4, v_head_dim=8, max_position_embeddings=32, use_cache=False))


@pytest.mark.parametrize("factory,stack", [
    (lambda: _gemma3(10), Stack("model.layers", 10, start=1, period=3)),    # layers 0-6 exported
    (lambda: _gpt_oss(7), Stack("model.layers", 7, start=1, period=2)),     # sliding and full in turn
    (lambda: _deepseek_v3(6), Stack("model.layers", 6, start=3, period=1)),  # two dense layers first
])
def test_a_stack_repeating_in_units_or_after_other_layers_stamps_as_the_whole_export(factory, stack, monkeypatch,
                                                                                      caplog):
    """Layers that repeat in units (Gemma 3, GPT-OSS) are stamped unit by unit from the
    second unit exported, and layers alike only after a few others (DeepSeek-V3's dense
    layers) from the second alike one after them: node for node the whole export."""
    model = factory()
    assert find_stack(model) == stack
    with caplog.at_level(logging.INFO, "autopar.capture"):
        stamped = capture(model, (), example_kwargs=_batch(), model_loss="required")
    assert f"exported with its first {stack.kept} of {stack.depth} layers" in caplog.text
    whole = _whole(monkeypatch, factory(), example_kwargs=_batch(), model_loss="required")
    assert _facts(stamped) == _facts(whole)
    assert stamped.code == whole.code


def test_the_rank_programs_of_a_stamped_capture_are_the_whole_ones(monkeypatch):
    batch = _batch()

    def programs():
        model = _llama(5)
        plan = autopar.plan(model, 2, example_kwargs=batch, strategy={"tensor": 2})
        return [rank_graph_code(autopar.rank_graph(model, plan, rank, example_kwargs=batch), plan, rank)
                for rank in range(2)]

    stamped = programs()
    monkeypatch.setenv("AUTOPAR_STAMP_LAYERS", "0")
    assert programs() == stamped
    assert "model_model_layers_4_mlp_down_proj" in stamped[0].replace(".", "_")


class _Layer(nn.Module):
    def __init__(self, index: int, window: int | None = None):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.layer_idx = index   # its own index: no difference between layers
        self.window = window

    def forward(self, x):
        return torch.relu(self.fc(x)) + x


class _Scaled(_Layer):
    """A layer computing with its own index: ``y * (layer_idx + 1)``."""

    def forward(self, x):
        return self.fc(x) * (self.layer_idx + 1)


class _Stack(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        if x.shape[0] > 1:   # symbolic tracing cannot branch on a shape: exported
            for layer in self.layers:
                x = layer(x)
        return self.head(x)


def test_layers_that_differ_are_no_stack():
    assert find_stack(_Stack([_Layer(i) for i in range(5)])) == Stack("layers", 5)
    assert find_stack(_Stack([_Layer(i) for i in range(3)])) is None                       # too short
    assert find_stack(_Stack([_Layer(i, window=4 if i % 2 else None) for i in range(5)])) is None  # no unit to stamp
    # in units of two: layer 0 before them, units 1-2 and 3-4 exported, 5-6 and 7-8 stamped
    assert find_stack(_Stack([_Layer(i, window=4 if i % 2 else None) for i in range(9)])) == Stack("layers", 9, 1, 2)
    # alike after two others: layer 2 before them, 3 checked, 4 the template
    assert find_stack(_Stack([_Layer(i, window=i if i < 2 else None) for i in range(6)])) == Stack("layers", 6, 3, 1)
    assert find_stack(_Stack([_Layer(i, window=2 * i + 1) for i in range(6)])) is None   # no two alike
    tied = _Stack([_Layer(i) for i in range(5)])
    tied.layers[3].fc.weight = tied.layers[1].fc.weight
    assert find_stack(tied) is None
    shared = _Layer(0)
    assert find_stack(_Stack([shared] * 5)) is None


def test_a_layer_computing_with_its_index_is_exported_whole(monkeypatch, caplog):
    """``y * (layer_idx + 1)`` makes every layer's graph its own: a layer whose code
    computes with the attribute holding its index (a comparison, a condition, arithmetic)
    is no stack, and the whole model is exported."""
    def model(layer=_Scaled):
        torch.manual_seed(0)
        return _Stack([layer(i) for i in range(5)])

    assert find_stack(model()) is None and find_stack(model(_Layer)) == Stack("layers", 5)
    x = torch.randn(4, 8)
    with caplog.at_level(logging.DEBUG, "autopar.capture"):
        got = capture(model(), (x,), tracer="export")
    assert "exported with its first" not in caplog.text
    assert _facts(got) == _facts(_whole(monkeypatch, model(), (x,), tracer="export"))


class _Looped(_Stack):
    """The model's own code at a depth the shallow export does not reach: a step after
    its middle layer, and one on a layer's position in its loop."""

    def __init__(self, layers, at: int):
        super().__init__(layers)
        self.at = at

    def forward(self, x):
        if x.shape[0] > 1:
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i == self.at:
                    x = x * 0.5
        return self.head(x)


@pytest.mark.parametrize("at", [2, 4, 7])
def test_the_models_own_code_between_later_layers_is_exported_whole(at, monkeypatch, caplog):
    """A step of the model after layer ``at``: where the shallow export keeps that layer
    (2, the last kept) it lies between two layers, where it does not (4, 7) only the
    export with stub layers at the whole depth shows it; either way the whole model is
    exported, node for node the model's."""
    def model():
        torch.manual_seed(0)
        return _Looped([_Layer(i) for i in range(9)], at)

    x = torch.randn(4, 8)
    with caplog.at_level(logging.DEBUG, "autopar.capture"):
        got = capture(model(), (x,), tracer="export")
    assert "exported whole" in caplog.text and "exported with its first" not in caplog.text
    assert _facts(got) == _facts(_whole(monkeypatch, model(), (x,), tracer="export"))


class _Counted(_Stack):
    """Runs its layers by a count of its own: cut short, its forward fails."""

    def forward(self, x):
        if x.shape[0] > 1:
            for i in range(5):
                x = self.layers[i](x)
        return self.head(x)


def test_a_model_that_cannot_run_cut_short_is_exported_whole(monkeypatch, caplog):
    def model():
        torch.manual_seed(0)
        return _Counted([_Layer(i) for i in range(5)])

    x = torch.randn(4, 8)
    with caplog.at_level(logging.DEBUG, "autopar.capture"):
        got = capture(model(), (x,), tracer="export")
    assert "does not export" in caplog.text
    assert _facts(got) == _facts(_whole(monkeypatch, model(), (x,), tracer="export"))


def test_an_exported_model_called_at_shapes_it_cannot_take_fails_its_capture():
    """An export's specs are read off its fake values, which no index out of range
    stops; at shapes other than the example's the export is run, and a sequence past
    GPT-2's 16 positions fails the capture with both shapes named, as a symbolic trace's."""
    torch.manual_seed(0)
    model = gpt2(2, positions=16)
    ids = torch.randint(0, 64, (2, 8))
    pm = autopar.compile(model, None, example_kwargs={"input_ids": ids, "labels": ids}, strategy={"data": 1})
    assert pm.step(input_ids=ids, labels=ids).dim() == 0
    long = torch.randint(0, 64, (2, 32))
    with pytest.raises(CaptureError, match=r"inputs of shapes \[\[2, 32\], \[2, 32\]\] differ"):
        pm.step(input_ids=long, labels=long)
