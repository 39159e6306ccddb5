"""Models used by the examples, tests and benchmarks: plain PyTorch, no autopar in them.

* :class:`MLP` — a stack of Linear → GELU → Linear blocks;
* :class:`TinyTransformer` — a GPT-style decoder (fused QKV attention written with
  explicit matmuls and a causal mask, MLP, LayerNorm, tied embedding and LM head),
  written the way people write them, with the head count baked into ``view`` calls;
* :func:`gpt2` — Hugging Face ``GPT2LMHeadModel`` from a small config, random weights;
* :class:`Inception`, :class:`Towers` — multi-branch CNN and MLP towers (D&SP's regions);
* :class:`StemTrunk` — a multi-branch convolutional stem feeding a transformer trunk
  (the mixed plans' example: D&SP on the stem, Megatron or 3D on the trunk).
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
    """``tied=False``: the LM head has its own weight (and a bias with ``head_bias``)."""

    def __init__(self, vocab: int = 64, width: int = 32, heads: int = 4, layers: int = 2, block: int = 16,
                 tied: bool = True, head_bias: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, heads, block) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=head_bias)
        if tied:
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


class Inception(nn.Module):
    """A small Inception-style CNN: a stem, three parallel branches of different cost
    joined by a concat over channels, and a classifier head."""

    def __init__(self, classes: int = 5):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.b1 = nn.Conv2d(8, 4, 1)
        self.b2 = nn.Sequential(nn.Conv2d(8, 4, 1), nn.ReLU(), nn.Conv2d(4, 6, 3, padding=1))
        self.b3 = nn.Sequential(nn.Conv2d(8, 2, 1), nn.ReLU(), nn.Conv2d(2, 2, 5, padding=2))
        self.head = nn.Linear(12, classes)

    def forward(self, x):
        h = F.relu(self.stem(x))
        y = torch.cat([self.b1(h), self.b2(h), self.b3(h)], dim=1)
        return self.head(y.mean((2, 3)))


class Towers(nn.Module):
    """Parallel MLP towers of unequal depth whose outputs are summed, plus a skip."""

    def __init__(self, width: int = 16, classes: int = 4, towers: int = 3):
        super().__init__()
        self.inp = nn.Linear(width, width)
        shapes = [
            nn.Sequential(nn.Linear(width, 32), nn.Tanh(), nn.Linear(32, width)),
            nn.Sequential(nn.Linear(width, width)),
            nn.Sequential(nn.Linear(width, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, width)),
            nn.Sequential(nn.Linear(width, 8), nn.ReLU(), nn.Linear(8, width)),
        ]
        self.towers = nn.ModuleList(shapes[:towers])
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        y = self.towers[0](h)
        for tower in self.towers[1:]:
            y = y + tower(h)
        return self.out(y)


class StemTrunk(nn.Module):
    """A multi-branch convolutional stem whose channels become the tokens of a
    transformer trunk: an image ``[B, 3, H, W]`` → a stem convolution (``stem``
    channels) → four branches of different cost concatenated over channels (``width`` in
    all) → ``H·W`` tokens of
    ``width`` → ``layers`` transformer blocks → mean over tokens → a classifier."""

    def __init__(self, width: int = 32, heads: int = 4, layers: int = 2, classes: int = 5, side: int = 4,
                 stem: int = 8):
        super().__init__()
        quarter = width // 4
        self.stem = nn.Conv2d(3, stem, 3, padding=1)
        self.b1 = nn.Conv2d(stem, quarter, 1)
        self.b2 = nn.Sequential(nn.Conv2d(stem, stem, 1), nn.ReLU(), nn.Conv2d(stem, quarter, 3, padding=1))
        self.b3 = nn.Sequential(nn.Conv2d(stem, stem // 2, 1), nn.ReLU(), nn.Conv2d(stem // 2, quarter, 5, padding=2))
        self.b4 = nn.Sequential(nn.AvgPool2d(3, 1, padding=1), nn.Conv2d(stem, quarter, 1))
        self.pos = nn.Parameter(torch.randn(side * side, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads, side * side) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = F.relu(self.stem(x))
        y = torch.cat([self.b1(h), self.b2(h), self.b3(h), self.b4(h)], dim=1)
        tokens = y.flatten(2).transpose(1, 2) + self.pos
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(self.ln_f(tokens).mean(1))


class TowerBlock(nn.Module):
    """A transformer block whose MLP is a dense mixture of expert towers: ``towers``
    MLPs of different widths read the same normalised input and their outputs are
    summed (a fork/join region of linear chains)."""

    def __init__(self, width: int, heads: int, block: int, towers: int = 4):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, block)
        self.ln2 = nn.LayerNorm(width)
        self.towers = nn.ModuleList(
            nn.Sequential(nn.Linear(width, (i + 1) * width), nn.GELU(), nn.Linear((i + 1) * width, width))
            for i in range(towers))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        h = self.ln2(x)
        y = self.towers[0](h)
        for tower in self.towers[1:]:
            y = y + tower(h)
        return x + y


class TowerTrunk(nn.Module):
    """A language model of :class:`TowerBlock` s: attention between mixtures of expert
    towers (token and position embeddings, ``layers`` blocks, a final norm, a head)."""

    def __init__(self, vocab: int = 64, width: int = 32, heads: int = 4, layers: int = 2, block: int = 16,
                 towers: int = 4):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(TowerBlock(width, heads, block, towers) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class ExpertMLP(nn.Module):
    """One expert: a SwiGLU MLP of standard linears (with biases: any module serves)."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(width, hidden), nn.Linear(width, hidden)
        self.w2 = nn.Linear(hidden, width)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class ListMoE(nn.Module):
    """A routed mixture-of-experts layer written with a ``ModuleList``, as users write it:
    a softmax router, top-k, renormalised weights, and a loop over the experts that runs
    each on the tokens routed to it (``torch.where``) and ``index_add``s its weighted
    output."""

    def __init__(self, width: int = 32, hidden: int = 48, experts: int = 4, top_k: int = 2):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList([ExpertMLP(width, hidden) for _ in range(experts)])

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, index = torch.topk(F.softmax(self.gate(x), dim=-1), self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(index == e)
            out = out.index_add(0, token, expert(x[token]) * weights[token, slot, None])
        return out.reshape(shape)


class ListMoETransformer(nn.Module):
    """Embedding, 2 pre-norm blocks of causal attention and a :class:`ListMoE`, a head."""

    def __init__(self, vocab: int = 64, width: int = 32, layers: int = 2, experts: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.attn = nn.ModuleList([CausalSelfAttention(width, 4, 16) for _ in range(layers)])
        self.norm1 = nn.ModuleList([nn.LayerNorm(width) for _ in range(layers)])
        self.norm2 = nn.ModuleList([nn.LayerNorm(width) for _ in range(layers)])
        self.moe = nn.ModuleList([ListMoE(width, experts=experts) for _ in range(layers)])
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        h = self.embed(ids)
        for attn, n1, n2, moe in zip(self.attn, self.norm1, self.norm2, self.moe):
            h = h + attn(n1(h))
            h = h + moe(n2(h))
        return self.head(h)


class UserAttention(nn.Module):
    """Attention as users write it: one fused QKV projection split in forward
    (``.split(width, -1)``, or ``.chunk(3, -1)`` with ``chunk=True``) and PyTorch's
    ``scaled_dot_product_attention`` with ``is_causal=True``."""

    def __init__(self, width: int, heads: int, chunk: bool = False):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.heads, self.width, self.chunk = heads, width, chunk

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).chunk(3, -1) if self.chunk else self.qkv(x).split(self.width, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class UserBlock(nn.Module):
    def __init__(self, width: int, heads: int, chunk: bool = False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = UserAttention(width, heads, chunk)
        self.fc, self.proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class UserGPT(nn.Module):
    """A GPT written as users write it (:class:`UserAttention`), its LM head the token
    embedding's weight applied by ``F.linear(x, self.wte.weight)`` (tied without a
    ``Linear`` module)."""

    def __init__(self, vocab: int, width: int, heads: int, layers: int, block: int, chunk: bool = False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(block, width)
        self.h = nn.ModuleList(UserBlock(width, heads, chunk) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)
