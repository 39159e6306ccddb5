"""The mixed plan's dynamic programme over the regions in graph order
(``docs/mixed_plans.md``).

Its state is the layout the previous region left: replicated, or split over y (or its
rows over z) by a 3D region, which the next 3D region may take as it is
(:class:`~autopar.strategies.mixed.credits.BoundaryCredits`). It is exact for chains of
regions; regions on parallel branches of the region graph are never directly
connected, so they meet at the replicated layout and the programme prices that. A
multi-branch region is one step with two choices: D&SP (its inner regions run whole on
their branch's rank, or Megatron-split over their sub-grid) or open (its inner regions
choose as any other, :func:`open_region`).
"""
from __future__ import annotations

from autopar.planning.strategy import PlanError
from autopar.strategies.mixed.credits import BoundaryCredits
from autopar.strategies.mixed.options import Option, RegionOptions, Step, seconds_of


def solve(options: RegionOptions, credits: BoundaryCredits) -> tuple[list[tuple[Step, str]], float]:
    """The programme: per step the option chosen (``"open"`` for a multi-branch region
    whose inner regions choose for themselves), minimising the summed seconds with
    the 3D boundary credits; ties to the option first in sorted order."""
    shared: dict = {}
    flat = [(step, _priced_choices(options, step, shared)) for step in options.steps()]
    # state key: (option, region id) of the step before -> (seconds, path, state); a path
    # is a linked list (its last choices, the path before) so extending one copies nothing
    best: dict[tuple, tuple[float, tuple | None, tuple]] = {("start", None): (0.0, None, ("start", None))}
    for step, choices in flat:
        nxt: dict[tuple, tuple[float, tuple | None, tuple]] = {}
        for seconds, path, (prev, prev_region) in best.values():
            for name, option, option_s in choices:
                if name == "open":
                    cost, inner_path, last = open_region(options, credits, step, prev, prev_region)
                    state = last or ("replicate", None)
                    total, new_path = seconds + cost, ([(step, "open")] + inner_path, path)
                else:
                    # a credit only between two 3D regions (BoundaryCredits.by_group)
                    saved = credits.credit(prev, prev_region, name, step.region) if prev == name == "tensor3d" else 0
                    total = seconds + option_s - saved
                    state, new_path = (name, step.region), ([(step, name)], path)
                # only a 3D region's exit changes what the next step pays
                key = (state[0], state[1].id) if state[0] == "tensor3d" else ("other", None)
                if key not in nxt or total < nxt[key][0] * (1 - 1e-12):
                    nxt[key] = (total, new_path, state)
        best = nxt
    seconds, linked, _ = min(best.values(), key=lambda v: v[0])
    parts = []
    while linked is not None:
        parts.append(linked[0])
        linked = linked[1]
    return [choice for part in reversed(parts) for choice in part], seconds


def _priced_choices(options: RegionOptions, step: Step, shared: dict) -> list[tuple[str, Option | None, float]]:
    """A step's choices (:func:`_choices`) with each option's seconds, read once per step
    rather than once per state. Without pins a tensor region's choices are its options,
    which identical regions share (:meth:`RegionOptions.of`): found once per solve."""
    if options.pins or step.branching:
        return [(name, option, None if option is None else seconds_of(option))
                for name, option in _choices(options, step)]
    key = id(step.options)  # shared: alive while the solve runs
    if key not in shared:
        shared[key] = [(name, option, seconds_of(option)) for name, option in _choices(options, step)]
    return shared[key]


def _choices(options: RegionOptions, step: Step) -> list[tuple[str, Option | None]]:
    """A step's choices in sorted order: a tensor region's options the pins leave; a
    multi-branch region's D&SP (unless a region inside is pinned otherwise) and leaving
    it open (unless it is pinned). A D&SP pin over a region pinned to something else
    raises a PlanError naming both."""
    allowed = options.allowed(step)
    if not step.branching:
        return sorted(allowed.items())
    pinned = options.pin_of(step.region) is not None
    # Megatron pins inside D&SP's sub-grids of several ranks split there
    sub = "dsp" in step.options and step.options["dsp"].details["subgrids"] < options.tensor
    inner_pins = [(s.region.id, p) for s in step.inner
                  if (p := options.pin_of(s.region)) is not None and p.family != "replicate"
                  and not (sub and p.family == "megatron")]
    if pinned and allowed and inner_pins:
        rid, pin = inner_pins[0]
        raise PlanError(f"region {step.region.id}: pinned to D&SP, which runs {rid} whole on one rank, but "
                        f"{rid} is pinned to {pin.describe()}")
    choices = [("dsp", allowed["dsp"])] if "dsp" in allowed and not inner_pins else []
    if not (pinned and allowed):
        choices.append(("open", None))
    return sorted(choices, key=lambda c: c[0])


def open_region(options: RegionOptions, credits: BoundaryCredits, step: Step, prev: str, prev_region):
    """A multi-branch region left open: its nodes outside the inner regions on every
    rank, and its inner regions in order, each its cheapest allowed option given the
    one before (a small programme of its own). Returns its seconds, the inner regions'
    choices and the last one's ``(option, region)`` (None without inner regions)."""
    model = options.model
    total, path, last = model.seconds(step.rest(), options.hw, 1 / options.data), [], None
    p, pr = prev, prev_region
    for s in step.inner:
        allowed = options.allowed(s)
        name, option = min(sorted(allowed.items()),
                           key=lambda kv: seconds_of(kv[1]) - credits.credit(p, pr, kv[0], s.region))
        total += seconds_of(option) - credits.credit(p, pr, name, s.region)
        path.append((s, name))
        p, pr, last = name, s.region, (name, s.region)
    return total, path, last
