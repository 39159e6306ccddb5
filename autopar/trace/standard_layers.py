"""Capture of PyTorch's standard transformer layers as readable graphs.

``torch.fx.symbolic_trace`` keeps every module of ``torch.nn`` as one opaque
``call_module`` node, so a model built from ``nn.TransformerEncoder`` is, to the
analysis passes, a single node with no attention and no MLP in it. Tracing *into* the
modules does not work either: ``nn.MultiheadAttention.forward`` and
``F.multi_head_attention_forward`` branch on ``query.dim()``, ``is_nested`` and mask
dtypes, which a symbolic tracer cannot evaluate.

:class:`StandardLayerTracer` therefore traces these modules through a spelling of their
own slow path (the computation PyTorch runs when its fused "fast path" is off), written
with ops the analysis passes read:

================================  ==================================================
module                            spelled as
================================  ==================================================
``nn.MultiheadAttention``         ``F.linear(x, in_proj_weight, in_proj_bias)``
                                  chunked into Q, K, V, ``view(B, T, H, d)`` per head,
                                  ``F.scaled_dot_product_attention``, ``out_proj``
``nn.TransformerEncoderLayer``    self-attention and feed-forward, post- or pre-norm
``nn.TransformerDecoderLayer``    self-attention, cross-attention, feed-forward
``nn.TransformerEncoder`` /       its layers in order, then the final norm
``nn.TransformerDecoder``
``nn.Transformer``                encoder, then decoder
================================  ==================================================

Masks (``attn_mask``, ``key_padding_mask``, boolean or additive) are merged into one
additive mask by :func:`additive_attention_mask`, a function the graph calls (it reads
dtypes at run time, which the tracer cannot).

An attention the spelling does not cover stays one opaque ``call_module`` node, exactly
as ``symbolic_trace`` would leave it, and is replicated by every plan: cross-attention
(query different from key/value: the packed in-projection would have to be sliced),
``kdim``/``vdim`` different from ``embed_dim``, ``add_bias_kv``, ``add_zero_attn``,
``is_causal=True`` without a mask (PyTorch refuses it too), and attention weights asked
for while attention dropout is active. The reason is logged on ``autopar.capture``.
Unbatched (2-D) inputs are not spelled: tracing fails and ``tracer="auto"`` falls back to
``torch.export``.

``torch.export`` traces the real modules; :func:`mha_fast_path_disabled` keeps it (and the
spelling's reference semantics) on the slow path, whose ATen graph
(``aten.linear`` with ``in_proj_weight``, ``unflatten(-1, [3, E])``, ``select``,
``aten.scaled_dot_product_attention``) the attention pass reads. Without it, a model in
eval mode under ``torch.no_grad`` would export as one ``_transformer_encoder_layer_fwd``.

Example (``capture(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), (x,))``,
the first lines)::

    size = input_0.size(0)
    size_1 = input_0.size(1)
    model_self_attn_in_proj_weight = self.model.self_attn.in_proj_weight
    model_self_attn_in_proj_bias = self.model.self_attn.in_proj_bias
    linear = torch._C._nn.linear(input_0, model_self_attn_in_proj_weight, model_self_attn_in_proj_bias)
    chunk = linear.chunk(3, dim = -1)
    getitem = chunk[0]
    view = getitem.view(size, size_1, 4, 4)
    transpose = view.transpose(1, 2)
    ...
    scaled_dot_product_attention = torch._C._nn.scaled_dot_product_attention(transpose, transpose_1, transpose_2, None, 0.1, False)
    transpose_3 = scaled_dot_product_attention.transpose(1, 2)
    reshape = transpose_3.reshape(size, size_1, 16)
    model_self_attn_out_proj = self.model.self_attn.out_proj(reshape)
    model_dropout1 = self.model.dropout1(model_self_attn_out_proj)
"""
from __future__ import annotations

import functools
import inspect
import logging
import math
from contextlib import contextmanager
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

log = logging.getLogger("autopar.capture")


