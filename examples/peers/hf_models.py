"""Hugging Face models from meta-pytorch/autoparallel's evaluation list
(``examples/run_hf_eval.sh``), built from small configurations with random weights and
no dropout, trained with a float64 loss of the logits (Hugging Face's own causal-LM loss
upcasts logits to float32, which would hide a plan's error below float32 rounding).

``gptj``: GPT-J's rotary embedding rotates every second pair with ``stack((-x2, x1), -1)``
and ``flatten``: a stack of head-split values along a new dimension keeps their split.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

VOCAB = 64


def build(name: str) -> torch.nn.Module:
    import transformers as T
    configs = {
        "gptj": (T.GPTJConfig, T.GPTJForCausalLM, dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4)),
        "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM,
                     dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)),
        # Llama 4: complex rotary; every layer a mixture of 4 experts held as fused
        # [experts, in, out] weights applied with bmm, top-1 sigmoid routing, a shared expert
        "llama4": (T.Llama4TextConfig, T.Llama4ForCausalLM,
                   dict(hidden_size=32, intermediate_size=32, intermediate_size_mlp=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                        num_experts_per_tok=1, interleave_moe_layer_step=1, max_position_embeddings=64,
                        attention_chunk_size=64, no_rope_layers=[1, 1])),
        # Jamba: Mamba and attention layers in turn, every second one a mixture of 2 experts
        # (a stack of period 2); the Mamba scan in PyTorch (no CUDA kernels on the CPU), the
        # experts by batched matmuls (torch's grouped matmul takes no float64)
        "jamba": (T.JambaConfig, T.JambaForCausalLM,
                  dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, num_experts=2, num_experts_per_tok=1, expert_layer_period=2,
                       expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=4,
                       mamba_d_conv=4, mamba_expand=2, use_mamba_kernels=False,
                       experts_implementation="batched_mm")),
        # Falcon's other two layouts of its fused projection: per head (q, k, v of each
        # head side by side, ``unflatten(-2, (H, 3))``) and multi-query (one key and one
        # value head after the queries, ``split([H, 1, 1])``)
        "falcon_heads": (T.FalconConfig, T.FalconForCausalLM,
                         dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, multi_query=False,
                              parallel_attn=False)),
        "falcon_mq": (T.FalconConfig, T.FalconForCausalLM,
                      dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, multi_query=True)),
        **_autoparallel_list(T),
    }
    config_class, model_class, sizes = configs[name]
    config = config_class(vocab_size=VOCAB, **sizes)
    for key in DROPOUTS:
        if hasattr(config, key):
            setattr(config, key, 0.0)
    torch.manual_seed(0)
    return model_class(config)


DROPOUTS = ("embd_pdrop", "resid_pdrop", "attn_pdrop", "hidden_dropout", "attention_dropout", "hidden_dropout_prob",
            "attention_probs_dropout_prob", "dropout", "dropout_rate", "embed_dropout", "resid_dropout",
            "seq_classif_dropout", "qa_dropout")
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
KWARGS = {"t5": "decoder_input_ids"}
"""Models that take a second input: its keyword (given the example's ids)."""


def _autoparallel_list(T) -> dict:
    """meta-pytorch/autoparallel's ``examples/run_hf_eval.sh`` list at small sizes: each
    ``(config class, model class, sizes)``. Several are one Hugging Face architecture with
    the published checkpoint's distinguishing options (Cerebras-GPT is GPT-2's with GeLU;
    SmolLM2, TinyLlama and Falcon 3 are Llama's: tied embeddings, grouped-query heads)."""
    grouped = dict(SMALL, num_key_value_heads=2)
    return {
        "gpt2": (T.GPT2Config, T.GPT2LMHeadModel, dict(n_embd=32, n_layer=2, n_head=4)),
        "cerebras_gpt": (T.GPT2Config, T.GPT2LMHeadModel,
                         dict(n_embd=32, n_layer=2, n_head=4, n_inner=128, activation_function="gelu")),
        "gpt_neo": (T.GPTNeoConfig, T.GPTNeoForCausalLM,
                    dict(hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
                         window_size=4, intermediate_size=64)),
        "pythia": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM, dict(SMALL, rotary_pct=0.25)),
        "bloom": (T.BloomConfig, T.BloomForCausalLM, dict(hidden_size=32, n_layer=2, n_head=4)),
        "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, grouped),
        "phi": (T.PhiConfig, T.PhiForCausalLM, dict(SMALL, partial_rotary_factor=0.5)),
        "smollm2": (T.LlamaConfig, T.LlamaForCausalLM, dict(grouped, tie_word_embeddings=True)),
        "tinyllama": (T.LlamaConfig, T.LlamaForCausalLM, grouped),
        "stablelm2": (T.StableLmConfig, T.StableLmForCausalLM,
                      dict(SMALL, num_key_value_heads=4, partial_rotary_factor=0.25, use_qkv_bias=True)),
        "falcon3": (T.LlamaConfig, T.LlamaForCausalLM, dict(grouped, head_dim=8, rope_theta=1000042.0)),
        "mistral": (T.MistralConfig, T.MistralForCausalLM, dict(grouped, sliding_window=4)),
        "t5": (T.T5Config, T.T5ForConditionalGeneration,
               dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0)),
        "bert": (T.BertConfig, T.BertForMaskedLM, SMALL),
        "roberta": (T.RobertaConfig, T.RobertaForMaskedLM, dict(SMALL, pad_token_id=1)),
        "distilbert": (T.DistilBertConfig, T.DistilBertForMaskedLM, dict(dim=32, n_layers=2, n_heads=4,
                                                                          hidden_dim=64)),
        "falcon": (T.FalconConfig, T.FalconForCausalLM,
                   dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, new_decoder_architecture=True,
                        num_kv_heads=2)),
        "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM, dict(grouped, head_dim=8)),
        "olmo2": (T.Olmo2Config, T.Olmo2ForCausalLM, grouped),
        "deepseek_v2": (T.DeepseekV2Config, T.DeepseekV2ForCausalLM,
                        dict(SMALL, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                             qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=32, first_k_dense_replace=1, n_shared_experts=1,
                             experts_implementation="batched_mm")),
        "rwkv": (T.RwkvConfig, T.RwkvForCausalLM, dict(hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                                                       intermediate_size=64, context_length=16)),
    }


def logits_loss(output, target: torch.Tensor) -> torch.Tensor:
    logits = output.logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def hf_job(cases: list) -> list[dict]:
    """On every rank: each ``(model name, strategy)`` in float64 against one process,
    with what the plan split (an error in the row unless it leaves the group unusable)."""
    from autopar.testing import compare_with_single_device, reported_in
    from examples.qkv_layouts import attention_strategies
    ids = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(0))
    rows = []
    for name, strategy in cases:
        row: dict = {"model": name, "strategy": strategy}
        with reported_in(row, f"{name} under {strategy}"):
            kwargs = {KWARGS[name]: ids} if name in KWARGS else None
            report = compare_with_single_device(lambda: build(name), (ids,), ids, logits_loss, strategy,
                                                kwargs=kwargs, dtype=torch.float64)
            row.update({k: report[k] for k in ("mesh", "strategies", "regions", "output", "loss", "grad", "param")})
            row["attention"] = attention_strategies(report)
        rows.append(row)
    return rows
