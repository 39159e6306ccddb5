"""What ``autopar calibrate`` times on every rank of a launched world.

:func:`calibration_job` runs on each rank (one intra-op thread each, denormals flushed)
and returns that rank's median seconds of every measurement: fp32 square matmuls, the
launch latency of a 1-element add, a large ``copy_``, and each of :data:`COLLECTIVES`
over every group size :func:`group_sizes` gives (groups of consecutive ranks, all
groups of one size at once) at the message sizes :func:`settings` picks. Each sample
starts after a barrier of all ranks; a collective sample is one call, a compute sample
repeats the kernel to last a few milliseconds.

The overhead terms are measured with the runtime's own pieces, in ``rounds`` rounds
taking turns with the measurements above (so a burst of other load corrupts one round,
which the fit reports as an outlier, rather than the figure): the host's cost per op of
an fx program run forward and backward (:func:`_time_host_ops`), autopar's autograd functions around a
collective, per call, on a group of one (:func:`_time_collective_calls`), a tiny all-reduce met in a loop of compute per group
size (:func:`_time_in_training`), tiny all-gathers in flight together against one after
another (:func:`_time_async_exposed`), ``pm.step`` of a one-linear model compiled data
parallel (:func:`runtime_case`) and of a ``world``-stage pipeline at two microbatch
counts (:func:`pipeline_case`). Fitting the cost model to these is
:mod:`autopar.cost.calibrate_fit`'s; :mod:`autopar.calibrate` launches the job and fits.
"""
from __future__ import annotations

import socket
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from autopar._torch_compat import all_gather_flat, reduce_scatter_flat
from autopar.cost.profiles import processor
from autopar.cost.calibrate_host import (_after_barrier, _time_async_exposed, _time_collective_calls,
                                         _time_host_ops, _time_in_training, _time_kernel, _time_special)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "scatter", "send")
"""The collectives measured, named as ``Hardware.measured`` and ``cost`` name them."""

BULK = ("all_reduce", "all_gather", "reduce_scatter")
BULK_BYTES = 16 << 20
"""The bulk collectives (:data:`BULK`) are also timed at this size (an all-gather with
parts of half of it, a bulk's worth gathered at G = 2), about a gradient
bucket's (DDP's default bucket is 25 MiB, FSDP2's per-block exchanges a few MiB to tens):
on gloo a 4 MiB call still pays latency and scheduling on shared cores (the 2-core VM's
4-rank all-reduce: 8-30 ms for 4 MiB, 49-55 ms for 16-25 MiB), so a bandwidth fitted to
4 B..4 MiB priced a 25 MiB gradient all-reduce at 3× its measured time."""

@dataclass(frozen=True)
class Settings:
    """What one calibration measures; :func:`settings` picks them for the full and quick runs."""

    message_bytes: tuple[int, ...]
    matmul_sizes: tuple[int, ...]
    copy_bytes: int
    repeats: int           # timed samples per collective point, one call each (after a warm-up call)
    compute_repeats: int   # timed samples per compute point (after a warm-up call) ...
    sample_s: float        # ... each repeating the kernel to last about this long
    rounds: int = 5        # the overhead terms are measured this many times, spread over the run


def settings(quick: "bool | str", device_type: str = "cpu") -> Settings:
    """Full: 11 message sizes 4 B..4 MiB (×4 apart) timed 41 times each, matmuls 32..2048
    timed in 11 samples of ~20 ms, the overhead terms in 5 rounds; quick: 6 sizes 4 B..4 MiB
    (×16 apart) timed 15 times, matmuls 32..1024 in 5 samples of ~5 ms, 3 rounds;
    ``"probe"`` (what ``compile`` measures on first use, :mod:`autopar.cost.first_use`):
    5 sizes 4 B..4 MiB (×32 apart, then 4 MiB) timed 5 times, matmuls 64, 256, 1024 in 3 samples of
    ~20 ms (several of the scheduler's 3 ms slices, as the full run's), a 16 MiB copy, one round. Every setting also times the bulk collectives (the
    gradient and parameter exchanges: all-reduce, all-gather, reduce-scatter) at
    :data:`BULK_BYTES`, a gradient bucket's size, so their bandwidth is read where
    training uses it rather than extrapolated from 4 MiB. GPUs get larger matmuls. Compute samples last
    several scheduler time slices, so where ranks share cores (more ranks than cores, or
    other load) the small kernels see the same sharing as the large ones."""
    gpu = device_type == "cuda"
    if quick == "probe":
        return Settings(message_bytes=tuple(4 * 32 ** k for k in range(4)) + (4 << 20,),
                        matmul_sizes=(64, 256, 1024) + ((4096,) if gpu else ()),
                        copy_bytes=16 << 20, repeats=5, compute_repeats=3, sample_s=20e-3, rounds=1)
    if quick:
        return Settings(message_bytes=tuple(4 * 16 ** k for k in range(6)),
                        matmul_sizes=(32, 64, 128, 256, 512, 1024) + ((2048, 4096) if gpu else ()),
                        copy_bytes=64 << 20, repeats=15, compute_repeats=5, sample_s=5e-3, rounds=3)
    return Settings(message_bytes=tuple(4 * 4 ** k for k in range(11)),
                    matmul_sizes=(32, 64, 128, 256, 512, 1024, 2048) + ((4096, 8192) if gpu else ()),
                    copy_bytes=256 << 20, repeats=41, compute_repeats=11, sample_s=20e-3)


