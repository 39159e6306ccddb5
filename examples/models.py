"""Models used by the examples, tests and benchmarks: plain PyTorch, no autopar in them.

* :class:`MLP` — a stack of Linear → GELU → Linear blocks;
* :class:`TinyTransformer` — a GPT-style decoder (fused QKV attention written with
  explicit matmuls and a causal mask, MLP, LayerNorm, tied embedding and LM head),
  written the way people write them, with the head count baked into ``view`` calls;
* :func:`gpt2` — Hugging Face ``GPT2LMHeadModel`` from a small config, random weights.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, width: int = 32, hidden: int = 64, depth: int = 2, out: int = 8):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, out)

    def forward(self, x):
        return self.head(self.body(x))


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, block: int):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.heads, self.width = heads, width

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(self.width, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        causal = x.new_ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, width: int, heads: int, block: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, block)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, heads: int = 4, layers: int = 2, block: int = 16):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, heads, block) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.tok.weight  # tied, as in GPT-2

    def forward(self, idx):
        T = idx.size(1)
        pos = torch.arange(T, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def lm_loss(logits, target):
    """Next-token cross-entropy over all positions (logits [B, T, V], target [B, T])."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def gpt2_loss(output, target):
    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def gpt2(layers: int = 2, width: int = 32, heads: int = 4, vocab: int = 64, positions: int = 16):
    """Hugging Face GPT-2 from a small config with random weights (dropout off, no cache)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=positions,
                        use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)
