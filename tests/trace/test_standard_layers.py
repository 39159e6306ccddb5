"""PyTorch's standard transformer layers (``nn.MultiheadAttention``,
``nn.TransformerEncoderLayer``/``DecoderLayer`` and their stacks) are read by analysis in
both capture spellings, split like hand-written attention, and train like the
single-device model.

Tier 1 captures small models with ``symbolic_trace`` (autopar's spelling of the modules,
``autopar/trace/standard_layers.py``) and ``export`` (PyTorch's slow path in ATen), runs the
analysis, and checks the regions found and their details, and that each rank's rewrite
has a rule for every node. Tier 2 trains the models of ``examples/standard_layers.py`` on
4 gloo ranks under every family, in one spawn, against the single-device model.
"""
import logging

import pytest
import torch
import torch.nn as nn

import autopar
from autopar.trace.capture import capture
from autopar.ir import regions
from autopar.passes.analysis.analyse import analyse
from autopar.strategies.megatron.rewrite import tensor_parallel_pass
from autopar.strategies.shared.tensor_rewrite import regions_without_rules
import shared_ranks
from examples.coverage import is_equal
from examples.models import lm_loss
from examples.standard_layers import HEADS, SEQ, VOCAB, WIDTH, model, standard_layers_job

TRACERS = ["symbolic_trace", "export"]


def _ids(batch=2):
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(0))


def _analysed(m: nn.Module, *inputs, tracer: str):
    gm = capture(m, inputs, tracer=tracer)
    analyse(gm)
    return gm


def _by_kind(gm, kind):
    return [r.details for r in regions(gm, kind)]


def _splits_without_fallback(gm, degree=2):
    """Every attention, MLP and vocabulary region has a rule for each node at ``degree``."""
    ids = [r.id for r in regions(gm) if r.kind in ("attention", "linear_chain", "vocab")]
    return regions_without_rules(gm, ids, degree) == {}


# ---------------------------------------------------------------------- tier 1: regions

@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layers_give_one_attention_and_one_mlp_each(tracer, batch_first, norm_first):
    from examples.standard_layers import EncoderLM
    gm = _analysed(EncoderLM(batch_first=batch_first, norm_first=norm_first), _ids(), tracer=tracer)
    attention = _by_kind(gm, "attention")
    assert len(attention) == 2
    for d in attention:
        # the packed in-projection: one linear split three ways, each block by heads
        assert d["fused_qkv"] and d["qkv_blocks"] == 3 and d["q_proj"] == d["k_proj"] == d["v_proj"]
        assert (d["heads"], d["kv_heads"], d["head_dim"], d["hidden"]) == (HEADS, HEADS, WIDTH // HEADS, WIDTH)
        assert d["out_proj"] != d["q_proj"]
    mlps = _by_kind(gm, "linear_chain")
    assert [d["hidden"] for d in mlps] == [2 * WIDTH, 2 * WIDTH]
    assert all(len(d["column"]) == 1 for d in mlps)
    assert [d["module_class"] for d in _by_kind(gm, "block")] == ["TransformerEncoderLayer"] * 2
    assert gm.meta["autopar.capture"].tracer == tracer
    assert _splits_without_fallback(gm)


def test_symbolic_spelling_names_the_modules_parameters():
    from examples.standard_layers import EncoderLM
    gm = _analysed(EncoderLM(), _ids(), tracer="symbolic_trace")
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    assert "model.encoder.layers.0.self_attn.in_proj_weight" in targets
    first = regions(gm, "attention")[0].details
    assert first["out_proj"] == "model_encoder_layers_0_self_attn_out_proj"
    assert _by_kind(gm, "linear_chain")[0] == {"column": ["model_encoder_layers_0_linear1"],
                                              "row": "model_encoder_layers_0_linear2", "hidden": 2 * WIDTH,
                                              "pointwise": ["relu", "model_encoder_layers_0_dropout"]}


def test_export_spelling_is_the_slow_path_even_in_eval_without_grad():
    """Eval mode under no_grad is where PyTorch takes its fused fast path
    (``_transformer_encoder_layer_fwd``); capture keeps the readable slow path."""
    from examples.standard_layers import EncoderLM
    m = EncoderLM().eval()
    with torch.no_grad():
        gm = _analysed(m, _ids(), tracer="export")
    assert not any("transformer_encoder_layer_fwd" in str(n.target) or "native_multi_head" in str(n.target)
                   for n in gm.graph.nodes)
    assert len(_by_kind(gm, "attention")) == 2
    assert torch.backends.mha.get_fastpath_enabled()  # restored after capture


@pytest.mark.parametrize("tracer", TRACERS)
def test_masks_keep_the_regions(tracer):
    """A causal mask (a buffer) and a key-padding mask computed from the input."""
    from examples.standard_layers import EncoderLM
    for m in (EncoderLM(causal=True, spelling=tracer), EncoderLM(padding=True, spelling=tracer)):
        gm = _analysed(m, _ids(), tracer="auto")
        assert gm.meta["autopar.capture"].tracer == tracer
        assert len(_by_kind(gm, "attention")) == 2 and _splits_without_fallback(gm)


@pytest.mark.parametrize("tracer", TRACERS)
def test_decoder_self_attention_is_a_region_and_cross_attention_is_not(tracer):
    gm = _analysed(model("decoder"), _ids(), tracer=tracer)
    attention = _by_kind(gm, "attention")
    assert len(attention) == 2  # one self-attention per layer
    assert all(d["fused_qkv"] and d["heads"] == HEADS for d in attention)
    assert [d["hidden"] for d in _by_kind(gm, "linear_chain")] == [2 * WIDTH, 2 * WIDTH]
    assert _splits_without_fallback(gm)
    if tracer == "symbolic_trace":  # the cross-attention stays one opaque module call
        opaque = [n.target for n in gm.graph.nodes if n.op == "call_module" and n.target.endswith("multihead_attn")]
        assert opaque == ["model.decoder.layers.0.multihead_attn", "model.decoder.layers.1.multihead_attn"]


@pytest.mark.parametrize("tracer", TRACERS)
def test_nn_transformer_encoder_and_decoder(tracer):
    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, WIDTH)
            self.core = nn.Transformer(WIDTH, HEADS, 1, 1, 2 * WIDTH, dropout=0.0, batch_first=True)
            self.head = nn.Linear(WIDTH, VOCAB)

        def forward(self, src, tgt):
            return self.head(self.core(self.tok(src), self.tok(tgt)))

    gm = _analysed(Seq2Seq(), _ids(), _ids(), tracer=tracer)
    assert len(_by_kind(gm, "attention")) == 2  # encoder self-attention, decoder self-attention
    assert len(_by_kind(gm, "linear_chain")) == 2
    assert _splits_without_fallback(gm)


