"""The profile cache (autopar.cost.profiles) and calibration's robust summaries, without
processes: which hardware a plan without ``hardware=`` prices with, what its header says,
what invalidates a cached profile; the rounds' medians and outliers, the collective fits
without the points they miss by far, the runtime terms from the measured steps."""
from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch

import autopar
from autopar.cost import calibration as cal
from autopar.cost.calibrate_fit import predict, robust_fit_alpha_beta, robust_summary
from autopar.cost.calibrate_measure import PIPELINE_MICROBATCHES, pipeline_case, pipeline_strategy, runtime_case
from autopar.cost import profiles
from autopar.cost.hardware import PRESETS


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPAR_CACHE_DIR", str(tmp_path))
    return tmp_path


def _plan(**kwargs):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    return autopar.plan(model, 2, (torch.randn(8, 16),), None, "data", **kwargs)


def _mine() -> "autopar.Hardware":
    return dataclasses.replace(PRESETS["cpu-gloo"], name="mine", peak_flops=1e12, host_op_s=3e-6)


def test_without_a_profile_a_plan_says_it_falls_back_to_the_preset(cache):
    profiles._said.clear()
    with pytest.warns(UserWarning, match="no calibrated profile of this machine.*'cpu-gloo' preset.*calibrate"):
        plan = _plan()
    assert plan.hardware == "cpu-gloo"
    assert plan.explain().splitlines()[0].startswith(
        "autopar plan: Sequential on 2 rank(s), hardware cpu-gloo (default preset; no calibrated profile of this "
        "machine), ")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _plan()  # said once per process


def test_a_cached_profile_prices_every_later_plan(cache):
    path = profiles.save_profile(_mine(), "gloo")
    assert path == cache / "profiles" / "gloo.json"
    for _ in range(2):
        plan = _plan()
        assert plan.hardware == "mine" and plan.hardware_source == f"this machine's calibrated profile, {path}"
    assert f"hardware mine (this machine's calibrated profile, {path})" in plan.explain()
    # the same plan as with the profile given by hand, and an explicit preset ignores the cache
    assert plan.step_s == _plan(hardware=_mine()).step_s
    explicit = _plan(hardware="cpu-gloo")
    assert explicit.hardware == "cpu-gloo" and explicit.hardware_source == "preset"
    assert "hardware cpu-gloo, " in explicit.explain()


@pytest.mark.parametrize("fact,value", [("cpu_cores", 4096), ("torch", "1.0.0"), ("host", "elsewhere"),
                                        ("accelerator", "8 x NVIDIA H200")])
def test_a_changed_machine_invalidates_the_profile(cache, fact, value):
    path = profiles.save_profile(_mine(), "gloo")
    saved = json.loads(path.read_text())
    saved["machine"][fact] = value
    path.write_text(json.dumps(saved))
    hw, why = profiles.load_profile("gloo")
    assert hw is None and "measured on another machine" in why and fact in why and str(value) in why
    plan = _plan()
    assert plan.hardware == "cpu-gloo" and plan.hardware_source.startswith("default preset; the profile at")
    assert fact in plan.hardware_source


def test_an_unreadable_profile_falls_back_and_names_the_file(cache):
    path = profiles.profile_path("gloo")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    hw, why = profiles.load_profile("gloo")
    assert hw is None and str(path) in why and "cannot be read" in why
    assert _plan().hardware == "cpu-gloo"


def test_each_backend_has_its_own_profile(cache):
    profiles.save_profile(_mine(), "nccl")
    assert profiles.load_profile("gloo")[0] is None and profiles.load_profile("nccl")[0].name == "mine"


# ---------------------------------------------------------------- robust summaries


def test_a_round_far_from_the_others_is_an_outlier_and_moves_nothing():
    # collective_call on 4 ranks sharing 2 cores: 54 µs in most rounds, 1.2 ms in one
    values = [54e-6, 57e-6, 1.2e-3, 52e-6, 55e-6]
    median, far = robust_summary(values)
    assert median == 55e-6 and far == [2]
    # rounds within a few per cent of each other are not outliers, however tight
    assert robust_summary([10e-6, 10.1e-6, 10.2e-6, 10.15e-6, 11e-6]) == (10.15e-6, [])


def test_the_slowest_ranks_median_is_kept_and_outliers_named():
    reports = [{"rounds": {("collective_call",): [50e-6, 52e-6, 51e-6], ("in_training", 2): [1e-4] * 3}},
               {"rounds": {("collective_call",): [60e-6, 2e-3, 61e-6], ("in_training", 2): [2e-4] * 3}}]
    kept, outliers = cal._overhead_rounds(reports)
    assert kept[("collective_call",)] == (61e-6, 60e-6, 2e-3) and kept[("in_training", 2)] == (2e-4, 2e-4, 2e-4)
    assert outliers == [cal.Outlier("collective_call", 1, 1, 2e-3, 61e-6)]


