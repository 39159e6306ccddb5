"""Expert parallelism's declaration to the generic layers (:mod:`autopar.planning.declared`):
the key ``experts`` and the pins ``{"experts": E}`` (or ``"replicate"``) of MoE regions,
taken off the strategy it rides on (data × tensor or a pipeline); the expert groups' axes;
in the explanation its section and its configurations."""
from __future__ import annotations

from autopar.grid import GroupSpec, MeshAxis
from autopar.planning.declared import Language
from autopar.planning.explain import PLACES, _bytes, _ms, mesh_text
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
        return self.name in candidate.form

    def refine_dims(self, plan, dims: dict) -> dict:
        """The data ranks as expert groups of consecutive ones: ``data = replica·E + e``."""
        if plan.experts <= 1:
            return dims
        e = plan.experts
        return {k: v for name, size in dims.items() for k, v in (
            ((MeshAxis.EXPERT_REPLICA, size // e), (MeshAxis.EXPERTS, e)) if name == MeshAxis.DATA
            else ((name, size),))}

    def refine_groups(self, plan, specs: dict, tied: tuple) -> dict:
        """The data dimension as ``expert_replica × experts`` (every group over ``data``
        spans both, in data order), with ``experts`` (an expert group: consecutive data
        ranks) and ``expert_replica`` (the ranks holding the same experts, over which their
        gradients are reduced)."""
        if plan.experts <= 1:
            return specs
        def split(spec):
            if spec is None or MeshAxis.DATA not in spec.dims:
                return spec
            dims = tuple(d for dim in spec.dims for d in (
                (MeshAxis.EXPERT_REPLICA, MeshAxis.EXPERTS) if dim == MeshAxis.DATA else (dim,)))
            return GroupSpec(dims, spec.only)
        return {**{name: split(spec) for name, spec in specs.items()}, MeshAxis.EXPERTS: GroupSpec((MeshAxis.EXPERTS,)),
                MeshAxis.EXPERT_REPLICA: GroupSpec((MeshAxis.EXPERT_REPLICA,))}

    def candidate_text(self, candidate) -> str | None:
        return mesh_text(candidate.mesh) + f", {candidate.form}" if candidate.form.startswith(self.name) else None

    def sections(self, plan) -> list[tuple[int, list[str]]]:
        """Expert parallelism's part (docs/experts.md): the expert groups, and per MoE region
        its placement, the rows per rank the planner assumed (uniform routing) and the last
        measured ones (``ParallelModule.expert_load``), its all-to-all volume and seconds."""
        rows = [r for r in plan.regions if r.kind == "experts"]
        if plan.experts <= 1 or not rows:
            return []
        e, d = plan.experts, plan.degree(MeshAxis.DATA)
        groups = [list(range(g * e, (g + 1) * e)) for g in range(d // e)]
        lines = ["", f"expert parallelism: expert groups of {e} consecutive data ranks (data indices {groups}); "
                     f"each MoE layer's experts spread over a group, tokens dispatched and combined by all-to-all "
                     f"(dropless), expert gradients reduced over the {d // e} rank(s) holding the same experts"
                     + ("; experts Megatron-split over the tensor group inside" if plan.degree(MeshAxis.TENSOR) > 1
                        else "")]
        for r in rows:
            x = r.details
            if r.strategy not in self.region_strategies:
                lines.append(f"  {r.region}: {x['experts']} experts, top-{x['top_k']}: not expert-parallel "
                             f"({r.reason})")
                continue
            placement = ", ".join(f"place {i}: experts {a}..{b - 1}" for i, (a, b) in enumerate(x["placement"]))
            measured = x.get("measured_tokens_per_rank")
            lines.append(f"  {r.region}: {x['experts']} experts, top-{x['top_k']}, {x['experts_per_rank']} per rank "
                         f"({placement}); rows per rank and step predicted {x['tokens_per_rank']:.0f} (uniform "
                         f"routing)" + (f", measured {measured} (last step, the expert group's ranks)" if measured
                                        else "")
                         + f"; all-to-all of {_bytes(x['all_to_all_bytes'])} per rank, 4 per step: "
                         f"{_ms(x['all_to_all_s'])}")
        return [(PLACES["experts"], lines)]


LANGUAGE = ExpertsLanguage()
