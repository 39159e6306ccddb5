"""``compile`` without ``hardware=`` and without a cached profile measures this machine on
the ranks it runs (autopar.cost.first_use), caches the profile, and prices with it; the
next compile reads the cache; ``AUTOPAR_FIRST_USE_CALIBRATION=0`` keeps the preset.
Behaviour only: what the plan says it priced with and what was written, never timing."""
from __future__ import annotations

import json
import os

import pytest
import torch

import autopar
from autopar.runtime.launcher import launch

pytestmark = pytest.mark.multiprocess


def _job():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x, y = torch.randn(8, 8), torch.randn(8, 4)
    sources = []
    for _ in range(2):  # the first measures and caches, the second reads the cache
        pm = autopar.compile(model, None, example_inputs=(x,), loss_fn=torch.nn.functional.mse_loss,
                             example_target=y)
        pm.step(x, target=y)
        sources.append((pm.plan.hardware, pm.plan.hardware_source))
    return sources


@pytest.mark.extended  # a probe and four compiles on 2 ranks: about a minute on the 2-core machine
def test_first_compile_measures_caches_and_prices_with_the_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPAR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AUTOPAR_FIRST_USE_CALIBRATION", "1")
    results = launch(_job, 2, (), backend="gloo", timeout_s=300)
    (first_hw, first), (second_hw, second) = results[0]
    assert all(r == results[0] for r in results)  # every rank priced with the same hardware
    assert first_hw == "first-use-gloo-2" and "measured on first use" in first
    assert second_hw == "first-use-gloo-2" and "calibrated profile" in second
    with open(tmp_path / "profiles" / "gloo.json") as f:
        saved = json.load(f)
    hw = saved["hardware"]
    # measured here: a rate, the host's overheads and the collectives' table, not the preset's
    assert hw["name"] == "first-use-gloo-2" and "compile on first use" in hw["description"]
    assert hw["peak_flops"] > 0 and hw["host_op_s"] > 0 and "all_reduce" in hw["measured"]["table"]
    assert hw["host_cores"] == (os.cpu_count() or 0) and hw["measured_ranks"] == 2


def test_turned_off_the_preset_prices_and_nothing_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPAR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AUTOPAR_FIRST_USE_CALIBRATION", "0")
    results = launch(_job, 2, (), backend="gloo", timeout_s=300)
    assert [hw for hw, _ in results[0]] == ["cpu-gloo", "cpu-gloo"]
    assert not (tmp_path / "profiles" / "gloo.json").exists()
