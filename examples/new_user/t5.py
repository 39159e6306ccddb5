"""A T5 encoder as Hugging Face's ``modeling_t5`` writes it: ``T5LayerNorm``, ``T5Attention``
with its relative position bias (log-spaced buckets, computed by the first layer and
passed to the others), unscaled scores, a padding mask, a ReLU feed-forward; with a
token-level head."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

class T5LayerNorm(nn.Module):
    """Root mean square norm: no mean subtracted, no bias."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states


class T5Attention(nn.Module):
    def __init__(self, d_model, d_kv, n_heads, has_relative_attention_bias=False,
                 relative_attention_num_buckets=32, relative_attention_max_distance=128):
        super().__init__()
        self.has_relative_attention_bias = has_relative_attention_bias
        self.relative_attention_num_buckets = relative_attention_num_buckets
        self.relative_attention_max_distance = relative_attention_max_distance
        self.n_heads, self.key_value_proj_dim = n_heads, d_kv
        self.inner_dim = n_heads * d_kv
        self.q = nn.Linear(d_model, self.inner_dim, bias=False)
        self.k = nn.Linear(d_model, self.inner_dim, bias=False)
        self.v = nn.Linear(d_model, self.inner_dim, bias=False)
        self.o = nn.Linear(self.inner_dim, d_model, bias=False)
        if self.has_relative_attention_bias:
            self.relative_attention_bias = nn.Embedding(self.relative_attention_num_buckets, self.n_heads)

    @staticmethod
    def _relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
        relative_buckets = 0
        if bidirectional:
            num_buckets //= 2
            relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
            relative_position = torch.abs(relative_position)
        else:
            relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
        max_exact = num_buckets // 2
        is_small = relative_position < max_exact
        relative_position_if_large = max_exact + (
            torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)).to(torch.long)
        relative_position_if_large = torch.min(relative_position_if_large,
                                               torch.full_like(relative_position_if_large, num_buckets - 1))
        relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
        return relative_buckets

    def compute_bias(self, query_length, key_length, device=None):
        context_position = torch.arange(query_length, dtype=torch.long, device=device)[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
        relative_position = memory_position - context_position  # shape (query_length, key_length)
        relative_position_bucket = self._relative_position_bucket(
            relative_position, bidirectional=True, num_buckets=self.relative_attention_num_buckets,
            max_distance=self.relative_attention_max_distance)
        values = self.relative_attention_bias(relative_position_bucket)  # (query_length, key_length, n_heads)
        return values.permute([2, 0, 1]).unsqueeze(0)  # (1, n_heads, query_length, key_length)

    def forward(self, hidden_states, mask=None, position_bias=None):
        batch_size, seq_length = hidden_states.shape[:2]

        def shape(states):
            return states.view(batch_size, -1, self.n_heads, self.key_value_proj_dim).transpose(1, 2)

        query_states = shape(self.q(hidden_states))
        key_states = shape(self.k(hidden_states))
        value_states = shape(self.v(hidden_states))
        scores = torch.matmul(query_states, key_states.transpose(3, 2))
        if position_bias is None:
            position_bias = self.compute_bias(seq_length, seq_length, device=scores.device)
            if mask is not None:
                position_bias = position_bias + mask  # (batch_size, n_heads, seq_length, key_length)
        scores += position_bias
        attn_weights = F.softmax(scores.float(), dim=-1).type_as(scores)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous().view(batch_size, -1, self.inner_dim)
        return self.o(attn_output), position_bias


class T5Block(nn.Module):
    def __init__(self, d_model, d_kv, d_ff, n_heads, has_relative_attention_bias=False):
        super().__init__()
        self.layer_norm = T5LayerNorm(d_model)
        self.SelfAttention = T5Attention(d_model, d_kv, n_heads, has_relative_attention_bias)
        self.ff_layer_norm = T5LayerNorm(d_model)
        self.wi = nn.Linear(d_model, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(0.0)

    def forward(self, hidden_states, attention_mask=None, position_bias=None):
        attention_output, position_bias = self.SelfAttention(self.layer_norm(hidden_states), mask=attention_mask,
                                                             position_bias=position_bias)
        hidden_states = hidden_states + self.dropout(attention_output)
        forwarded = self.wo(self.dropout(F.relu(self.wi(self.ff_layer_norm(hidden_states)))))
        return hidden_states + self.dropout(forwarded), position_bias


class T5Encoder(nn.Module):
    """The encoder stack and a token-level head (a tagger, or masked-token prediction)."""

    def __init__(self, vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, d_model)
        self.block = nn.ModuleList([T5Block(d_model, d_kv, d_ff, num_heads, has_relative_attention_bias=bool(i == 0))
                                    for i in range(num_layers)])
        self.final_layer_norm = T5LayerNorm(d_model)
        self.dropout = nn.Dropout(0.0)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, input_ids, attention_mask=None):
        hidden_states = self.dropout(self.embed_tokens(input_ids))
        extended_attention_mask = None
        if attention_mask is not None:
            extended_attention_mask = attention_mask[:, None, None, :].to(dtype=hidden_states.dtype)
            extended_attention_mask = (1.0 - extended_attention_mask) * torch.finfo(hidden_states.dtype).min
        position_bias = None
        for layer_module in self.block:
            hidden_states, position_bias = layer_module(hidden_states, extended_attention_mask, position_bias)
        hidden_states = self.dropout(self.final_layer_norm(hidden_states))
        return self.lm_head(hidden_states)
