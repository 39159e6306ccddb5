"""Attention that normalises each query and key head over its own features before the
scores (Qwen 3's, OLMo's and Gemma 3's q/k norms), written three ways: ``F.rms_norm``
with the weight by position, by keyword, and ``nn.RMSNorm`` modules; and one that
normalises the whole query projection before the view to heads (OLMo 2), a reduction
over every head. Under tensor parallelism the per-head norms split with the heads, each
rank normalising its own heads with the whole weight, whose gradient is then a partial
sum over the rank's heads: Megatron's f on the weight sums it over the group."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH, HEADS, HEAD_DIM, VOCAB, SEQ = 32, 4, 8, 64, 8
FORMS = ("positional", "keyword", "module", "whole")


class NormedAttention(nn.Module):
    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(4))
        width = WIDTH if form == "whole" else HEAD_DIM
        if form == "module":
            self.q_norm, self.k_norm = nn.RMSNorm(width, eps=1e-6), nn.RMSNorm(width, eps=1e-6)
        else:
            self.q_weight = nn.Parameter(torch.rand(width) + 0.5)
            self.k_weight = nn.Parameter(torch.rand(width) + 0.5)

    def norm(self, x: torch.Tensor, which: str) -> torch.Tensor:
        if self.form == "module":
            return getattr(self, f"{which}_norm")(x)
        weight = getattr(self, f"{which}_weight")
        if self.form == "keyword":
            return F.rms_norm(x, (x.shape[-1],), weight=weight, eps=1e-6)
        return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k = self.q(x), self.k(x)
        if self.form == "whole":
            q, k = self.norm(q, "q"), self.norm(k, "k")
        q, k = q.view(b, t, HEADS, HEAD_DIM), k.view(b, t, HEADS, HEAD_DIM)
        if self.form != "whole":
            q, k = self.norm(q, "q"), self.norm(k, "k")
        v = self.v(x).view(b, t, HEADS, HEAD_DIM)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, WIDTH))


class NormedLM(nn.Module):
    def __init__(self, form: str = "positional"):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.attention = nn.Embedding(VOCAB, WIDTH), NormedAttention(form)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        return self.head(x + self.attention(x))


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def head_norms_job(cases: list) -> list[dict]:
    """On every rank: each ``(form, strategy)`` in float64 against one process."""
    from autopar.testing import compare_with_single_device, reported_in
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(0))
    rows = []
    for form, strategy in cases:
        row: dict = {"form": form, "strategy": strategy}
        with reported_in(row, f"{form} under {strategy}"):
            report = compare_with_single_device(lambda: NormedLM(form), (ids,), ids, lm_loss, strategy,
                                                dtype=torch.float64)
            row.update({k: report[k] for k in ("regions", "output", "loss", "grad", "param")})
        rows.append(row)
    return rows
