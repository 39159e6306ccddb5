"""Tier 2: the parallel model against the single-device model on real gloo ranks.

Each world size is launched once (spawning costs seconds; tests/shared_ranks.py shares
the launch with other modules' jobs) and runs every case; the parametrised tests then
check one case each. Tolerances (fp32):

* outputs, loss, every gradient and the gradient norms: relative 1e-5, each tensor to its
  own largest reference value (autopar.testing) — collectives change the order of
  summation, nothing else (seen: up to ~7e-7);
* parameters after 3 AdamW steps (lr 1e-2): absolute 5e-4. The key bias of attention has
  an exactly-zero gradient in exact arithmetic (softmax ignores a shift shared by all
  keys); Adam normalises its rounding noise, which differs on both sides, into steps of
  up to ~1e-4. Every other parameter agrees to ~1e-6.
"""
import pytest

import shared_ranks
from autopar.testing import equivalence_job

WORLD_2 = [
    ("mlp", {"data": 2}), ("mlp", {"tensor": 2}), ("mlp", "auto"),
    ("transformer", {"data": 2}), ("transformer", {"tensor": 2}), ("transformer", "auto"),
    ("gpt2", {"data": 2}), ("gpt2", {"tensor": 2}), ("gpt2", "auto"),
]
WORLD_4 = [
    ("mlp", {"data": 2, "tensor": 2}),
    ("transformer", {"data": 2, "tensor": 2}), ("transformer", "auto"),
    ("gpt2", {"data": 2, "tensor": 2}), ("gpt2", "auto"),
    ("transformer", ("mesh", (1, 4))),  # a user's named 2-D DeviceMesh fixes the degrees
]
# tensor 4 and data 4 alone (each degree runs on 2 ranks above, and in data x tensor here):
# the extended suite
EXTENDED_4 = [("mlp", {"tensor": 4}), ("transformer", {"tensor": 4}), ("gpt2", {"data": 4})]

_LAUNCHED = {world: shared_ranks.register(world, __name__, equivalence_job, (cases,), timeout_s=600)
             for world, cases in ((2, WORLD_2), (4, WORLD_4))}
_EXTENDED_4 = shared_ranks.register(4, __name__ + ":extended", equivalence_job, (EXTENDED_4,), timeout_s=600,
                                    extended=True)


def _reports(world: int, cases):
    return _LAUNCHED[world]()


def _check(report):
    assert report["output"][1] < 1e-5, report
    assert report["loss"][1] < 1e-5, report
    assert report["grad"][1] < 1e-5, report
    assert report["grad_norm"][1] < 1e-5, report  # pm.grad_norm: each part over its group
    assert report["param"][0] < 5e-4, report


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(WORLD_2)), ids=[f"{m}-{s}" for m, s in WORLD_2])
def test_world_2(index):
    reports = _reports(2, WORLD_2)
    for rank_reports in reports:  # every rank computed the same full results
        _check(rank_reports[index])
    assert reports[0][index]["mesh"] == reports[1][index]["mesh"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("cases,index", [(WORLD_4, i) for i in range(len(WORLD_4))]
                         + [pytest.param(EXTENDED_4, i, marks=pytest.mark.extended) for i in range(len(EXTENDED_4))],
                         ids=[f"{m}-{s}" for m, s in WORLD_4 + EXTENDED_4])
def test_world_4(cases, index):
    reports = _LAUNCHED[4]() if cases is WORLD_4 else _EXTENDED_4()
    for rank_reports in reports:
        _check(rank_reports[index])
    model, strategy = cases[index]
    if isinstance(strategy, tuple):
        assert reports[0][index]["mesh"] == {"data": strategy[1][0], "tensor": strategy[1][1]}
    if isinstance(strategy, dict):
        expected = {"data": strategy.get("data", 4 // strategy.get("tensor", 1)),
                    "tensor": strategy.get("tensor", 4 // strategy.get("data", 1))}
        assert reports[0][index]["mesh"] == expected


# ------------------------------------------------------------ the comparison itself, no ranks

def test_the_comparison_takes_the_largest_relative_error_over_every_tensor():
    """A small gradient 1% off is the worst even where a large one differs by more in
    absolute terms; a tensor zero at the comparison's resolution (an exactly-zero
    gradient computed as rounding noise, an all-zero one) is measured against the
    largest of its kind; a NaN on one side is infinitely wrong."""
    import math

    import torch

    from autopar.testing import _compare
    big, small = torch.linspace(-1, 1, 100, dtype=torch.float64), torch.linspace(-1e-4, 1e-4, 10, dtype=torch.float64)
    report = {}
    _compare({"big": (big * (1 + 1e-5), big), "small": (small * 1.01, small)}, report, "grad")
    assert report["worst_grad"] == "small" and report["grad"][1] == pytest.approx(1e-2, rel=1e-6)
    assert report["grad"][0] == pytest.approx(1e-5)  # the largest absolute difference is the big one's
    noise, zero = torch.full((4,), 1e-9, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    report = {}
    _compare({"big": (big, big), "noise": (noise, -noise), "zero": (zero + 1e-9, zero)}, report, "grad")
    assert report["grad"][1] == pytest.approx(2e-9) and report["worst_grad"] == "noise"
    report = {}
    _compare({"loss": (torch.tensor(float("nan")), torch.tensor(1.0))}, report, "loss")
    assert report["loss"] == (math.inf, math.inf)
    report = {}  # nothing to scale by: equal is 0, anything else inf
    _compare({"a": (zero, zero)}, report, "loss")
    assert report["loss"] == (0.0, 0.0)
    # what each rank computed, fingerprinted
    assert report["computed"]["loss"]["a"] == (0.0, 0.0)
