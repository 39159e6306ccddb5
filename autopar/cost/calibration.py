"""Fitting what ``autopar calibrate`` (and ``compile`` on first use) measured: the
:class:`Calibration`, its fits and its table (:mod:`autopar.calibrate` launches the
measurement and applies this; the module docstring there describes both).
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from autopar.cost.calibrate_fit import fit_matmul, predict, robust_fit_alpha_beta, robust_summary
from autopar.cost.calibrate_measure import (BULK_BYTES, COLLECTIVES, PIPELINE_MICROBATCHES, group_sizes,
                                       pipeline_case, pipeline_strategy, runtime_case, settings)
from autopar.cost import model as cost
from autopar.cost.hardware import Hardware, get_hardware


@dataclass(frozen=True)
class Measurement:
    """One measured point beside the fitted model's prediction. ``size`` is the formula's
    ``m`` in bytes for collectives, FLOPs for ``matmul``, bytes copied for ``copy``."""

    kind: str
    group_size: int
    size: float
    measured_s: float
    predicted_s: float

    @property
    def rel_error(self) -> float:
        return abs(self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class Fit:
    collective: str
    group_size: int
    alpha_s: float
    beta_bps: float
    median_rel_error: float
    max_rel_error: float
    points: int
    dropped: tuple = ()  # (m bytes, seconds) the robust fit left out (calibrate_fit.FIT_OUTLIER)


@dataclass(frozen=True)
class Outlier:
    """One round of an overhead term far from that rank's median of the term
    (:func:`autopar.cost.calibrate_fit.robust_summary`); the median kept does not use it."""

    term: str
    rank: int
    round: int
    value_s: float
    median_s: float


def _term_value(term: str, value: float, width: int = 0) -> str:
    """A round's value as printed: a ratio for ``async_exposed`` (time together over
    time one after another), else microseconds."""
    if term == "async_exposed":
        return f"{value:>{width}.2f}" + ("   " if width else "")
    return f"{value * 1e6:>{width}.1f} us"


def _term_name(key: tuple) -> str:
    return key[0] if len(key) == 1 else f"{key[0]}[{key[1]}]"


@dataclass
class Calibration:
    """What :func:`run_calibration` found: the fitted :class:`Hardware`, the base preset it
    is compared with, every measurement beside its prediction, and the fits."""

    hardware: Hardware
    base: Hardware
    measurements: list[Measurement]
    fits: list[Fit]
    seconds: float
    world_size: int
    backend: str
    quick: bool
    facts: dict = field(default_factory=dict)
    outliers: list[Outlier] = field(default_factory=list)
    rounds: dict = field(default_factory=dict)  # term → (median, smallest, largest) of the slowest rank's rounds

    def fit(self, collective: str, group_size: int) -> Fit:
        return next(f for f in self.fits if (f.collective, f.group_size) == (collective, group_size))

    def points(self, kind: str, group_size: int | None = None) -> list[Measurement]:
        return [p for p in self.measurements if p.kind == kind and group_size in (None, p.group_size)]

    def points_json(self) -> list[dict[str, Any]]:
        """Every measurement as a dict (for ``autopar calibrate --points``)."""
        return [dict(dataclasses.asdict(p), rel_error=p.rel_error) for p in self.measurements]

    def table(self, *, points: bool = False) -> str:
        """The fits as text: compute figures beside the base preset's, then α (µs), β (GB/s)
        and the fit's median / largest relative error per collective and group size; with
        ``points`` every measurement beside its prediction too."""
        hw, base = self.hardware, self.base
        matmul = self.points("matmul")
        lines = [
            f"autopar calibrate: {self.world_size} {self.backend} rank(s) on {self.facts.get('host', '?')} "
            f"({self.facts.get('processor', '?')}, {os.cpu_count()} CPU cores), torch {torch.__version__}, "
            f"{'quick, ' if self.quick else ''}{self.seconds:.1f} s",
            "",
            f"compute (per rank, all {self.world_size} ranks at once)    fitted              {base.name}",
            f"  matmul rate (peak x efficiency)    {hw.peak_flops * hw.matmul_efficiency / 1e9:10.1f} GFLOP/s "
            f"{base.peak_flops * base.matmul_efficiency / 1e9:10.1f} GFLOP/s",
            f"  matmul saturation                  {hw.saturation_flops:10.3g} FLOP    {base.saturation_flops:10.3g} FLOP",
            f"  kernel launch                      {hw.kernel_launch_s * 1e6:10.2f} us      "
            f"{base.kernel_launch_s * 1e6:10.2f} us",
            f"  host per kernel pass (fx+autograd) {hw.host_op_s * 1e6:10.2f} us      "
            f"{base.host_op_s * 1e6:10.2f} us",
            f"  transcendental element (exp, erf)  {hw.special_element_s * 1e9:10.2f} ns      "
            f"{base.special_element_s * 1e9:10.2f} ns",
            f"  host per collective call           {hw.collective_call_s * 1e6:10.2f} us      "
            f"{base.collective_call_s * 1e6:10.2f} us",
            f"  asynchronous collectives exposed   {hw.async_exposed:10.2f}         {base.async_exposed:10.2f}",
            f"  runtime per step (runner, buckets) {hw.step_overhead_s * 1e3:10.2f} ms      "
            f"{base.step_overhead_s * 1e3:10.2f} ms",
            f"  memory bandwidth (copy)            {hw.memory_bandwidth / 1e9:10.2f} GB/s    "
            f"{base.memory_bandwidth / 1e9:10.2f} GB/s",
            f"  memory per rank                    {hw.memory_bytes / 2**30:10.2f} GiB     "
            f"{base.memory_bytes / 2**30:10.2f} GiB",
            "  matmul fit: median rel. error "
            f"{statistics.median(p.rel_error for p in matmul):.0%}, largest {max(p.rel_error for p in matmul):.0%} "
            f"(n = {', '.join(str(round((p.size / 2) ** (1 / 3))) for p in matmul)})",
            "",
            f"{'collective':<15} {'G':>3} {'alpha us':>9} {'beta GB/s':>10} {'med err':>8} {'max err':>8} {'points':>7}",
        ]
        for f in self.fits:
            lines.append(f"{f.collective:<15} {f.group_size:>3} {f.alpha_s * 1e6:>9.1f} {f.beta_bps / 1e9:>10.3f} "
                         f"{f.median_rel_error:>8.0%} {f.max_rel_error:>8.0%} {f.points:>7}"
                         + (f"  (left out: {', '.join(f'{m:g} B {t * 1e6:.0f} us' for m, t in f.dropped)})"
                            if f.dropped else ""))
        if self.rounds:
            lines += ["", "overhead terms, per rank the median of its rounds, the slowest rank's (its rounds' range):"]
            for term, (med, lo, hi) in self.rounds.items():
                lines.append(f"  {term:<22} {_term_value(term, med, 10)}   ({_term_value(term, lo)} .. "
                             f"{_term_value(term, hi)})")
            lines.append(f"  -> pipeline action       {hw.pipeline_action_s * 1e6:>10.1f} us   "
                         f"(per stage, forward or backward of one microbatch)")
        if self.outliers:
            lines += ["", f"outliers ({len(self.outliers)}: rounds far from their rank's median, which they do not "
                          f"move; a busy machine):"]
            for o in self.outliers:
                lines.append(f"  {o.term:<22} rank {o.rank} round {o.round}: {_term_value(o.term, o.value_s)} "
                             f"(its median {_term_value(o.term, o.median_s)})")
        where = (f"intra-node (all_reduce G=2) {hw.intra_node_latency_s * 1e6:.1f} us, "
                 f"{hw.intra_node_bandwidth / 1e9:.3f} GB/s; inter-node (all_reduce G={self.world_size})"
                 if self.world_size > 1 else
                 f"({base.name}'s: one rank times no collective) intra-node {hw.intra_node_latency_s * 1e6:.1f} us, "
                 f"{hw.intra_node_bandwidth / 1e9:.3f} GB/s; inter-node")
        lines += [
            "",
            f"scalar fields: {where} {hw.inter_node_latency_s * 1e6:.1f} us, {hw.inter_node_bandwidth / 1e9:.3f} GB/s; "
            f"{base.name}: {base.intra_node_latency_s * 1e6:.1f} us, {base.intra_node_bandwidth / 1e9:.3f} GB/s; "
            f"{base.inter_node_latency_s * 1e6:.1f} us, {base.inter_node_bandwidth / 1e9:.3f} GB/s",
        ]
        if points:
            lines += ["", f"{'measurement':<15} {'G':>3} {'size':>12} {'measured us':>12} {'fitted us':>12} {'err':>6}"]
            for p in self.measurements:
                lines.append(f"{p.kind:<15} {p.group_size:>3} {p.size:>12.6g} {p.measured_s * 1e6:>12.2f} "
                             f"{p.predicted_s * 1e6:>12.2f} {p.rel_error:>6.0%}")
        return "\n".join(lines)


def fit_reports(reports: list[dict], world_size: int, *, backend: str, base: "str | Hardware" = "cpu-gloo",
                quick: "bool | str" = False, name: str | None = None, dtype: str = "fp32",
                seconds: float = 0.0, plan_fn=None) -> Calibration:
    """The :class:`Calibration` fitted to every rank's
    :func:`~autopar.cost.calibrate_measure.calibration_job` report (the same reports give
    the same hardware on any rank); ``plan_fn``: ``autopar.plan``, which prices the
    runtime's own cases for the per-step and per-action terms."""
    base_hw = get_hardware(base)
    medians: dict[tuple, float] = {}
    for report in reports:  # the slowest rank's median of each measurement
        for key, value in report["medians"].items():
            medians[key] = max(value, medians.get(key, 0.0))
    rounds, outliers = _overhead_rounds(reports)
    medians.update({key: med for key, (med, _, _) in rounds.items()})
    facts = {k: reports[0][k] for k in ("host", "processor", "device_type")}

    compute = _fit_compute(medians, base_hw)
    # the runtime's own pieces: per kernel pass beyond the launch (an op is a forward and
    # a backward pass), per collective call the wrapper's own cost
    host_op_s = max(0.0, medians[("host_op",)] / 2 - compute.launch_s)
    collective_call_s = max(0.0, medians[("collective_call",)])
    fits, measurements, measured, intra, inter = _fit_network(medians, world_size, base_hw)
    memory_bytes = reports[0]["memory_bytes"]
    if memory_bytes != memory_bytes:  # nan: no /proc/meminfo
        memory_bytes = base_hw.memory_bytes
    hardware = Hardware(
        name=name or f"calibrated-{backend}-{world_size}",
        description=_description(compute, facts, backend, world_size, quick, base_hw.name, dtype),
        peak_flops=compute.rate,
        matmul_efficiency=1.0,
        saturation_flops=compute.saturation,
        memory_bandwidth=compute.memory_bandwidth,
        kernel_launch_s=compute.launch_s,
        devices_per_node=world_size if world_size > 1 else base_hw.devices_per_node,
        intra_node_bandwidth=intra[1],
        inter_node_bandwidth=inter[1],
        intra_node_latency_s=intra[0],
        inter_node_latency_s=inter[0],
        memory_bytes=memory_bytes,
        measured=measured,
        host_op_s=host_op_s,
        special_element_s=medians.get(("special",), 0.0),
        collective_call_s=collective_call_s,
        pipeline_action_s=base_hw.pipeline_action_s,
        host_cores=(os.cpu_count() or 0) if facts["device_type"] == "cpu" else 0,
        measured_ranks=world_size,
        async_exposed=min(1.0, max(0.0, medians.get(("async_exposed",), 1.0))),
        fused_kernels=facts["device_type"] == "cuda",  # compile fuses pointwise chains on GPUs
    )
    if ("runtime_step",) in medians and plan_fn is not None:
        hardware = _runtime_terms(hardware, medians, world_size, plan_fn)
    return Calibration(hardware, base_hw, compute.rows(hardware) + measurements, fits, seconds, world_size, backend,
                       bool(quick), facts, outliers, {_term_name(k): v for k, v in rounds.items()})


