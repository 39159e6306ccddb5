"""Pipeline schedules: the order of forward and backward passes each pipeline rank runs
(megatron §2.2). Pure Python: the runtime drives a schedule, the planner simulates it
(:mod:`autopar.planning.timeline`), and tests compare it with the paper's Figure 4.

A schedule for ``p`` ranks and ``m`` microbatches is, per rank, a list of
:class:`Action`: ``F`` or ``B`` of one microbatch on one model chunk (``chunk`` is 0
without interleaving; with ``v`` chunks per rank, rank ``r``'s chunk ``c`` is pipeline
stage ``c·p + r``, Megatron's assignment of layers 1-4 and 9-12 to device 1).

* :func:`gpipe` (§2.2.1, GPipe): every forward, then every backward, first in first out.
* :func:`one_f_one_b` (§2.2.1, PipeDream-Flush): ``p − r − 1`` warm-up forwards on rank
  ``r``, then one forward and one backward alternately, then the remaining backwards;
  at most ``p − r`` microbatches in flight instead of ``m``.
* :func:`interleaved` (§2.2.2): 1F1B over ``v`` chunks per rank; forwards run the chunks
  in groups of ``p`` microbatches, backwards the chunks in reverse; warm-up
  ``2(p − r − 1) + (v − 1)·p``; needs ``m`` to be a multiple of ``p``.

Bubble fractions (§2.2): ``(p − 1)/m`` for the first two, ``(p − 1)/(v·m)`` interleaved.
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved")


class ScheduleError(ValueError):
    """A schedule the sizes do not allow; the message names the argument."""


@dataclass(frozen=True, order=True)
class Action:
    """One pass of one microbatch through one of a rank's model chunks."""

    kind: str        # "F" (forward) or "B" (backward)
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
                            f"of the pipeline ranks (megatron §2.2.2); m={m} is not a multiple of p={p}. Use "
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


def schedule(name: str, p: int, m: int, rank: int, v: int = 1) -> list[Action]:
    """The named schedule (``"gpipe"``, ``"1f1b"`` or ``"interleaved"``) on ``rank``."""
    if name == "gpipe":
        return gpipe(p, m, rank)
    if name == "1f1b":
        return one_f_one_b(p, m, rank)
    if name == "interleaved":
        return interleaved(p, m, v, rank)
    raise ScheduleError(f"pipeline: unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """The idle share of a step, ``(p − 1)/(v·m)`` (megatron §2.2)."""
    return (p - 1) / (v * m)
