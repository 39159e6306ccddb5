"""``autopar calibrate``: measure the live backend and fit the cost model's figures to it.

:func:`calibrate` launches ``world_size`` local ranks (one intra-op thread each, as the
runtime runs them; denormals flushed) and, on every rank at once, times

* fp32 square matmuls from 32 to 2048 (8192 on a GPU), fitted to
  ``cost.MATMUL_TIME`` = (flops + saturation)/rate + launch by least squares: the
  fitted rate is stored as ``peak_flops`` with ``matmul_efficiency`` 1.0 (the base
  preset's peak is not kept: it is a datasheet figure where one exists, while the fit
  is what the kernels reach here, with the other ranks running beside them);
* kernel launch latency: the median of a 1-element ``torch.add``;
* memory bandwidth: a large ``copy_`` (bytes read + written over time, the convention
  of ``cost.MEMORY_BOUND_TIME``);
* all_reduce, all_gather, reduce_scatter, all_to_all and broadcast over every group
  size G ≥ 2 that divides the world (groups of consecutive ranks, all groups of one size
  running at once, as the groups of one mesh dimension do in training), message sizes
  from 4 B to 4 MiB, and a point-to-point ``send`` between pairs of ranks (half a
  send/recv round trip).

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
:func:`calibrate` returns just the :class:`~autopar.cost.hardware.Hardware`.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import platform
import socket
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import sympy
import torch
import torch.distributed as dist

from autopar._torch_compat import all_gather_flat, reduce_scatter_flat
from autopar.cost import model as cost
from autopar.cost.hardware import Hardware, get_hardware

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send")
"""The collectives measured, named as ``Hardware.measured`` and ``cost`` name them."""

FORMULA_OF = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
              "all_to_all": "all_to_all", "broadcast": "broadcast", "send": "point_to_point"}
"""Each measured collective's key in ``cost.FORMULAS``."""

ALPHA_FLOOR_S = 1e-9
"""A fitted α of 0 (the fit found no fixed cost) is stored as this, so the profile stays positive."""
BETA_CEILING = 1e15
"""A fitted 1/β of 0 (no per-byte cost) is stored as this bandwidth (bytes/s)."""


@dataclass(frozen=True)
class Settings:
    """What one calibration measures; :func:`settings` picks them for the full and quick runs."""

    message_bytes: tuple[int, ...]
    matmul_sizes: tuple[int, ...]
    copy_bytes: int
    repeats: int           # timed samples per collective point, one call each (after a warm-up call)
    compute_repeats: int   # timed samples per compute point (after a warm-up call) ...
    sample_s: float        # ... each repeating the kernel to last about this long


def settings(quick: bool, device_type: str = "cpu") -> Settings:
    """Full: 11 message sizes 4 B..4 MiB (×4 apart) timed 41 times each, matmuls 32..2048
    timed in 11 samples of ~20 ms; quick: 6 sizes 4 B..4 MiB (×16 apart) timed 31 times,
    matmuls 32..1024 in 7 samples of ~5 ms. GPUs get larger matmuls. Compute samples last
    several scheduler time slices, so where ranks share cores (more ranks than cores, or
    other load) the small kernels see the same sharing as the large ones."""
    gpu = device_type == "cuda"
    if quick:
        return Settings(message_bytes=tuple(4 * 16 ** k for k in range(6)),
                        matmul_sizes=(32, 64, 128, 256, 512, 1024) + ((2048, 4096) if gpu else ()),
                        copy_bytes=64 << 20, repeats=31, compute_repeats=7, sample_s=5e-3)
    return Settings(message_bytes=tuple(4 * 4 ** k for k in range(11)),
                    matmul_sizes=(32, 64, 128, 256, 512, 1024, 2048) + ((4096, 8192) if gpu else ()),
                    copy_bytes=256 << 20, repeats=41, compute_repeats=11, sample_s=20e-3)


def group_sizes(world_size: int) -> list[int]:
    """Every group size the planner can form on ``world_size`` ranks: the divisors ≥ 2."""
    return [g for g in range(2, world_size + 1) if world_size % g == 0]


