"""Mixture-of-experts layers written densely, as Hugging Face's Llama 4 writes its own:
every expert runs on every token, the token's row scaled by a routing weight that is zero
for the experts its router did not pick (docs/experts.md, "Experts written densely").

``DenseMoELM(form)``: an embedding, two blocks of RMS norm and a dense MoE layer with a
shared expert, and a head. The ``form`` says how the layer is written:

* ``"sigmoid_bmm"``: Llama 4's: ``sigmoid`` of the top-k logits scattered into ``-inf``,
  ``x.repeat(E, 1)`` scaled by ``scores.t().reshape(-1, 1)``, ``torch.bmm`` with
  ``[E, in, out]`` weights, the sum over the experts of a ``[E, T, H]`` view;
* ``"softmax_matmul"``: a softmax over the experts of the scattered logits, ``torch.matmul``
  and ``tile``, the halves of the gated projection taken apart with ``split``;
* ``"zeros"``: the softmax of the top-k logits (over the slots) scattered into zeros;
* ``"not_zero"`` (not read as routed): the top-k values scattered into zeros and then a
  sigmoid, so every expert gets a weight of at least 0.5: a dense mixture, which no
  dispatch of the picked pairs computes (data and tensor parallelism still apply).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

FORMS = ("sigmoid_bmm", "softmax_matmul", "zeros")
UNREAD = ("not_zero",)
VOCAB, HIDDEN, EXPERTS, INNER = 64, 32, 4, 16


class DenseMoE(nn.Module):
    def __init__(self, form: str, top_k: int = 1):
        super().__init__()
        self.form, self.top_k = form, top_k
        self.router = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.gate_up = nn.Parameter(torch.randn(EXPERTS, HIDDEN, 2 * INNER) * 0.1)
        self.down = nn.Parameter(torch.randn(EXPERTS, INNER, HIDDEN) * 0.1)
        self.shared_in = nn.Linear(HIDDEN, 2 * INNER, bias=False)
        self.shared_out = nn.Linear(INNER, HIDDEN, bias=False)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        value, index = torch.topk(logits, self.top_k, dim=1)
        if self.form == "sigmoid_bmm":
            return torch.sigmoid(torch.full_like(logits, float("-inf")).scatter_(1, index, value).float()).to(x.dtype)
        if self.form == "softmax_matmul":
            return torch.softmax(torch.full_like(logits, float("-inf")).scatter(1, index, value), dim=-1)
        if self.form == "zeros":
            return torch.zeros_like(logits).scatter(1, index, torch.softmax(value, dim=-1))
        return torch.sigmoid(torch.zeros_like(logits).scatter(1, index, value))   # "not_zero"

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, seq, width = hidden.shape
        x = hidden.reshape(-1, width)
        scores = self.scores(x)
        if self.form == "softmax_matmul":
            routed = torch.tile(x, (EXPERTS, 1)) * scores.transpose(0, 1).reshape(-1, 1)
            h = torch.matmul(routed.view(EXPERTS, -1, width), self.gate_up)
            gate, up = h.split(INNER, dim=-1)
            out = torch.matmul(F.gelu(gate) * up, self.down)
        else:
            routed = x.repeat(EXPERTS, 1) * scores.t().reshape(-1, 1)
            gate, up = torch.bmm(routed.view(EXPERTS, -1, width), self.gate_up).chunk(2, dim=-1)
            out = torch.bmm(F.silu(gate) * up, self.down)
        routed_out = out.reshape(EXPERTS, -1, width).sum(dim=0)
        shared_gate, shared_up = self.shared_in(x).chunk(2, dim=-1)
        shared = self.shared_out(F.silu(shared_gate) * shared_up)
        return (shared + routed_out).view(batch, seq, width)


class RMSNorm(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    def __init__(self, form: str, top_k: int):
        super().__init__()
        self.norm, self.moe = RMSNorm(HIDDEN), DenseMoE(form, top_k)

    def forward(self, x):
        return x + self.moe(self.norm(x))


class DenseMoELM(nn.Module):
    def __init__(self, form: str = "sigmoid_bmm", top_k: int = 1, layers: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block(form, top_k) for _ in range(layers))
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def dense_experts_job(cases: list) -> list[dict]:
    """On every rank: each ``(form, top_k, strategy)`` in float64 against one process, with
    the strategies its experts regions got."""
    from autopar.testing import compare_with_single_device, reported_in
    ids = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(0))
    rows = []
    for form, top_k, strategy in cases:
        row: dict = {"form": form, "top_k": top_k, "strategy": strategy}
        with reported_in(row, f"{form} top-{top_k} under {strategy}"):
            report = compare_with_single_device(lambda: DenseMoELM(form, top_k), (ids,), ids, lm_loss, strategy,
                                                dtype=torch.float64)
            row.update({k: report[k] for k in ("mesh", "strategies", "regions", "output", "loss", "grad", "param")})
        rows.append(row)
    return rows
