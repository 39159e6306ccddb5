"""Simulating a pipeline schedule: when each rank runs each pass, the idle share, and a
text timeline in the style of megatron Figure 4.

Rank ``r``'s chunk ``c`` is stage ``c·p + r`` (``r`` and ``2p − 1 − r`` under ZB-V,
:func:`autopar.planning.schedules.stage_of`). A forward of a microbatch on a stage waits
for its forward on the stage before; a backward (``B``, or the input pass ``I`` of a
zero-bubble schedule) waits for the backward on the stage after (the last stage's for
its own forward); a weight pass ``W`` for its own stage's ``I``. Every rank runs its
actions in the schedule's order, as soon as both its previous action and the dependency
are done; a schedule whose orders wait on each other in a cycle is reported as a
deadlock, naming the ranks and actions stuck.
"""
from __future__ import annotations

from dataclasses import dataclass

from autopar.planning.schedules import Action, schedule, stage_of


class DeadlockError(RuntimeError):
    """The per-rank orders of a schedule wait on each other."""


@dataclass
class Timeline:
    """Start and end of every action on every rank (time units of the forward of one chunk)."""

    p: int
    m: int
    v: int
    name: str
    runs: list[list[tuple[Action, float, float]]]  # per rank: (action, start, end)

    @property
    def makespan(self) -> float:
        return max(end for rank in self.runs for _, _, end in rank)

    @property
    def busy(self) -> float:
        """Time one rank computes (the same on every rank)."""
        return sum(end - start for _, start, end in self.runs[0])

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the ideal time, as megatron §2.2 defines it: bubble / ideal."""
        return (self.makespan - self.busy) / self.busy

    def text(self, unit: int = 4) -> str:
        """One row per rank; each time unit a cell: ``F3`` forward of microbatch 3 (1-based,
        as in the paper; ``F3'`` on the second chunk, ``F3"`` the third...), ``B3``
        backward, ``I3`` and ``W3`` its input and weight passes, ``.`` idle."""
        width = int(round(self.makespan))
        lines = []
        for r, run in enumerate(self.runs):
            cells = ["." for _ in range(width)]
            for action, start, end in run:
                label = f"{action.kind}{action.microbatch + 1}" + "'" * action.chunk
                for t in range(int(round(start)), int(round(end))):
                    cells[t] = label
            lines.append(f"rank {r} |" + "".join(c.center(unit) for c in cells) + "|")
        ideal = self.busy
        lines.append(f"{self.name}: p={self.p} m={self.m}" + (f" v={self.v}" if self.v > 1 else "")
                     + f"; step {self.makespan:g} units, compute {ideal:g} per rank, bubble "
                     f"{self.bubble_fraction:.3f} of the ideal time")
        return "\n".join(lines)

    def svg(self, unit: float = 28.0, row: float = 22.0) -> str:
        """The same timeline as an SVG drawing (no dependency): forwards blue, backwards
        green, weight passes brown, a chunk's passes lighter, idle time left blank."""
        width = self.makespan * unit + 70
        height = self.p * row + 30
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
                 f'font-family="monospace" font-size="10">']
        for r, run in enumerate(self.runs):
            y = 5 + r * row
            parts.append(f'<text x="2" y="{y + row * 0.65:.1f}">rank {r}</text>')
            for action, start, end in run:
                shade = {"F": ("#4a7bd0", "#8fb0e8"), "W": ("#b07a2a", "#dcb77a")}.get(action.kind,
                                                                                      ("#3f9b5a", "#8ccc9c"))
                colour = shade[min(action.chunk, 1)]
                x = 60 + start * unit
                parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{(end - start) * unit:.1f}" '
                             f'height="{row - 4:.1f}" fill="{colour}" stroke="white"/>')
                label = f"{action.kind}{action.microbatch + 1}" + "'" * action.chunk
                parts.append(f'<text x="{x + 3:.1f}" y="{y + row * 0.6:.1f}" fill="white">{label}</text>')
        parts.append(f'<text x="2" y="{height - 6:.0f}">{self.name}: p={self.p} m={self.m} v={self.v}, bubble '
                     f'{self.bubble_fraction:.3f} of the ideal time</text>')
        parts.append("</svg>")
        return "\n".join(parts) + "\n"


def simulate(name: str, p: int, m: int, v: int = 1, *, forward: float = 1.0, backward: float = 2.0,
             input_grad: float | None = None, weight_grad: float | None = None,
             orders: list[list[Action]] | None = None) -> Timeline:
    """Run schedule ``name`` on ``p`` ranks with ``m`` microbatches (``v`` chunks per rank)
    where one chunk's forward takes ``forward``, its whole backward ``backward``, and
    split, its input pass ``input_grad`` and weight pass ``weight_grad`` (by default
    half the backward each); ``orders`` replaces the named schedule's per-rank orders (to
    check a hand-made one)."""
    if orders is None:
        orders = [schedule(name, p, m, r, v) for r in range(p)]
    seconds = {"F": forward, "B": backward, "I": backward / 2 if input_grad is None else input_grad,
               "W": backward / 2 if weight_grad is None else weight_grad}
    stages = p * v
    done: dict[tuple[str, int, int], float] = {}  # (kind, microbatch, stage) -> end; B and I both as "B"
    runs: list[list[tuple[Action, float, float]]] = [[] for _ in range(p)]
    clock = [0.0] * p
    position = [0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            while position[r] < len(orders[r]):
                action = orders[r][position[r]]
                stage = stage_of(name, p, r, action.chunk)
                if action.kind == "F":
                    need = ("F", action.microbatch, stage - 1) if stage > 0 else None
                elif action.kind == "W":
                    need = ("B", action.microbatch, stage)
                else:
                    need = ("B", action.microbatch, stage + 1) if stage < stages - 1 else ("F", action.microbatch,
                                                                                           stage)
                if need is not None and need not in done:
                    break
                start = max(clock[r], done[need] if need is not None else 0.0)
                end = start + seconds[action.kind]
                done[("F" if action.kind == "F" else "B" if action.kind in "BI" else "W", action.microbatch,
                      stage)] = end
                runs[r].append((action, start, end))
                clock[r] = end
                position[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = ", ".join(f"rank {r} at {orders[r][position[r]]}" for r in range(p)
                              if position[r] < len(orders[r]))
            raise DeadlockError(f"pipeline schedule {name} (p={p}, m={m}, v={v}) deadlocks: {stuck}")
    return Timeline(p, m, v, name, runs)
