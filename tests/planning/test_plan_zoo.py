"""The plan zoo: the real configurations users bring, planned on the meta device.

Each model is built from its published configuration (written out below: no download)
on the meta device in bf16 and planned with ``strategy="auto"`` for a realistic number
of devices of a preset (``autopar/cost/hardware.py``) at sequence length 4096 and a
global batch that fits that world. Every one must plan; the mixture-of-experts models
must weigh expert parallelism, which is what lets them fit. Two cases run in
``make test`` (a dense and an MoE model, about 20 s together on the 2-core machine); the
rest are ``extended``. docs/benchmarks.md ("Real configurations planned") lists each
case's planning time and plan.

The first tests are the regression of the experts family's pricing on a base plan too
big for memory (such a base was rejected without a region table, and pricing experts on
it failed with ``'NoneType' object has no attribute 'regions'``), on a small Mixtral
under a memory limit.
"""
import time

import pytest
import torch
import transformers

import autopar
from autopar.cost.hardware import get_hardware
from examples.zoo import logits_loss

SEQ = 4096


def _rope(theta: float) -> dict:
    return {"rope_type": "default", "rope_theta": float(theta)}


# model class, config class, the published configuration (sizes, heads, experts, vocabulary)
CONFIGS = {
    "Llama-3-8B": ("LlamaForCausalLM", "LlamaConfig", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=8192, rope_parameters=_rope(500000), rms_norm_eps=1e-5,
        tie_word_embeddings=False)),
    "Llama-3-70B": ("LlamaForCausalLM", "LlamaConfig", dict(
        vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, max_position_embeddings=8192, rope_parameters=_rope(500000), rms_norm_eps=1e-5,
        tie_word_embeddings=False)),
    "Mixtral-8x7B": ("MixtralForCausalLM", "MixtralConfig", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768,
        rope_parameters=_rope(1e6), rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "Qwen3-MoE-30B-A3B": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960,
        rope_parameters=_rope(1e6), rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "DeepSeek-V3": ("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
        n_routed_experts=256, num_experts_per_tok=8, first_k_dense_replace=3, n_group=8, topk_group=4,
        routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, max_position_embeddings=163840, rope_parameters=_rope(10000),
        rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "GPT-OSS-120B": ("GptOssForCausalLM", "GptOssConfig", dict(
        vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=36, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, num_local_experts=128, num_experts_per_tok=4, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 18, max_position_embeddings=131072,
        rope_parameters=_rope(150000), rms_norm_eps=1e-5, attention_bias=True, tie_word_embeddings=False)),
    "Gemma-3-27B": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        vocab_size=262208, hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32,
        num_key_value_heads=16, head_dim=128, query_pre_attn_scalar=168, sliding_window=1024,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 10 + ["sliding_attention"] * 2,
        max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=True)),
}
MOE = {"Mixtral-8x7B", "Qwen3-MoE-30B-A3B", "DeepSeek-V3", "GPT-OSS-120B"}

# (model, devices, preset, global batch of SEQ-token sequences); the first two run in make test
CASES = [
    ("Llama-3-8B", 64, "h100", 256),
    ("Mixtral-8x7B", 64, "h100", 256),
    ("Llama-3-8B", 32, "a100-selene", 128),
    ("Llama-3-70B", 512, "a100-selene", 1024),
    ("Mixtral-8x7B", 256, "a100-perlmutter", 1024),
    ("Qwen3-MoE-30B-A3B", 32, "h100", 128),
    ("DeepSeek-V3", 2048, "h100", 8192),
    ("GPT-OSS-120B", 128, "h100", 512),
    ("Gemma-3-27B", 256, "a100-perlmutter", 512),
]
FAST = 2


def build(name: str, batch: int, seq: int = SEQ):
    """The model ``name`` on the meta device in bf16, and its token ids ``[batch, seq]``."""
    model_class, config_class, sizes = CONFIGS[name]
    config = getattr(transformers, config_class)(**sizes, use_cache=False)
    with torch.device("meta"):
        model = getattr(transformers, model_class)(config).to(torch.bfloat16)
    return model, torch.zeros(batch, seq, dtype=torch.long, device="meta")


