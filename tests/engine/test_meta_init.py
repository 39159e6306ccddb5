"""Models compiled from the meta device (docs/guide/large_models.md).

In one process: a meta model compiles, refuses to run before its weights have values
and names what to call; ``init_weights`` gives the model's own initialisation (the
statistics of a Hugging Face Llama's and of ``nn`` layers built for real; rotary
``inv_freq`` exactly); a module whose parameters no scheme initialises is named.

On gloo ranks: ``init_weights(seed=0)`` gives a bit-identical ``full_state_dict()``
under four plans on 4 ranks, one on 2 ranks and one process; a differently seeded
model on one rank is refused at ``compile``, naming a parameter; Llama built on the
meta device and loaded (``load_pretrained``) from a safetensors file the single-device
model wrote trains as that model does (Qwen2-MoE's experts and the other plans in the
extended job); a meta-compiled rank never allocates a full-size tensor of a parameter it
holds a part of (compile, ``load_pretrained`` and a step under a dispatch mode that
records every allocation).
"""
import hashlib
import os
import shutil
import tempfile

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from safetensors.torch import save_model

import autopar
import shared_ranks
from autopar.engine.materialise import NotInitialisedError
from autopar.testing import compare_with_single_device

transformers = pytest.importorskip("transformers")

V, H, B, T = 96, 32, 2, 12


def llama(tie: bool = False, kv_heads: int = 2):
    config = transformers.LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=80, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
                                      tie_word_embeddings=tie)
    return transformers.LlamaForCausalLM(config)


def qwen_moe():
    config = transformers.Qwen2MoeConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                                         num_experts_per_tok=2, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=32, max_position_embeddings=64)
    return transformers.Qwen2MoeForCausalLM(config)


def gpt2():
    config = transformers.GPT2Config(vocab_size=V, n_embd=H, n_layer=2, n_head=4, n_positions=64)
    return transformers.GPT2LMHeadModel(config)


def nn_model():
    layer = nn.TransformerEncoderLayer(H, 4, 64, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.Linear(8, H), nn.LayerNorm(H), nn.TransformerEncoder(layer, 2), nn.Linear(H, 5))


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (B * 2, T), generator=g)
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}


def digest(state: dict) -> dict[str, str]:
    return {k: hashlib.sha256(v.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
            for k, v in state.items()}


def meta_init_digests(factory, strategy, kwargs=None, inputs=(), target=None, loss_fn=None):
    with torch.device("meta"):
        model = factory()
    pm = autopar.compile(model, None, example_inputs=inputs, example_kwargs=kwargs, strategy=strategy,
                         loss_fn=loss_fn, example_target=target)
    pm.init_weights(seed=0)
    return digest(pm.full_state_dict())


# ---------------------------------------------------------------------------- in one process
def test_meta_model_refuses_to_run_until_initialised():
    with torch.device("meta"):
        model = llama()
    kwargs = batch()
    pm = autopar.compile(model, None, example_kwargs=kwargs)
    assert all(p.device.type == "cpu" for p in pm.parameters())
    with pytest.raises(NotInitialisedError, match=r"init_weights\(seed=...\).*load_pretrained"):
        pm.step(**kwargs)
    pm.init_weights(seed=3)
    assert torch.isfinite(pm.step(**kwargs))


def test_init_weights_follows_the_models_own_scheme():
    """The statistics of every parameter match those of the model built for real (the
    same scheme, other random numbers); constants (norms, biases, inv_freq) exactly."""
    torch.manual_seed(0)
    real = llama()
    with torch.device("meta"):
        meta = llama()
    pm = autopar.compile(meta, None, example_kwargs=batch())
    pm.init_weights(seed=0)
    mine = pm.full_state_dict()
    theirs = {**real.state_dict(), **dict(real.named_buffers())}
    buffers = dict(pm.root.model.named_buffers())
    for name, value in real.named_buffers():
        assert torch.equal(buffers[name], value), name  # rotary inv_freq, computed from the config
    for name, ref in theirs.items():
        if name not in mine:
            continue
        got = mine[name]
        if ref.numel() > 256 and ref.std() > 0:
            assert abs(got.mean() - ref.mean()) < 0.01 and 0.8 < float(got.std() / ref.std()) < 1.25, name
        else:
            assert torch.equal(got, ref), name  # norms' ones


def test_init_weights_of_nn_layers_and_an_uninitialisable_module():
    torch.manual_seed(0)
    real = nn_model()
    with torch.device("meta"):
        meta = nn_model()
    x = torch.randn(4, 6, 8)
    pm = autopar.compile(meta, None, (x,), F.mse_loss, example_target=torch.randn(4, 6, 5))
    pm.init_weights(seed=0)
    mine = pm.full_state_dict()
    for name, ref in real.state_dict().items():
        assert mine[name].shape == ref.shape
        if name.endswith("out_proj.bias") or "norm" in name:  # constants of their schemes
            assert torch.equal(mine[name], ref), name
        elif ref.numel() > 256:
            assert 0.8 < float(mine[name].std() / ref.std()) < 1.25, name

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)
            self.scale = nn.Parameter(torch.ones(8))

        def forward(self, x):
            return self.linear(x) * self.scale

    with torch.device("meta"):
        model = Scaled()
    pm = autopar.compile(model, None, (torch.randn(4, 8),))
    with pytest.raises(NotImplementedError, match=r"scale \(parameter of Scaled\).*reset_parameters"):
        pm.init_weights()


