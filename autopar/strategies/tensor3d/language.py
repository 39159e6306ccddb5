"""AxoNN's 3D grid's declaration to the generic layers (:mod:`autopar.planning.declared`):
the keys ``x``, ``y``, ``z`` (with ``data``), the pin ``{'tensor3d': {'x': gx, 'y': gy, 'z': gz}}``
(``'3d'`` read as its older spelling),
the grid's axes and groups, its regions' strategy; in the explanation, the grid's rank
layout, its layers and their boundaries in a mixed plan."""
from __future__ import annotations

from autopar.grid import Grid3D, MeshAxis
from autopar.planning.declared import Language, PinForm
from autopar.planning.explain import PLACES, grid_layout, layer_lines
from autopar.planning.strategy import Pin, PlanError, Strategy

AXES = ("x", "y", "z")


def _pin(pattern: str, options: dict | None, where: str) -> Pin:
    if options is None:
        return Pin(pattern, "tensor3d")
    grid = tuple(int(options.get(a, 1)) for a in AXES)
    if min(grid) < 1:
        raise PlanError(f"{where}: 3D grid sizes must be at least 1, got {options}")
    return Pin(pattern, "tensor3d", grid=grid)


def _describe(pin: Pin) -> str:
    return "tensor3d {}x{}x{}".format(*pin.grid) if pin.grid is not None else "tensor3d"


class Tensor3DLanguage(Language):
    name = "tensor3d"
    kind = "tensor3d"
    built_in = True
    precedence = 40
    keys = AXES
    key_text = "the 3D grid 'x', 'y', 'z' (with 'data')"
    trigger = frozenset(AXES)
    aliases = ("axonn", "3d")
    renamed = ((2, "3d", "tensor3d"),)   # plan.json format 2's mixed forms: "mixed 3d 2x2"
    axes = (MeshAxis.X, MeshAxis.Y, MeshAxis.Z, MeshAxis.REPLICA)
    absent = "the model has no linear chain or attention region, or a strategy was forced"
    region_strategies = ("tensor3d",)
    colours = (("tensor3d", "#b07a2a"),)
    draws_follow = False   # rows over z, columns in blocks
    pin = PinForm("tensor3d", "{'tensor3d': {'x': gx, 'y': gy, 'z': gz}}", options=frozenset(AXES), parse=_pin,
                  describe=_describe)

    def parse(self, strategy: dict) -> Strategy:
        if set(strategy) - {"x", "y", "z", "data"}:
            raise PlanError(f"strategy: a 3D grid {strategy} combines only with 'data'; drop "
                            f"{sorted(set(strategy) - {'x', 'y', 'z', 'data'})}")
        try:
            grid = Grid3D(*(int(strategy.get(a, 1)) for a in ("x", "y", "z", "data")))
        except ValueError as e:
            raise PlanError(f"strategy: {e}") from None
        return Strategy(grid.data, 1, grid=grid)

    def is_kind(self, strategy) -> bool:
        return strategy.grid is not None

    def owns(self, candidate) -> bool:
        return MeshAxis.X in candidate.mesh

    def rank_dims(self, plan) -> dict | None:
        """AxoNN's ``data × z × y × x`` (the cube's too)."""
        return {axis: plan.degree(axis) for axis in (MeshAxis.DATA, MeshAxis.Z, MeshAxis.Y, MeshAxis.X)} \
            if plan.grid is not None else None

    def group_specs(self, plan, tied: tuple) -> dict | None:
        """One group per axis of the grid, and ``replica`` (the ranks of one (x, y): they
        split the batch, ordered by batch chunk ``data·Gz + z``)."""
        if plan.grid is None:
            return None
        return {**plan.grid.group_specs(), MeshAxis.TENSOR: None, MeshAxis.SEGMENT: None, MeshAxis.SUBGRID: None}

    def rank_layout(self, plan) -> str | None:
        return grid_layout(plan, "3D grid") if plan.grid is not None else None

    def sections(self, plan) -> list[tuple[int, list[str]]]:
        layered = [r for r in plan.regions if r.strategy in self.region_strategies]
        if not layered:
            return []
        return [(PLACES["layers"], ["", "3D layers (orientation by data flow; Algorithm 1: all-gather W over z, "
                                        "all-reduce the output over the in axis; backward: all-reduce dI over the "
                                        "out axis, reduce-scatter dW over z):", *layer_lines(layered)])]

    def candidate_text(self, candidate) -> str | None:
        mesh = candidate.mesh
        if MeshAxis.X not in mesh:
            return None
        return f"3D x={mesh[MeshAxis.X]} y={mesh[MeshAxis.Y]} z={mesh[MeshAxis.Z]} data={mesh[MeshAxis.DATA]}"

    def boundary(self, plan, choice) -> str:
        return choice.details.get("boundary", "")


LANGUAGE = Tensor3DLanguage()