# ------------------------------------------------------------------ on every rank


def _device(backend: str) -> torch.device:
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_kernel(op: Callable[[], Any], device: torch.device, s: Settings) -> float:
    """Median seconds per call of a compute kernel ``op`` over ``s.compute_repeats``
    samples, each started after a barrier of all ranks and repeating ``op`` to last about
    ``s.sample_s`` (a microsecond kernel is below the timer's resolution alone)."""
    op()  # warm-up: first-call costs (allocations, caches)
    _sync(device)
    start = time.perf_counter()
    op()
    _sync(device)
    inner = max(1, round(s.sample_s / max(time.perf_counter() - start, 1e-9)))
    samples = []
    for _ in range(s.compute_repeats):
        dist.barrier()
        _sync(device)
        start = time.perf_counter()
        for _ in range(inner):
            op()
        _sync(device)
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def _time_collectives(ops: list[Callable[[], Any]], device: torch.device, s: Settings) -> list[float]:
    """Median seconds of one call of each of ``ops`` over ``s.repeats`` samples, each
    started after a barrier of all ranks. Collectives in training are separated by
    compute, so each call is timed alone rather than back to back; the ops take turns
    (round-robin over the repeats), so a burst of other load on the machine spreads over
    all message sizes instead of corrupting one."""
    for op in ops:
        op()  # warm-up: first-call costs (connections, allocations)
    samples: list[list[float]] = [[] for _ in ops]
    for _ in range(s.repeats):
        for op, times in zip(ops, samples):
            dist.barrier()
            _sync(device)
            start = time.perf_counter()
            op()
            _sync(device)
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in samples]


