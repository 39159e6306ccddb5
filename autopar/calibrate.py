"""``autopar calibrate``: measure the live backend and fit the cost model's figures to it.

:func:`calibrate` launches ``world_size`` local ranks (one intra-op thread each, as the
runtime runs them; denormals flushed) and, on every rank at once, times

* square matmuls (fp32, or bf16 with ``dtype="bf16"``) from 32 to 2048 (8192 on a GPU), fitted to
  ``cost.MATMUL_TIME`` = (flops + saturation)/rate + launch by least squares: the
  fitted rate is stored as ``peak_flops`` with ``matmul_efficiency`` 1.0 (the base
  preset's peak is not kept: it is a datasheet figure where one exists, while the fit
  is what the kernels reach here, with the other ranks running beside them);
* kernel launch latency: the median of a 1-element ``torch.add``;
* memory bandwidth: a large ``copy_`` (bytes read + written over time, the convention
  of ``cost.MEMORY_BOUND_TIME``);
* all_reduce, all_gather, reduce_scatter, all_to_all, broadcast and scatter over every group
  size G ≥ 2 that divides the world (groups of consecutive ranks, all groups of one size
  running at once, as the groups of one mesh dimension do in training), message sizes
  from 4 B to 4 MiB, and a point-to-point ``send`` between pairs of ranks (half a
  send/recv round trip). One rank (a single GPU) times no collective: the base preset's
  network figures stand in.

Each sample starts after a barrier so all ranks start together. A collective sample is
one call (in training, collectives are separated by compute, not back to back), and the
message sizes take turns so a burst of other load spreads over all of them; a compute
sample repeats the kernel to last 5-20 ms (a 1-µs kernel is below the timer's
resolution alone, and a long sample sees the same core sharing as a long kernel does).
The figure kept is the median over the samples, then the largest median over the ranks
(a collective is as slow as its slowest member). Each (collective, G) is fitted to that
collective's own formula in ``cost.FORMULAS``, which is linear in α and 1/β:
t = a(G)·α + b(G, m)·(1/β), by non-negative least squares on relative errors (each row
divided by its measured time, so 4-byte messages weigh as much as 4-MiB ones). The fits land in
``Hardware.measured[collective][str(G)] = [α, β]``, which the cost model uses in place
of its placement model for that collective and group size.

:func:`run_calibration` returns the :class:`Calibration` (the hardware, every
measurement beside its fitted prediction, the fits and their errors);
:func:`calibrate` returns just the :class:`~autopar.cost.hardware.Hardware`. What each
rank times is in :mod:`autopar.cost.calibrate_measure`, the fitting in
:mod:`autopar.cost.calibrate_fit`; this module launches the one and applies the other.
"""
from __future__ import annotations

import time

from autopar.api import compile, plan
from autopar.cost.calibrate_measure import MATMUL_DTYPES, calibration_job
from autopar.cost.calibration import Calibration, Fit, Measurement, Outlier, fit_reports
from autopar.cost.hardware import Hardware
from autopar.runtime.launcher import launch


def run_calibration(world_size: int = 4, *, backend: str = "gloo", base: "str | Hardware" = "cpu-gloo",
                    quick: bool = False, name: str | None = None, timeout_s: float | None = None,
                    dtype: str = "fp32") -> Calibration:
    """Launch ``world_size`` ranks on ``backend``, measure, fit; see the module docstring.
    ``base`` is the preset the table compares with and whose figures stand in for any the
    fit cannot give. ``name`` defaults to ``calibrated-{backend}-{world_size}``. ``dtype``
    (``"fp32"`` or ``"bf16"``) is the matmuls' (a GPU's presets give its bf16 peak). One
    rank (``world_size=1``, a single GPU) times compute alone: the network figures are
    ``base``'s."""
    if world_size < 1:
        raise ValueError(f"calibrate needs at least 1 rank, got world_size={world_size}")
    if dtype not in MATMUL_DTYPES:
        raise ValueError(f"calibrate: dtype={dtype!r}; one of {sorted(MATMUL_DTYPES)}")
    started = time.perf_counter()
    reports = launch(calibration_job, world_size, (backend, quick, dtype, compile), backend=backend,
                     timeout_s=timeout_s or (300.0 if quick else 900.0))
    return fit_reports(reports, world_size, backend=backend, base=base, quick=quick, name=name, dtype=dtype,
                       seconds=time.perf_counter() - started, plan_fn=plan)


def calibrate(world_size: int = 4, *, backend: str = "gloo", base: "str | Hardware" = "cpu-gloo",
              quick: bool = False, name: str | None = None, dtype: str = "fp32") -> Hardware:
    """Measure the live backend on ``world_size`` local ranks and return the fitted
    :class:`Hardware` (``json.dump(hw.to_json(), f)`` makes it a profile for
    ``autopar.compile(..., hardware=PATH)``). :func:`run_calibration` also returns the
    measurements and the fits' errors."""
    return run_calibration(world_size, backend=backend, base=base, quick=quick, name=name, dtype=dtype).hardware


__all__ = ["Calibration", "Fit", "Measurement", "Outlier", "calibrate", "fit_reports", "run_calibration"]
