"""ZeRO-3 by unit (autopar/strategies/data/zero_runtime.py): a parameter that no use
gives a gradient keeps none, as in one process (AdamW would otherwise decay it); under
full recomputation each layer's gradients are still reduce-scattered during backward,
not all at its end (a recomputed forward's reads are not uses of their own); every data
rank issues the same collectives in the same order."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import shared_ranks


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.unused = nn.Linear(d, d)   # never read
        self.side = nn.Linear(d, d)     # read; its output does not reach the loss

    def forward(self, x):
        return x + torch.tanh(self.a(x)), self.side(x)


class Net(nn.Module):
    def __init__(self, d: int = 8, layers: int = 3):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        x = self.inp(x)
        sides = []
        for b in self.blocks:
            x, s = b(x)
            sides.append(s)
        return self.head(x), torch.stack(sides).sum()


def loss_fn(out, y):
    return F.cross_entropy(out[0], y)


def units_job():
    from autopar.strategies.data import zero_runtime
    from autopar.testing import compare_with_single_device
    from examples.factories import training_case
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=g, dtype=torch.float64), torch.randint(0, 4, (8,), generator=g)
    unused = compare_with_single_device(lambda: Net().double(), (x,), y, loss_fn, {"data": 2, "zero": 3},
                                        dtype=torch.float64)
    log = []   # each unit's reduce-scatter, and whether backward was running when it was launched
    launched = zero_runtime._Unit.reduce

    def reduce(unit, grads):
        log.append((unit.key, torch._C._current_graph_task_id() != -1))
        return launched(unit, grads)
    zero_runtime._Unit.reduce = reduce
    try:
        factory, inputs, target, lm = training_case("transformer", layers=4)
        recomputed = compare_with_single_device(factory, inputs, target, lm,
                                                {"data": 2, "zero": 3, "recompute": "full"}, dtype=torch.float64,
                                                steps=1)
    finally:
        zero_runtime._Unit.reduce = launched
    return {"unused": unused["param"], "unused_grad": unused["grad"], "recomputed": recomputed["param"], "log": log}


_JOB = shared_ranks.register(2, __name__, units_job, timeout_s=300)


@pytest.mark.multiprocess
def test_zero3_units_match_one_process_and_reduce_in_backward():
    reports = _JOB()
    for report in reports:
        assert report["unused"][0] < 1e-12 and report["unused_grad"][0] < 1e-12, report
        assert report["recomputed"][0] < 1e-12, report
        blocks = [(key, inside) for key, inside in report["log"] if key.startswith("blocks.")]
        assert blocks and all(inside for _, inside in blocks), report["log"]
    assert reports[0]["log"] == reports[1]["log"]   # the same collectives, in the same order