@contextmanager
def mha_fast_path_disabled():
    """PyTorch's fused transformer fast path off for the duration (restored after)."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def additive_attention_mask(attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None,
                            heads: int, dtype: torch.dtype) -> torch.Tensor | None:
    """``nn.MultiheadAttention``'s masks as one additive mask for
    ``scaled_dot_product_attention`` on ``[B, heads, L, S]`` scores.

    A boolean mask is ``-inf`` where True (masked out), a floating one is added as it is
    (``F._canonical_mask``). ``attn_mask`` is ``[L, S]`` or ``[B·heads, L, S]`` (made
    ``[B, heads, L, S]``); ``key_padding_mask`` is ``[B, S]`` (made ``[B, 1, 1, S]``).
    """
    def additive(mask: torch.Tensor) -> torch.Tensor:
        if mask.dtype == torch.bool:
            return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask, float("-inf"))
        return mask.to(dtype)

    merged = None
    if attn_mask is not None:
        merged = additive(attn_mask)
        if merged.dim() == 3:
            merged = merged.view(-1, heads, merged.size(-2), merged.size(-1))
    if key_padding_mask is not None:
        padding = additive(key_padding_mask)
        padding = padding.view(padding.size(0), 1, 1, padding.size(1))
        merged = padding if merged is None else merged + padding
    return merged


# ---------------------------------------------------------------- the spellings

def _bind(method: Callable, module: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = inspect.signature(method).bind(module, *args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.pop("self")
    return arguments


def _mha_unreadable(m: nn.MultiheadAttention, a: dict[str, Any]) -> str | None:
    """Why the spelling does not cover this call (None when it does)."""
    if not m._qkv_same_embed_dim:
        return "kdim/vdim differ from embed_dim (separate Q/K/V projection weights)"
    if m.bias_k is not None:
        return "add_bias_kv=True"
    if m.add_zero_attn:
        return "add_zero_attn=True"
    if not (a["query"] is a["key"] and a["key"] is a["value"]):
        return "query, key and value are different values (cross-attention)"
    if a["is_causal"] and a["attn_mask"] is None:
        return "is_causal=True without attn_mask"
    if a["need_weights"] and m.training and m.dropout > 0:
        return "attention weights asked for while attention dropout is active"
    return None


def _mha_forward(tracer: "StandardLayerTracer", m: nn.MultiheadAttention, *args, **kwargs):
    """``nn.MultiheadAttention`` (self-attention, packed in-projection) as readable ops."""
    a = _bind(nn.MultiheadAttention.forward, m, args, kwargs)
    x = a["query"]
    embed, heads = m.embed_dim, m.num_heads
    head_dim = embed // heads
    if not m.batch_first:  # [T, B, E] -> [B, T, E]
        x = x.transpose(0, 1)
    batch, length = x.size(0), x.size(1)
    qkv = F.linear(x, m.in_proj_weight, m.in_proj_bias)
    chunks = qkv.chunk(3, dim=-1)
    q, k, v = (chunks[i].view(batch, length, heads, head_dim).transpose(1, 2) for i in range(3))
    use_causal = bool(a["is_causal"]) and a["key_padding_mask"] is None and not a["need_weights"]
    mask = None
    if not use_causal and (a["attn_mask"] is not None or a["key_padding_mask"] is not None):
        mask = tracer.create_proxy("call_function", additive_attention_mask,
                                   (a["attn_mask"], a["key_padding_mask"], heads, a["query"].dtype), {})
    dropout = m.dropout if m.training else 0.0
    context = F.scaled_dot_product_attention(q, k, v, mask, dropout, use_causal)
    out = m.out_proj(context.transpose(1, 2).reshape(batch, length, embed))
    if not m.batch_first:
        out = out.transpose(0, 1)
    weights = None
    if a["need_weights"]:
        # a side computation (attention dropout is off here, see _mha_unreadable); erased
        # after tracing when the caller drops the weights
        first = len(tracer.graph.nodes)
        scores = (q * (1.0 / math.sqrt(head_dim))) @ k.transpose(-2, -1)
        if mask is not None:
            scores = scores + mask
        weights = scores.softmax(dim=-1)
        if a["average_attn_weights"]:
            weights = weights.mean(dim=1)
        tracer.side_nodes.extend(list(tracer.graph.nodes)[first:])
    return out, weights


def _encoder_layer_forward(tracer, m: nn.TransformerEncoderLayer, *args, **kwargs):
    a = _bind(nn.TransformerEncoderLayer.forward, m, args, kwargs)

    def attention(x):
        return m.dropout1(m.self_attn(x, x, x, attn_mask=a["src_mask"], key_padding_mask=a["src_key_padding_mask"],
                                      need_weights=False, is_causal=a["is_causal"])[0])

    x = a["src"]
    if m.norm_first:
        x = x + attention(m.norm1(x))
        return x + _feed_forward(m, m.norm2(x))
    x = m.norm1(x + attention(x))
    return m.norm2(x + _feed_forward(m, x))


def _decoder_layer_forward(tracer, m: nn.TransformerDecoderLayer, *args, **kwargs):
    a = _bind(nn.TransformerDecoderLayer.forward, m, args, kwargs)
    memory = a["memory"]

    def self_attention(x):
        return m.dropout1(m.self_attn(x, x, x, attn_mask=a["tgt_mask"], key_padding_mask=a["tgt_key_padding_mask"],
                                      is_causal=a["tgt_is_causal"], need_weights=False)[0])

    def cross_attention(x):
        return m.dropout2(m.multihead_attn(x, memory, memory, attn_mask=a["memory_mask"],
                                           key_padding_mask=a["memory_key_padding_mask"],
                                           is_causal=a["memory_is_causal"], need_weights=False)[0])

    x = a["tgt"]
    if m.norm_first:
        x = x + self_attention(m.norm1(x))
        x = x + cross_attention(m.norm2(x))
        return x + _feed_forward(m, m.norm3(x), last_dropout=m.dropout3)
    x = m.norm1(x + self_attention(x))
    x = m.norm2(x + cross_attention(x))
    return m.norm3(x + _feed_forward(m, x, last_dropout=m.dropout3))


def _feed_forward(m, x, last_dropout=None):
    last_dropout = m.dropout2 if last_dropout is None else last_dropout
    return last_dropout(m.linear2(m.dropout(m.activation(m.linear1(x)))))


def _encoder_forward(tracer, m: nn.TransformerEncoder, *args, **kwargs):
    a = _bind(nn.TransformerEncoder.forward, m, args, kwargs)
    # ``is_causal`` is a hint that the mask is causal; None (detect) is passed as "no hint",
    # which computes the same result through the mask itself
    output = a["src"]
    for layer in m.layers:
        output = layer(output, src_mask=a["mask"], src_key_padding_mask=a["src_key_padding_mask"],
                       is_causal=a["is_causal"] is True)
    return m.norm(output) if m.norm is not None else output


def _decoder_forward(tracer, m: nn.TransformerDecoder, *args, **kwargs):
    a = _bind(nn.TransformerDecoder.forward, m, args, kwargs)
    output = a["tgt"]
    for layer in m.layers:
        output = layer(output, a["memory"], tgt_mask=a["tgt_mask"], memory_mask=a["memory_mask"],
                       tgt_key_padding_mask=a["tgt_key_padding_mask"],
                       memory_key_padding_mask=a["memory_key_padding_mask"],
                       tgt_is_causal=a["tgt_is_causal"] is True, memory_is_causal=a["memory_is_causal"])
    return m.norm(output) if m.norm is not None else output


def _transformer_forward(tracer, m: nn.Transformer, *args, **kwargs):
    a = _bind(nn.Transformer.forward, m, args, kwargs)
    memory = m.encoder(a["src"], mask=a["src_mask"], src_key_padding_mask=a["src_key_padding_mask"],
                       is_causal=a["src_is_causal"])
    return m.decoder(a["tgt"], memory, tgt_mask=a["tgt_mask"], memory_mask=a["memory_mask"],
                     tgt_key_padding_mask=a["tgt_key_padding_mask"],
                     memory_key_padding_mask=a["memory_key_padding_mask"],
                     tgt_is_causal=a["tgt_is_causal"], memory_is_causal=a["memory_is_causal"])


_SPELLINGS: dict[type, Callable] = {
    nn.MultiheadAttention: _mha_forward,
    nn.TransformerEncoderLayer: _encoder_layer_forward,
    nn.TransformerDecoderLayer: _decoder_layer_forward,
    nn.TransformerEncoder: _encoder_forward,
    nn.TransformerDecoder: _decoder_forward,
    nn.Transformer: _transformer_forward,
}


class StandardLayerTracer(fx.Tracer):
    """``symbolic_trace``'s tracer, tracing PyTorch's transformer modules through the
    spellings above instead of keeping them opaque (see the module docstring).

    Only the exact classes are spelled: a user's subclass may override ``forward``, so it
    is traced as ``symbolic_trace`` would trace it.
    """

    def __init__(self):
        super().__init__()
        self.side_nodes: list[fx.Node] = []
        self._through: list[nn.Module] = []

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if self._through and m is self._through[-1]:
            return False
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Callable, args: tuple, kwargs: dict) -> Any:
        spelling = _SPELLINGS.get(type(m))
        if spelling is not None and type(m) is nn.MultiheadAttention:
            why = _mha_unreadable(m, _bind(nn.MultiheadAttention.forward, m, args, kwargs))
            if why is not None:
                log.info("capture: %s (nn.MultiheadAttention) stays one opaque node: %s; it is replicated",
                         self.path_of_module(m), why)
                spelling = None
        if spelling is None:
            return super().call_module(m, forward, args, kwargs)
        self._through.append(m)
        try:
            return super().call_module(m, functools.partial(spelling, self, m), args, kwargs)
        finally:
            self._through.pop()

    def trace(self, root, concrete_args=None) -> fx.Graph:
        graph = super().trace(root, concrete_args)
        for node in reversed(self.side_nodes):  # attention weights nobody reads
            if not node.users:
                graph.erase_node(node)
        return graph


def symbolic_trace(root: nn.Module) -> fx.GraphModule:
    """``torch.fx.symbolic_trace(root)`` with :class:`StandardLayerTracer`."""
    tracer = StandardLayerTracer()
    with mha_fast_path_disabled():
        graph = tracer.trace(root)
    return fx.GraphModule(tracer.root, graph, type(root).__name__)


__all__ = ["StandardLayerTracer", "symbolic_trace", "mha_fast_path_disabled", "additive_attention_mask"]