class StandaloneAttention(nn.Module):
    """A block written with ``nn.MultiheadAttention`` directly (need_weights defaults to True)."""

    def __init__(self, use_weights=False, **attention):
        super().__init__()
        self.use_weights = use_weights
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True, **attention)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        a, weights = self.attn(x, x, x)
        h = x + a
        out = h + self.fc2(torch.relu(self.fc1(h)))
        return out + weights.sum() if self.use_weights else out


@pytest.mark.parametrize("tracer", TRACERS)
def test_standalone_attention_dropping_its_weights(tracer):
    gm = _analysed(StandaloneAttention(), torch.randn(2, SEQ, WIDTH), tracer=tracer)
    if tracer == "symbolic_trace":
        # the weights nobody reads are not computed
        assert not any(n.op == "call_method" and n.target == "mean" for n in gm.graph.nodes)
        assert len(_by_kind(gm, "attention")) == 1
    # export spells need_weights=True as an explicit [B·H, T, T] softmax: not read
    assert len(_by_kind(gm, "linear_chain")) == 1


def test_standalone_attention_weights_used_are_computed_and_split_correctly():
    torch.manual_seed(0)
    m = StandaloneAttention(use_weights=True)
    x = torch.randn(2, SEQ, WIDTH)
    gm = _analysed(m, x, tracer="symbolic_trace")
    assert len(_by_kind(gm, "attention")) == 1
    torch.testing.assert_close(gm(x), m(x), rtol=1e-5, atol=1e-5)
    # the weights average over heads: a rank gathers its heads' weights first (a fallback)
    ids = [r.id for r in regions(gm, "attention")]
    assert regions_without_rules(gm, ids, 2) == {}


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("variant", [{"add_bias_kv": True}, {"kdim": 16, "vdim": 24}])
def test_unreadable_attention_stays_outside_regions_and_the_plan_is_made(tracer, variant, caplog):
    from examples.standard_layers import CrossKV, EncoderLM
    m = EncoderLM(attention=variant) if "add_bias_kv" in variant else CrossKV()
    with caplog.at_level(logging.INFO, logger="autopar.capture"):
        gm = _analysed(m, _ids(), tracer=tracer)
    assert _by_kind(gm, "attention") == []
    assert _by_kind(gm, "linear_chain")  # the MLPs around it still split
    if tracer == "symbolic_trace":
        assert "stays one opaque node" in caplog.text
    plan = autopar.plan(m, 4, (_ids(4),), lm_loss, {"data": 2, "tensor": 2}, example_target=_ids(4))
    split = {r.kind for r in plan.regions if r.strategy == "megatron"}
    assert "linear_chain" in split and "attention" not in split


