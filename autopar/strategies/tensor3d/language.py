"""AxoNN's 3D grid's declaration to the generic layers (:mod:`autopar.planning.declared`):
the keys ``x``, ``y``, ``z`` (with ``data``), the pin ``{'3d': {'x': gx, 'y': gy, 'z': gz}}``,
the grid's axes and groups, its regions' strategy."""
from __future__ import annotations

from autopar.grid import Grid3D, MeshAxis
from autopar.planning.declared import Language, PinForm
from autopar.planning.strategy import Pin, PlanError, Strategy

AXES = ("x", "y", "z")


def _pin(pattern: str, options: dict | None, where: str) -> Pin:
    if options is None:
        return Pin(pattern, "3d")
    grid = tuple(int(options.get(a, 1)) for a in AXES)
    if min(grid) < 1:
        raise PlanError(f"{where}: 3D grid sizes must be at least 1, got {options}")
    return Pin(pattern, "3d", grid=grid)


def _describe(pin: Pin) -> str:
    return "3d {}x{}x{}".format(*pin.grid) if pin.grid is not None else "3d"


class Tensor3DLanguage(Language):
    name = "3d"
    kind = "3d"
    built_in = True
    precedence = 40
    keys = AXES
    key_text = "the 3D grid 'x', 'y', 'z' (with 'data')"
    trigger = frozenset(AXES)
    aliases = ("axonn",)
    axes = (MeshAxis.X, MeshAxis.Y, MeshAxis.Z, MeshAxis.REPLICA)
    absent = "the model has no linear chain or attention region, or a strategy was forced"
    region_strategies = ("tensor3d",)
    colours = (("3d", "#b07a2a"),)
    draws_follow = False   # rows over z, columns in blocks
    pin = PinForm("3d", "{'3d': {'x': gx, 'y': gy, 'z': gz}}", options=frozenset(AXES), parse=_pin,
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


LANGUAGE = Tensor3DLanguage()