def _collective_op(name: str, group, group_ranks: list[int], nbytes: int,
                   device: torch.device) -> tuple[Callable[[], Any], int]:
    """The operation timing ``name`` on ``group`` near ``nbytes`` bytes and the message
    size ``m`` it has in the formula's convention (all-gather: each rank's contribution;
    the others: the buffer each rank holds; fp32 elements, split evenly over G)."""
    size = len(group_ranks)
    n = max(1, nbytes // 4)
    zeros = lambda k: torch.zeros(k, dtype=torch.float32, device=device)  # noqa: E731 - zeros stay normal
    if name == "all_reduce":
        buf = zeros(n)
        return (lambda: dist.all_reduce(buf, group=group)), 4 * n
    if name == "all_gather":
        inp, out = zeros(n), zeros(n * size)
        return (lambda: all_gather_flat(out, inp, group=group)), 4 * n
    if name in ("reduce_scatter", "all_to_all"):
        n = max(size, n // size * size)
        inp, out = zeros(n), zeros(n // size if name == "reduce_scatter" else n)
        if name == "reduce_scatter":
            return (lambda: reduce_scatter_flat(out, inp, group=group)), 4 * n
        return (lambda: dist.all_to_all_single(out, inp, group=group)), 4 * n
    if name == "broadcast":
        buf = zeros(n)
        return (lambda: dist.broadcast(buf, src=group_ranks[0], group=group)), 4 * n
    if name == "send":  # one op = a round trip between the pair; the caller halves it
        buf = zeros(n)
        rank = dist.get_rank()
        peer = group_ranks[1] if rank == group_ranks[0] else group_ranks[0]
        if rank == group_ranks[0]:
            def ping():
                dist.send(buf, peer)
                dist.recv(buf, peer)
        else:
            def ping():
                dist.recv(buf, peer)
                dist.send(buf, peer)
        return ping, 4 * n
    raise ValueError(f"unknown collective {name!r}; expected one of {COLLECTIVES}")


def _memory_bytes(device: torch.device, world_size: int) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024 / world_size
    except OSError:
        pass
    return float("nan")


def _processor_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _time_matmul(n: int, gen: torch.Generator, device: torch.device, s: Settings) -> float:
    """Median seconds of one fp32 ``n×n @ n×n`` (2n³ FLOPs), allocating its output as a
    model's matmul does (and as the 1-element add that measures the launch latency does)."""
    a = torch.randn(n, n, generator=gen).to(device)
    b = torch.randn(n, n, generator=gen).to(device)
    return _time_kernel(lambda: torch.mm(a, b), device, s)


def _time_copy(nbytes: int, device: torch.device, s: Settings) -> float:
    """Median seconds of ``dst.copy_(src)`` of ``nbytes`` (reads and writes 2·nbytes)."""
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return _time_kernel(lambda: dst.copy_(src), device, s)


def calibration_job(backend: str, quick: bool) -> dict[str, Any]:
    """Run on every rank of a launched world: this rank's medians (seconds) of every
    measurement, keyed ``("matmul", n)``, ``("launch",)``, ``("copy", bytes)`` and
    ``(collective, G, m)``, plus facts about the machine."""
    torch.set_flush_denormal(True)
    device = _device(backend)
    world, rank = dist.get_world_size(), dist.get_rank()
    s = settings(quick, device.type)
    medians: dict[tuple, float] = {}

    # --- compute, on every rank at once (as training runs it)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(1, generator=gen).to(device), torch.randn(1, generator=gen).to(device)
    medians[("launch",)] = _time_kernel(lambda: torch.add(x, y), device, s)
    for n in s.matmul_sizes:
        medians[("matmul", n)] = _time_matmul(n, gen, device, s)
    medians[("copy", s.copy_bytes)] = _time_copy(s.copy_bytes, device, s)

    # --- collectives: groups of consecutive ranks, every group of a size at once
    for size in group_sizes(world):
        group, members = None, None
        for first in range(0, world, size):
            ranks = list(range(first, first + size))
            made = dist.group.WORLD if size == world else dist.new_group(ranks)  # on every rank, same order
            if rank in ranks:
                group, members = made, ranks
        for name in COLLECTIVES[:-1]:
            ops, sizes = zip(*(_collective_op(name, group, members, nbytes, device) for nbytes in s.message_bytes))
            for m, t in zip(sizes, _time_collectives(list(ops), device, s)):
                medians[(name, size, m)] = t
    # point-to-point between pairs (0,1), (2,3), ...; a last odd rank only joins the barriers
    pair = [rank - rank % 2, rank - rank % 2 + 1]
    if pair[1] < world:
        ops, sizes = zip(*(_collective_op("send", None, pair, nbytes, device) for nbytes in s.message_bytes))
        for m, t in zip(sizes, _time_collectives(list(ops), device, s)):
            medians[("send", 2, m)] = t / 2  # an op is a round trip
    else:
        _time_collectives([lambda: None] * len(s.message_bytes), device, s)
    return {"medians": medians, "host": socket.gethostname(), "processor": _processor_name(device),
            "memory_bytes": _memory_bytes(device, world), "device_type": device.type}


# ------------------------------------------------------------------ fitting


def nnls(rows: list[list[float]], targets: list[float]) -> list[float]:
    """Non-negative least squares for a few unknowns: min ‖A x − y‖ over x ≥ 0, exactly,
    by solving the unconstrained problem on every subset of columns (the optimum is the
    unconstrained solution on its own support) and keeping the best feasible one."""
    k = len(rows[0])
    A = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor(targets, dtype=torch.float64)
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
        residual = float(((A @ torch.tensor(x, dtype=torch.float64)) - y).square().sum())
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


def fit_matmul(points: list[tuple[float, float]], launch_s: float) -> tuple[float, float]:
    """(rate FLOP/s, saturation FLOPs) from [(flops, seconds)]: ``MATMUL_TIME`` with efficiency
    1 is t = flops/rate + saturation/rate + launch, linear in 1/rate and saturation/rate."""
    rows = [[f / t, 1.0 / t] for f, t in points]
    inv_rate, sat_over_rate = nnls(rows, [(t - launch_s) / t for _, t in points])
    if inv_rate <= 0:
        raise ValueError(f"matmul fit found no per-FLOP cost in {points}")
    return 1.0 / inv_rate, sat_over_rate / inv_rate


# ------------------------------------------------------------------ results


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
                         f"{f.median_rel_error:>8.0%} {f.max_rel_error:>8.0%} {f.points:>7}")
        lines += [
            "",
            f"scalar fields: intra-node (all_reduce G=2) {hw.intra_node_latency_s * 1e6:.1f} us, "
            f"{hw.intra_node_bandwidth / 1e9:.3f} GB/s; inter-node (all_reduce G={self.world_size}) "
            f"{hw.inter_node_latency_s * 1e6:.1f} us, {hw.inter_node_bandwidth / 1e9:.3f} GB/s; "
            f"{base.name}: {base.intra_node_latency_s * 1e6:.1f} us, {base.intra_node_bandwidth / 1e9:.3f} GB/s; "
            f"{base.inter_node_latency_s * 1e6:.1f} us, {base.inter_node_bandwidth / 1e9:.3f} GB/s",
        ]
        if points:
            lines += ["", f"{'measurement':<15} {'G':>3} {'size':>12} {'measured us':>12} {'fitted us':>12} {'err':>6}"]
            for p in self.measurements:
                lines.append(f"{p.kind:<15} {p.group_size:>3} {p.size:>12.6g} {p.measured_s * 1e6:>12.2f} "
                             f"{p.predicted_s * 1e6:>12.2f} {p.rel_error:>6.0%}")
        return "\n".join(lines)


def run_calibration(world_size: int = 4, *, backend: str = "gloo", base: "str | Hardware" = "cpu-gloo",
                    quick: bool = False, name: str | None = None, timeout_s: float | None = None) -> Calibration:
    """Launch ``world_size`` ranks on ``backend``, measure, fit; see the module docstring.
    ``base`` is the preset the table compares with and whose figures stand in for any the
    fit cannot give. ``name`` defaults to ``calibrated-{backend}-{world_size}``."""
    from autopar.runtime.launcher import launch

    if world_size < 2:
        raise ValueError(f"calibrate needs at least 2 ranks to time collectives, got world_size={world_size}")
    base_hw = get_hardware(base)
    started = time.perf_counter()
    reports = launch(calibration_job, world_size, (backend, quick), backend=backend,
                     timeout_s=timeout_s or (300.0 if quick else 900.0))
    seconds = time.perf_counter() - started
    medians: dict[tuple, float] = {}
    for report in reports:  # the slowest rank's median of each measurement
        for key, value in report["medians"].items():
            medians[key] = max(value, medians.get(key, 0.0))
    facts = {k: reports[0][k] for k in ("host", "processor", "device_type")}

    # --- compute
    launch_s = medians[("launch",)]
    matmul_points = sorted((2.0 * k[1] ** 3, t) for k, t in medians.items() if k[0] == "matmul")
    try:
        rate, saturation = fit_matmul(matmul_points, launch_s)
    except ValueError:
        rate, saturation = base_hw.peak_flops * base_hw.matmul_efficiency, base_hw.saturation_flops
    (copy_key, copy_s), = [(k, t) for k, t in medians.items() if k[0] == "copy"]
    memory_bandwidth = 2.0 * copy_key[1] / max(copy_s - launch_s, 1e-12)  # read + written

    # --- collectives
    fits: list[Fit] = []
    measurements: list[Measurement] = []
    measured: dict[str, dict[str, list[float]]] = {}
    for collective in COLLECTIVES:
        for size in sorted({k[1] for k in medians if k[0] == collective}):
            points = sorted((k[2], t) for k, t in medians.items() if k[0] == collective and k[1] == size)
            alpha_s, beta_bps = fit_alpha_beta(collective, size, points)
            rows = [Measurement(collective, size, m, t, predict(collective, size, m, alpha_s, beta_bps))
                    for m, t in points]
            errors = [r.rel_error for r in rows]
            fits.append(Fit(collective, size, alpha_s, beta_bps, statistics.median(errors), max(errors), len(rows)))
            measurements += rows
            measured.setdefault(collective, {})[str(size)] = [alpha_s, beta_bps]

    intra = measured["all_reduce"]["2"]
    inter = measured["all_reduce"][str(max(group_sizes(world_size)))]
    memory_bytes = reports[0]["memory_bytes"]
    if memory_bytes != memory_bytes:  # nan: no /proc/meminfo
        memory_bytes = base_hw.memory_bytes
    s = settings(quick, facts["device_type"])
    cores = os.cpu_count()
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    description = (
        f"Measured by autopar calibrate{' --quick' if quick else ''} on {facts['host']} ({facts['processor']}, "
        f"{cores} CPU cores) on {when}: torch {torch.__version__}, backend {backend}, {world_size} ranks "
        f"(one intra-op thread each, all measuring at once; per point the slowest rank's median of "
        f"{s.repeats} one-call samples for collectives, {s.compute_repeats} samples of ~{s.sample_s * 1e3:g} ms "
        f"for compute). "
        f"fp32 matmuls n={s.matmul_sizes[0]}..{s.matmul_sizes[-1]} fitted to MATMUL_TIME: "
        f"{rate / 1e9:.1f} GFLOP/s stored as peak (efficiency 1.0), saturation {saturation:.3g} FLOP; "
        f"launch = median 1-element add {launch_s * 1e6:.2f} us; memory bandwidth = copy_ of "
        f"{s.copy_bytes >> 20} MiB (read + write) {memory_bandwidth / 1e9:.2f} GB/s; memory = "
        f"{'device memory' if facts['device_type'] == 'cuda' else 'MemTotal / ranks'}. "
        f"Collectives over groups of consecutive ranks, G in {group_sizes(world_size)}, "
        f"{s.message_bytes[0]} B..{s.message_bytes[-1] >> 20} MiB, fitted per (collective, G) to cost.FORMULAS "
        f"by relative-error NNLS (field measured); intra-node = all_reduce G=2, inter-node = all_reduce "
        f"G={max(group_sizes(world_size))}, devices_per_node = {world_size}.")
    hardware = Hardware(
        name=name or f"calibrated-{backend}-{world_size}",
        description=description,
        peak_flops=rate,
        matmul_efficiency=1.0,
        saturation_flops=saturation,
        memory_bandwidth=memory_bandwidth,
        kernel_launch_s=launch_s,
        devices_per_node=world_size,
        intra_node_bandwidth=intra[1],
        inter_node_bandwidth=inter[1],
        intra_node_latency_s=intra[0],
        inter_node_latency_s=inter[0],
        memory_bytes=memory_bytes,
        measured=measured,
    )
    compute_rows = [Measurement("matmul", 1, f, t, cost.matmul_time(f, hardware)) for f, t in matmul_points]
    compute_rows.append(Measurement("launch", 1, 0, launch_s, launch_s))
    compute_rows.append(Measurement("copy", 1, copy_key[1], copy_s, cost.memory_bound_time(2 * copy_key[1], hardware)))
    return Calibration(hardware, base_hw, compute_rows + measurements, fits, seconds, world_size, backend,
                       quick, facts)


def calibrate(world_size: int = 4, *, backend: str = "gloo", base: "str | Hardware" = "cpu-gloo",
              quick: bool = False, name: str | None = None) -> Hardware:
    """Measure the live backend on ``world_size`` local ranks and return the fitted
    :class:`Hardware` (``json.dump(hw.to_json(), f)`` makes it a profile for
    ``autopar.compile(..., hardware=PATH)``). :func:`run_calibration` also returns the
    measurements and the fits' errors."""
    return run_calibration(world_size, backend=backend, base=base, quick=quick, name=name).hardware


__all__ = ["COLLECTIVES", "Calibration", "Fit", "Measurement", "Settings", "calibrate", "calibration_job",
           "fit_alpha_beta", "fit_matmul", "formula_coefficients", "group_sizes", "nnls", "predict",
           "run_calibration", "settings"]