def plan_case(name: str, world: int, preset: str, batch: int, seq: int = SEQ, **options):
    """(the plan of ``name`` on ``world`` devices of ``preset``, seconds planning took)."""
    model, ids = build(name, batch, seq)
    start = time.perf_counter()
    plan = autopar.plan(model, world, (ids,), logits_loss, example_target=ids, hardware=preset, **options)
    return plan, time.perf_counter() - start


def experts_priced(plan) -> list:
    """The configurations with expert parallelism the search priced (rejected ones with
    their figures included)."""
    return [c for c in plan.candidates if "experts" in c.form and c.step_s is not None]


def test_every_config_class_is_in_the_installed_transformers():
    for model_class, config_class, sizes in CONFIGS.values():
        assert hasattr(transformers, model_class) and hasattr(transformers, config_class)
        config = getattr(transformers, config_class)(**sizes)
        for key, value in sizes.items():   # no size silently dropped or renamed
            assert getattr(config, key) == value, (config_class, key)


# ---------------------------------------------------------------- the experts family on a base too big

def _small_mixtral(strategy, memory_mib: float = 50, batch: int = 8, seq: int = 16):
    """A Mixtral of 13M parameters (8 experts 256 -> 1024, 2 layers) on 8 A100s given
    ``memory_mib`` each. At 50 MiB and 8 x 16 tokens no data or tensor layout fits
    without expert parallelism unless ZeRO shards it (which expert parallelism does not
    run with); expert degree 8 over 8 data ranks needs 35 MiB."""
    with torch.device("meta"):
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            vocab_size=256, hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, use_cache=False))
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return autopar.plan(model, 8, (ids,), logits_loss, strategy, example_target=ids, hardware="a100-selene",
                        memory_limit=memory_mib * 2**20)


def test_an_moe_layers_dispatch_is_not_rows_of_the_batch_meeting():
    # its tokens sorted by expert, gathered, counted and put back: each row's output is its
    # own (autopar.passes.analysis.batch_rows), so the batch splits and expert parallelism is weighed
    from autopar.passes.analysis.batch_rows import couplings
    from autopar.api import _global_graph
    with torch.device("meta"):
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=4, num_local_experts=4, num_experts_per_tok=2, use_cache=False))
    ids = torch.zeros(8, 16, dtype=torch.long, device="meta")
    assert couplings(_global_graph(model, (ids,), logits_loss, ids)) == []


def test_auto_prices_experts_on_a_base_too_big_whose_levers_were_not_weighed():
    # 64 x 128 tokens at 90 MiB: data 2 x tensor 4 does not fit whole and, slower than
    # the best plan priced before it, is rejected without its memory levers; its experts
    # configurations are priced all the same (this crashed: the base had no region table)
    plan = _small_mixtral("auto", 90, batch=64, seq=128)
    assert plan.experts > 1 and not plan.zero
    priced = {(c.mesh.get("pipeline", 1), c.mesh["data"], c.mesh["tensor"], c.form): c for c in experts_priced(plan)}
    assert not priced[(1, 2, 4, "experts 2")].feasible
    assert priced[(1, 2, 4, "experts 2")].reason.startswith("needs")
    assert priced[(1, 8, 1, "experts 4")].feasible


def test_forced_experts_on_a_base_that_fits_only_with_zero_plans_it():
    # the base fits only with ZeRO, which expert parallelism does not run with (this was
    # refused naming ZeRO); its experts spread over 8 data ranks fit without it
    plan = _small_mixtral({"data": 8, "experts": 8})
    assert plan.experts == 8 and plan.mesh == {"data": 8, "tensor": 1} and not plan.zero
    assert plan.total.memory_bytes <= 50 * 2**20
    rows = {r.region: r for r in plan.regions}
    assert rows["experts:model.layers.0.mlp"].strategy == "experts"


