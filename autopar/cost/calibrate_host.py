"""The host's own costs that ``autopar calibrate`` and the first-use probe time on every
rank (:mod:`autopar.cost.calibrate_measure` runs them in its overhead rounds): per kernel
pass of an fx program, per transcendental element, per collective call through autopar's
autograd functions, a tiny all-reduce met in a loop of compute, asynchronous collectives
in flight together; and the timing primitives every measurement uses (each sample after
a barrier of all ranks, the device synchronised). ``s`` is a
:class:`~autopar.cost.calibrate_measure.Settings`."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from autopar.runtime.collectives import _CopyToRegion, _ReduceFromRegion


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _after_barrier(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one ``fn()`` started after a barrier of all ranks, the device synchronised
    before and after."""
    dist.barrier()
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _time_kernel(op: Callable[[], Any], device: torch.device, s: Any) -> float:
    """Median seconds per call of a compute kernel ``op`` over ``s.compute_repeats``
    samples, each started after a barrier of all ranks and repeating ``op`` to last about
    ``s.sample_s`` (a microsecond kernel is below the timer's resolution alone)."""
    op()  # warm-up: first-call costs (allocations, caches)
    _sync(device)
    start = time.perf_counter()
    op()
    _sync(device)
    inner = max(1, round(s.sample_s / max(time.perf_counter() - start, 1e-9)))
    def repeated():
        for _ in range(inner):
            op()
    return statistics.median(_after_barrier(repeated, device) / inner for _ in range(s.compute_repeats))