def _fit_network(medians: dict[tuple, float], world_size: int, base_hw: Hardware
                 ) -> tuple[list[Fit], list[Measurement], dict[str, dict], Sequence[float], Sequence[float]]:
    """The collectives' fits and rows (:func:`_fit_collectives`), ``Hardware.measured`` with
    the cost of a call in training and every measured point, and the intra- and inter-node
    (latency, bandwidth): the all-reduce fits over 2 ranks and over the largest group, or,
    with one rank, ``base_hw``'s."""
    # a collective as training meets it, beyond its timed-alone fit: per group size
    # (``measured["call"]``, read by cost._collective_time beside collective_call_s)
    smallest = {}
    for k, t in medians.items():
        if k[0] == "all_reduce" and (k[1] not in smallest or k[2] < smallest[k[1]][0]):
            smallest[k[1]] = (k[2], t)
    calls = {str(g): [max(0.0, medians[("in_training", g)] - smallest[g][1]), 0.0]
             for g in smallest if ("in_training", g) in medians}
    fits, measurements, measured = _fit_collectives(medians)
    measured["call"] = calls
    # every measured point, which the cost model interpolates between (the fit is for
    # sizes past the largest and for the scalar fields)
    measured["table"] = {}
    for k, t in sorted(medians.items(), key=lambda kv: str(kv[0])):
        if k[0] in COLLECTIVES:
            measured["table"].setdefault(k[0], {}).setdefault(str(k[1]), []).append([float(k[2]), t])
    for by_size in measured["table"].values():
        for points in by_size.values():
            points.sort()
    if world_size == 1:  # one device: no collective to time; the base preset's network stands in
        intra = (base_hw.intra_node_latency_s, base_hw.intra_node_bandwidth)
        inter = (base_hw.inter_node_latency_s, base_hw.inter_node_bandwidth)
        measured = {"call": {}, "table": {}}
    else:
        sizes = group_sizes(world_size)  # the divisors >= 2: an odd world has no group of 2
        intra = measured["all_reduce"][str(min(sizes))]
        inter = measured["all_reduce"][str(max(sizes))]
    return fits, measurements, measured, intra, inter


