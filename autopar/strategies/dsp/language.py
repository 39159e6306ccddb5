"""D&SP's declaration to the generic layers (:mod:`autopar.planning.declared`): the keys
``subgrids``, ``topology_aware`` and ``csub``, the pin ``{'dsp': {'subgrids': g}}``, the
sub-grids' axes and groups, its regions' strategy; in the explanation, the sub-grids
beside the mesh, the branches on them and their boundaries in a mixed plan."""
from __future__ import annotations

from autopar.grid import MeshAxis, subgrid_dims, subgrid_group_specs
from autopar.planning.declared import Language, PinForm
from autopar.planning.explain import PLACES, mesh_text
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

    # the plan's layout: ``position × subgrid`` (topology-aware) or ``subgrid × position``
    def rank_dims(self, plan) -> dict | None:
        return subgrid_dims(plan.world_size, plan.subgrids, plan.topology_aware) if plan.subgrids > 1 else None

    def group_specs(self, plan, tied: tuple) -> dict | None:
        """``segment`` (one position of every sub-grid, in sub-grid order), ``subgrid``
        (one sub-grid, in position order) and ``data`` (every rank in batch-chunk order
        ``p·g + s``; under cSub the sub-grid)."""
        return {MeshAxis.TENSOR: None, **subgrid_group_specs(plan.csub)} if plan.subgrids > 1 else None

    def batch_parts(self, plan) -> int | None:
        """Under cSub the ranks of one sub-grid (sub-grid 0 runs the common layers)."""
        return plan.degree(MeshAxis.DATA) // plan.subgrids if plan.csub else None

    def batch_chunk(self, plan, rank: int) -> int | None:
        """``p·g + s``, so that a segment group's chunks are one sub-grid chunk
        (``docs/dsp_design.md``); under cSub the position ``p`` (every sub-grid's rank
        ``p`` works on the rows of sub-grid 0's rank ``p``)."""
        if plan.subgrids == 1:
            return None
        s, p = plan.subgrid_coordinates(rank)
        return p if plan.csub else p * plan.subgrids + s

    def layout_key(self, layout) -> tuple:
        return layout.subgrids, layout.topology_aware or layout.subgrids == 1, layout.csub

    def partial_rank(self, plan, rank: int) -> bool:
        """cSub: the ranks off sub-grid 0 run their branches only."""
        return plan.csub and plan.subgrid_coordinates(rank)[0] != 0

    def mesh_note(self, plan) -> str:
        if plan.subgrids <= 1:
            return ""
        return (f"; {'D&SP-cSub' if plan.csub else 'D&SP'}: {plan.subgrids} sub-grids of "
                f"{plan.world_size // plan.subgrids} rank(s), {'topology-aware' if plan.topology_aware else 'naive'} "
                f"order" + (", common layers on sub-grid 0" if plan.csub else ""))

    def sections(self, plan) -> list[tuple[int, list[str]]]:
        split = [r for r in plan.regions if r.strategy in self.region_strategies]
        if not split:
            return []
        return [(PLACES["branches"], ["", "branches on sub-grids:", *(f"  {r.region}: {r.reason}" for r in split)])]

    def candidate_text(self, candidate) -> str | None:
        if candidate.subgrids <= 1:
            return None
        return (mesh_text(candidate.mesh) + f", {'D&SP-cSub' if candidate.csub else 'D&SP'} {candidate.subgrids} "
                f"sub-grids ({'topology-aware' if candidate.topology_aware else 'naive'})")

    def boundary(self, plan, choice) -> str:
        group = MeshAxis.TENSOR_SEG if plan.tensor_subgrids else MeshAxis.TENSOR
        join = (f"all-reduce over {group}; backward identity" if choice.details.get("join") == "sum" else
                f"all-gather of the branches' columns over {group}; backward the own columns")
        return f"fork (identity; backward all-reduce over {group}), join ({join})"


LANGUAGE = DspLanguage()