def test_a_parents_scheme_over_its_childrens_weights():
    """GPT-2's attention and MLP rescale their children's output projections to
    0.02 / sqrt(2 · layers) after the children's own init: the parent's scheme applies."""
    kwargs = batch()
    with torch.device("meta"):
        model = gpt2()
    pm = autopar.compile(model, None, example_kwargs=kwargs)
    pm.init_weights(seed=0)
    state = pm.full_state_dict()
    scaled = 0.02 / (2 * 2) ** 0.5
    for name in ("transformer.h.0.attn.c_proj.weight", "transformer.h.1.mlp.c_proj.weight"):
        assert 0.8 < float(state[name].std()) / scaled < 1.25, name
    assert 0.8 < float(state["transformer.h.0.attn.c_attn.weight"].std()) / 0.02 < 1.25


def test_a_constant_made_in_forward_is_a_real_constant():
    """A tensor the model makes from Python values in forward is captured with its value
    (captures run on fake tensors; a fake constant would train on fake losses)."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x) * torch.tensor([1.0, 2.0, 3.0, 4.0])

    torch.manual_seed(0)
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    model = Scaled()
    expected = F.mse_loss(model(x), y)
    pm = autopar.compile(model, None, (x,), F.mse_loss, example_target=y)
    loss = pm.step(x, target=y)
    assert type(loss) is torch.Tensor and torch.allclose(loss, expected)


def test_one_process_digests():
    """The reference the ranks' digests are compared with (test below)."""
    kwargs = batch()
    assert meta_init_digests(llama, "data", kwargs) == meta_init_digests(llama, {"data": 1}, kwargs)


# ---------------------------------------------------------------------------- on gloo ranks
PLANS_4 = [{"tensor": 2, "data": 2}, {"pipeline": 2, "data": 2, "microbatches": 2}, {"x": 2, "y": 1, "z": 2},
           {"data": 4, "zero": 3}]