def _overhead_rounds(reports: list[dict]) -> tuple[dict[tuple, tuple[float, float, float]], list[Outlier]]:
    """Per overhead term: per rank the median of its rounds (outliers reported), then the
    slowest rank's (median, smallest round, largest round)."""
    kept: dict[tuple, tuple[float, float, float]] = {}
    outliers: list[Outlier] = []
    for rank, report in enumerate(reports):
        for key, values in report.get("rounds", {}).items():
            med, far = robust_summary(values)
            outliers += [Outlier(_term_name(key), rank, i, values[i], med) for i in far]
            if key not in kept or med > kept[key][0]:
                kept[key] = (med, min(values), max(values))
    return kept, outliers


def _runtime_terms(hardware: Hardware, medians: dict[tuple, float], world_size: int, plan) -> Hardware:
    """The runner's fixed cost per step (the data-parallel case's measured step less its
    prediction) and the pipeline executor's cost per action (the pipeline case's extra
    step time per extra microbatch beyond the predicted, over the two actions, forward and
    backward, a stage adds per microbatch)."""
    model, inputs, loss, target = runtime_case(world_size)
    predicted = plan(model, world_size, inputs, loss, {"data": world_size}, example_target=target,
                             hardware=hardware).step_s
    hardware = dataclasses.replace(hardware, step_overhead_s=max(0.0, medians[("runtime_step",)] - predicted))
    k1, k2 = PIPELINE_MICROBATCHES[0], PIPELINE_MICROBATCHES[-1]
    if ("pipeline_step", k2) in medians and k2 > k1:
        model, inputs, loss, target = pipeline_case(world_size)
        hardware = dataclasses.replace(hardware, pipeline_action_s=0.0)
        p1, p2 = (plan(model, world_size, inputs, loss, pipeline_strategy(world_size, k),
                       example_target=target, hardware=hardware).step_s for k in (k1, k2))
        extra = (medians[("pipeline_step", k2)] - medians[("pipeline_step", k1)]) - (p2 - p1)
        hardware = dataclasses.replace(hardware, pipeline_action_s=max(0.0, extra / (2 * (k2 - k1) * world_size)))
    return hardware


