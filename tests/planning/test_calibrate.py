"""``autopar calibrate``: the fitting on synthetic data, then one quick calibration on 2
gloo ranks through the CLI (one spawn for the module) checked for a loadable profile, a
points table that puts the fit beside every measurement, and a cost model that uses the
fit. The checks are behavioural (the profile loads back, every figure is finite and
positive, each fit is the one its own points give and reproduces them within the errors
the table reports), never a bound on a timed value: how well the fit reproduces the
measurements is a benchmark (bench_fidelity.py)."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import statistics

import pytest

from autopar import cli
from autopar.calibrate import run_calibration
from autopar.cost.calibrate_fit import FORMULA_OF, fit_alpha_beta, fit_matmul, nnls, predict, robust_fit_alpha_beta
from autopar.cost.calibrate_measure import BULK, BULK_BYTES, COLLECTIVES, settings
from autopar.cost import model as cost
from autopar.cost.hardware import get_hardware


def _formula(collective: str, group_size: int, nbytes: float, alpha_s: float, beta_bps: float) -> float:
    """The collective's sympy formula evaluated directly (not through the lambdified copies)."""
    expr = cost.FORMULAS[FORMULA_OF[collective]]
    return float(expr.subs({cost.G: group_size, cost.m: nbytes, cost.alpha: alpha_s, cost.beta: beta_bps}))


# ---------------------------------------------------------------- fitting, no processes


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("group_size", [2, 4, 8])
def test_fit_recovers_alpha_beta_from_the_formula(collective, group_size):
    alpha_s, beta_bps = 75e-6, 1.3e9
    points = [(m, _formula(collective, group_size, m, alpha_s, beta_bps)) for m in (4, 256, 16384, 1 << 20, 4 << 20)]
    got_alpha, got_beta = fit_alpha_beta(collective, group_size, points)
    assert got_alpha == pytest.approx(alpha_s, rel=1e-6)
    assert got_beta == pytest.approx(beta_bps, rel=1e-6)


def test_fit_weighs_relative_errors_so_small_messages_count():
    # α 100 µs, β 1 GB/s, but the 4 MiB point 50% slow: an absolute least-squares fit would
    # follow that point; the relative fit keeps α where the small messages put it
    points = [(m, _formula("all_reduce", 2, m, 100e-6, 1e9)) for m in (4, 64, 1024, 16384, 1 << 20)]
    points.append((4 << 20, 1.5 * _formula("all_reduce", 2, 4 << 20, 100e-6, 1e9)))
    alpha_s, _ = fit_alpha_beta("all_reduce", 2, points)
    assert alpha_s == pytest.approx(100e-6, rel=0.1)


