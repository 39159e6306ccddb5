"""Mixed plans' declaration to the generic layers (:mod:`autopar.planning.declared`): the
key ``regions`` (region pins, with ``data`` and ``tensor``); each region's family over
the tensor group. In the explanation, the tensor group's layout beside the mesh, the
best single-family plan beside it and each split region's boundaries (their text the
region's family's, ``Language.boundary``)."""
from __future__ import annotations

from autopar.grid import GroupSpec, MeshAxis
from autopar.planning.declared import DECLARED, Language, first, region_owner
from autopar.planning.explain import PLACES, _family, _mesh_text, _ms, mesh_text
from autopar.planning.region_table import runs
from autopar.planning.strategy import PlanError, Strategy, parse_pins
from autopar.strategies.shared.forms import mixed_form


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
        return candidate.form.startswith(self.name)

    # the plan's layout: the tensor group as sub-grids (``tensor_seg × tensor_sub``) or
    # as the 3D regions' ``z × y × x``
    def rank_dims(self, plan) -> dict | None:
        g, grid = plan.tensor_subgrids, plan.tensor_grid
        if not g and not grid:
            return None
        outer = {MeshAxis.PIPELINE: plan.degree(MeshAxis.PIPELINE)} if plan.pipeline else {}
        if g:   # tensor index: sub-grid · t/g + place
            tensor = {MeshAxis.TENSOR_SEG: g, MeshAxis.TENSOR_SUB: plan.degree(MeshAxis.TENSOR) // g}
        else:   # (z·Gy + y)·Gx + x
            tensor = {**({MeshAxis.Z: grid[MeshAxis.Z]} if grid.get(MeshAxis.Z, 1) > 1 else {}),
                      MeshAxis.Y: grid[MeshAxis.Y], MeshAxis.X: grid[MeshAxis.X]}
        return {**outer, MeshAxis.DATA: plan.degree(MeshAxis.DATA), **tensor}

    def group_specs(self, plan, tied: tuple) -> dict | None:
        """Megatron and D&SP over the tensor group (D&SP over sub-grids of it, Megatron
        inside one), 3D over its x and y (and z where the 3D regions split their rows)."""
        if not plan.mixed:
            return None
        one, grid = GroupSpec, plan.tensor_grid
        x, y, z, data = MeshAxis.X, MeshAxis.Y, MeshAxis.Z, MeshAxis.DATA
        if plan.tensor_subgrids:
            seg, sub = MeshAxis.TENSOR_SEG, MeshAxis.TENSOR_SUB
            tensor = {MeshAxis.TENSOR: one((seg, sub)), seg: one((seg,)), sub: one((sub,))}
        elif grid.get(MeshAxis.Z, 1) > 1:
            tensor = {MeshAxis.TENSOR: one((z, y, x)), x: one((x,)), y: one((y,)), z: one((z,)),
                      MeshAxis.REPLICA: one((data, z))}
        elif grid:
            tensor = {MeshAxis.TENSOR: one((y, x)), x: one((x,)), y: one((y,)), z: None, MeshAxis.REPLICA: one((data,))}
        else:
            tensor = {MeshAxis.TENSOR: one((MeshAxis.TENSOR,))}
        return {data: one((data,)), **tensor}

    def form(self, plan) -> str | None:
        return mixed_form(plan.tensor_grid, plan.tensor_subgrids) if plan.mixed else None

    def candidate_text(self, candidate) -> str | None:
        return mesh_text(candidate.mesh) + f", {candidate.form}" if candidate.form.startswith(self.name) else None

    def mesh_note(self, plan) -> str:
        if not plan.mixed:
            return ""
        grid = plan.tensor_grid
        return ("; mixed: each region its own family over the tensor group"
                + ((f", 3D regions on it as Gx={grid[MeshAxis.X]} x Gy={grid[MeshAxis.Y]} (tensor = y*Gx + x)"
                    if grid.get(MeshAxis.Z, 1) == 1 else
                    f", 3D regions on it as Gx={grid[MeshAxis.X]} x Gy={grid[MeshAxis.Y]} x Gz={grid[MeshAxis.Z]}, "
                    f"their rows split over z (tensor = (z*Gy + y)*Gx + x)") if grid else "")
                + (f", D&SP over {plan.tensor_subgrids} sub-grids of it, their branches Megatron-split inside one "
                   f"(tensor = sub-grid*{plan.degree(MeshAxis.TENSOR) // plan.tensor_subgrids} + place)"
                   if plan.tensor_subgrids else ""))

    def header_lines(self, plan) -> list[str]:
        """Beside a mixed plan, the best plan of one family weighed (what mixing buys)."""
        if not plan.mixed:
            return []
        single = [c for c in plan.candidates if c.feasible and self.name not in c.form]
        if not single:
            return ["best single-family plan: none weighed (the mixed plan was forced)" if plan.forced else
                    "best single-family plan: none feasible"]
        best = min(single, key=lambda c: (c.step_s, _mesh_text(c)))
        return [f"best single-family plan: {_mesh_text(best)} ({_family(best, plan.world_size)}), step "
                f"{_ms(best.step_s)}: {best.step_s / plan.step_s:.2f}x the mixed plan's"]

    def sections(self, plan) -> list[tuple[int, list[str]]]:
        """Each split region's conversions from and to the layout regions meet at (the
        activation replicated over the tensor group), with their cost (the row's
        communication; docs/mixed_plans.md has each conversion's formula)."""
        if not plan.mixed:
            return []
        lines = ["", "boundaries (the conversions from and to the activation replicated over the tensor group; "
                 "the region's communication per step):"]
        shown = [(r, text) for r in plan.regions if r.cost.comm_s and (owner := region_owner(r.strategy)) is not None
                 and (text := owner.boundary(plan, r)) is not None]
        texts = {id(r): text for r, text in shown}
        for start, end, count, r in runs([r for r, _ in shown]):
            where = start if count == 1 else f"{start} .. {end} (x{count}, each)"
            comm = ", ".join(f"{g} {_ms(v)}" for g, v in sorted(r.cost.comm_s.items()) if v)
            lines.append(f"  {where}: {texts[id(r)]}: {comm or 'none'}")
        return [(PLACES["boundaries"], lines)] if len(lines) > 2 else []


LANGUAGE = MixedLanguage()
