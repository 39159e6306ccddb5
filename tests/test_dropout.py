"""Dropout under tensor parallelism: replicated activations draw the same mask on every
tensor rank, split ones draw from the per-rank stream (DESIGN.md, megatron §2.3)."""
import pytest
import torch
import torch.nn as nn

import autopar
import shared_ranks


def test_dropout_on_a_split_activation_uses_the_sharded_stream():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.5), nn.Linear(16, 8), nn.Dropout(0.1))
    plan = autopar.plan(model, 2, (torch.randn(4, 8),), strategy={"tensor": 2})
    code = autopar.rank_graph(model, plan, 0, (torch.randn(4, 8),)).code
    assert "sharded_dropout(model_1, 0.5, True, 'tensor')" in code  # between the column and row linear
    assert "replicated_dropout(add, 0.1, True, 'tensor')" in code   # after g and the bias
    # with sequence parallelism the dropout after the row linear is on its tokens' split
    plan = autopar.plan(model, 2, (torch.randn(4, 8),), strategy={"tensor": 2, "sequence_parallel": True})
    code = autopar.rank_graph(model, plan, 0, (torch.randn(4, 8),)).code
    assert plan.sequence_parallel and "sharded_dropout(add, 0.1, True, 'tensor')" in code


def _gpt2_with_dropout():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, use_cache=False,
                        resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 64, (2, 16))
    pm = autopar.compile(model, None, example_inputs=(ids,), strategy={"tensor": 2}, seed=7)
    first = pm(ids).logits.detach()
    second = pm(ids).logits.detach()
    pm.eval()
    plain = pm(ids).logits.detach()
    return first, second, plain


_LAUNCHED = shared_ranks.register(2, __name__, _gpt2_with_dropout)  # one launch with other modules' jobs


@pytest.mark.multiprocess
def test_replicated_dropout_masks_agree_across_tensor_ranks():
    (a0, b0, e0), (a1, b1, e1) = _LAUNCHED()
    assert torch.equal(a0, a1) and torch.equal(b0, b1)  # same masks on both tensor ranks
    assert not torch.equal(a0, b0)                      # fresh masks each call
    assert not torch.allclose(a0, e0)                   # dropout was active in training mode
    assert torch.equal(e0, e1)
