"""One fused Q/K/V projection, laid out each way model code in the wild writes it, and the
job that trains each under tensor parallelism against the single device
(``tests/test_qkv_layouts.py``).

The projection yields ``3·H·d`` features; the layouts differ in what is outermost:

* ``heads_3_d``: ``view(B, T, H, 3, d).unbind(3)`` (torchtitan's and BLOOM's fused
  projection): each head's q, k, v contiguous;
* ``heads_3d``: ``view(B, T, H, 3·d).split(d, -1)`` (GPT-NeoX);
* ``unflatten``: ``unflatten(-1, (H, 3, d)).unbind(-2)``, the first spelled otherwise;
* ``3_heads_d``: ``view(B, T, 3, H, d).unbind(2)``: Q, K and V as three blocks;
* ``permuted``: ``reshape(B, T, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)`` (timm's
  vision transformer): three blocks, taken after a permute;
* ``chunk``: ``chunk(3, -1)`` of the packed features, each viewed ``[B, T, H, d]``.

With heads outermost a plain column split of the projection is a split by heads; with
Q, K and V outermost each block is split (``qkv_blocks = 3``). With three heads the
shapes alone cannot tell the two apart, and the dimension the query is taken along does.
"""
from __future__ import annotations

import traceback
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ = 64, 8
LAYOUTS = ("heads_3_d", "heads_3d", "unflatten", "3_heads_d", "permuted", "chunk")
HEAD_MAJOR = {"heads_3_d", "heads_3d", "unflatten"}


class FusedAttention(nn.Module):
    def __init__(self, layout: str, heads: int, width: int):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
        self.layout, self.heads = layout, heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        b, t, width = x.shape
        h, d = self.heads, width // self.heads
        y = self.qkv(x)
        if self.layout == "heads_3_d":
            q, k, v = y.view(b, t, h, 3, d).unbind(3)
        elif self.layout == "heads_3d":
            q, k, v = y.view(b, t, h, 3 * d).split(d, dim=-1)
        elif self.layout == "unflatten":
            q, k, v = y.unflatten(-1, (h, 3, d)).unbind(-2)
        elif self.layout == "3_heads_d":
            q, k, v = y.view(b, t, 3, h, d).unbind(2)
        elif self.layout == "permuted":
            q, k, v = y.reshape(b, t, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        else:
            q, k, v = (z.view(b, t, h, d) for z in y.chunk(3, dim=-1))
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.out(o.transpose(1, 2).reshape(b, t, width))


class FusedAttentionLM(nn.Module):
    """Embedding → :class:`FusedAttention` (residual) → linear head."""

    def __init__(self, layout: str, heads: int = 4, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.attn = FusedAttention(layout, heads, width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, ids):
        h = self.embed(ids)
        return self.head(h + self.attn(h))


def lm_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def qkv_layouts_job(cases: list[tuple[str, int, Any]]) -> list[dict[str, Any]]:
    """On every rank: each ``(layout, heads, strategy)`` trained in float64 against the
    single device (:func:`autopar.testing.compare_with_single_device`), with the regions
    the plan split; an error is reported in the row, unless it leaves the process group
    unusable."""
    from autopar.testing import compare_with_single_device, leaves_group_unusable
    rows = []
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=generator)
    target = torch.randint(0, VOCAB, (4, SEQ), generator=generator)
    for layout, heads, strategy in cases:
        row: dict[str, Any] = {"layout": layout, "heads": heads, "strategy": strategy}
        try:
            report = compare_with_single_device(lambda: FusedAttentionLM(layout, heads, 8 * heads), (ids,), target,
                                                lm_loss, strategy, dtype=torch.float64)
            row.update({k: report[k] for k in ("output", "loss", "grad", "param", "strategies")})
            row["attention"] = [line.split()[2] for line in report["plan"].splitlines()
                                if line.startswith("attention:")]
        except Exception as e:  # noqa: BLE001 - reported per case
            if leaves_group_unusable(e):
                raise RuntimeError(f"layout {layout} under {strategy}: {type(e).__name__}: {e}") from e
            row.update({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        rows.append(row)
    return rows
