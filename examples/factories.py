"""Example cases: factories for ``autopar plan FILE:FACTORY`` (each returns model, inputs,
loss, target) and :func:`training_case` for the equivalence checks on ranks."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples.models import (MLP, Inception, ListMoETransformer, StemTrunk, TinyTransformer, Towers,  # noqa: E402
                            TowerTrunk, UserGPT, gpt2 as _gpt2, gpt2_loss, lm_loss)
from examples.zoo import logits_loss  # noqa: E402


def mlp():
    torch.manual_seed(0)
    return MLP(), (torch.randn(8, 32),), F.cross_entropy, torch.randint(0, 8, (8,))


def transformer():
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4, 16))
    return TinyTransformer(), (ids,), lm_loss, torch.randint(0, 64, (4, 16))


def gpt2():
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4, 16))
    return _gpt2(), (ids,), gpt2_loss, torch.randint(0, 64, (4, 16))


def mixtral():
    """Hugging Face Mixtral (2 layers, top-2 of 4 experts) from a config, random weights."""
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4, 8))
    return moe_model("mixtral"), (ids,), logits_loss, torch.randint(0, 64, (4, 8))


def inception():
    torch.manual_seed(0)
    return Inception(), (torch.randn(8, 3, 8, 8),), F.cross_entropy, torch.randint(0, 5, (8,))


def stem_trunk():
    torch.manual_seed(0)
    return StemTrunk(), (torch.randn(8, 3, 4, 4),), F.cross_entropy, torch.randint(0, 5, (8,))


def training_case(model_name: str, batch: int | None = None, layers: int | None = None, vocab: int | None = None,
                  tied: bool = True):
    """``(model factory, inputs, target, loss)`` of a named example, for training on ranks
    against a single-device copy (``autopar.testing``, ``examples/train.py``): the factory,
    not a model, so every rank builds its own from the same seed. ``batch``: the language
    models' batch (4 by default; Bian's cube on 8 ranks needs 8: z, then x and y, split it)
    and the MLP's (8 by default);
    ``layers``: their number of blocks (2 by default; a pipeline of 4 stages needs 4);
    ``vocab``: the language models' vocabulary (64 by default; 63 divides by no tensor
    degree: a padded vocabulary); ``tied=False``: the transformer's LM head has its own
    weight and a bias."""
    generator = torch.Generator().manual_seed(1)
    if model_name == "inception":
        return Inception, (torch.randn(8, 3, 8, 8, generator=generator),), \
            torch.randint(0, 5, (8,), generator=generator), F.cross_entropy
    if model_name == "stem_trunk":
        return (lambda: StemTrunk(layers=layers or 2)), (torch.randn(batch or 8, 3, 4, 4, generator=generator),), \
            torch.randint(0, 5, (batch or 8,), generator=generator), F.cross_entropy
    if model_name in ("towers", "towers4"):
        factory = Towers if model_name == "towers" else (lambda: Towers(towers=4))
        return factory, (torch.randn(8, 16, generator=generator),), \
            torch.randint(0, 4, (8,), generator=generator), F.cross_entropy
    if model_name == "mlp":
        x = torch.randn(batch or 8, 32, generator=generator)
        y = torch.randint(0, 8, (batch or 8,), generator=generator)
        return MLP, (x,), y, F.cross_entropy
    vocab = vocab or 64
    ids = torch.randint(0, vocab, (batch or 4, 16), generator=generator)
    target = torch.randint(0, vocab, (batch or 4, 16), generator=generator)
    if model_name == "transformer":
        return (lambda: TinyTransformer(vocab=vocab, layers=layers or 2, tied=tied, head_bias=not tied)), (ids,), \
            target, lm_loss
    if model_name == "tower_trunk":
        return (lambda: TowerTrunk(vocab=vocab, layers=layers or 2)), (ids,), target, lm_loss
    if model_name == "gpt2":
        return (lambda: _gpt2(layers=layers or 2, vocab=vocab)), (ids,), target, gpt2_loss
    if model_name == "llama":
        return (lambda: _llama(layers or 2, vocab)), (ids,), target, gpt2_loss
    if model_name == "encoder":  # torch's own nn.TransformerEncoderLayer blocks (causal, post-norm)
        from examples.standard_layers import EncoderLM
        return (lambda: EncoderLM(causal=True, layers=layers or 2, seq=16)), (ids % 64,), target % 64, lm_loss
    if model_name == "list_moe":
        return (lambda: ListMoETransformer(vocab=vocab, layers=layers or 2)), (ids,), target, lm_loss
    if model_name in MOE_MODELS:
        return (lambda: moe_model(model_name, layers=layers or 2, vocab=vocab)), (ids,), target, logits_loss
    raise ValueError(f"unknown example model {model_name!r}")


def _llama(layers: int, vocab: int):
    """Hugging Face Llama from a small config, random weights (GQA: 2 key/value heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers,
                                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                        max_position_embeddings=16, use_cache=False))


