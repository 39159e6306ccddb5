"""Models built from PyTorch's standard transformer layers (``nn.TransformerEncoder`` of
``nn.TransformerEncoderLayer``, ``nn.MultiheadAttention``), and the job that trains them on
ranks against the single-device model (``tests/trace/test_standard_layers.py``).

:class:`EncoderLM` is token embedding → ``nn.TransformerEncoder`` → linear head. Its
inputs and outputs are batch-major whatever ``batch_first`` says (a sequence-first
encoder is wrapped in transposes), so data parallelism splits the batch. ``spelling``
picks how capture sees the layers: ``"symbolic_trace"`` (autopar's tracer spells the
modules out, see ``autopar/trace/standard_layers.py``) or ``"export"`` (the forward branches
on the input's shape, which symbolic tracing cannot follow, so ``torch.export`` captures
the real modules).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from examples.models import lm_loss

VOCAB, WIDTH, HEADS, SEQ = 64, 32, 4, 8


class EncoderLM(nn.Module):
    def __init__(self, *, batch_first: bool = True, norm_first: bool = False, causal: bool = False,
                 padding: bool = False, spelling: str = "symbolic_trace", layers: int = 2,
                 attention: dict | None = None, seq: int = SEQ):
        super().__init__()
        self.batch_first, self.spelling, self.padding = batch_first, spelling, padding
        self.tok = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 2 * WIDTH, dropout=0.0, batch_first=batch_first,
                                           norm_first=norm_first)
        if attention is not None:  # a variant of the attention the layer holds (add_bias_kv, kdim, ...)
            layer.self_attn = nn.MultiheadAttention(WIDTH, HEADS, dropout=0.0, batch_first=batch_first, **attention)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq) if causal else None)

    def forward(self, ids):
        h = self.tok(ids)
        if self.spelling == "export" and ids.size(1) > 4096:  # shape control flow: symbolic tracing stops here
            h = h * 0.5
        if not self.batch_first:
            h = h.transpose(0, 1)
        # torch's TransformerEncoder compares a mask with a causal one to detect causality,
        # which torch.export cannot trace (a data-dependent branch): give it the hint
        hint = True if self.spelling == "export" and self.mask is not None else None
        # padding: the tokens below 8 stand for padding, masked out as keys
        h = self.encoder(h, mask=self.mask, is_causal=hint, src_key_padding_mask=ids < 8 if self.padding else None)
        if not self.batch_first:
            h = h.transpose(0, 1)
        return self.head(h)


class DecoderLM(nn.Module):
    """Token embedding → ``nn.TransformerDecoder`` (2 layers) reading the embedded tokens
    as memory too → head: self-attention and the MLP are regions, cross-attention (the
    packed in-projection sliced for the query and for the key/value) stays replicated."""

    def __init__(self, spelling: str = "symbolic_trace"):
        super().__init__()
        self.spelling = spelling
        self.tok = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerDecoderLayer(WIDTH, HEADS, 2 * WIDTH, dropout=0.0, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, 2)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        h = self.tok(ids)
        if self.spelling == "export" and ids.size(1) > 4096:
            h = h * 0.5
        return self.head(self.decoder(h, h))


class CrossKV(nn.Module):
    """One ``nn.MultiheadAttention`` whose keys and values have their own widths
    (``kdim``/``vdim``), next to an MLP: the attention cannot be read, the MLP can."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.memory = nn.Linear(WIDTH, 16)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, kdim=16, vdim=24, batch_first=True)
        self.values = nn.Linear(WIDTH, 24)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        h = self.tok(ids)
        a, _ = self.attn(h, self.memory(h), self.values(h))
        h = h + a
        h = h + self.fc2(torch.relu(self.fc1(h)))
        return self.head(h)


def model(name: str) -> nn.Module:
    """A model by name: ``encoder``, ``encoder_seq_first``, ``encoder_prenorm``,
    ``encoder_causal``, ``encoder_padding``, ``decoder``, each with ``_export`` appended for
    the export spelling; ``bias_kv`` (``add_bias_kv=True``), ``kdim_vdim`` (:class:`CrossKV`)."""
    if name == "bias_kv":
        return EncoderLM(attention={"add_bias_kv": True})
    if name == "kdim_vdim":
        return CrossKV()
    if name.startswith("decoder"):
        return DecoderLM("export" if name.endswith("_export") else "symbolic_trace")
    base, _, spelling = name.partition("_export")
    options = {"encoder": {}, "encoder_seq_first": {"batch_first": False}, "encoder_prenorm": {"norm_first": True},
               "encoder_causal": {"causal": True}, "encoder_padding": {"padding": True}}[base]
    return EncoderLM(spelling="export" if name.endswith("_export") else "symbolic_trace", **options)


def training_case(name: str, batch: int = 4):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (batch, SEQ), generator=generator)
    target = torch.randint(0, VOCAB, (batch, SEQ), generator=generator)
    return (lambda: model(name)), (ids,), target, lm_loss


def standard_layers_job(cases: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """On every rank: each ``(model name, strategy)`` compared with single-device
    training (``autopar.testing.compare_with_single_device``); an error is reported in the
    row, not raised, so one spawn runs every case (``autopar.testing.reported_in``)."""
    from autopar.testing import compare_with_single_device, reported_in
    rows = []
    for name, strategy in cases:
        row: dict[str, Any] = {"model": name, "strategy": strategy}
        with reported_in(row, f"case {name} under {strategy}"):
            factory, inputs, target, loss_fn = training_case(name)
            row.update(compare_with_single_device(factory, inputs, target, loss_fn, strategy))
        rows.append(row)
    return rows