@pytest.mark.parametrize("tracer", TRACERS)
def test_rank_graph_splits_heads_and_the_packed_projection(tracer):
    from examples.standard_layers import EncoderLM
    gm = _analysed(EncoderLM(batch_first=False), _ids(), tracer=tracer)
    ids = [r.id for r in regions(gm) if r.kind in ("attention", "linear_chain", "vocab")]
    tensor_parallel_pass(gm, megatron_regions=ids, degree=2, rank=0)
    shards = gm.meta["autopar.param_shards"]
    packed = shards["model.encoder.layers.0.self_attn.in_proj_weight"]
    assert (packed.dim, packed.blocks) == (0, 3)
    assert (shards["model.encoder.layers.0.self_attn.out_proj.weight"].dim,
            shards["model.encoder.layers.0.linear2.weight"].dim) == (1, 1)
    # nothing is gathered but the vocabulary-split logits at the output
    assert gm.code.count("gather_from_tensor_region(") == 1


# ---------------------------------------------------------------------- tier 2: on ranks

CASES = [
    ("encoder", {"data": 2, "tensor": 2}),
    ("encoder_seq_first_export", {"data": 2, "tensor": 2}),
    ("encoder_padding_export", {"data": 2, "tensor": 2}),
    ("encoder_export", {"x": 1, "y": 2, "z": 2}),
    ("decoder", {"data": 2, "tensor": 2}),
    ("kdim_vdim", {"data": 2, "tensor": 2}),
]


# repeats of paths the cases above take on another layout: the extended suite
EXTENDED = [
    ("encoder_seq_first", {"tensor": 4}),
    ("encoder_prenorm_export", {"tensor": 4}),
    ("encoder_causal", {"data": 2, "tensor": 2}),
    ("encoder", {"pipeline": 2, "tensor": 2}),
    ("bias_kv", {"data": 2, "tensor": 2}),
    ("encoder_seq_first_export", {"pipeline": 2, "data": 2}),
    ("encoder", "auto"),
    ("encoder_seq_first", {"data": 4, "subgrids": 2}),
]


# the 4-rank launch is shared with other modules' jobs (tests/shared_ranks.py)
_LAUNCHED = shared_ranks.register(4, __name__, standard_layers_job, (CASES,), timeout_s=900)
_EXTENDED = shared_ranks.register(4, __name__ + ":extended", standard_layers_job, (EXTENDED,), timeout_s=900,
                                  extended=True)


@pytest.fixture(scope="module")
def rows():
    return _LAUNCHED()


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{m}-{s}" for m, s in CASES])
def test_trains_like_the_single_device_model(rows, index):
    _check(rows[0][index], *CASES[index])


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(EXTENDED)), ids=[f"{m}-{s}" for m, s in EXTENDED])
def test_trains_like_the_single_device_model_extended(index):
    _check(_EXTENDED()[0][index], *EXTENDED[index])


def _check(row, name, strategy):
    assert "error" not in row, row.get("traceback")
    assert is_equal(row), {k: (row[k], row["worst_" + k]) for k in ("output", "loss", "grad", "grad_norm", "param")}
    expected = {"x": "tensor3d", "subgrids": "dsp"}
    family = next((f for key, f in expected.items() if isinstance(strategy, dict) and key in strategy), None)
    if family:
        assert family in row["strategies"], row["plan"]
    elif isinstance(strategy, dict) and strategy.get("tensor", 1) > 1:
        assert "megatron" in row["strategies"], row["plan"]
        attention = [line.split() for line in row["plan"].splitlines() if line.startswith("attention:")]
        if name in ("bias_kv", "kdim_vdim"):
            assert attention == []
        else:  # every attention of the model is split
            assert len(attention) == 2 and all(words[2] == "megatron" for words in attention), row["plan"]
    if isinstance(strategy, dict) and "pipeline" in strategy:
        assert row["mesh"]["pipeline"] == 2
    assert row["tracer"] == ("export" if name.endswith("_export") else "symbolic_trace")


@pytest.mark.multiprocess
def test_every_rank_reports_the_same_plan(rows):
    summary = [[(r.get("plan"), is_equal(r) if "error" not in r else None) for r in rank_rows] for rank_rows in rows]
    assert all(s == summary[0] for s in summary)
