"""The fusion pass and its generated Triton kernels (docs/fusion.md), run on CPU tensors
in Triton's interpreter (conftest sets TRITON_INTERPRET=1): each kernel's forward and
backward against the unfused ops, dropout masks against unfused rank-aware dropout,
fallbacks with their reasons, the cost model's view of fusion, and a whole transformer
fused and unfused on 2 gloo ranks."""
import copy
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import shared_ranks
from autopar.trace.capture import capture
from autopar.passes.fusion.rewrite import FUSION, fusion_pass
from autopar.runtime import draws, philox, rng

triton = pytest.importorskip("triton")


def _fused(model, inputs):
    gm = fusion_pass(capture(model, inputs))
    return gm, gm.meta[FUSION]


def _run(fn, inputs, params):
    """Outputs of ``fn`` and the gradients of a fixed random projection of them."""
    inputs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    for p in params:
        p.grad = None
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    torch.manual_seed(123)
    loss = sum((o.float() * torch.randn(o.shape)).sum() for o in outs)
    loss.backward()
    grads = [x.grad for x in inputs if x.requires_grad] + [p.grad for p in params]
    return [o.detach() for o in outs], grads


def _assert_close(a, b, rtol=1e-5):
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is None:
            continue
        scale = y.abs().max().item() + 1e-12
        assert torch.allclose(x.float(), y.float(), rtol=rtol, atol=rtol * scale), (x - y).abs().max()


def _check(model, inputs, expect_pattern, rtol=1e-5):
    """Fused equals unfused, forward and backward (inputs and parameters)."""
    gm, report = _fused(copy.deepcopy(model), inputs)
    if expect_pattern is not None:
        assert report.kernels, report.summary()
        assert any(name.startswith(expect_pattern) for name, _ in report.uses), report.summary()
    fused_params = [p for _, p in sorted(gm.named_parameters())]
    ref_params = [p for _, p in sorted(model.named_parameters())]
    out_f, grad_f = _run(gm, inputs, fused_params)
    out_r, grad_r = _run(model, inputs, ref_params)
    _assert_close(out_f, out_r, rtol)
    assert len(grad_f) == len(grad_r)
    _assert_close(grad_f, grad_r, rtol)
    return report