def group_sizes(world_size: int) -> list[int]:
    """Every group size the planner can form on ``world_size`` ranks: the divisors ≥ 2."""
    return [g for g in range(2, world_size + 1) if world_size % g == 0]


def _device(backend: str) -> torch.device:
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _time_collectives(ops: list[Callable[[], Any]], device: torch.device, s: Settings) -> list[float]:
    """Median seconds of one call of each of ``ops`` over ``s.repeats`` samples, each
    started after a barrier of all ranks. Collectives in training are separated by
    compute, so each call is timed alone rather than back to back; the ops take turns
    (round-robin over the repeats), so a burst of other load on the machine spreads over
    all message sizes instead of corrupting one."""
    for op in ops:  # warm-up: first-call costs (connections, allocations, the sockets' buffers grown
        op()        # to the largest message: gloo over TCP sends a cold 4 MiB 2-3× slower)
        op()
    samples: list[list[float]] = [[] for _ in ops]
    for _ in range(s.repeats):
        for op, times in zip(ops, samples):
            times.append(_after_barrier(op, device))
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
    if name == "scatter":  # the root's whole buffer, a piece to each rank (D&SP-cSub's slice; a gather costs the same)
        n = max(size, n // size * size)
        out = zeros(n // size)
        pieces = [zeros(n // size) for _ in range(size)] if dist.get_rank() == group_ranks[0] else None
        return (lambda: dist.scatter(out, pieces, src=group_ranks[0], group=group)), 4 * n
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
    return processor()


def _time_matmul(n: int, gen: torch.Generator, device: torch.device, s: Settings,
                 dtype: torch.dtype = torch.float32) -> float:
    """Median seconds of one ``n×n @ n×n`` in ``dtype`` (2n³ FLOPs), allocating its output as a
    model's matmul does (and as the 1-element add that measures the launch latency does)."""
    a = torch.randn(n, n, generator=gen, device="cpu").to(device, dtype)  # the CPU generator's draws, then moved
    b = torch.randn(n, n, generator=gen, device="cpu").to(device, dtype)
    return _time_kernel(lambda: torch.mm(a, b), device, s)


def _time_copy(nbytes: int, device: torch.device, s: Settings) -> float:
    """Median seconds of ``dst.copy_(src)`` of ``nbytes`` (reads and writes 2·nbytes)."""
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return _time_kernel(lambda: dst.copy_(src), device, s)


def runtime_case(world: int):
    """The model whose training step measures the runtime's fixed cost per step: one
    small linear layer, two rows per rank, data parallel over the world."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    x, y = torch.randn(2 * world, 16, device="cpu"), torch.randn(2 * world, 16, device="cpu")  # gloo only
    return model, (x,), torch.nn.functional.mse_loss, y


PIPELINE_MICROBATCHES = (1, 2)
"""The pipeline case is timed at ``k × world`` microbatches for each k here; the extra
step time per extra microbatch, beyond the predicted, is the executor's actions'."""


def pipeline_case(world: int):
    """The model whose training steps measure the pipeline executor's cost per action:
    ``world`` small linear layers as ``world`` stages (1F1B), 2 rows per microbatch at the
    largest count of :data:`PIPELINE_MICROBATCHES`."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(16, 16) for _ in range(world)))
    rows = 2 * world * max(PIPELINE_MICROBATCHES)
    x, y = torch.randn(rows, 16, device="cpu"), torch.randn(rows, 16, device="cpu")
    return model, (x,), torch.nn.functional.mse_loss, y


def pipeline_strategy(world: int, k: int) -> dict:
    return {"pipeline": world, "microbatches": k * world, "schedule": "1f1b"}


def _compiled_cases(world: int, compile_fn: Callable) -> dict[tuple, Any]:
    """The runtime's own cases, compiled once by ``compile_fn`` (``autopar.compile``): the
    data-parallel step and the pipeline at each microbatch count (keys as in
    :func:`calibration_job`'s medians); one rank has no pipeline to time."""
    # priced with the preset, not this machine's profile, which compile may be measuring now
    model, inputs, loss, target = runtime_case(world)
    cases = {("runtime_step",): (compile_fn(model, None, example_inputs=inputs, loss_fn=loss,
                                            example_target=target, strategy={"data": world},
                                            hardware="cpu-gloo"), inputs, target)}
    if world < 2:
        return cases
    model, inputs, loss, target = pipeline_case(world)
    for k in PIPELINE_MICROBATCHES:
        pm = compile_fn(model, None, example_inputs=inputs, loss_fn=loss, example_target=target,
                        strategy=pipeline_strategy(world, k), hardware="cpu-gloo")
        cases[("pipeline_step", k)] = (pm, inputs, target)
    return cases


def _time_step(pm, inputs, target, s: Settings) -> float:
    """Median seconds of ``pm.step`` (each step after a barrier, two warm-up steps)."""
    samples = []
    for i in range(2 + s.compute_repeats):
        dist.barrier()
        start = time.perf_counter()
        pm.step(*inputs, target=target)
        if i >= 2:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _make_groups(world: int, rank: int) -> dict[int, tuple[Any, list[int]]]:
    """For every group size: this rank's group of consecutive ranks and its members (every
    group of every size made on every rank, in the same order)."""
    groups = {}
    for size in group_sizes(world):
        for first in range(0, world, size):
            ranks = list(range(first, first + size))
            made = dist.group.WORLD if size == world else dist.new_group(ranks)
            if rank in ranks:
                groups[size] = (made, ranks)
    return groups


def _group_of_one(world: int, rank: int):
    """This rank's group of itself alone (a group per rank made on every rank, in order)."""
    if world == 1:
        return dist.group.WORLD
    alone = None
    for r in range(world):
        made = dist.new_group([r])
        if r == rank:
            alone = made
    return alone


def _overhead_round(device: torch.device, s: Settings, groups: dict, cases: dict) -> dict[tuple, float]:
    """One round of the overhead terms: per kernel pass, per collective call (ours less
    the bare forward and backward), a tiny all-reduce in training per group size, the runtime's steps."""
    values = {("host_op",): _time_host_ops(device, s)}
    values[("collective_call",)], values[("collective_raw",)] = _time_collective_calls(device, s, groups[1][0])
    for size, (group, _) in groups.items():
        if size > 1:
            values[("in_training", size)] = _time_in_training(group, device, s)
    values[("async_exposed",)] = _time_async_exposed(device, s)
    for key, (pm, inputs, target) in cases.items():
        values[key] = _time_step(pm, inputs, target, s)
    return values


MATMUL_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def calibration_job(backend: str, quick: "bool | str", dtype: str = "fp32",
                    compile_fn: "Callable | None" = None) -> dict[str, Any]:
    """Run on every rank of a launched world: this rank's medians (seconds) of every
    measurement, keyed ``("matmul", n)``, ``("launch",)``, ``("copy", bytes)`` and
    ``(collective, G, m)``; the overhead terms' value in each of ``settings().rounds``
    rounds spread over the run (``"rounds"``: key → list, keys ``("host_op",)``,
    ``("collective_call",)`` — autopar's wrapper per call —, ``("collective_raw",)`` — the bare
    forward and backward it is measured against —,
    ``("in_training", G)``, ``("async_exposed",)``, and on CPUs ``("runtime_step",)``,
    ``("pipeline_step", k)``);
    plus facts about the machine. Matmuls are timed in ``dtype`` (:data:`MATMUL_DTYPES`).
    ``quick``: as :func:`settings` takes it (False, True or ``"probe"``); ``compile_fn``:
    ``autopar.compile``, which compiles the runtime's own cases on CPUs (None: not timed;
    passed in rather than imported, as ``compile`` itself measures on first use)."""
    if quick != "probe":  # a launched rank of its own (the probe runs in the user's process)
        torch.set_flush_denormal(True)
    device = _device(backend)
    world, rank = dist.get_world_size(), dist.get_rank()
    s = settings(quick, device.type)
    groups = _make_groups(world, rank)
    groups[1] = (_group_of_one(world, rank), [rank])  # the host's own costs, read without other ranks
    try:
        return _measure(device, world, rank, s, groups, dtype, compile_fn)
    finally:
        made = {id(g): g for size, (g, _) in groups.items() if g is not dist.group.WORLD}
        dist.barrier()
        for group in made.values():  # every group of every size was made on every rank
            dist.destroy_process_group(group)


def _measure(device: torch.device, world: int, rank: int, s: Settings, groups: dict, dtype: str,
             compile_fn: "Callable | None") -> dict[str, Any]:
    """:func:`calibration_job`'s report, measured on ``groups`` (size -> this rank's group
    and its members, a group of one included) with the settings ``s``."""
    cases = _compiled_cases(world, compile_fn) if device.type == "cpu" and compile_fn is not None else {}
    medians: dict[tuple, float] = {}
    rounds: dict[tuple, list[float]] = {}

    def overhead_round():
        for key, value in _overhead_round(device, s, groups, cases).items():
            rounds.setdefault(key, []).append(value)

    # the overhead rounds take turns with the other measurements, so a burst of other
    # load on the machine corrupts one round (reported as an outlier), not every one
    measure_steps: list[Callable[[], None]] = []
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(1, generator=gen, device="cpu").to(device)
    y = torch.randn(1, generator=gen, device="cpu").to(device)
    measure_steps.append(lambda: medians.__setitem__(("launch",), _time_kernel(lambda: torch.add(x, y), device, s)))
    for n in s.matmul_sizes:
        measure_steps.append(lambda n=n: medians.__setitem__(("matmul", n),
                                                                    _time_matmul(n, gen, device, s, MATMUL_DTYPES[dtype])))
    measure_steps.append(lambda: medians.__setitem__(("copy", s.copy_bytes), _time_copy(s.copy_bytes, device, s)))
    measure_steps.append(lambda: medians.__setitem__(("special",), _time_special(device, s)))
    for size, (group, members) in groups.items():  # every group of a size at once
        for name in (COLLECTIVES[:-1] if size > 1 else ()):
            def collective(name=name, size=size, group=group, members=members):
                # an all-gather's size is each rank's part: half the bulk, a bulk's worth at G = 2
                bulk = BULK_BYTES // 2 if name == "all_gather" else BULK_BYTES
                message_bytes = s.message_bytes + ((bulk,) if name in BULK else ())
                ops, sizes = zip(*(_collective_op(name, group, members, nbytes, device)
                                   for nbytes in message_bytes))
                for m, t in zip(sizes, _time_collectives(list(ops), device, s)):
                    medians[(name, size, m)] = t
            measure_steps.append(collective)
    measure_steps.append(lambda: _time_sends(world, rank, device, s, medians))
    every = max(1, len(measure_steps) // s.rounds)
    for i, step in enumerate(measure_steps):
        if i % every == 0 and len(rounds.get(("host_op",), [])) < s.rounds:
            overhead_round()
        step()
    while len(rounds.get(("host_op",), [])) < s.rounds:
        overhead_round()
    return {"medians": medians, "rounds": rounds, "host": socket.gethostname(),
            "processor": _processor_name(device), "memory_bytes": _memory_bytes(device, world),
            "device_type": device.type}


def _time_sends(world: int, rank: int, device: torch.device, s: Settings, medians: dict) -> None:
    """Point-to-point between pairs (0,1), (2,3), ...; a last odd rank only joins the barriers."""
    pair = [rank - rank % 2, rank - rank % 2 + 1]
    if pair[1] < world:
        ops, sizes = zip(*(_collective_op("send", None, pair, nbytes, device) for nbytes in s.message_bytes))
        for m, t in zip(sizes, _time_collectives(list(ops), device, s)):
            medians[("send", 2, m)] = t / 2  # an op is a round trip
    else:
        _time_collectives([lambda: None] * len(s.message_bytes), device, s)


__all__ = ["COLLECTIVES", "PIPELINE_MICROBATCHES", "Settings", "calibration_job", "group_sizes", "pipeline_case",
           "pipeline_strategy", "runtime_case", "settings"]