@dataclass(frozen=True)
class _Compute:
    """The compute figures fitted to the slowest rank's medians."""

    launch_s: float
    matmul_points: list[tuple[float, float]]  # (flops, seconds)
    rate: float
    saturation: float
    copy_bytes: int
    copy_s: float
    memory_bandwidth: float

    def rows(self, hardware: Hardware) -> list[Measurement]:
        """Each compute measurement beside what ``hardware`` predicts for it."""
        rows = [Measurement("matmul", 1, f, t, cost.matmul_time(f, hardware)) for f, t in self.matmul_points]
        rows.append(Measurement("launch", 1, 0, self.launch_s, self.launch_s))
        rows.append(Measurement("copy", 1, self.copy_bytes, self.copy_s,
                                cost.memory_bound_time(2 * self.copy_bytes, hardware)))
        return rows


def _fit_compute(medians: dict[tuple, float], base_hw: Hardware) -> _Compute:
    """Launch latency, the matmul fit (``base_hw``'s figures where the fit finds no
    per-FLOP cost) and the copy's memory bandwidth."""
    launch_s = medians[("launch",)]
    matmul_points = sorted((2.0 * k[1] ** 3, t) for k, t in medians.items() if k[0] == "matmul")
    try:
        rate, saturation = fit_matmul(matmul_points, launch_s)
    except ValueError:
        rate, saturation = base_hw.peak_flops * base_hw.matmul_efficiency, base_hw.saturation_flops
    (copy_key, copy_s), = [(k, t) for k, t in medians.items() if k[0] == "copy"]
    memory_bandwidth = 2.0 * copy_key[1] / max(copy_s - launch_s, 1e-12)  # read + written
    return _Compute(launch_s, matmul_points, rate, saturation, copy_key[1], copy_s, memory_bandwidth)