class BiasGelu(nn.Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.fc = nn.Linear(8, 24)
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(self.fc(x), approximate=self.approximate)


class ScaleMaskSoftmax(nn.Module):
    def forward(self, scores):
        T = scores.shape[-1]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        return F.softmax((scores * 0.125).masked_fill(~causal, float("-inf")), dim=-1)


class BiasDropoutAddNorm(nn.Module):
    """Megatron's bias+dropout+add, then the next block's layer norm (megatron §5.8)."""

    def __init__(self, p=0.25):
        super().__init__()
        self.b = nn.Parameter(torch.randn(24))
        self.ln = nn.LayerNorm(24)
        self.p = p

    def forward(self, y, residual):
        h = residual + draws.dropout(y + self.b, self.p, True, _form="dropout", _site=3, _at=(None, None, None))
        return h, self.ln(h)


class SwiGLU(nn.Module):
    """Llama's gate: silu(a) * b, then a scale and a cast round trip through bf16."""

    def forward(self, a, b):
        return (F.silu(a) * b * 0.5).to(torch.bfloat16).float()


class Mixed(nn.Module):
    """Every other primitive once: sub, div, neg, exp, sigmoid, tanh, relu, pow, sqrt, rsqrt, erf."""

    def forward(self, x, y):
        z = torch.sigmoid(x) - torch.tanh(y) / (1.5 + torch.exp(-x.abs()))
        z = -torch.relu(z) + z ** 2 + torch.sqrt(y * y + 1.0) * torch.rsqrt(x * x + 2.0)
        return torch.erf(z) + z ** 3


def _states():
    return rng.use_random_states(rng.RandomStates(7))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_matches_unfused(approximate):
    torch.manual_seed(0)
    report = _check(BiasGelu(approximate), (torch.randn(2, 3, 8),), "bias_gelu")
    assert report.biases_split == 1


def test_scale_mask_softmax_matches_unfused():
    torch.manual_seed(0)
    _check(ScaleMaskSoftmax(), (torch.randn(2, 3, 5, 5),), "scale_mask_softmax")


def test_bias_dropout_add_layer_norm_matches_unfused_with_the_same_masks():
    torch.manual_seed(0)
    model = BiasDropoutAddNorm()
    inputs = (torch.randn(2, 5, 24), torch.randn(2, 5, 24))
    with _states():   # capture runs the model once
        gm, report = _fused(copy.deepcopy(model), inputs)
    assert [name.split("_")[:4] for name, _ in report.uses] == [["bias", "dropout", "add", "layer"]]
    # the same key for both: the fused kernel draws the mask the unfused dropout draws
    with _states():
        out_f, grad_f = _run(gm, inputs, [p for _, p in sorted(gm.named_parameters())])
    with _states():
        out_r, grad_r = _run(model, inputs, [p for _, p in sorted(model.named_parameters())])
    dropped = (out_r[0] - inputs[1] == 0)
    assert 0.1 < dropped.float().mean() < 0.4   # p = 0.25 was applied
    assert torch.equal(out_f[0] - inputs[1] == 0, dropped)   # the same elements dropped
    _assert_close(out_f, out_r)
    _assert_close(grad_f, grad_r)


def test_kernel_dropout_mask_is_the_unfused_mask_over_global_indices():
    """A fused dropout keeps exactly the elements the unfused one keeps
    (:func:`autopar.runtime.rng.keep_mask` over each element's index in the whole value):
    on rows 3..5 of a batch of 9 they are rows 3..5 of the whole batch's mask."""
    layout = (("rows", 1), None)

    class Drop(nn.Module):
        def forward(self, x):
            return draws.dropout(x * 1.0 + 0.0, 0.5, True, _form="dropout", _site=2, _at=layout) * 2.0

    x = torch.ones(3, 37)
    with _states():
        gm, report = _fused(Drop(), (x,))
    assert len(report.uses) == 1
    states = rng.RandomStates(11)
    states.calls = 4
    with rng.use_random_states(states), rng.rows(3, 3, 9):
        fused = gm(x)
        unfused = Drop()(x)
        mask = rng.keep_mask(x.shape, 0.5, 2, layout)
    with rng.use_random_states(states):
        whole = rng.keep_mask((9, 37), 0.5, 2, (None, None))
    assert torch.equal(fused, unfused)
    assert torch.equal(fused != 0, mask) and torch.equal(mask, whole[3:6])
    assert 0.3 < mask.float().mean() < 0.7


def test_swiglu_and_casts_match_unfused():
    torch.manual_seed(0)
    _check(SwiGLU(), (torch.randn(4, 16), torch.randn(4, 16)), "swiglu")


class WrittenOutRMSNorm(nn.Module):
    """Llama's RMS norm as Hugging Face writes it (LlamaRMSNorm.forward), after a residual
    add: the fp32 round trip, ``pow(2).mean(-1, keepdim=True)``, ``rsqrt(var + eps)``."""

    def __init__(self, n=16, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(n))
        self.eps = eps

    def forward(self, x, residual):
        h = x + residual
        dtype = h.dtype
        hidden = h.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.eps)
        return self.weight * hidden.to(dtype), h


class TorchRMSNorm(nn.Module):
    """torch's own spellings: ``nn.RMSNorm`` and ``F.rms_norm`` (eps None: the dtype's)."""

    def __init__(self, n=16):
        super().__init__()
        self.norm = nn.RMSNorm(n, eps=1e-5)
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(n))

    def forward(self, x):
        return F.rms_norm(self.norm(x) * 2.0, (x.shape[-1],), self.weight)


def test_rms_norm_matches_unfused():
    """The RMS norm in Llama's written-out form (with the residual add before it: one
    kernel) and in torch's spellings: forward, and backward to inputs and weights."""
    torch.manual_seed(0)
    report = _check(WrittenOutRMSNorm(), (torch.randn(2, 5, 16), torch.randn(2, 5, 16)), "add_rms_norm")
    assert len(report.uses) == 1, report.summary()
    _check(TorchRMSNorm(), (torch.randn(3, 16),), "rms_norm")


def _rotate_half(x):
    """Hugging Face's rotate_half (modeling_llama), the function itself."""
    from transformers.models.llama.modeling_llama import rotate_half
    return rotate_half(x)


