"""Language models whose attention is written out (``q @ k^T``, elementwise ops on the
scores, ``softmax``, ``@ v``) instead of ``scaled_dot_product_attention``, for context
parallelism's all-gather form (docs/context.md, "Attention written out";
``tests/strategies/context/test_context_written_out.py``).

``form`` chooses what happens to the scores between the matmul and the softmax:

* ``"causal"``: scaled, an additive causal mask built in ``forward`` from the sequence
  length (``full((T, T), -inf).triu(1)``), softmax over the keys;
* ``"bias"``: scaled, a learned attention bias (a ``[heads, S, S]`` parameter, sliced to
  the length) added, a causal ``masked_fill``, soft-capped (``tanh(s / cap) · cap``), the
  softmax upcast to float32 and cast back (Hugging Face's eager attention);
* ``"key_bias"``: the causal mask and a bias per key computed from the hidden states
  (``x.mean(-1)`` viewed ``[B, 1, 1, T]``): split by the keys where the scores are split
  by the queries, so context parallelism gathers its key columns;
* ``"queries"``: the causal mask, then a softmax over the *queries* (``dim=-2``), which no
  rank holding a share of the queries can compute on its own: context parallelism is
  refused, naming the softmax.

``dropout`` (training mode) drops the embeddings: drawn for the whole sequence, so every
later value is whole and no attention runs on a rank's rows (refused, naming the dropout).

``gemma2()`` builds a small Hugging Face Gemma 2 (eager attention, sliding window 4:
alternating sliding-window and global layers, soft-capped scores and logits).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, HIDDEN, HEADS, SEQ = 64, 32, 4, 16


class WrittenAttention(nn.Module):
    def __init__(self, form: str):
        super().__init__()
        self.form, self.head_dim = form, HIDDEN // HEADS
        self.qkv, self.out = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        if form == "bias":
            self.bias = nn.Parameter(torch.randn(HEADS, SEQ, SEQ) * 0.5)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, HEADS, self.head_dim).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if self.form == "bias":
            scores = scores + self.bias[:, :T, :T]
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            scores = torch.tanh(scores / 20.0) * 20.0
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        else:
            scores = scores + torch.full((T, T), float("-inf"), dtype=x.dtype, device=x.device).triu(1)
            if self.form == "key_bias":
                scores = scores + x.mean(-1).view(B, 1, 1, T)
            probs = F.softmax(scores, dim=-2 if self.form == "queries" else -1)
        y = (probs @ v).transpose(1, 2).reshape(B, T, C)
        return self.out(y)


class WrittenAttentionLM(nn.Module):
    """Token embedding, ``layers`` pre-norm blocks (written-out attention, a GELU MLP), a head."""

    def __init__(self, form: str = "causal", layers: int = 2, dropout: float = 0.0):
        super().__init__()
        self.embed, self.drop = nn.Embedding(VOCAB, HIDDEN), nn.Dropout(dropout)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "norm1": nn.LayerNorm(HIDDEN), "attn": WrittenAttention(form), "norm2": nn.LayerNorm(HIDDEN),
            "up": nn.Linear(HIDDEN, 2 * HIDDEN), "down": nn.Linear(2 * HIDDEN, HIDDEN)}) for _ in range(layers))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        x = self.drop(self.embed(ids))
        for b in self.blocks:
            x = x + b["attn"](b["norm1"](x))
            x = x + b["down"](F.gelu(b["up"](b["norm2"](x))))
        return self.head(x)


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def gemma2(sliding_window: int = 4) -> nn.Module:
    """A small Hugging Face Gemma 2 with eager (written-out) attention."""
    import transformers as T
    config = T.Gemma2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=HEADS, num_key_value_heads=2, head_dim=8, sliding_window=sliding_window,
                            max_position_embeddings=64, attention_dropout=0.0, attn_implementation="eager")
    config._attn_implementation = "eager"
    return T.Gemma2ForCausalLM(config)


def logits_loss(output, target: torch.Tensor) -> torch.Tensor:
    """A float64 loss of a Hugging Face model's logits (its own loss upcasts to float32)."""
    return lm_loss(output.logits, target)