class FullAllocations(TorchDispatchMode):
    """Records every operation that allocates a tensor (not a view, not on meta, not a
    capture's fake tensor) whose shape is one of ``shapes``."""

    def __init__(self, shapes):
        super().__init__()
        self.shapes, self.seen = set(shapes), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        real = lambda x: isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor) and x.device.type != "meta"  # noqa: E731
        given = {x.untyped_storage().data_ptr() for x in tree_leaves((args, kwargs)) if real(x)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if real(t) and tuple(t.shape) in self.shapes and \
                    t.untyped_storage().data_ptr() not in given:  # a view is no allocation
                self.seen.append((str(func), tuple(t.shape)))
        return out


def four_ranks_job():
    kwargs = batch()
    out = {"init": [meta_init_digests(llama, plan, kwargs) for plan in PLANS_4]}
    # loaded from a safetensors file the single-device model wrote, trained as that model
    out["numerics"] = [compare_with_single_device(llama, (), None, None, PLANS_4[0], kwargs=kwargs, steps=3,
                                                  from_meta="pretrained")]
    # never a full-size tensor of a parameter this rank holds a part of (shapes chosen so
    # that no part, gradient or activation has the full shape of another parameter)
    with torch.device("meta"):
        model = llama(kv_heads=4)
    pm = None
    shapes = set()
    folder = tempfile.mkdtemp(prefix="autopar-meta-init-")
    torch.manual_seed(0)
    save_model(llama(kv_heads=4), os.path.join(folder, "model.safetensors"))  # this rank's own file
    with FullAllocations(()) as tracker:
        pm = autopar.compile(model, None, example_kwargs=kwargs, strategy={"tensor": 2, "data": 2})
        tracker.shapes = shapes = {p.full_shape for p in pm.layout.unique() if p.cut is not None}
        pm.load_pretrained(folder)  # each rank reads the slices it holds
        pm.step(**kwargs)
    shutil.rmtree(folder, ignore_errors=True)
    out["split_shapes"], out["full_allocations"] = sorted(shapes), tracker.seen
    return out


def two_ranks_job():
    kwargs = batch()
    out = {"init": meta_init_digests(llama, {"tensor": 2}, kwargs)}
    torch.manual_seed(torch.distributed.get_rank())  # a different model on each rank
    try:
        autopar.compile(llama(), None, example_kwargs=kwargs, strategy={"tensor": 2})
        out["unequal"] = None
    except ValueError as e:
        out["unequal"] = str(e)
    torch.manual_seed(0)
    out["equal"] = autopar.compile(llama(), None, example_kwargs=kwargs, strategy={"tensor": 2}) is not None
    # rank 0 given the real model, rank 1 a meta one: the same error on both, no hang
    with torch.device("meta" if torch.distributed.get_rank() else "cpu"):
        model = llama()
    try:
        autopar.compile(model, None, example_kwargs=kwargs, strategy={"tensor": 2})
        out["mixed"] = "compiled"
    except ValueError as e:
        out["mixed"] = str(e)
    return out


def four_ranks_schemes_job():
    """init_weights of a tied model and of schemes that write their children's weights."""
    kwargs = batch()
    out = {"init_tied": meta_init_digests(lambda: llama(tie=True), {"tensor": 2, "data": 2}, kwargs),
           "init_gpt2": meta_init_digests(gpt2, {"tensor": 2, "data": 2}, kwargs)}  # split children, parent's scheme
    # nn.MultiheadAttention zeroes its out_proj's bias over the out_proj's own init
    nn_args = dict(inputs=(torch.randn(4, 6, 8),), target=torch.randn(4, 6, 5), loss_fn=F.mse_loss)
    out["init_nn"] = [meta_init_digests(nn_model, plan, **nn_args) for plan in ({"tensor": 2, "data": 2},
                                                                                 {"data": 4, "zero": 3})]
    return out


def four_ranks_extended_job():
    """Llama under the pipeline, 3D and ZeRO-3 plans, and Qwen2-MoE's experts, built on
    the meta device."""
    kwargs = batch()
    out = [compare_with_single_device(llama, (), None, None, plan, kwargs=kwargs, steps=3, from_meta="pretrained")
           for plan in PLANS_4[1:]]
    out += [compare_with_single_device(qwen_moe, (), None, None, plan, kwargs=kwargs, steps=3,
                                       from_meta="pretrained")
            for plan in ({"data": 4, "experts": 2}, {"data": 2, "tensor": 2, "experts": 2})]
    return out


_FOUR = shared_ranks.register(4, __name__, four_ranks_job, timeout_s=600)
_FOUR_SCHEMES = shared_ranks.register(4, __name__ + ".schemes", four_ranks_schemes_job, timeout_s=600,
                                      extended=True)
_FOUR_EXTENDED = shared_ranks.register(4, __name__ + ".extended", four_ranks_extended_job, timeout_s=900,
                                       extended=True)
_TWO = shared_ranks.register(2, __name__, two_ranks_job)


def test_init_weights_is_the_same_model_whatever_the_plan():
    reference = meta_init_digests(llama, "data", batch())
    four, two = _FOUR(), _TWO()
    for rank_out in four:
        for plan, digests in zip(PLANS_4, rank_out["init"]):
            assert digests == reference, plan
    for rank_out in two:
        assert rank_out["init"] == reference


@pytest.mark.extended
def test_init_weights_of_tied_weights_and_parents_schemes_whatever_the_plan():
    four = _FOUR_SCHEMES()
    assert four[0]["init_tied"] == four[1]["init_tied"] == meta_init_digests(lambda: llama(tie=True), "data", batch())
    assert four[0]["init_gpt2"] == meta_init_digests(gpt2, "data", batch())
    nn_reference = meta_init_digests(nn_model, "data", inputs=(torch.randn(4, 6, 8),), target=torch.randn(4, 6, 5),
                                     loss_fn=F.mse_loss)
    assert four[0]["init_nn"] == [nn_reference, nn_reference]


def test_differently_seeded_ranks_are_refused_at_compile():
    for rank_out in _TWO():
        assert rank_out["unequal"] is not None and "model.embed_tokens.weight differs between rank 0 vs rank 1" \
            in rank_out["unequal"], rank_out["unequal"]
        assert "some ranks were given a model with weights and others one on the meta device" in rank_out["mixed"]
        assert rank_out["equal"]


def test_meta_built_llama_trains_as_the_single_device_model():
    for rank_out in _FOUR():
        for plan, report in zip(PLANS_4[:1], rank_out["numerics"]):
            for kind in ("output", "loss", "grad", "param"):
                assert report[kind][1] < 1e-4, (plan, kind, report[kind])


def test_a_meta_compiled_rank_never_allocates_a_full_split_parameter():
    for rank_out in _FOUR():
        assert rank_out["split_shapes"]  # the plan splits parameters
        assert rank_out["full_allocations"] == []


@pytest.mark.extended
def test_meta_built_llama_and_qwen_moe_under_the_other_plans():
    plans = PLANS_4[1:] + [{"data": 4, "experts": 2}, {"data": 2, "tensor": 2, "experts": 2}]
    for rank_out in _FOUR_EXTENDED():
        for plan, report in zip(plans, rank_out):
            for kind in ("output", "loss", "grad", "param"):
                assert report[kind][1] < 1e-4, (plan, kind, report[kind])
