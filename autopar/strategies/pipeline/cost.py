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

def in_flight(name: str, p: int, m: int, v: int, rank: int) -> list[int]:
    """Most microbatches whose activations rank ``rank`` holds at once, per chunk (at the
    first moment the total is largest), in closed form from the schedules' shapes
    (:mod:`autopar.planning.schedules`; a test checks it against their action lists):
    the peak comes with the first forward after the warm-up, before any backward, so it
    is that many forwards: ``m`` under GPipe, ``min(p − r, m)`` under 1F1B, and warm-up + 1
    chunk-passes interleaved, whose k-th forward runs chunk ``(k mod p·v) // p``."""
    if name == "gpipe":
        return [m] + [0] * (v - 1)
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


def activation_memory(name: str, p: int, m: int, v: int, rank: int, chunk_bytes: list[float],
                      chunk_input_bytes: list[float], recompute: bool = False) -> float:
    """Bytes of activations rank ``rank`` holds at its peak: per chunk, one microbatch's
    saved activations (``chunk_bytes``) times the microbatches in flight; under
    recomputation only the chunk's inputs (``chunk_input_bytes``) per microbatch in
    flight plus the largest chunk's activations, rebuilt for one backward at a time."""
    counts = in_flight(name, p, m, v, rank)
    if recompute:
        return sum(n * b for n, b in zip(counts, chunk_input_bytes)) + max(chunk_bytes, default=0.0)
    return sum(n * b for n, b in zip(counts, chunk_bytes))


def microbatch_choices(local_batch: int, p: int, v: int, name: str) -> list[int]:
    """The microbatch counts a schedule accepts for a data rank's ``local_batch`` rows:
    divisors of it, multiples of ``p`` for the interleaved schedule (megatron §2.2.2)."""
    out = [m for m in range(1, local_batch + 1) if local_batch % m == 0]
    if name == "interleaved" and v > 1:
        out = [m for m in out if m % p == 0]
    return out


def spread_over_ends(model, hw, parts: dict[int, list[str]], compute: float, comm: float, act: float
                     ) -> list[tuple[int, float, float, float]]:
    """A region both ends of a pipeline compute (a tied vocabulary: ``parts``, its nodes
    per stage): ``(stage, compute, communication, activation bytes)`` per end, the
    compute and the activations by the share of the region's work on that end, the
    communication shared equally by its ends. The Megatron and the mixed stage figures
    both price a split vocabulary so (``model``: the planner's ``ModelFacts``)."""
    key = (tuple((s, tuple(nodes)) for s, nodes in sorted(parts.items())), hw)
    memo = model.memo("pipeline.end_shares")
    if key not in memo:
        work = {s: model.seconds(nodes, hw, 1.0) for s, nodes in parts.items()}
        total = sum(work.values()) or 1.0
        memo[key] = {s: w / total for s, w in work.items()}
    shares = memo[key]
    return [(s, compute * shares[s], comm / len(parts), act * shares[s]) for s in sorted(parts)]
