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
    }
    config_class, model_class, sizes = configs[name]
    config = config_class(vocab_size=VOCAB, **sizes)
    for key in ("embd_pdrop", "resid_pdrop", "attn_pdrop", "hidden_dropout", "attention_dropout"):
        if hasattr(config, key):
            setattr(config, key, 0.0)
    torch.manual_seed(0)
    return model_class(config)


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
            report = compare_with_single_device(lambda: build(name), (ids,), ids, logits_loss, strategy,
                                                dtype=torch.float64)
            row.update({k: report[k] for k in ("mesh", "strategies", "output", "loss", "grad", "param")})
            row["attention"] = attention_strategies(report)
        rows.append(row)
    return rows
