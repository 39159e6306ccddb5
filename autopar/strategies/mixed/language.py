"""Mixed plans' declaration to the generic layers (:mod:`autopar.planning.declared`): the
key ``regions`` (region pins, with ``data`` and ``tensor``); each region's family over
the tensor group."""
from __future__ import annotations

from autopar.planning.declared import DECLARED, Language, first
from autopar.planning.strategy import PlanError, Strategy, parse_pins


class MixedLanguage(Language):
    name = "mixed"
    kind = "mixed"
    built_in = True
    precedence = 60
    keys = ("regions",)
    trigger = frozenset({"regions"})
    absent = "no multi-branch region as wide as a tensor group and no 3D grid of one, or a strategy was forced"

    def parse(self, strategy: dict) -> Strategy:
        """``{"data": d, "tensor": t, "regions": {PATTERN: SPEC}}``, or ``{"regions": ...}``
        alone (the planner picks the mesh): a mixed plan with those regions pinned."""
        rest = set(strategy) - {"regions", "data", "tensor"}
        why = first(d.stray({k: strategy[k] for k in rest}) for d in DECLARED.values())
        if why is not None:
            raise PlanError(f"{why} beside the region pins")
        if rest:
            raise PlanError(f"strategy: region pins combine with 'data', 'tensor' and a pipeline's keys in this "
                            f"version (the other families' degrees go into the pins), not {sorted(rest)}")
        parsed, grid = parse_pins(strategy["regions"])
        data, tensor = strategy.get("data"), strategy.get("tensor")
        return Strategy(None if data is None else int(data), None if tensor is None else int(tensor),
                        grid=grid, mixed=True, regions=parsed)

    def is_kind(self, strategy) -> bool:
        return strategy.mixed

    def owns(self, candidate) -> bool:
        return candidate.form.startswith("mixed")


LANGUAGE = MixedLanguage()