class Rotary(nn.Module):
    """Llama's apply_rotary_pos_emb: queries and keys ``[B, H, T, D]``, ``cos`` and ``sin``
    ``[B, T, D]`` unsqueezed to broadcast over the heads (a broadcast over an inner
    dimension); keys with fewer heads (grouped-query attention)."""

    def forward(self, q, k, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def test_rotary_embedding_matches_unfused():
    """Forward, and backward to the queries, keys, cos and sin (summed over the heads they
    were broadcast along); in the symbolic-trace spelling here, in torch.export's (ATen
    slices) in the Llama test below."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    angles = torch.randn(2, 5, 4)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    report = _check(Rotary(), (q, k, cos, sin), "rotary")
    assert len(report.uses) == 2, report.summary()   # the queries' and the keys' (another head count)


def test_llama_blocks_fuse_rms_norm_swiglu_and_rotary():
    """A Hugging Face Llama (2 blocks, random weights) fused and unfused: its RMS norms
    (with the residual adds), SwiGLU gates and rotary embeddings become generated
    kernels, and logits and every gradient agree."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16, use_cache=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 8))
    gm, report = _fused(copy.deepcopy(model), (ids,))
    names = [name for name, _ in report.uses]
    assert any("rms_norm" in n for n in names) and any(n.startswith("swiglu") for n in names), report.summary()
    assert any(n.startswith("rotary") for n in names), report.summary()
    logits = gm(ids)
    logits = logits.logits if hasattr(logits, "logits") else logits
    logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    reference = model(ids).logits
    _assert_close([logits], [reference])
    weights = torch.randn(reference.shape, generator=torch.Generator().manual_seed(1))
    (logits.float() * weights).sum().backward()
    (reference * weights).sum().backward()
    fused_grads = dict(gm.named_parameters())
    for name, p in model.named_parameters():
        match = [g for n, g in fused_grads.items() if n.endswith(name)]
        assert match and match[0].grad is not None, name
        _assert_close([match[0].grad], [p.grad])


def test_every_primitive_matches_unfused():
    torch.manual_seed(0)
    _check(Mixed(), (torch.randn(6, 10), torch.randn(6, 10)), "sigmoid")


class _TwoViews(nn.Module):
    def forward(self, x, y):
        v1, v2 = torch.exp(x).view(4, 6), torch.exp(y).view(6, 4)
        return v1.t().reshape(-1), (v1 + 1) * 1.0, v2.t().reshape(-1), (v2 + 1) * 1.0


class _Crossed(nn.Module):
    """Two chains, each reading the other's first value: fused together they would wait
    on each other (``cycle``); or one reading a value the other only has after a matmul."""

    def __init__(self, cycle: bool):
        super().__init__()
        self.w, self.w2, self.cycle = nn.Parameter(torch.randn(4, 4)), nn.Parameter(torch.randn(4, 4)), cycle

    def forward(self, a, b, x):
        c0, n = torch.exp(a), torch.exp(b)
        r = c0 @ self.w
        z = x @ self.w2
        m = torch.where(z > 0, n, c0) if self.cycle else n + z
        return (c0 * n) * 1.0, m * 1.0, r


class _BiasThroughView(nn.Module):
    def __init__(self, out: int, shape: tuple):
        super().__init__()
        self.fc, self.shape = nn.Linear(8, out), shape

    def forward(self, x):
        return F.gelu(self.fc(x).view(*self.shape)) * 2


class _Pow(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c

    def forward(self, x):
        return torch.exp(x) ** self.c * 2


@pytest.mark.parametrize("case", ["two views", "cycle", "late input", "view splits rows", "view flattens",
                                  "view adds a dim", "pow -1", "pow -0.5", "bf16 then upcast"])
def test_reviewed_edge_cases_match_unfused(case):
    """Chains that must not share a kernel, chains that would wait on each other, bias
    splits through views, negative exponents and rounding before an upcast."""
    torch.manual_seed(0)
    four = [torch.randn(4, 4) for _ in range(3)]
    model, inputs = {
        "two views": (_TwoViews(), (torch.randn(2, 12), torch.randn(2, 12))),
        "cycle": (_Crossed(True), four),
        "late input": (_Crossed(False), four),
        "view splits rows": (_BiasThroughView(12, (2, 3, 3, 4)), (torch.randn(2, 3, 8),)),
        "view flattens": (_BiasThroughView(12, (-1,)), (torch.randn(2, 3, 8),)),
        "view adds a dim": (_BiasThroughView(4, (2, 3, 4, 1)), (torch.randn(2, 3, 8),)),
        "pow -1": (_Pow(-1), (torch.rand(4, 8) + 0.5,)),
        "pow -0.5": (_Pow(-0.5), (torch.rand(4, 8) + 0.5,)),
        "bf16 then upcast": (SwiGLU(), (torch.randn(8, 8), torch.randn(8, 8))),
    }[case]
    if case == "bf16 then upcast":
        class Upcast(nn.Module):
            def forward(self, x, y):
                return ((x + y).float() * 3).bfloat16() * 2
        model, inputs = Upcast(), tuple(x.bfloat16() for x in inputs)
    report = _check(model, tuple(inputs), None)
    if case == "cycle":
        assert not report.uses and "wait on each other" in report.skipped[0][1]
    if case == "late input":
        assert len(report.uses) == 1 and "computed after a reader" in report.skipped[0][1]
    if case == "two views":
        assert len(report.kernels) == 2


def test_the_generated_backward_is_not_differentiated_again():
    torch.manual_seed(0)
    gm, _ = _fused(BiasGelu(), (torch.randn(2, 8),))
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="higher-order gradients"):
        torch.autograd.grad(gm(x).sum(), x, create_graph=True)


def test_bf16_bias_gelu_matches_the_fp32_ops_rounded_once():
    """bf16 in the interpreter: the kernel computes in fp32 and rounds once; eager bf16
    rounds after every op, so the two agree to bf16's precision."""
    torch.manual_seed(0)
    model = BiasGelu().to(torch.bfloat16)
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    gm, report = _fused(copy.deepcopy(model), (x,))
    assert report.kernels
    out = gm(x)
    assert out.dtype == torch.bfloat16
    reference = F.gelu(F.linear(x.float(), model.fc.weight.float()).to(torch.bfloat16).float()
                       + model.fc.bias.float())
    assert torch.allclose(out.float(), reference, rtol=1e-2, atol=1e-2)
    _assert_close([out], [model(x)], rtol=2e-2)


def test_philox_in_pytorch_equals_tritons_randint4x_beyond_32_bit_counters():
    """All four words of every counter, offsets past 2^32 included (their high word is the
    counter's second: the global index of an element of a large value)."""
    import triton.language as tl

    @triton.jit
    def words(out_ptr, seed, base, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        a, b, c, d = tl.randint4x(seed, offs.to(tl.int64) + base)
        for k, w in enumerate((a, b, c, d)):
            tl.store(out_ptr + k * n + offs, w.to(tl.int64) & 0xFFFFFFFF, mask=offs < n)

    for seed, base in ((2**62 + 5, 0), (2**63 - 1, 2**33 + 7), (rng.RandomStates(3).site_seed(1), 2**40)):
        got = torch.empty(4, 300, dtype=torch.int64)
        words[(3,)](got, seed, base, 300, BLOCK=128)
        expect = philox.philox4(seed, torch.arange(300) + base)
        for k in range(4):
            assert torch.equal(got[k], expect[k]), (seed, base, k)
    kept = philox.keep_mask(2**62 + 9, (100, 100), 0.3).float().mean().item()
    assert abs(kept - 0.7) < 0.02


def test_a_mask_broadcast_over_inner_dimensions_is_read_by_its_strides():
    class PaddingMask(nn.Module):
        def forward(self, scores, mask):   # HF-style [B, 1, 1, T] additive mask
            return F.softmax(scores * 0.5 + mask, dim=-1)

    torch.manual_seed(0)
    report = _check(PaddingMask(), (torch.randn(2, 3, 4, 4), torch.randn(2, 1, 1, 4)), "scale_mask_softmax")
    (kernel,) = report.kernels
    assert [i.kind for i in kernel.chain.tensors] == ["full", "broadcast"]


@pytest.mark.parametrize("case", ["rms_norm", "rotary", "swiglu"])
def test_llama_kernels_in_bf16_match_unfused_to_bf16_precision(case):
    """bf16 as Llama trains on a GPU: the kernels compute in fp32 and round at the casts
    and outputs, eager bf16 after every op; forward and backward agree to bf16's precision."""
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    if case == "rms_norm":
        model, inputs = WrittenOutRMSNorm().to(bf16), (torch.randn(2, 5, 16), torch.randn(2, 5, 16))
        case = "add_rms_norm"
    elif case == "rotary":
        angles = torch.randn(2, 5, 4)
        model, inputs = Rotary(), (torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8),
                                   torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin())
    else:
        model, inputs = SwiGLU(), (torch.randn(4, 16), torch.randn(4, 16))
    _check(model, tuple(x.to(bf16) for x in inputs), case, rtol=2e-2)


class _ComputedNormShape(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(1.0 + 0.1 * torch.randn(8))

    def forward(self, x):   # the normalized shape computed in the graph under symbolic tracing
        return F.rms_norm(x * 2.0, x.shape[-1:], self.w) + F.layer_norm(x, x.shape[-1:]) + 1.0


class _MeanReadOutside(nn.Module):
    def forward(self, x):   # the row mean is an output: the softmax chain still fuses
        h = torch.exp(x * 2)
        return torch.softmax(h, -1), h.mean(-1, keepdim=True)


class _RotateComputed(nn.Module):
    def forward(self, q, cos, sin):   # the rotated value is computed first: it stays out of the rotary kernel
        q = q * 2 + 1
        return q * cos.unsqueeze(1) + _rotate_half(q) * sin.unsqueeze(1)


@pytest.mark.parametrize("case", ["computed norm shape", "row mean read outside", "rotated value computed"])
def test_reviewed_row_and_rotary_edge_cases_match_unfused(case):
    """What a review of the row and rotary kernels found: a normalized shape the graph
    computes (not recognised, no crash), a row reduction read outside its chain (the
    chain around it still fuses), a rotation of a value the chain computes (it is loaded,
    not rotated in registers)."""
    torch.manual_seed(0)
    angles = torch.randn(2, 5, 4)
    model, inputs, pattern = {
        "computed norm shape": (_ComputedNormShape(), (torch.randn(3, 8),), None),
        "row mean read outside": (_MeanReadOutside(), (torch.randn(4, 8),), "scale_exp_softmax"),
        "rotated value computed": (_RotateComputed(), (torch.randn(2, 4, 5, 8), torch.cat((angles, angles), -1).cos(),
                                                      torch.cat((angles, angles), -1).sin()), "rotary"),
    }[case]
    report = _check(model, inputs, pattern)
    if case == "rotated value computed":
        assert len(report.uses) == 2, report.summary()   # q * 2 + 1, then the rotary


def test_an_unfusable_chain_falls_back_with_the_reason_logged(caplog):
    class Leaky(nn.Module):
        def forward(self, x):
            var = x.pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(var + 1e-6), var

    with caplog.at_level(logging.INFO, logger="autopar.fusion"):
        gm, report = _fused(Leaky(), (torch.randn(4, 8),))
    assert not report.kernels
    (names, reason), = report.skipped
    assert "(one value per row) is read outside the chain" in reason, report.summary()
    assert "stay unfused" in caplog.text and "one value per row" in caplog.text
    x = torch.randn(4, 8)
    for a, b in zip(gm(x), Leaky()(x)):
        assert torch.equal(a, b)


def test_unsupported_dtype_falls_back():
    model = BiasGelu().double()
    gm, report = _fused(model, (torch.randn(2, 8, dtype=torch.float64),))
    assert not report.kernels
    assert "float64" in report.skipped[0][1]


def test_fusion_true_on_cpu_without_the_interpreter_is_a_clear_error(monkeypatch):
    from autopar.passes.fusion import resolve_fusion
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        resolve_fusion(True, torch.device("cpu"))
    assert resolve_fusion(None, torch.device("cpu")) is False
    assert resolve_fusion(False, torch.device("cuda")) is False


def test_the_planner_prices_a_fused_chain_as_one_kernel():
    """On GPU hardware the chain's ops cost one kernel's launch and bytes: the predicted
    step drops, and by about what the unfused intermediate tensors cost."""
    import dataclasses

    import autopar
    from autopar.cost.hardware import get_hardware
    from examples.models import TinyTransformer, lm_loss
    x = torch.randint(0, 64, (8, 16))
    h100 = get_hardware("h100")
    unfused = dataclasses.replace(h100, fused_kernels=False)
    fused_plan = autopar.plan(TinyTransformer(), 1, (x,), lm_loss, example_target=x, hardware=h100)
    plain_plan = autopar.plan(TinyTransformer(), 1, (x,), lm_loss, example_target=x, hardware=unfused)
    assert fused_plan.fusion and not plain_plan.fusion
    assert fused_plan.step_s < plain_plan.step_s
    assert "fused into generated kernels" in fused_plan.explain()


# ---------------------------------------------------------------- 2 gloo ranks

def _transformers_fused_and_not():
    """TinyTransformer (symbolic trace), GPT-2 with dropout 0.1 and Llama (torch.export;
    its RMS norms, SwiGLU and rotary embeddings over the rank's 2 of 4 heads and 1 of 2 key
    heads) under Megatron tensor 2, and GPT-2 on a 2-stage pipeline, two steps each, fused
    and not, in the same processes."""
    import autopar
    from transformers import GPT2Config, GPT2LMHeadModel
    from examples.models import TinyTransformer, gpt2_loss, lm_loss

    def gpt2_dropout():
        cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, use_cache=False,
                         resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, bos_token_id=0, eos_token_id=0)
        return GPT2LMHeadModel(cfg)

    def llama():
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16, use_cache=False)
        return LlamaForCausalLM(cfg)

    out = {}
    megatron, pipeline = {"data": 1, "tensor": 2}, {"pipeline": 2, "microbatches": 2}
    for name, factory, loss_fn, strategy in (("tiny", TinyTransformer, lm_loss, megatron),
                                             ("gpt2", gpt2_dropout, gpt2_loss, megatron),
                                             ("llama", llama, gpt2_loss, megatron),
                                             ("gpt2-pipeline", gpt2_dropout, gpt2_loss, pipeline)):
        for fusion in (True, False):
            torch.manual_seed(0)
            model = factory()
            x, y = torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))
            pm = autopar.compile(model, None, example_inputs=(x,), loss_fn=loss_fn, example_target=y,
                                 strategy=strategy, fusion=fusion)
            optimizer = torch.optim.SGD(pm.parameters(), lr=0.1)
            losses = []
            for _ in range(2):   # a step, an optimizer step, a step
                optimizer.zero_grad()
                losses.append(pm.step(x, target=y).item())
                grads = {k: v for k, v in pm.full_gradients().items() if v is not None}
                optimizer.step()
            if name == "tiny":   # and the single-device model, trained the same way
                torch.manual_seed(0)
                reference = factory()
                sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
                for _ in range(2):
                    sgd.zero_grad()
                    loss = loss_fn(reference(x), y)
                    loss.backward()
                    sgd.step()
                losses.append(loss.item())
            code = pm.rank_graph_code() if strategy is megatron else ""
            out[name, fusion] = (losses, grads, [line.split("'")[1] for line in code.splitlines()
                                                 if "fused_kernel(" in line])
    return out


