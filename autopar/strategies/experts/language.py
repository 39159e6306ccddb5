"""Expert parallelism's declaration to the generic layers (:mod:`autopar.planning.declared`):
the key ``experts`` and the pins ``{"experts": E}`` (or ``"replicate"``) of MoE regions,
taken off the strategy it rides on (data × tensor or a pipeline); the expert groups' axes."""
from __future__ import annotations

from autopar.grid import MeshAxis
from autopar.planning.declared import Language
from autopar.planning.strategy import PlanError


def _pins(rest: dict) -> list[tuple[str, int]]:
    """The expert pins of ``rest["regions"]``, taken out of it (the key dropped when none is left)."""
    regions, pins = rest.get("regions"), []
    if not isinstance(regions, dict):
        return pins
    others = {}
    for pattern, spec in regions.items():
        if isinstance(spec, dict) and set(spec) == {"experts"}:
            e = spec["experts"]
            if isinstance(e, bool) or not isinstance(e, int) or e < 1:
                raise PlanError(f"strategy['regions'][{pattern!r}]: experts={e!r}; give the expert degree "
                                f"(an integer at least 1)")
            pins.append((pattern, e))
        elif pattern == "kind:experts" or (isinstance(pattern, str) and pattern.startswith("experts:")):
            if spec != "replicate":
                raise PlanError(f"strategy['regions'][{pattern!r}]: cannot read {spec!r}; an MoE region "
                                f"is pinned to {{'experts': E}} or 'replicate'")
            pins.append((pattern, 1))
        else:
            others[pattern] = spec
    if others:
        rest["regions"] = others
    else:
        del rest["regions"]
    return pins


class ExpertsLanguage(Language):
    name = "experts"
    kind = "experts"
    built_in = True
    precedence = 90
    keys = ("experts",)
    axes = (MeshAxis.EXPERTS, MeshAxis.EXPERT_REPLICA)
    absent = ("the model has no routed mixture-of-experts layer, no data degree above 1 that an expert count "
              "shares a divisor with, or a strategy without 'experts' was forced")
    region_strategies = ("experts",)
    colours = (("experts", "#8a5bb8"),)
    draws_follow = False   # the tokens dispatched to other ranks

    def take(self, strategy: dict) -> tuple[dict, dict, bool]:
        """``strategy`` less its expert parallelism (the ``"experts"`` degree and the region
        pins ``{"experts": E}``, or ``"replicate"`` on ``"kind:experts"``), the Strategy
        fields those give (``{}`` without), and whether they ask for expert groups."""
        rest, degree = dict(strategy), None
        if "experts" in rest:
            degree = rest.pop("experts")
            if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
                raise PlanError(f"strategy: experts={degree!r}; give the expert degree, the number of data ranks "
                                f"each MoE layer's experts are spread over (an integer at least 1)")
        pins = _pins(rest)
        degrees = {e for _, e in pins if e > 1} | ({degree} if degree is not None and degree > 1 else set())
        if len(degrees) > 1:
            raise PlanError(f"strategy: expert degrees {sorted(degrees)} asked for; the MoE regions of one plan "
                            f"share one expert degree in this version")
        if degree is None and not pins:
            return rest, {}, False
        if degree == 1 and not pins:   # {"experts": 1}: no expert parallelism anywhere
            pins = [("kind:experts", 1)]
        if degree is None:
            degree = next(iter(degrees), 1)
        return rest, {"experts": degree, "expert_pins": tuple(pins)}, degree > 1

    def combine(self, parsed, fields: dict) -> None:
        if parsed.kind() not in ("mesh", "pipeline"):
            raise PlanError(f"strategy: expert parallelism combines with data, tensor and pipeline plans in this "
                            f"version, not with {parsed.kind()!r}; drop 'experts' or those keys")

    def is_kind(self, strategy) -> bool:
        return strategy.experts is not None and strategy.experts > 1

    def owns(self, candidate) -> bool:
        return "experts" in candidate.form


LANGUAGE = ExpertsLanguage()