def test_auto_weighs_experts_on_bases_that_need_zero():
    plan = _small_mixtral("auto")
    # expert parallelism without ZeRO against the bases with it: the fastest wins (here a
    # zero-bubble pipeline with ZeRO-2, by 2 %); the experts' best is weighed and named
    assert plan.step_s == pytest.approx(min(c.step_s for c in plan.candidates if c.feasible))
    assert plan.why_not("experts").startswith(("experts: chosen", "experts: lost"))
    priced = experts_priced(plan)
    # every data x tensor layout at every expert degree (none fits without ZeRO), and pipelines
    meshes = {(c.mesh.get("pipeline", 1), c.mesh["data"], c.mesh["tensor"], c.form) for c in priced}
    assert {(1, 8, 1, "experts 2"), (1, 8, 1, "experts 4"), (1, 8, 1, "experts 8"), (1, 4, 2, "experts 4")} <= meshes
    assert any(c.mesh.get("pipeline", 1) > 1 for c in priced if c.feasible)
    too_big = [c for c in priced if not c.feasible]
    assert too_big and all(c.reason.startswith("needs") for c in too_big)   # rejected with what they need


def test_forced_experts_that_do_not_fit_are_rejected_with_what_they_need():
    with pytest.raises(autopar.PlanError, match=r"no feasible plan .*'data': 8, 'tensor': 1}: needs .* per rank"):
        _small_mixtral({"data": 8, "experts": 8}, memory_mib=20)


# ---------------------------------------------------------------- the zoo

def _check(plan, name: str, world: int, preset: str) -> None:
    assert plan.world_size == world and plan.step_s > 0
    assert plan.total.memory_bytes <= get_hardware(preset).memory_bytes
    if name in MOE:
        assert experts_priced(plan), f"{name}: expert parallelism not weighed: {plan.why_not('experts')}"


def _case_id(case) -> str:
    name, world, preset, batch = case
    return f"{name}-{world}x{preset}-b{batch}"


@pytest.mark.parametrize("case", CASES[:FAST], ids=_case_id)
def test_real_configurations_plan(case):
    name, world, preset, batch = case
    plan, _ = plan_case(name, world, preset, batch)
    _check(plan, name, world, preset)


@pytest.mark.extended
@pytest.mark.parametrize("case", CASES[FAST:], ids=_case_id)
def test_real_configurations_plan_extended(case):
    name, world, preset, batch = case
    plan, _ = plan_case(name, world, preset, batch)
    _check(plan, name, world, preset)


def describe(plan) -> str:
    """The plan as docs/benchmarks.md lists it: mesh, form and levers."""
    mesh = " ".join(f"{k[0] if k != 'pipeline' else 'p'}={v}" for k, v in plan.mesh.items())
    parts = [mesh] + ([plan.form] if plan.form else [])
    if plan.pipeline:
        parts.append(f"m={plan.pipeline['microbatches']}")
    elif plan.microbatches > 1:
        parts.append(f"{plan.microbatches} microbatches")
    if plan.zero:
        parts.append(f"ZeRO-{plan.zero}")
    if plan.recompute or plan.selective_recompute:
        parts.append("full recomputation" if plan.recompute else "selective recomputation")
    return ", ".join(parts)


if __name__ == "__main__":   # the table of docs/benchmarks.md: python tests/planning/test_plan_zoo.py [CASE-INDEX ...]
    import sys
    for i in [int(a) for a in sys.argv[1:]] or range(len(CASES)):
        name, world, preset, batch = CASES[i]
        plan, seconds = plan_case(name, world, preset, batch)
        params = sum(p.numel() for p in build(name, 1, 8)[0].parameters())
        print(f"| {name} ({params / 1e9:.1f}B) | {world} x {preset} | {batch} x {SEQ} | {seconds:.1f} s | "
              f"{describe(plan)} | {plan.step_s:.2f} s | {plan.total.memory_bytes / 2**30:.1f} GiB | "
              f"{len(plan.candidates)} ({len(experts_priced(plan))}) | {plan.why_not('experts').split(':')[1].strip()}",
              flush=True)