# one launch with other modules' jobs (tests/shared_ranks.py)
_LAUNCHED = shared_ranks.register(2, __name__, _transformers_fused_and_not, timeout_s=600)


@pytest.mark.multiprocess
def test_transformers_fused_equal_unfused_on_two_ranks():
    results = _LAUNCHED()
    for out in results:
        for name in ("tiny", "gpt2", "llama", "gpt2-pipeline"):
            (loss_on, grads_on, kernels), (loss_off, grads_off, none) = out[name, True], out[name, False]
            assert (kernels or name == "gpt2-pipeline") and not none
            assert loss_on == pytest.approx(loss_off, rel=1e-5)   # both steps (after an optimizer step)
            for key, g in grads_off.items():
                scale = g.abs().max().item() + 1e-12
                assert (grads_on[key] - g).abs().max().item() <= 1e-5 * scale, key
        fused, _, _ = out["tiny", True]
        assert fused[1] == pytest.approx(fused[2], rel=1e-5)   # the single-device model after the same SGD step
        assert any(k.startswith("bias_gelu") for k in out["tiny", True][2])
        assert any(k.startswith("scale_mask_softmax") for k in out["tiny", True][2])
        assert any("dropout_add_layer_norm" in k for k in out["gpt2", True][2])
        assert {"add_rms_norm", "swiglu", "rotary"} <= {k.rsplit("_", 1)[0] for k in out["llama", True][2]}
    # the tensor ranks drew the same replicated masks, so they report the same losses
    assert results[0]["gpt2", True][0] == results[1]["gpt2", True][0]


def test_pipeline_stages_are_fused():
    import autopar
    from autopar.driver.rank_program import rewrite
    from autopar.strategies.pipeline.program import stage_graphs
    from examples.models import gpt2, gpt2_loss
    x = torch.randint(0, 64, (8, 16))
    plan = autopar.plan(gpt2(), 2, (x,), gpt2_loss, strategy={"pipeline": 2, "microbatches": 4}, example_target=x)
    for rank in (0, 1):
        built, _, _ = stage_graphs(gpt2(), plan, rank, (x[:2],), gpt2_loss, x[:2], fusion=True, rewrite=rewrite)
        for module, _ in built.values():
            assert module.meta[FUSION].uses, f"rank {rank}: nothing fused"