def _fit_collectives(medians: dict[tuple, float]) -> tuple[list[Fit], list[Measurement], dict[str, dict]]:
    """Per (collective, G): the α-β fit, each point beside its prediction, and
    ``Hardware.measured``'s entry ``[α, β]``."""
    fits: list[Fit] = []
    measurements: list[Measurement] = []
    measured: dict[str, dict[str, list[float]]] = {}
    for collective in COLLECTIVES:
        for size in sorted({k[1] for k in medians if k[0] == collective}):
            points = sorted((k[2], t) for k, t in medians.items() if k[0] == collective and k[1] == size)
            alpha_s, beta_bps, dropped = robust_fit_alpha_beta(collective, size, points)
            rows = [Measurement(collective, size, m, t, predict(collective, size, m, alpha_s, beta_bps))
                    for m, t in points]
            errors = [r.rel_error for r in rows if (r.size, r.measured_s) not in dropped]
            fits.append(Fit(collective, size, alpha_s, beta_bps, statistics.median(errors), max(errors), len(rows),
                            tuple(dropped)))
            measurements += rows
            measured.setdefault(collective, {})[str(size)] = [alpha_s, beta_bps]
    return fits, measurements, measured


def _description(compute: _Compute, facts: dict, backend: str, world_size: int, quick: "bool | str", base: str,
                 dtype: str = "fp32") -> str:
    """The profile's description: where and how it was measured, and what was fitted."""
    s = settings(quick, facts["device_type"])
    cores = os.cpu_count()
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return (
        f"Measured by {'compile on first use (a probe)' if quick == 'probe' else 'autopar calibrate'}"
        f"{' --quick' if quick is True else ''} on {facts['host']} ({facts['processor']}, "
        f"{cores} CPU cores) on {when}: torch {torch.__version__}, backend {backend}, {world_size} ranks "
        f"(one intra-op thread each, all measuring at once; per point the slowest rank's median of "
        f"{s.repeats} one-call samples for collectives, {s.compute_repeats} samples of ~{s.sample_s * 1e3:g} ms "
        f"for compute; the overhead terms in {s.rounds} rounds, per rank their median, outliers reported). "
        f"{dtype} matmuls n={s.matmul_sizes[0]}..{s.matmul_sizes[-1]} fitted to MATMUL_TIME: "
        f"{compute.rate / 1e9:.1f} GFLOP/s stored as peak (efficiency 1.0), saturation {compute.saturation:.3g} FLOP; "
        f"launch = median 1-element add {compute.launch_s * 1e6:.2f} us; memory bandwidth = copy_ of "
        f"{s.copy_bytes >> 20} MiB (read + write) {compute.memory_bandwidth / 1e9:.2f} GB/s; memory = "
        f"{'device memory' if facts['device_type'] == 'cuda' else 'MemTotal / ranks'}. "
        + (f"Collectives over groups of consecutive ranks, G in {group_sizes(world_size)}, "
           f"{s.message_bytes[0]} B..{s.message_bytes[-1] >> 20} MiB (all-reduce and reduce-scatter also "
           f"{BULK_BYTES >> 20} MiB, all-gather {BULK_BYTES >> 21} MiB parts), fitted per (collective, G) to cost.FORMULAS "
           f"by relative-error NNLS (field measured); intra-node = all_reduce at the smallest G, inter-node = all_reduce "
           f"G={max(group_sizes(world_size))}, devices_per_node = {world_size}." if world_size > 1 else
           f"One rank: no collective timed; the network figures and devices_per_node are {base}'s."))


__all__ = ["Calibration", "Fit", "Measurement", "Outlier", "fit_reports"]