def test_the_collective_fit_leaves_out_a_point_it_misses_by_far():
    alpha_s, beta_bps = 100e-6, 1e9
    sizes = [4, 64, 1024, 16384, 1 << 18, 1 << 20, 4 << 20, 16 << 20]
    points = [(m, predict("all_reduce", 4, m, alpha_s, beta_bps)) for m in sizes]
    points[1] = (64, 12 * points[1][1])  # a descheduled rank: one small message 12x slow
    got_alpha, got_beta, dropped = robust_fit_alpha_beta("all_reduce", 4, points)
    assert dropped == [points[1]]
    assert got_alpha == pytest.approx(alpha_s, rel=1e-6) and got_beta == pytest.approx(beta_bps, rel=1e-6)
    # clean points: nothing dropped; at most a quarter of the points ever is
    assert robust_fit_alpha_beta("all_reduce", 4, [(m, predict("all_reduce", 4, m, alpha_s, beta_bps))
                                                   for m in sizes])[2] == []
    wild = [(m, t * (1 + 30 * (i % 2))) for i, (m, t) in enumerate(points)]
    assert len(robust_fit_alpha_beta("all_reduce", 4, wild)[2]) <= len(points) // 4


def test_the_runtime_terms_from_the_measured_steps():
    """Hand-made measurements: the data-parallel step 0.4 ms over its prediction, the
    pipeline's steps 2 × 1 × (extra microbatches) × 150 µs over theirs → the runner's
    0.4 ms per step and the executor's 150 µs per action."""
    world, hw = 2, dataclasses.replace(PRESETS["cpu-gloo"], host_op_s=2e-6)
    model, inputs, loss, target = runtime_case(world)
    data_s = autopar.plan(model, world, inputs, loss, {"data": world}, example_target=target, hardware=hw).step_s
    model, inputs, loss, target = pipeline_case(world)
    steps = {k: autopar.plan(model, world, inputs, loss, pipeline_strategy(world, k), example_target=target,
                             hardware=hw).step_s for k in PIPELINE_MICROBATCHES}
    k1, k2 = PIPELINE_MICROBATCHES[0], PIPELINE_MICROBATCHES[-1]
    medians = {("runtime_step",): data_s + 4e-4, ("pipeline_step", k1): steps[k1] + 1e-3,
               ("pipeline_step", k2): steps[k2] + 1e-3 + 2 * (k2 - k1) * world * 150e-6}
    got = cal._runtime_terms(hw, medians, world, autopar.plan)
    assert got.step_overhead_s == pytest.approx(4e-4, rel=1e-9)
    assert got.pipeline_action_s == pytest.approx(150e-6, rel=1e-9)


def _synthetic_report(world: int) -> dict:
    """One rank's probe report with plausible figures: every collective over every group
    size the world has (its divisors >= 2), times of an α-β line."""
    from autopar.cost.calibrate_measure import COLLECTIVES, group_sizes, settings
    s = settings("probe")
    medians = {("launch",): 1e-6, ("copy", s.copy_bytes): 2 * s.copy_bytes / 1e10}
    medians.update({("matmul", n): 2 * n ** 3 / 1e11 + 1e-6 for n in s.matmul_sizes})
    for g in group_sizes(world):
        for name in COLLECTIVES[:-1]:
            medians.update({(name, g, m): 1e-4 * (g - 1) + m / 1e9 for m in s.message_bytes})
    if world > 1:
        medians.update({("send", 2, m): 1e-4 + m / 1e9 for m in s.message_bytes})
    rounds = {("host_op",): [2e-5], ("collective_call",): [1e-4], ("collective_raw",): [1e-4],
              ("async_exposed",): [0.7], **{("in_training", g): [3e-4] for g in group_sizes(world)}}
    return {"medians": medians, "rounds": rounds, "host": "h", "processor": "p", "memory_bytes": 8e9,
            "device_type": "cpu"}


@pytest.mark.parametrize("world", [2, 3, 4, 9])
def test_a_probe_fits_on_any_world_size(world):
    # an odd world has no group of 2: the intra-node figures come from its smallest group
    hw = cal.fit_reports([_synthetic_report(world)] * world, world, backend="gloo", quick="probe").hardware
    assert hw.intra_node_bandwidth > 0 and hw.inter_node_bandwidth > 0 and hw.devices_per_node == world
    assert hw.peak_flops > 0 and not hw.fused_kernels
