"""Elements evaluated through a transcendental function (NodeWork.special) are counted
in both graph spellings and priced by Hardware.special_element_s; 0 leaves a plan's
prices as they were."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.cost import model as cost
from autopar.cost.hardware import get_hardware
from autopar.passes.analysis.flops import graph_work
from autopar.trace.capture import capture

B, T, H, HEADS = 2, 8, 16, 4


class _Activations(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(H, 4 * H)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * H, H)

    def forward(self, x):
        h = self.down(self.act(self.up(x)))               # a module: 4H elements a row
        h = F.silu(h) + torch.tanh(h) + h.exp() + h * 2   # a function, a torch op, a method; a product
        q = h.view(B, T, HEADS, H // HEADS).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True)  # its scores: B·heads·T·T
        return F.softmax(a.transpose(1, 2).reshape(B, T, H), dim=-1)


def _work(tracer: str):
    torch.manual_seed(0)
    gm = capture(_Activations(), (torch.randn(B, T, H),), lambda out, t: F.cross_entropy(out.flatten(0, 1), t),
                 torch.randint(0, H, (B * T,)), tracer=tracer)
    return graph_work(gm)


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export"])
def test_each_transcendental_element_is_counted_once(tracer):
    works = _work(tracer)
    total = sum(w.special for w in works.values())
    rows = B * T
    # GELU 4H, SiLU, tanh, exp H each, attention's scores, the softmax's input H, the
    # loss's log-softmax over its input H (a row each)
    expected = rows * 4 * H + 3 * rows * H + B * HEADS * T * T + rows * H + rows * H
    assert total == expected, {n: w.special for n, w in works.items() if w.special}
    assert all(w.special == 0 for w in works.values() if not w.is_kernel)


def test_priced_per_element_beside_the_bytes():
    hw = get_hardware("cpu-gloo")
    assert hw.special_element_s == 0.0  # the presets leave it out: a GPU streams these kernels
    works = list(_work("symbolic_trace").values())
    plain = cost.step_compute_time(works, hw)
    costly = dataclasses.replace(hw, special_element_s=2e-9)
    special = sum(w.special * cost.passes_per_step(w) for w in works if w.is_kernel)
    assert cost.step_compute_time(works, costly) == pytest.approx(plain + special * 2e-9, rel=1e-9)
    assert cost.scaled_step_compute_time(works, 0.5, costly) == pytest.approx(
        cost.scaled_step_compute_time(works, 0.5, hw) + special * 0.5 * 2e-9, rel=1e-9)
    # on shared cores it scales as the other compute figures do
    shared = dataclasses.replace(costly, host_cores=2, measured_ranks=2)
    assert shared.on_world(4).special_element_s == pytest.approx(2 * 2e-9)