def test_nnls_keeps_coefficients_non_negative():
    # y = 2·x0 − 1·x1 fits exactly with x1 < 0; the non-negative optimum drops x1
    rows = [[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]
    x = nnls(rows, [1.0, 3.0, 5.0])
    assert x[1] == 0.0 and x[0] > 0
    assert x[0] == pytest.approx((1 * 1 + 2 * 3 + 3 * 5) / (1 + 4 + 9))


def test_matmul_fit_recovers_rate_and_saturation():
    rate, saturation, launch = 2e11, 1.5e5, 1e-6
    points = [(f, (f + saturation) / rate + launch) for f in (2 * n ** 3 for n in (32, 64, 128, 256, 512, 1024))]
    got_rate, got_saturation = fit_matmul(points, launch)
    assert got_rate == pytest.approx(rate, rel=1e-6)
    assert got_saturation == pytest.approx(saturation, rel=1e-4)


def test_calibrate_refuses_no_ranks_and_unknown_dtypes():
    with pytest.raises(ValueError, match="at least 1 rank"):
        run_calibration(0)
    with pytest.raises(ValueError, match="dtype='fp8'"):
        run_calibration(1, dtype="fp8")


@pytest.mark.extended  # a calibration launch of its own (the multi-rank one below runs in the main suite)
@pytest.mark.multiprocess
def test_one_rank_times_compute_and_keeps_the_base_network():
    """One device (a single GPU): compute measured in the dtype asked for, no collective
    timed, the base preset's network figures kept and said to be its."""
    result = run_calibration(1, quick=True, base="h100", dtype="bf16", name="one")
    hw, base = result.hardware, result.base
    assert not result.fits and not [m for m in result.measurements if m.kind not in ("matmul", "copy", "launch")]
    assert (hw.intra_node_bandwidth, hw.inter_node_bandwidth, hw.devices_per_node) == \
        (base.intra_node_bandwidth, base.inter_node_bandwidth, base.devices_per_node)
    assert hw.peak_flops != base.peak_flops and hw.memory_bandwidth != base.memory_bandwidth
    assert "bf16 matmuls" in hw.description and "network figures and devices_per_node are h100's" in hw.description
    assert "h100's: one rank times no collective" in result.table()


# ---------------------------------------------------------------- one real calibration


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """``autopar calibrate --world 2 --quick``: the profile, the measurements, the printed
    table, the profile cache it wrote (its own: the other tests' plans must not see it)."""
    tmp = tmp_path_factory.mktemp("calibrate")
    profile, points = str(tmp / "profile.json"), str(tmp / "points.json")
    printed = io.StringIO()
    before = os.environ["AUTOPAR_CACHE_DIR"]
    os.environ["AUTOPAR_CACHE_DIR"] = str(tmp / "cache")
    try:
        with contextlib.redirect_stdout(printed):
            status = cli.main(["calibrate", "--world", "2", "--quick", "--out", profile, "--points-json", points])
    finally:
        os.environ["AUTOPAR_CACHE_DIR"] = before
    assert status == 0
    with open(points) as f:
        rows = json.load(f)
    return profile, rows, printed.getvalue(), str(tmp / "cache")


multiprocess = pytest.mark.multiprocess


@multiprocess
def test_cli_writes_a_profile_get_hardware_loads(calibrated):
    profile, _, printed, _ = calibrated
    with open(profile) as f:
        text = f.read()
    raw = json.loads(text)
    assert list(raw) == sorted(raw) and text.startswith("{\n  ")  # indent 2, sorted keys
    hw = get_hardware(profile)
    assert hw.to_json() == raw  # it loads back as written
    assert hw.name == "calibrated-gloo-2" and hw.devices_per_node == 2
    assert "gloo" in hw.description and "2 ranks" in hw.description
    for field in ("peak_flops", "memory_bandwidth", "kernel_launch_s", "intra_node_bandwidth", "inter_node_bandwidth",
                  "intra_node_latency_s", "inter_node_latency_s", "memory_bytes"):
        value = getattr(hw, field)
        assert math.isfinite(value) and value > 0, (field, value)
    # the fits may find no fixed cost (non-negative least squares), the runtime no overhead
    for field in ("saturation_flops", "host_op_s", "collective_call_s", "step_overhead_s", "pipeline_action_s"):
        value = getattr(hw, field)
        assert math.isfinite(value) and value >= 0, (field, value)
    assert hw.matmul_efficiency == 1.0
    assert (hw.intra_node_latency_s, hw.intra_node_bandwidth) == tuple(hw.measured["all_reduce"]["2"])
    # the table names every fit
    for collective in COLLECTIVES:
        assert f"\n{collective}" in printed, printed
    assert f"wrote {profile}" in printed


@multiprocess
def test_the_compute_fit_is_its_own_points_fit(calibrated):
    """The matmul rate and saturation in the profile are what fitting the measured matmul
    points gives (with the measured launch), and each point's prediction is the loaded
    profile's; the copy's bandwidth is its own point's."""
    profile, rows, _, _ = calibrated
    hw = get_hardware(profile)
    matmuls = [r for r in rows if r["kind"] == "matmul"]
    (launch,) = [r for r in rows if r["kind"] == "launch"]
    (copy,) = [r for r in rows if r["kind"] == "copy"]
    assert len(matmuls) == len(settings(quick=True).matmul_sizes) and launch["measured_s"] == hw.kernel_launch_s
    for r in matmuls + [launch, copy]:
        assert math.isfinite(r["measured_s"]) and r["measured_s"] > 0, r
    rate, saturation = fit_matmul([(r["size"], r["measured_s"]) for r in matmuls], hw.kernel_launch_s)
    assert (rate, saturation) == (pytest.approx(hw.peak_flops, rel=1e-9), pytest.approx(hw.saturation_flops,
                                                                                        rel=1e-9, abs=1e-9))
    for r in matmuls:
        assert r["predicted_s"] == pytest.approx(cost.matmul_time(r["size"], hw), rel=1e-12), r
    assert hw.memory_bandwidth == pytest.approx(2 * copy["size"] / (copy["measured_s"] - launch["measured_s"]),
                                                rel=1e-12)


@multiprocess
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_measured_fit_reproduces_its_points_within_its_reported_errors(calibrated, collective):
    """The profile's α and β are finite and positive, they are the robust fit of the
    collective's own measured points (refitting those points gives them back, leaving out
    the points the table says it left out), and the table's median and largest errors are
    those the fit has on the points it kept (so each of them is within what the table
    reports)."""
    profile, rows, printed, _ = calibrated
    hw = get_hardware(profile)
    alpha_s, beta_bps = hw.measured[collective]["2"]
    assert math.isfinite(alpha_s) and math.isfinite(beta_bps) and alpha_s > 0 and beta_bps > 0
    points = [(r["size"], r["measured_s"]) for r in rows if r["kind"] == collective]
    fitted_alpha, fitted_beta, dropped = robust_fit_alpha_beta(collective, 2, points)
    assert (fitted_alpha, fitted_beta) == (pytest.approx(alpha_s, rel=1e-9), pytest.approx(beta_bps, rel=1e-9))
    kept = [(m, t) for m, t in points if (m, t) not in dropped]
    errors = [abs(predict(collective, 2, m, alpha_s, beta_bps) - t) / t for m, t in kept]
    median, largest = statistics.median(errors), max(errors)
    assert len(kept) >= 3 and all(math.isfinite(e) for e in errors)
    line = next(l for l in printed.splitlines() if l.split()[:2] == [collective, "2"])
    assert line.split()[4:7] == [f"{median:.0%}", f"{largest:.0%}", str(len(points))], (line, errors)
    assert ("left out" in line) == bool(dropped), (line, dropped)


@multiprocess
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_measurement_is_beside_the_fits_prediction(calibrated, collective):
    """The points table holds every message size, each predicted by the profile's formula.
    How close the fit comes to what the machine measured depends on how busy the machine
    is: that is benchmarks/bench_fidelity.py's fit check, not a test."""
    profile, rows, _, _ = calibrated
    hw = get_hardware(profile)
    alpha_s, beta_bps = hw.measured[collective]["2"]
    mine = [r for r in rows if r["kind"] == collective]
    # 4 B..4 MiB, and a bucket's size for the bulk collectives; a collective that splits the
    # buffer over the 2 ranks holds at least one fp32 element each
    split = collective in ("reduce_scatter", "all_to_all", "scatter")
    bulk = BULK_BYTES // 2 if collective == "all_gather" else BULK_BYTES  # an all-gather's part
    sizes = settings(quick=True).message_bytes + ((bulk,) if collective in BULK else ())
    assert [r["size"] for r in mine] == [max(m, 4 * 2) if split else m for m in sizes]
    for r in mine:  # the table's predictions are the profile's formula
        assert r["predicted_s"] == pytest.approx(_formula(collective, 2, r["size"], alpha_s, beta_bps), rel=1e-9)
        assert r["measured_s"] > 0 and r["rel_error"] == pytest.approx(
            abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"]), r


@multiprocess
def test_planner_prices_with_the_profile(calibrated):
    hw = get_hardware(calibrated[0])
    for collective, price in (("all_reduce", cost.all_reduce_time), ("all_gather", cost.all_gather_time),
                              ("reduce_scatter", cost.reduce_scatter_time), ("all_to_all", cost.all_to_all_time),
                              ("broadcast", cost.broadcast_time), ("scatter", cost.scatter_time)):
        alpha_s, beta_bps = hw.measured[collective]["2"]
        # the measured points, interpolated (past the largest: its time plus the fit's
        # growth), plus what a call costs in training beyond them (the autograd
        # functions around it, the wait met in a loop of compute): all measured
        overhead = cost.call_overhead(2, hw)
        assert overhead == hw.collective_call_s + hw.measured["call"]["2"][0] and overhead >= 0
        table = hw.measured["table"][collective]["2"]
        assert [m for m, _ in table] == sorted(m for m, _ in table)
        assert len(table) == len(settings(True).message_bytes) + (collective in BULK)
        (m0, t0), (m1, t1) = table[-2], table[-1]
        middle = (m0 + m1) / 2
        assert price(2, middle, hw) == pytest.approx((t0 + t1) / 2 + overhead, rel=1e-12)
        assert price(2, m1, hw) == pytest.approx(t1 + overhead, rel=1e-12)
        past = 4 * m1
        grown = _formula(collective, 2, past, alpha_s, beta_bps) - _formula(collective, 2, m1, alpha_s, beta_bps)
        assert price(2, past, hw) == pytest.approx(t1 + grown + overhead, rel=1e-9)
    alpha_s, beta_bps = hw.measured["send"]["2"]
    (m1, t1) = hw.measured["table"]["send"]["2"][-1]
    assert cost.point_to_point_time(4 * m1, hw) == pytest.approx(t1 + 3 * m1 / beta_bps + overhead, rel=1e-9)
    # the runtime's own pieces, measured: per kernel pass, per step; the ranks that shared the cores
    assert math.isfinite(hw.host_op_s) and hw.host_op_s >= 0 and hw.step_overhead_s >= 0
    assert math.isfinite(hw.special_element_s) and hw.special_element_s >= 0
    assert hw.measured_ranks == 2 and hw.host_cores >= 1
    assert math.isfinite(hw.pipeline_action_s) and hw.pipeline_action_s >= 0
    # and differently from the placement model where a fit differs from the scalar fields
    assert cost.all_gather_time(2, 1 << 20, hw) != pytest.approx(
        _formula("all_gather", 2, 1 << 20, hw.intra_node_latency_s, hw.intra_node_bandwidth), rel=1e-6)


@multiprocess
def test_a_plan_takes_the_profile_path(calibrated):
    import torch
    import autopar

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(8, 16)
    plan = autopar.plan(model, 2, (x,), None, "data", hardware=calibrated[0])
    assert "calibrated-gloo-2" in plan.explain()
    assert os.path.isfile(calibrated[0])



@multiprocess
def test_calibrate_caches_the_profile_for_later_plans(calibrated, monkeypatch):
    """The profile autopar calibrate measured is this machine's from then on: a plan
    without hardware= prices with it and says so in its header; the table shows each
    overhead term's rounds (and the pipeline executor's cost per action)."""
    import torch
    import autopar

    profile, _, printed, cache = calibrated
    assert "cached as this machine's profile" in printed and "overhead terms" in printed
    assert "pipeline_step[2]" in printed and "-> pipeline action" in printed
    monkeypatch.setenv("AUTOPAR_CACHE_DIR", cache)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    for _ in range(2):  # every later plan, not only the first
        plan = autopar.plan(model, 2, (torch.randn(8, 16),), None, "data")
        assert plan.hardware == "calibrated-gloo-2"
        assert plan.hardware_source.startswith("this machine's calibrated profile, " + cache)
        assert "(this machine's calibrated profile, " in plan.explain().splitlines()[0]
    with open(profile) as f, open(plan.hardware_source.split(", ", 1)[1]) as g:
        cached = json.load(g)
        assert cached["hardware"] == json.load(f) and cached["backend"] == "gloo"  # the same profile, and where