MOE_MODELS = ("mixtral", "mixtral8", "qwen2_moe", "deepseek_v3", "gpt_oss")
"""Hugging Face mixture-of-experts models from configs (random weights): Mixtral top-2 of
4 and of 8 experts, Qwen2-MoE (top-2 of 4 routed experts and a gated shared expert),
DeepSeek-V3 (sigmoid scores with a correction bias, group-limited top-2 of 8 experts in 2
groups, a shared expert, scaled weights; its first layer dense), GPT-OSS (a router with a
bias, softmax over the top-2 of 4 logits, experts with biases and the clamped SwiGLU on
interleaved gate/up columns, attention sinks, sliding and full attention layers)."""


def moe_model(name: str, layers: int = 2, vocab: int = 64, aux: bool = False):
    """A small HF MoE model (:data:`MOE_MODELS`) in float32 (torch's grouped matmul, which
    their experts call, takes no float64); ``aux``: it returns its router logits and adds
    the load-balancing loss to its own loss (``output_router_logits``)."""
    from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, MixtralConfig, MixtralForCausalLM,
                              Qwen2MoeConfig, Qwen2MoeForCausalLM)
    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=32, use_cache=False,
                  output_router_logits=aux, router_aux_loss_coef=0.1)
    if name == "qwen2_moe":
        return Qwen2MoeForCausalLM(Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                                  shared_expert_intermediate_size=48, intermediate_size=48,
                                                  norm_topk_prob=True, **common))
    if name == "deepseek_v3":
        return DeepseekV3ForCausalLM(DeepseekV3Config(
            intermediate_size=48, moe_intermediate_size=16, first_k_dense_replace=1, n_routed_experts=8,
            num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1, q_lora_rank=None, kv_lora_rank=16,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, **{**common, "num_hidden_layers": layers + 1,
                                                                       "num_key_value_heads": 4}))
    if name == "gpt_oss":
        return gpt_oss_model(layers, vocab, aux)
    experts = 8 if name == "mixtral8" else 4
    return MixtralForCausalLM(MixtralConfig(intermediate_size=48, num_local_experts=experts, num_experts_per_tok=2,
                                            **common))


def gpt_oss_model(layers: int = 2, vocab: int = 64, aux: bool = False):
    """A small Hugging Face GPT-OSS (hidden 64, 4 heads of 16 over 2 key/value heads, top-2
    of 4 experts, a sliding window of 8 on its even layers, YaRN rotary). Its experts'
    biases start at zero and its sinks near zero; they are drawn here instead (the
    model's own generator state), and the SwiGLU's clamp is low enough to cut some
    gates and ups, so each part of its experts and attention shows in the comparison."""
    from transformers import GptOssConfig, GptOssForCausalLM
    config = GptOssConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        max_position_embeddings=32, swiglu_limit=0.3, use_cache=False, output_router_logits=aux,
        router_aux_loss_coef=0.1, rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                                                   "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                                   "original_max_position_embeddings": 8})
    model = GptOssForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
            layer.mlp.experts.gate_up_proj_bias.normal_(0.0, 0.1)
            layer.mlp.experts.down_proj_bias.normal_(0.0, 0.1)
    return model


# Megatron PTD-P Table 1 (§5.1): parameters (billions), heads, hidden size, layers,
# tensor / pipeline degrees, GPUs, batch, achieved teraFLOP/s per GPU. V = 51,200, s = 2048.
MEGATRON_TABLE_1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]


def gpt_meta(layers: int = 96, width: int = 12288, heads: int = 96, batch: int = 1536, seq: int = 2048,
             vocab: int = 51200):
    """A GPT-style model (:class:`TinyTransformer`) of any size on the meta device, in
    bf16 as Megatron trains: no weights are allocated, so a 175B model (the defaults are
    GPT-3's) costs nothing to build and plans from its shapes alone."""
    with torch.device("meta"):
        model = TinyTransformer(vocab=vocab, width=width, heads=heads, layers=layers, block=seq).to(torch.bfloat16)
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return model, (ids,), lm_loss, ids


def gpt_user_meta(layers: int = 96, width: int = 12288, heads: int = 96, batch: int = 1536, seq: int = 2048,
                  vocab: int = 51200, chunk: bool = False):
    """GPT-3 175B (the defaults) written as users write it (:class:`examples.models.UserGPT`:
    the fused QKV projection split in forward, ``.chunk(3, -1)`` with ``chunk``, SDPA, the
    LM head tied by ``F.linear(x, self.wte.weight)``), on the meta device in bf16."""
    with torch.device("meta"):
        model = UserGPT(vocab, width, heads, layers, seq, chunk=chunk).to(torch.bfloat16)
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return model, (ids,), lm_loss, ids


def gpt3_175b():
    """``autopar plan examples/factories.py:gpt3_175b --world 3072 --preset a100-selene``."""
    return gpt_meta()
