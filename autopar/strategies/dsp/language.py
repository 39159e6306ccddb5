"""D&SP's declaration to the generic layers (:mod:`autopar.planning.declared`): the keys
``subgrids``, ``topology_aware`` and ``csub``, the pin ``{'dsp': {'subgrids': g}}``, the
sub-grids' axes and groups, its regions' strategy."""
from __future__ import annotations

from autopar.grid import MeshAxis
from autopar.planning.declared import Language, PinForm
from autopar.planning.strategy import Pin, PlanError


def _pin(pattern: str, options: dict | None, where: str) -> Pin:
    if options is None:
        return Pin(pattern, "dsp")
    g = int(options.get("subgrids", 0))
    if g < 0 or g == 1:
        raise PlanError(f"{where}: D&SP needs at least 2 sub-grids, got subgrids={g}")
    if options.get("csub", False):
        raise PlanError(f"{where}: D&SP-cSub runs the common layers on one sub-grid, which a mixed plan does not; "
                        f"force {{'subgrids': g, 'csub': True}} for the whole model")
    return Pin(pattern, "dsp", g)


def _describe(pin: Pin) -> str:
    return "dsp" + (f" subgrids={pin.subgrids}" if pin.subgrids else "")


class DspLanguage(Language):
    name = "dsp"
    kind = "dsp"
    built_in = True
    precedence = 30
    keys = ("subgrids", "topology_aware", "csub")
    key_text = "D&SP 'subgrids' (with 'topology_aware' and 'csub')"
    aliases = ("d&sp",)
    axes = (MeshAxis.POSITION, MeshAxis.SUBGRID, MeshAxis.SEGMENT, MeshAxis.TENSOR_SEG, MeshAxis.TENSOR_SUB)
    absent = "the model has no multi-branch region (fork/join branches or attention heads), or a strategy was forced"
    region_strategies = ("dsp",)
    colours = (("dsp", "#3f9b5a"),)
    draws_follow = False   # the branches run on other rows
    branches = True
    pin = PinForm("dsp", "{'dsp': {'subgrids': g}}", "{'dsp': {'subgrids': g, 'csub': False}}",
                  frozenset({"subgrids", "csub"}), _pin, _describe)

    def fields(self, strategy: dict) -> dict:
        return {"subgrids": int(strategy.get("subgrids", 1)),
                "topology_aware": bool(strategy.get("topology_aware", True)),
                "csub": bool(strategy.get("csub", False))}

    def is_kind(self, strategy) -> bool:
        return strategy.subgrids > 1 or strategy.csub

    def owns(self, candidate) -> bool:
        return candidate.subgrids > 1


LANGUAGE = DspLanguage()
