"""Pipeline schedules: the order of forward and backward passes each pipeline rank runs
(megatron §2.2). Pure Python: the runtime drives a schedule, the planner simulates it
(:mod:`autopar.planning.timeline`), and tests compare it with the paper's Figure 4.

A schedule for ``p`` ranks and ``m`` microbatches is, per rank, a list of
:class:`Action`: ``F`` or ``B`` (``I`` and ``W`` split) of one microbatch on one model
chunk (``chunk`` is 0 without interleaving; with ``v`` chunks per rank, rank ``r``'s chunk
``c`` is pipeline stage ``c·p + r``, Megatron's assignment of layers 1-4 and 9-12 to
device 1; under ZB-V stages ``r`` and ``2p − 1 − r``, :func:`stage_of`).

* :func:`gpipe` (§2.2.1, GPipe): every forward, then every backward, first in first out.
* :func:`one_f_one_b` (§2.2.1, PipeDream-Flush): ``p − r − 1`` warm-up forwards on rank
  ``r``, then one forward and one backward alternately, then the remaining backwards;
  at most ``p − r`` microbatches in flight instead of ``m``.
* :func:`interleaved` (§2.2.2): 1F1B over ``v`` chunks per rank; forwards run the chunks
  in groups of ``p`` microbatches, backwards the chunks in reverse; warm-up
  ``2(p − r − 1) + (v − 1)·p``; needs ``m`` to be a multiple of ``p``.

Bubble fractions (§2.2): ``(p − 1)/m`` for the first two, ``(p − 1)/(v·m)`` interleaved.

Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) split
each backward into ``I``, the gradient of the stage's input (which the stage before
waits for), and ``W``, the gradient of its weights (which waits for nobody and fills
the bubbles). The orders follow ``torch.distributed.pipelining``'s schedule
definitions, action for action (a test compares them):

* :func:`zero_bubble` with ``v = 1`` is ZB-H1 (the paper's §3.1, Figure 3; torch's
  ``ScheduleInterleavedZeroBubble`` on one stage per rank): 1F1B's warm-up, then ``F I``
  with rank ``r``'s first ``r`` weight passes deferred, so every rank keeps at most
  ``p`` microbatches and the tail of the pipeline is filled with ``W``; bubble
  ``(p − 1)(F + I − W)`` instead of 1F1B's ``(p − 1)(F + I + W)``.
* :func:`zero_bubble` with ``v > 1`` is the interleaved zero-bubble schedule (torch's
  ``ScheduleInterleavedZeroBubble``, the paper's ZB1P over ``v`` chunks): rounds of
  ``m / ⌊m/p⌋`` microbatches per chunk, warm-up ``(v − 1)·round + p − 1 − r``.
* :func:`zbv` is ZB-V (the paper's §6; torch's ``ScheduleZBVZeroBubble``): two chunks
  per rank in a V, rank ``r`` holding stages ``r`` and ``2p − 1 − r``, so the first and
  the last stage share rank 0 and the turn at stage ``p − 1 → p`` needs no transfer.

:func:`stage_of` and :func:`rank_of` map a rank's chunk to its stage and back for every
schedule (the V layout for ``zbv``, Megatron's loop ``c·p + r`` for the others).
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "interleaved-zb", "zbv")
SPLIT_BACKWARD = frozenset({"zb-h1", "interleaved-zb", "zbv"})  # backward as I then W
V_SHAPED = frozenset({"zbv"})                                   # rank r holds stages r and 2p − 1 − r


class ScheduleError(ValueError):
    """A schedule the sizes do not allow; the message names the argument."""


@dataclass(frozen=True, order=True)
class Action:
    """One pass of one microbatch through one of a rank's model chunks."""

    kind: str        # "F" forward, "B" whole backward, "I" input gradient, "W" weight gradient
    microbatch: int  # 0-based
    chunk: int = 0   # the rank's model chunk (0 without interleaving)

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def _check(p: int, m: int, rank: int, v: int = 1) -> None:
    if p < 1 or m < 1 or v < 1:
        raise ScheduleError(f"pipeline: stages p={p}, microbatches m={m} and chunks v={v} must be at least 1")
    if not 0 <= rank < p:
        raise ScheduleError(f"pipeline: rank {rank} is outside a pipeline of {p} ranks")