class _Chain(torch.nn.Module):
    """``n`` ops on a tiny tensor: what the rank's program pays per op besides the kernel
    (fx's generated Python, dispatch, autograd's graph and its backward). The ops take
    turns as a transformer's graph mixes them (a linear, a layer norm, a GeLU, a softmax,
    a product and a residual sum): 13.9 µs an op forward and backward in one process on
    the 2-core machine, where a chain of products alone costs 7.5 µs, which would price
    the fidelity zoo's data-parallel plans at 0.5-0.8 of their measured step
    (docs/benchmarks.md §12)."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n
        self.weight = torch.nn.Parameter(torch.full((4, 4), 0.25, device="cpu"))  # moved to the measured device
        self.norm = torch.nn.Parameter(torch.ones(4, device="cpu"))

    def forward(self, x):
        for i in range(self.n):
            x = CHAIN_OPS[i % len(CHAIN_OPS)](self, x)
        return x.sum()


CHAIN_OPS = (lambda c, x: torch.nn.functional.linear(x, c.weight),
             lambda c, x: torch.nn.functional.layer_norm(x, (4,), c.norm),
             lambda c, x: torch.nn.functional.gelu(x),
             lambda c, x: torch.nn.functional.softmax(x, -1),
             lambda c, x: x * 1.0001,
             lambda c, x: x + 1.0)
# ops in the two chains timed (whole turns of CHAIN_OPS); their difference cancels the fixed costs
HOST_CHAIN = (36, 156)


SPECIAL_ELEMENTS = 1 << 16
"""Elements of the buffer :func:`_time_special` times (256 KiB in fp32: a small model's
activation, in cache as a step's are)."""


def _time_special(device: torch.device, s: Any) -> float:
    """Seconds per element of a transcendental function beyond an add of the same shape,
    forward (``Hardware.special_element_s``): exp, tanh, the exact GELU (erf) and SiLU
    (sigmoid), each run forward and backward on :data:`SPECIAL_ELEMENTS` elements, less
    an add's forward and backward, over the two passes; the median of the four."""
    import torch.nn.functional as F
    x = torch.randn(SPECIAL_ELEMENTS, device=device, requires_grad=True)
    ones = torch.ones(SPECIAL_ELEMENTS, device=device)

    def timed(fn) -> float:
        def run():
            fn(x).backward(ones)
        return _time_kernel(run, device, s)
    base = timed(lambda t: t + t)
    extra = [timed(fn) - base for fn in (torch.exp, torch.tanh, F.gelu, F.silu)]
    return max(0.0, statistics.median(extra)) / (2 * SPECIAL_ELEMENTS)


def _time_host_ops(device: torch.device, s: Any) -> float:
    """Median seconds per op of an fx-traced chain run forward and backward (each op one
    forward and one backward kernel pass), from two chain lengths."""
    import torch.fx as fx
    x = torch.ones(2, 4, device=device, requires_grad=True)
    times = []
    for n in HOST_CHAIN:
        gm = fx.symbolic_trace(_Chain(n).to(device))
        times.append(_time_kernel(lambda: gm(x).backward(), device, s))
    return max(0.0, (times[1] - times[0]) / (HOST_CHAIN[1] - HOST_CHAIN[0]))


def _time_in_training(group, device: torch.device, s: Any) -> float:
    """Seconds a tiny all-reduce over ``group`` adds to a loop of compute, per call: how
    training meets a collective, each rank arriving from its own compute (where ranks
    share cores, the other members may be descheduled then), less the same loop's
    compute alone. Median over ``s.compute_repeats`` samples of 20 iterations."""
    a = torch.ones(96, 96, device=device)
    buf = torch.zeros(2, device=device)

    def compute():
        for _ in range(8):
            torch.mm(a, a)

    def loop(with_call: bool) -> float:
        def twenty():
            for _ in range(20):
                compute()
                if with_call:
                    dist.all_reduce(buf, group=group)
        return statistics.median(_after_barrier(twenty, device) / 20 for _ in range(s.compute_repeats))
    loop(True)  # warm-up
    return max(0.0, loop(True) - loop(False))


ASYNC_CALLS = 8  # tiny all-gathers in flight at once in the asynchronous measurement


def _time_async_exposed(device: torch.device, s: Any) -> float:
    """Of :data:`ASYNC_CALLS` tiny all-gathers over the world, the time when issued
    asynchronously together and then waited for, over the time issued one after another
    (medians of ``s.compute_repeats`` samples): how much of an asynchronous collective's
    time a step still waits for when several are in flight (AxoNN's runtime, axonn §IV)."""
    world = dist.get_world_size()
    x = torch.ones(16, device=device)
    outs = [torch.empty(world * 16, device=device) for _ in range(ASYNC_CALLS)]

    def together():
        for work in [dist.all_gather_into_tensor(o, x, async_op=True) for o in outs]:
            work.wait()

    def one_by_one():
        for o in outs:
            dist.all_gather_into_tensor(o, x)

    def timed(fn) -> float:
        return statistics.median(_after_barrier(fn, device) for _ in range(s.compute_repeats))
    together()  # warm-up
    return timed(together) / max(timed(one_by_one), 1e-9)


def _time_collective_calls(device: torch.device, s: Any, alone) -> tuple[float, float]:
    """What autopar's autograd functions around a collective cost the host per call,
    beyond the call itself: the Megatron region's forward all-reduce and its input's
    backward one through a forward and backward, over ``alone`` (this rank's group of
    one, where the functions make no call), less the same forward and backward without
    them; per call, and the seconds of that bare forward and backward. A group of one
    reads the wrapper without the wait on other ranks, which on shared cores varies by
    milliseconds from call to call and buried the wrapper's microseconds (over the world,
    ours less raw calls measured -1.1 to +2.3 ms on the 2-core VM); that wait is
    ``in_training``'s, and the call itself the collectives' table's."""
    x = torch.ones(8, device=device, requires_grad=True)

    def bare():
        (x * 1.0).sum().backward()

    def ours():
        _ReduceFromRegion.apply(_CopyToRegion.apply(x * 1.0, alone), alone).sum().backward()

    ours_s, bare_s = _time_kernel(ours, device, s), _time_kernel(bare, device, s)
    return (ours_s - bare_s) / 2, bare_s


__all__ = ["ASYNC_CALLS", "CHAIN_OPS", "HOST_CHAIN", "SPECIAL_ELEMENTS"]
