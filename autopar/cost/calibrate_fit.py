"""Fitting the cost model's figures to what ``autopar calibrate`` measured.

Each (collective, group size) is fitted to that collective's own formula in
``cost.FORMULAS``, which is linear in α and 1/β: t = a(G)·α + b(G, m)·(1/β)
(:func:`formula_coefficients`), by non-negative least squares (:func:`nnls`) on
relative errors, each row divided by its measured time so 4-byte messages weigh as much
as 4-MiB ones (:func:`fit_alpha_beta`); :func:`robust_fit_alpha_beta` drops the points
the fit misses by far more than the others (a burst of load on an oversubscribed
machine) and says which. Matmul times are fitted to ``MATMUL_TIME`` with efficiency 1
(:func:`fit_matmul`). The overhead terms, measured in rounds, are summarised by
:func:`robust_summary`: the median and the rounds far from it.
"""
from __future__ import annotations

import functools
import statistics
from typing import Callable

import sympy
import torch

from autopar.cost import model as cost

FORMULA_OF = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
              "all_to_all": "all_to_all", "broadcast": "broadcast", "scatter": "scatter", "send": "point_to_point"}
"""Each measured collective's key in ``cost.FORMULAS``."""

ALPHA_FLOOR_S = 1e-9
"""A fitted α of 0 (the fit found no fixed cost) is stored as this, so the profile stays positive."""
BETA_CEILING = 1e15
"""A fitted 1/β of 0 (no per-byte cost) is stored as this bandwidth (bytes/s)."""


def nnls(rows: list[list[float]], targets: list[float]) -> list[float]:
    """Non-negative least squares for a few unknowns: min ‖A x − y‖ over x ≥ 0, exactly,
    by solving the unconstrained problem on every subset of columns (the optimum is the
    unconstrained solution on its own support) and keeping the best feasible one."""
    k = len(rows[0])
    A = torch.tensor(rows, dtype=torch.float64, device="cpu")
    y = torch.tensor(targets, dtype=torch.float64, device="cpu")
    best, best_x = float("inf"), [0.0] * k
    for mask in range(1, 1 << k):
        cols = [j for j in range(k) if mask >> j & 1]
        sub = A[:, cols]
        scale = sub.abs().amax(dim=0).clamp_min(1e-300)  # columns of very different magnitude
        sol = torch.linalg.lstsq(sub / scale, y[:, None]).solution[:, 0] / scale
        if bool((sol < 0).any()) or not bool(torch.isfinite(sol).all()):
            continue
        x = [0.0] * k
        for j, v in zip(cols, sol.tolist()):
            x[j] = v
        residual = float(((A @ torch.tensor(x, dtype=torch.float64, device="cpu")) - y).square().sum())
        if residual < best:
            best, best_x = residual, x
    return best_x


_inv_beta = sympy.Symbol("inv_beta", positive=True)


@functools.lru_cache(maxsize=None)
def formula_coefficients(collective: str) -> tuple[Callable, Callable]:
    """(a(G, m), b(G, m)) with ``FORMULAS[collective]`` = a·α + b·(1/β)."""
    expr = cost.FORMULAS[FORMULA_OF[collective]].subs(cost.beta, 1 / _inv_beta)
    a, b = sympy.diff(expr, cost.alpha), sympy.diff(expr, _inv_beta)
    if sympy.simplify(expr - a * cost.alpha - b * _inv_beta) != 0:
        raise ValueError(f"{collective}: formula {expr} is not linear in alpha and 1/beta")
    return (sympy.lambdify((cost.G, cost.m), a, "math"), sympy.lambdify((cost.G, cost.m), b, "math"))


