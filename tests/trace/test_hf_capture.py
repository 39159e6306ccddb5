"""Hugging Face models as users build them: default configs (generation cache on).

A causal LM's default ``use_cache=True`` made its forward build a ``DynamicCache``:
``torch.export`` could not return it (``pm(ids)`` failed to capture) and the cache updates
hid attention and the repeated blocks from analysis (Qwen2, OPT, GPT-NeoX got neither).
Capture now turns the cache off while it traces and restores the user's setting."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autopar.trace.capture import capture
from autopar.ir import REGIONS
from autopar.passes.analysis.analyse import analyse

transformers = pytest.importorskip("transformers")


def _qwen2():
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32)
    assert config.use_cache  # the default a user gets
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config)


def _loss(output, target):
    return F.cross_entropy(output.logits.flatten(0, -2), target.flatten())


def test_default_causal_lm_gets_attention_and_blocks_and_keeps_its_config():
    model = _qwen2()
    ids = torch.randint(0, 64, (4, 16))
    gm = analyse(capture(model, (ids,), _loss, ids))
    kinds = sorted(r.kind for r in gm.meta[REGIONS].values())
    assert kinds.count("attention") == 2 and kinds.count("block") == 2, kinds
    assert model.config.use_cache is True  # restored after capture


def test_default_causal_lm_forward_captures_without_the_cache():
    model = _qwen2()
    ids = torch.randint(0, 64, (4, 16))
    gm = capture(model, (ids,))  # no loss: the model's own output, which held a DynamicCache
    out = gm(ids)
    torch.testing.assert_close(out.logits, model(ids).logits)
    assert getattr(out, "past_key_values", None) is None


def test_gpt_neox_attention_is_found_head_major():
    """GPT-NeoX packs Q, K and V head by head ([B, T, H, 3·d], then chunks the last
    dimension) and rotates only part of each head (slice, rotate, cat): its attention is
    a region, and the fused projection is split as one block (a head's q, k, v rows are
    contiguous), not three as GPT-2's [Q | K | V]."""
    config = transformers.GPTNeoXConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=32, rotary_pct=0.25)
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(config)
    ids = torch.randint(0, 64, (4, 16))
    gm = analyse(capture(model, (ids,), _loss, ids))
    attention = [r for r in gm.meta[REGIONS].values() if r.kind == "attention"]
    assert len(attention) == 2
    details = attention[0].details
    assert details["fused_qkv"] and details["qkv_blocks"] == 1 and details["heads"] == 4, details
