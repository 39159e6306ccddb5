"""The cost of a pipeline (megatron §2.2, §3): step time with its bubble, point-to-point
volume per microbatch, activations in flight per schedule, and the microbatch size.

Pure formulas over per-stage figures; :mod:`autopar.strategies.pipeline.planner` walks
the graph for them. With ``p`` pipeline ranks, ``v`` chunks per rank and ``m``
microbatches, rank ``r`` runs stages ``c·p + r`` (``c < v``); ``t_r`` is the time it
spends on one microbatch over all its chunks (forward + backward, its tensor-parallel
communication and its point-to-point sends included). Then (megatron §2.2.1-2.2.2)

    step = m·t + (p − 1)·t/v,       t = max_r t_r,

that is an ideal time ``m·t`` and a bubble of ``(p − 1)/(v·m)`` of it. The microbatch
size ``b = B/(d·m)`` enters through ``t``: a kernel on fewer rows runs further below the
device's peak (the saturation term of :func:`autopar.cost.model.matmul_time`) and pays
its launch more often, so ``(m + (p − 1)/v)·t(b)`` has a best ``m`` — megatron eq (1),
``(b'/b + p − 1)·t(b)``, for the interleaved schedule with ``p − 1`` replaced by
``(p − 1)/v``.

Point-to-point (megatron §4.1): each microbatch sends the carried values (the hidden
state, ``b·s·h``) forward and their gradients backward over every stage boundary, once
per chunk; with the scatter/gather optimisation each of the ``t`` tensor ranks sends
``1/t`` of it and the receivers all-gather over the tensor group.

Memory: a rank keeps the activations of every microbatch whose forward ran and whose
backward has not: all ``m`` under GPipe, at most ``p − r`` under 1F1B, and, interleaved,
the warm-up's ``2(p − r − 1) + (v − 1)·p + 1`` chunk-passes. :func:`in_flight` counts them
from the schedule itself. With recomputation a stage keeps only its inputs per microbatch
in flight, plus one microbatch's activations while it recomputes (megatron §3.5).
"""
from __future__ import annotations

import functools

from autopar.planning.timeline import simulate


def in_flight(name: str, p: int, m: int, v: int, rank: int) -> list[int]:
    """Most microbatches whose activations rank ``rank`` holds at once, per chunk (at the
    first moment the total is largest), in closed form from the schedules' shapes
    (:mod:`autopar.planning.schedules`; a test checks it against their action lists):
    the peak comes with the first forward after the warm-up, before any backward, so it
    is that many forwards: ``m`` under GPipe, ``min(p − r, m)`` under 1F1B, and warm-up + 1
    chunk-passes interleaved, whose k-th forward runs chunk ``(k mod p·v) // p``."""
    return list(_in_flight(name, p, m, v, rank))


@functools.lru_cache(maxsize=65536)
def _in_flight(name: str, p: int, m: int, v: int, rank: int) -> tuple[int, ...]:
    return tuple(_counts(name, p, m, v, rank))


def _counts(name: str, p: int, m: int, v: int, rank: int) -> list[int]:
    if name == "gpipe":
        return [m] + [0] * (v - 1)
    if name in ("zb-h1", "interleaved-zb"):  # a microbatch's activations live until its W
        per_round = m // max(1, m // p)  # every chunk but the last holds one round
        return [per_round] * (v - 1) + [min(p, m)]
    if name == "zbv":  # rank r: stages r and 2p − 1 − r
        return [min(m, 2 * p - 1 - rank), min(m, rank + 1)]
    if name == "1f1b" or v == 1:
        return [min(p - rank, m)] + [0] * (v - 1)
    total = m * v
    warmup = total if m == p else min((p - rank - 1) * 2 + (v - 1) * p, total)
    done = min(warmup + 1, total)
    rounds, rest = divmod(done, p * v)
    return [rounds * p + min(max(rest - c * p, 0), p) for c in range(v)]


def step_time(rank_seconds: list[float], p: int, m: int, v: int) -> tuple[float, float]:
    """``(step seconds, bubble seconds)`` from each pipeline rank's seconds per microbatch."""
    t = max(rank_seconds)
    bubble = (p - 1) * t / v
    return m * t + bubble, bubble


_EXACT_ACTIONS = 4096  # simulate the whole step below this many actions; else extrapolate (split_bubble)


