"""The spec run answers each distinct operation once on fake and meta tensors
(autopar.trace.specs): every node's SPEC is what running every node gives, on repeated
layers, in-place operations, data-dependent sizes and torch's own layers."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.ir import SPEC
from autopar.trace import specs
from autopar.trace.capture import capture


class _Block(nn.Module):
    def __init__(self, width: int, in_place: bool):
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.norm = nn.LayerNorm(width)
        self.act = nn.ReLU(inplace=in_place)
        self.in_place = in_place

    def forward(self, x):
        h = self.act(self.up(self.norm(x)))
        if self.in_place:
            h = h.mul_(0.5)
            h += 1.0
        return x + self.down(h)


class _Stack(nn.Module):
    def __init__(self, in_place: bool = False, pick: bool = False, width: int = 16, depth: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList(_Block(width, in_place) for _ in range(depth))
        self.head = nn.Linear(width, 8)
        self.pick = pick

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
            if self.pick:  # a size set by values: symbolic on fake tensors, never remembered
                x = x + x[torch.nonzero(x[..., 0] > 0)[:, 0]].sum()
        return self.head(x)


def _specs(model, device: str, remembered: bool, monkeypatch) -> list:
    if not remembered:
        monkeypatch.setattr(specs, "_op_key", lambda interpreter, n: None)
    with torch.device(device):
        torch.manual_seed(0)
        m = model()
    x = torch.randn(4, 16, device=device)
    gm = capture(m, (x,), lambda out, t: F.mse_loss(out, t), torch.randn(4, 8, device=device))
    monkeypatch.undo()
    return [(n.name, n.op, str(n.target), n.meta.get(SPEC)) for n in gm.graph.nodes]


@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("kind", ["plain", "in_place", "data_dependent"])
def test_every_spec_is_what_running_every_node_gives(kind, device, monkeypatch):
    if kind == "data_dependent" and device == "meta":
        pytest.skip("nonzero has no meta kernel")
    model = lambda: _Stack(in_place=kind == "in_place", pick=kind == "data_dependent")  # noqa: E731
    assert _specs(model, device, True, monkeypatch) == _specs(model, device, False, monkeypatch)


def test_repeated_layers_are_answered_once_and_real_tensors_never(monkeypatch):
    seen = []
    run = specs._SpecRecorder.run

    def recording(self, *args, **kwargs):
        out = run(self, *args, **kwargs)
        seen.append((len(self.memo), self.share))
        return out
    monkeypatch.setattr(specs._SpecRecorder, "run", recording)
    with torch.device("meta"):
        on_meta_model = _Stack()
    specs.propagate_specs(torch.fx.symbolic_trace(on_meta_model), (torch.empty(4, 16, device="meta"),))
    specs.propagate_specs(torch.fx.symbolic_trace(_Stack()), (torch.randn(4, 16),))
    (on_meta, shared), (on_cpu, _) = seen
    per_block = 6  # norm, up, act, down, add ... each block's operations, remembered once
    assert 0 < on_meta <= per_block + 4 and shared  # not once per block: 4 blocks share the entries
    assert on_cpu == 0  # a real tensor's values can set a size: nothing is remembered