def gpipe(p: int, m: int, rank: int) -> list[Action]:
    """All forwards, then all backwards (first in, first out)."""
    _check(p, m, rank)
    return [Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]


def one_f_one_b(p: int, m: int, rank: int) -> list[Action]:
    """PipeDream-Flush: warm-up, steady one-forward-one-backward, cool-down."""
    _check(p, m, rank)
    warmup = min(p - rank - 1, m)
    actions = [Action("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        actions += [Action("F", warmup + i), Action("B", i)]
    actions += [Action("B", i) for i in range(m - warmup, m)]
    return actions


def interleaved(p: int, m: int, v: int, rank: int) -> list[Action]:
    """Megatron's interleaved 1F1B with ``v`` model chunks per rank (§2.2.2)."""
    _check(p, m, rank, v)
    if v > 1 and m % p:
        raise ScheduleError(f"pipeline: the interleaved schedule needs the number of microbatches to be a multiple "
                            f"of the pipeline ranks (Narayanan et al. 2021, §2.2.2); m={m} is not a multiple of p={p}. Use "
                            f"m={(m // p + 1) * p}, or the 1F1B schedule")
    total = m * v

    def action(kind: str, k: int) -> Action:
        # the k-th forward (backward) of this rank: groups of p microbatches per chunk
        group, position = divmod(k, p * v)
        chunk = position // p
        return Action(kind, group * p + k % p, chunk if kind == "F" else v - 1 - chunk)

    if v == 1:
        return one_f_one_b(p, m, rank)
    # Megatron-LM runs every forward first when m = p (its warm-up would cover them all)
    warmup = total if m == p else min((p - rank - 1) * 2 + (v - 1) * p, total)
    actions = [action("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        actions += [action("F", warmup + k), action("B", k)]
    actions += [action("B", k) for k in range(total - warmup, total)]
    return actions


def zero_bubble(p: int, m: int, v: int, rank: int) -> list[Action]:
    """ZB-H1 (``v = 1``) and the interleaved zero-bubble schedule (``v > 1``): 1F1B's
    shape with every backward split into ``I`` then ``W``, rank ``r``'s first ``r``
    weight passes deferred to the cool-down (Qi et al. 2024, §3.1; the order of
    ``torch.distributed.pipelining.ScheduleInterleavedZeroBubble``)."""
    _check(p, m, rank, v)
    rounds = max(1, m // p)
    if v > 1 and m % rounds:
        raise ScheduleError(f"pipeline: the zero-bubble schedules run the microbatches in {rounds} rounds of "
                            f"m / {rounds}; m={m} is not a multiple of {rounds} (use a multiple of p={p}, or a "
                            f"count below 2p)")
    per_round = m // rounds
    total = m * v
    warmup = min((v - 1) * per_round + p - 1 - rank, total)
    count = {kind: [0] * v for kind in "FIW"}

    def action(kind: str, chunk: int) -> Action:
        count[kind][chunk] += 1
        return Action(kind, count[kind][chunk] - 1, chunk)

    def backward_chunk(k: int) -> int:
        return v - 1 - ((k - warmup) // per_round) % v

    actions = [action("F", (k // per_round) % v) for k in range(warmup)]
    backwards: list[int] = []
    for k in range(warmup, total + warmup):
        if k < total:
            actions.append(action("F", (k // per_round) % v))
        actions.append(action("I", backward_chunk(k)))
        backwards.append(k)
        if k - warmup >= rank:  # the first `rank` weight passes wait for the cool-down
            actions.append(action("W", backward_chunk(backwards[len(backwards) - 1 - rank])))
    done = len(backwards) - min(rank, len(backwards))
    actions += [action("W", backward_chunk(k)) for k in backwards[done:]]
    return actions


def zbv(p: int, m: int, rank: int) -> list[Action]:
    """ZB-V (Qi et al. 2024, §6; the order of
    ``torch.distributed.pipelining.ScheduleZBVZeroBubble``): chunk 0 is stage ``r``,
    chunk 1 stage ``2p − 1 − r``. Warm-up ``2(p − r) − 1`` forwards of chunk 0, then
    alternating chunks, then ``F I W`` of both chunks in turn, a cool-down of input
    passes with the weight passes filling behind them."""
    _check(p, m, rank, 2)
    n = max(2 * p - 1, m)  # the order is made for at least 2p − 1 microbatches; the extra ones are dropped
    out: list[Action] = []
    f, i, w = [0, 0], [0, 0], [0, 0]

    def add(kind: str, chunk: int, counter: list[int]) -> None:
        out.append(Action(kind, counter[chunk], chunk))
        counter[chunk] += 1

    for _ in range(2 * (p - rank) - 1):
        add("F", 0, f)
    for _ in range(rank):
        add("F", 1, f)
        add("F", 0, f)
    for _ in range(p - rank):
        add("F", 1, f)
        add("I", 1, i)
        add("W", 1, w)
    while f[1] < f[0] or f[0] < n:
        if f[0] < n:
            add("F", 0, f)
        add("I", 0, i)
        add("W", 0, w)
        add("F", 1, f)
        add("I", 1, i)
        add("W", 1, w)
    for _ in range(rank):
        add("I", 0, i)
        add("I", 1, i)
    for _ in range(p - rank):
        add("I", 0, i)
        add("W", 0, w)
    while w[1] < i[1]:
        add("W", 1, w)
    while w[0] < i[0]:
        add("W", 0, w)
    return [a for a in out if a.microbatch < m]


def check_chunks(name: str, v: int) -> None:
    """The chunks per rank a schedule runs: 2 for ZB-V, more than 1 for the interleaved
    ones, 1 for the others."""
    if name == "zbv" and v != 2:
        raise ScheduleError(f"pipeline: the zbv schedule runs exactly 2 chunks per rank (a V), not chunks={v}")
    if name in ("interleaved", "interleaved-zb") and v < 2:
        raise ScheduleError(f"pipeline: the {name} schedule needs chunks of at least 2; with one chunk per rank use "
                            f"{'1f1b' if name == 'interleaved' else 'zb-h1'}")
    if name in ("gpipe", "1f1b", "zb-h1") and v != 1:
        raise ScheduleError(f"pipeline: chunks={v} needs an interleaved schedule (interleaved, interleaved-zb) or "
                            f"zbv (2 chunks), not {name!r}")


def schedule(name: str, p: int, m: int, rank: int, v: int = 1) -> list[Action]:
    """The named schedule (one of :data:`SCHEDULES`) on ``rank``."""
    if name == "gpipe":
        return gpipe(p, m, rank)
    if name == "1f1b":
        return one_f_one_b(p, m, rank)
    if name == "interleaved":
        return interleaved(p, m, v, rank)
    if name in ("zb-h1", "interleaved-zb"):
        return zero_bubble(p, m, v, rank)
    if name == "zbv":
        return zbv(p, m, rank)
    raise ScheduleError(f"pipeline: unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")


def stage_of(name: str, p: int, rank: int, chunk: int) -> int:
    """The pipeline stage of ``rank``'s ``chunk`` under schedule ``name``."""
    if name in V_SHAPED:
        return rank if chunk == 0 else 2 * p - 1 - rank
    return chunk * p + rank


def rank_of(name: str, p: int, stage: int) -> int:
    """The pipeline rank that runs ``stage`` under schedule ``name``."""
    if name in V_SHAPED and stage >= p:
        return 2 * p - 1 - stage
    return stage % p


def stages_of(name: str, p: int, v: int, rank: int) -> list[int]:
    """``rank``'s stages, chunk by chunk."""
    return [stage_of(name, p, rank, c) for c in range(v)]


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """The idle share of a step, ``(p − 1)/(v·m)`` (megatron §2.2)."""
    return (p - 1) / (v * m)
