"""Timing helpers shared by the benchmarks: side-by-side interleaved timing, statistics, tables.

Every benchmark compares autopar with a baseline *in one run*: the two sides' timed
repetitions alternate (A B A B ...), so a burst of machine noise (another process, a
frequency change) lands on both sides instead of on whichever ran second. Warm-up
repetitions run first, in the same alternation, and are not recorded::

    times = interleaved({"autopar": step_a, "eager": step_b}, steps=30, warmup=5)
    row = compare("compile_overhead", "mlp", times, ours="autopar", baseline="eager", goal=1.03)
    print(format_rows([row]))      # medians, IQRs, ratio, paired ratio, goal, met

On several ranks, pass ``sync=torch.distributed.barrier``: every repetition is then
``barrier; t0; step; barrier; t1``, so all ranks start the step together and the time is
that of the slowest rank (plus one barrier, which both sides pay). Only the timings of
rank 0 are reported.

A *training step* in these benchmarks is ``zero_grad`` (set to ``None``) + forward +
backward (+ the gradient synchronisation where the side has one), never the optimizer
step.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
from typing import Callable, Mapping, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # examples/ is not an installed package
    sys.path.insert(0, REPO_ROOT)


def interleaved(sides: Mapping[str, Callable[[], object]], steps: int, warmup: int,
                sync: Callable[[], object] | None = None) -> dict[str, list[float]]:
    """Time each side's ``fn()`` ``steps`` times, alternating sides every repetition.

    Returns seconds per repetition for every side, warm-up excluded. ``sync`` (e.g. a
    barrier) is called before the clock starts and again before it stops.
    """
    names = list(sides)
    times: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    for repetition in range(warmup + steps):
        for name in names:
            fn = sides[name]
            if sync is not None:
                sync()
            start = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            elapsed = time.perf_counter() - start
            if repetition >= warmup:
                times[name].append(elapsed)
    return times


def timed_step(pm, inputs, target, kwargs) -> float:
    """Seconds of one ``pm.step`` on every rank, gradients cleared first, between two
    barriers of the default group (all ranks start together; the slowest sets the time)."""
    import torch.distributed as dist
    for p in pm.parameters():
        p.grad = None
    dist.barrier()
    start = time.perf_counter()
    pm.step(*inputs, target=target, **kwargs)
    dist.barrier()
    return time.perf_counter() - start


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile), linear interpolation between samples."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


@dataclasses.dataclass
class Row:
    """One comparison: both sides' median and IQR in milliseconds and their ratio."""

    benchmark: str
    case: str
    ours: str
    baseline: str
    ours_median_ms: float
    ours_iqr_ms: float
    baseline_median_ms: float
    baseline_iqr_ms: float
    ratio: float          # median(ours) / median(baseline)
    paired_ratio: float   # median over repetitions of ours_i / baseline_i (same ABAB pair)
    paired_ratio_iqr: float
    goal: float
    steps: int
    note: str = ""

    @property
    def met(self) -> bool:
        return self.ratio <= self.goal


def compare(benchmark: str, case: str, times: Mapping[str, list[float]], *, ours: str, baseline: str,
            goal: float, note: str = "") -> Row:
    a, b = times[ours], times[baseline]
    qa, qb = quartiles(a), quartiles(b)
    pq = quartiles([x / y for x, y in zip(a, b)])
    return Row(benchmark, case, ours, baseline,
               qa[1] * 1e3, (qa[2] - qa[0]) * 1e3, qb[1] * 1e3, (qb[2] - qb[0]) * 1e3,
               qa[1] / qb[1], pq[1], pq[2] - pq[0], goal, len(a), note)


def extra_side(times: Mapping[str, list[float]], name: str) -> str:
    """``name: median ms (IQR ms)`` of a reference side that is not part of the ratio."""
    q = quartiles(times[name])
    return f"{name} {q[1] * 1e3:.2f} ms (IQR {(q[2] - q[0]) * 1e3:.2f})"


def format_rows(rows: Sequence[Row], markdown: bool = False) -> str:
    """A table of rows; ``markdown=True`` gives the pipe table used in docs/benchmarks.md."""
    header = ["benchmark", "case", "autopar median (IQR) ms", "baseline", "baseline median (IQR) ms",
              "ratio", "paired ratio (IQR)", "goal", "met"]
    lines = []
    for r in rows:
        lines.append([
            r.benchmark, r.case,
            f"{r.ours_median_ms:.2f} ({r.ours_iqr_ms:.2f})",
            r.baseline,
            f"{r.baseline_median_ms:.2f} ({r.baseline_iqr_ms:.2f})",
            f"{r.ratio:.3f}x",
            f"{r.paired_ratio:.3f} ({r.paired_ratio_iqr:.3f})",
            f"<= {r.goal:.2f}x" if r.goal != float("inf") else "- (measured only)",
            "yes" if r.met else "NO",
        ])
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        out += ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines]
    return "\n".join(out)


