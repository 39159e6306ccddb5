"""Bian's cube's declaration to the generic layers (:mod:`autopar.planning.declared`): the
key ``cube`` (with ``data``), its pin word (refused: no per-region layout), its regions'
strategy; the grid's axes are the 3D grid's. In the explanation, its rank layout and
its layers."""
from __future__ import annotations

from autopar.grid import Grid3D, MeshAxis
from autopar.planning.declared import Language, PinForm
from autopar.planning.explain import PLACES, grid_layout, layer_lines
from autopar.planning.strategy import PlanError, Strategy


def _pin(pattern: str, options: dict | None, where: str):
    raise PlanError(f"{where}: Bian's cube has no per-region layout in this version; pin AxoNN's grid "
                    f"{{'tensor3d': {{'x': gx, 'y': gy, 'z': gz}}}}, or force the whole model onto the cube ({{'cube': p}})")


class CubeLanguage(Language):
    name = "cube"
    kind = "cube"
    built_in = True
    precedence = 50
    keys = ("cube",)
    key_text = "Bian's 'cube' (with 'data')"
    trigger = frozenset({"cube"})
    absent = "a strategy was forced"
    region_strategies = ("cube",)
    renamed = ((2, "cube3d", "cube"),)   # plan.json format 2 said cube3d
    colours = (("cube", "#c0583a"),)
    draws_follow = False
    pin = PinForm("cube", "'cube'", parse=_pin)

    def parse(self, strategy: dict) -> Strategy:
        if set(strategy) - {"cube", "data"}:
            raise PlanError(f"strategy: the cube form {strategy} combines only with 'data'; drop "
                            f"{sorted(set(strategy) - {'cube', 'data'})}")
        p, data = int(strategy["cube"]), strategy.get("data")
        if p < 2 or (data is not None and int(data) < 1):
            raise PlanError(f"strategy: cube={p}, data={data}: the cube's edge p must be at least 2 and "
                            f"the data degree at least 1")
        return Strategy(None if data is None else int(data), 1, grid=Grid3D(p, p, p, int(data or 1)),
                        form=self.name)

    def is_kind(self, strategy) -> bool:
        return strategy.form == self.name

    def owns(self, candidate) -> bool:
        return candidate.form == self.name

    def form(self, plan) -> str | None:
        return self.name if plan.regions_with(self.region_strategies[0]) else None

    def rank_layout(self, plan) -> str | None:
        return grid_layout(plan, "Bian cube") if plan.grid is not None and plan.form == self.name else None

    def sections(self, plan) -> list[tuple[int, list[str]]]:
        layered = [r for r in plan.regions if r.strategy in self.region_strategies]
        if not layered:
            return []
        return [(PLACES["layers"], ["", "cube layers (Bian et al.; orientation by data flow; Algorithms 1/3: "
                                        "all-gather A's rows over the out axis and W over z, reduce-scatter the "
                                        "output's rows over the in axis; backward (2/4): all-gather dC over the in "
                                        "axis, reduce-scatter dA over the out axis and dW over z; biases on the "
                                        "diagonal ranks, Algorithms 7-8):", *layer_lines(layered)])]

    def candidate_text(self, candidate) -> str | None:
        if candidate.form != self.name:
            return None
        if MeshAxis.X not in candidate.mesh:
            return "3D cube (Bian)"
        return f"3D cube (Bian) p={candidate.mesh[MeshAxis.X]} data={candidate.mesh[MeshAxis.DATA]}"


LANGUAGE = CubeLanguage()