def fit_alpha_beta(collective: str, group_size: int, points: list[tuple[float, float]]) -> tuple[float, float]:
    """(α seconds per step, β bytes/s) of ``collective`` over ``group_size`` ranks from
    ``points`` = [(m bytes, measured seconds)]: relative-error NNLS on the formula's
    coefficients; α floored at :data:`ALPHA_FLOOR_S`, β capped at :data:`BETA_CEILING`."""
    a_of, b_of = formula_coefficients(collective)
    rows = [[a_of(group_size, m) / t, b_of(group_size, m) / t] for m, t in points]
    alpha_s, inv_beta = nnls(rows, [1.0] * len(points))
    return max(alpha_s, ALPHA_FLOOR_S), min(1.0 / inv_beta, BETA_CEILING) if inv_beta > 0 else BETA_CEILING


def predict(collective: str, group_size: int, m: float, alpha_s: float, beta_bps: float) -> float:
    """The collective's formula at (G, m) with the given α and β."""
    a_of, b_of = formula_coefficients(collective)
    return a_of(group_size, m) * alpha_s + b_of(group_size, m) / beta_bps


OUTLIER_MADS = 3.0
"""A round is an outlier when it is further from the median than this many scaled MADs
(1.4826 · median absolute deviation, the normal σ's estimate) ..."""
OUTLIER_FLOOR = (0.25, 2e-6)
"""... and further than this fraction of the median and this many seconds (rounds that
agree to within a few per cent are not outliers however small their MAD)."""


def robust_summary(values: list[float]) -> tuple[float, list[int]]:
    """(median, indices of the outliers) of one term's rounds; see :data:`OUTLIER_MADS`."""
    med = statistics.median(values)
    mad = 1.4826 * statistics.median(abs(v - med) for v in values)
    bound = max(OUTLIER_MADS * mad, OUTLIER_FLOOR[0] * abs(med), OUTLIER_FLOOR[1])
    return med, [i for i, v in enumerate(values) if abs(v - med) > bound]


FIT_OUTLIER = (3.0, 0.5)
"""A collective's point is dropped from its fit when its relative error exceeds both this
multiple of the fit's median error and this fraction, worst first, at most a quarter of
the points."""


def robust_fit_alpha_beta(collective: str, group_size: int, points: list[tuple[float, float]]
                          ) -> tuple[float, float, list[tuple[float, float]]]:
    """:func:`fit_alpha_beta` without the points it misses by far (:data:`FIT_OUTLIER`),
    refitted after each drop: (α, β, the dropped points)."""
    kept, dropped = list(points), []
    while True:
        alpha_s, beta_bps = fit_alpha_beta(collective, group_size, kept)
        errors = [abs(predict(collective, group_size, m, alpha_s, beta_bps) - t) / t for m, t in kept]
        ordered = sorted(errors)
        median = ordered[len(ordered) // 2]
        worst = max(range(len(kept)), key=errors.__getitem__)
        if (errors[worst] <= max(FIT_OUTLIER[0] * median, FIT_OUTLIER[1])
                or len(dropped) + 1 > len(points) // 4 or len(kept) <= 3):
            return alpha_s, beta_bps, dropped
        dropped.append(kept.pop(worst))


def fit_matmul(points: list[tuple[float, float]], launch_s: float) -> tuple[float, float]:
    """(rate FLOP/s, saturation FLOPs) from [(flops, seconds)]: ``MATMUL_TIME`` with efficiency
    1 is t = flops/rate + saturation/rate + launch, linear in 1/rate and saturation/rate."""
    rows = [[f / t, 1.0 / t] for f, t in points]
    inv_rate, sat_over_rate = nnls(rows, [(t - launch_s) / t for _, t in points])
    if inv_rate <= 0:
        raise ValueError(f"matmul fit found no per-FLOP cost in {points}")
    return 1.0 / inv_rate, sat_over_rate / inv_rate


__all__ = ["ALPHA_FLOOR_S", "BETA_CEILING", "FIT_OUTLIER", "FORMULA_OF", "OUTLIER_FLOOR", "OUTLIER_MADS",
           "fit_alpha_beta", "fit_matmul", "formula_coefficients", "nnls", "predict", "robust_fit_alpha_beta",
           "robust_summary"]