def print_rows(title: str, rows: Sequence[Row]) -> None:
    print(f"\n== {title} ==")
    print(format_rows(rows))
    for r in rows:
        if r.note:
            print(f"  {r.case}: {r.note}")


def parser(description: str, default_steps: int = 40) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=default_steps, help="timed steps per side (after warm-up)")
    p.add_argument("--warmup", type=int, default=5, help="untimed warm-up steps per side")
    p.add_argument("--quick", action="store_true", help="smoke run: few steps, small cases only")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    p.add_argument("--cases", nargs="+", metavar="CASE", help="run only these cases")
    return p


def cases_of(args_cases, quick: bool, cases: Sequence[str], quick_cases: Sequence[str]) -> list[str]:
    """The cases to run: those named on the command line, else the quick or the full list."""
    if args_cases:
        unknown = sorted(set(args_cases) - set(cases))
        if unknown:
            raise SystemExit(f"unknown case(s) {unknown}; this benchmark has {list(cases)}")
        return list(args_cases)
    return list(quick_cases if quick else cases)


SMALL_CASES = {"mlp-small", "transformer-small"}
"""Cases under ~2 ms a step on one rank: outside ``--quick`` they run 5× the steps (cheap,
and their ratios are noisier)."""


def steps_for(name: str, steps: int, warmup: int, quick: bool) -> tuple[int, int]:
    factor = 5 if name in SMALL_CASES and not quick else 1
    return steps * factor, warmup * factor


def steps_of(args) -> tuple[int, int]:
    """(timed steps, warm-up steps), shrunk by ``--quick``."""
    if args.quick:
        return min(args.steps, 5), min(args.warmup, 2)
    return args.steps, args.warmup


def write_json(path: str | None, rows: Sequence[Row]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump([dataclasses.asdict(r) | {"met": r.met} for r in rows], f, indent=2)


def make_case(name: str):
    """(model, input, target, loss_fn) of a named benchmark case, built from seed 0, so
    every rank (and both sides of a comparison) starts from the same weights and batch."""
    import torch
    import torch.nn.functional as F

    from examples.models import MLP, TinyTransformer, lm_loss

    torch.manual_seed(0)
    if name == "mlp-small":       # 32 → 64 → 32, ×2, batch 16: almost nothing but Python overhead
        return MLP(32, 64, 2, 8), torch.randn(16, 32), torch.randn(16, 8), F.mse_loss
    if name == "mlp-1024":        # 1024 → 4096 → 1024, ×2, head 1024 → 1024, batch 64: 17.8 M parameters
        return MLP(1024, 4096, 2, 1024), torch.randn(64, 1024), torch.randn(64, 1024), F.mse_loss
    if name == "transformer-small":   # width 32, 4 heads, 2 layers, vocab 64, batch 4 × seq 16
        model = TinyTransformer(vocab=64, width=32, heads=4, layers=2, block=16)
        return model, torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16)), lm_loss
    if name == "transformer-256x4":   # width 256, 4 heads, 4 layers, vocab 256, batch 8 × seq 64: 3.2 M parameters
        model = TinyTransformer(vocab=256, width=256, heads=4, layers=4, block=64)
        return model, torch.randint(0, 256, (8, 64)), torch.randint(0, 256, (8, 64)), lm_loss
    raise KeyError(f"unknown case {name!r}")


def check_close(what: str, ours, theirs, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Fail loudly when the two sides do not compute the same loss (then the timing
    would compare different work)."""
    import torch

    ours, theirs = torch.as_tensor(ours).detach().double(), torch.as_tensor(theirs).detach().double()
    if not torch.allclose(ours, theirs, rtol=rtol, atol=atol):
        raise AssertionError(f"{what}: the two sides disagree (autopar {ours.item():.6g}, baseline "
                             f"{theirs.item():.6g}); the benchmark would compare different computations")


def zero_grad(params) -> None:
    """``optimizer.zero_grad()``'s default: drop the gradients (set them to ``None``)."""
    for p in params:
        p.grad = None


def vm(field: str) -> int:
    """A ``/proc/self/status`` figure of this process in bytes (``VmRSS``: the resident set;
    ``VmHWM``: its peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")
