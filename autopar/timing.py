"""How long the way to the first training step took, phase by phase: :class:`Timings`
(``pm.timings``), filled by ``compile`` and by every program a rank builds.

A phase is timed where its work is done (``capture``, ``analysis``, the rewrite, the
recompilation of a rank program), into whatever :func:`recording` is active, under that
recording's prefix: ``compile.capture`` inside ``compile``, ``program.capture`` while a
rank builds a program. Phases nest; each keeps its own time only (a rank's rewrite runs
the analysis pipeline first: that time is ``program.analysis``, not
``program.rewrite``), so the phases of one call add up to its wall time. Outside a
recording a phase costs one context-variable read.

    >>> t = Timings()
    >>> with recording(t, "compile."), phase("planning"):
    ...     plan = ...
    >>> sorted(t)
    ['compile.planning']
"""
from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Iterator

from autopar.heap import held

COMPILE_PHASES = ("checks", "capture", "analysis", "planning", "groups", "module")
"""``compile``'s phases, in order (``checks``: the ranks' agreement on the call, the
hardware and the plan, and what lies between the other phases)."""

PROGRAM_PHASES = ("capture", "analysis", "rewrite", "recompile")
"""A rank program's phases: the capture at the rank's batch, the analysis of it, the
plan's rewrite passes (with fusion; and the rest of the build, a pipeline's cut into
stages), and the executable module built from it."""


class Timings(dict):
    """Seconds by phase, summed over every time the phase ran: ``compile.<phase>``
    (:data:`COMPILE_PHASES`), ``program.<phase>`` (:data:`PROGRAM_PHASES`, over every
    program the rank built: one per input signature and mode, a pipeline rank's one per
    stage), and ``first_step.run`` (the first ``step`` without the building of its
    programs)."""

    def add(self, name: str, seconds: float) -> None:
        self[name] = self.get(name, 0.0) + seconds

    def total(self, prefix: str) -> float:
        """The seconds of every phase named ``prefix...``."""
        return sum(s for name, s in self.items() if name.startswith(prefix))

    def summary(self, prefix: str, since: "Timings | None" = None) -> str:
        """``capture 1.20 s, analysis 0.10 s, ...`` for the phases under ``prefix``
        (``since``: only what was added after that copy)."""
        parts = []
        for name, seconds in self.items():
            if name.startswith(prefix):
                seconds -= (since or {}).get(name, 0.0)
                parts.append(f"{name[len(prefix):]} {seconds:.2f} s")
        return ", ".join(parts)


_RECORDING: contextvars.ContextVar = contextvars.ContextVar("autopar_timings", default=None)


class _Recording:
    __slots__ = ("timings", "prefix", "inner")

    def __init__(self, timings: Timings, prefix: str, inner: list[float]):
        self.timings, self.prefix, self.inner = timings, prefix, inner


@contextlib.contextmanager
def recording(timings: Timings, prefix: str) -> Iterator[Timings]:
    """Time the phases run inside into ``timings``, each as ``prefix + name``; inside
    another recording, its phases still leave out the time of these."""
    outer = _RECORDING.get()
    token = _RECORDING.set(_Recording(timings, prefix, outer.inner if outer is not None else []))
    try:
        yield timings
    finally:
        _RECORDING.reset(token)


@contextlib.contextmanager
def phase(name: str, hold: bool = True) -> Iterator[None]:
    """Time the block as phase ``name`` of the active recording (none: nothing), less
    the time of the phases inside it; with ``hold`` (compile-time phases), the objects
    that exist when it starts are held out of the garbage collector's walks while it
    runs (:func:`autopar.heap.held`)."""
    with held() if hold else contextlib.nullcontext():
        yield from _timed(name)


def _timed(name: str) -> Iterator[None]:
    active = _RECORDING.get()
    if active is None:
        yield
        return
    stack = active.inner
    stack.append(0.0)
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        inner = stack.pop()
        active.timings.add(active.prefix + name, elapsed - inner)
        if stack:
            stack[-1] += elapsed


__all__ = ["COMPILE_PHASES", "PROGRAM_PHASES", "Timings", "phase", "recording"]