def split_bubble(name: str, p: int, m: int, v: int, forward: float, input_grad: float, weight_grad: float) -> float:
    """Bubble seconds of a zero-bubble schedule whose chunk passes take ``forward``,
    ``input_grad`` and ``weight_grad`` seconds, read off the simulated timeline
    (:func:`autopar.planning.timeline.simulate`): the makespan less one rank's work.

    Qi et al.'s closed form assumes equal passes (ZB-H1: ``(p − 1)(F + I − W)``); with
    unequal ones the weight passes fill the bubbles only up to their length: ZB-H1 and
    the interleaved zero-bubble schedule take ``(p − 1)·max(F, I, F + I − W)`` per chunk
    once ``m ≥ p`` (a test checks it against the simulation); with fewer microbatches
    than ranks the timeline is simulated up to 8 ranks and bounded by ``v(p − 1)(F + I)``
    beyond (the weight passes then mostly wait at the end; within a factor 2 of the
    simulation, above it). ZB-V has no such simple
    form (it grows by about ``(p − 2)·(W − F)`` where ``W > F``), so its timeline, and
    any with fewer microbatches than ranks, is simulated, memoised on the passes'
    ratios (to 1/8 of the forward); with ``m ≥ 2p`` (or past a few thousand actions) at
    2 and 3 ranks with ``2p`` microbatches, where the bubble no longer depends on
    ``m``, and extrapolated along ``p`` (it is affine in ``p`` from 2 ranks on: checked
    for every ratio from 1/4 to 4 in steps of 1/8 at 8 and 13 ranks, and by a test).
    ``"auto"`` weighs ZB-V only with ``m ≥ 2p``, the microbatches its order is made for."""
    if forward <= 0:
        return 0.0
    if name != "zbv" and m >= p:  # ZB-H1 and its interleaved form: the weight passes fill up to W
        return (p - 1) * max(forward, input_grad, forward + input_grad - weight_grad)
    ratio_i = round(input_grad / forward * 8) / 8
    ratio_w = round(weight_grad / forward * 8) / 8
    if m < 2 * p and p * m * v * 3 <= _EXACT_ACTIONS and (p <= 8 or name == "zbv"):
        return _bubble_units(name, p, m, v, ratio_i, ratio_w) * forward
    if name != "zbv":  # fewer microbatches than ranks on many ranks: a bound (W waits at the end)
        return v * (p - 1) * (forward + input_grad)
    two, three = (_bubble_units(name, k, 2 * k, v, ratio_i, ratio_w) for k in (2, 3))
    return max(two + (three - two) * (p - 2), 0.0) * forward


@functools.lru_cache(maxsize=4096)
def _bubble_units(name: str, p: int, m: int, v: int, ratio_i: float, ratio_w: float) -> float:
    timeline = simulate(name, p, m, v, forward=1.0, backward=ratio_i + ratio_w, input_grad=ratio_i,
                        weight_grad=ratio_w)
    return timeline.makespan - timeline.busy


def activation_memory(name: str, p: int, m: int, v: int, rank: int, chunk_bytes: list[float],
                      chunk_input_bytes: list[float], recompute: bool = False) -> float:
    """Bytes of activations rank ``rank`` holds at its peak: per chunk, one microbatch's
    saved activations (``chunk_bytes``) times the microbatches in flight; under
    recomputation only the chunk's inputs (``chunk_input_bytes``) per microbatch in
    flight plus the largest chunk's activations, rebuilt for one backward at a time."""
    counts = _in_flight(name, p, m, v, rank)
    if recompute:
        return sum(n * b for n, b in zip(counts, chunk_input_bytes)) + max(chunk_bytes, default=0.0)
    return sum(n * b for n, b in zip(counts, chunk_bytes))


def accepts(name: str, p: int, m: int, v: int) -> bool:
    """Whether schedule ``name`` runs ``m`` microbatches on ``p`` ranks with ``v`` chunks:
    the interleaved 1F1B needs a multiple of ``p`` (megatron §2.2.2), the interleaved
    zero-bubble schedule a multiple of its rounds ``m // p`` (torch.pipelining's rule)."""
    if name == "interleaved" and v > 1:
        return m % p == 0
    if name == "interleaved-zb":
        return m % max(1, m // p) == 0
    return True


def microbatch_choices(local_batch: int, p: int, v: int, name: str) -> list[int]:
    """The microbatch counts a schedule accepts for a data rank's ``local_batch`` rows:
    divisors of it that :func:`accepts` takes."""
    return [m for m in range(1, local_batch + 1) if local_batch % m == 0 and accepts(name, p, m, v)]
