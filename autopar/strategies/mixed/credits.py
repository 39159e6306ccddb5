"""What consecutive 3D regions of a mixed plan save where they meet (axonn end of
§III-B), the credits the programme takes off their options' costs.

A 3D region's last (transposed) layer leaves its output split over y; a 3D region whose
first layers read it directly takes it as it is, saving its entry cut and, when nothing
else reads it, the first's exit all-gather (over y, and with ``Gz > 1`` the rows' over z
too). On a grid with ``Gz > 1`` the rows stay split over z through the nodes between two
3D regions (a residual add, a layer norm), saving both row conversions and ``1 − 1/Gz``
of those nodes' work. Found once per pair of regions and memoised per model.
"""
from __future__ import annotations

from autopar.grid import Grid3D, MeshAxis
from autopar.ir import tensor_spec
from autopar.passes.analysis.ops import match_linear
from autopar.planning.model import ModelFacts
from autopar.strategies.mixed.structure import node_names, node_order, region_structure
from autopar.strategies.shared.grid3d.cost import boundary_comm, rows_boundary_comm
from autopar.strategies.shared.grid3d.rewrite import region_linears


class BoundaryCredits:
    """The credits between the 3D regions of one configuration: its grid of the tensor
    group (None: no 3D region, no credit) on ``data`` ranks' rows."""

    def __init__(self, model: ModelFacts, hw, grid: Grid3D | None, data: int):
        self.model, self.hw, self.grid, self.data = model, hw, grid, data
        self.links = model.memo("mixed.links")
        # the credits by what decides them, on this grid and hardware (hashed once here)
        self.saved = model.memo("mixed.credits").setdefault((grid, hw), {}) if grid is not None else {}
        self.gaps_between = model.memo("mixed.gaps")
        # per pair of regions, the credit on this grid, hardware and rows (the grid and
        # hardware hashed once here, not per pair asked)
        pairs = model.memo("mixed.pair_credits").setdefault((grid, hw, data), {}) if grid is not None else {}
        self.pairs, self.sums = pairs.setdefault("by_group", {}), pairs.setdefault("sum", {})

    def credit(self, prev: str, prev_region, name: str, region) -> float:
        """What two 3D regions save where the first's transposed layer feeds the second's
        plain layers directly (axonn end of §III-B): the second's entry cut and, when
        nothing else reads it, the first's exit all-gather (over y, and with Gz > 1 the
        rows' over z too)."""
        if prev != "tensor3d" or name != "tensor3d" or self.grid is None:
            return 0
        key = (prev_region.id, region.id)
        total = self.sums.get(key)
        if total is None:
            total = self.sums[key] = sum(self.by_group(prev, prev_region, name, region).values())
        return total

    def by_group(self, prev: str, prev_region, name: str, region) -> dict[str, float]:
        """:meth:`credit` by group (``compute``: seconds of work saved); read only."""
        if prev != "tensor3d" or name != "tensor3d" or self.grid is None:
            return {}
        key = (prev_region.id, region.id)
        found = self.pairs.get(key)
        if found is None:
            found = self.pairs[key] = self._by_group(prev_region, region)
        return found

    def _by_group(self, prev_region, region) -> dict[str, float]:
        """:meth:`by_group` between two 3D regions, computed."""
        link = self._link(prev_region, region)
        grid, hw = self.grid, self.hw
        if link is None:
            return self._kept_rows(prev_region, region) if grid.z > 1 else {}
        credit = self.saved.get(link)
        if credit is None:
            in_bytes, out_bytes = link
            credit = self.saved[link] = {
                MeshAxis.Y: boundary_comm(in_bytes, 0.0, grid, hw) + boundary_comm(0.0, out_bytes, grid, hw),
                **({MeshAxis.Z: rows_boundary_comm(in_bytes, out_bytes, grid, hw)} if grid.z > 1 else {})}
        return credit

    def _kept_rows(self, prev_region, region) -> dict[str, float]:
        """Two 3D regions on a grid with ``Gz > 1`` with nodes outside every region between
        them (a residual add, a layer norm): the rows stay split over z through them
        (``tensor3d.rewrite._RowSplit``), which saves the first's exit all-gather over z,
        the second's entry cut, and ``1 − 1/Gz`` of the nodes' work. Nodes of a
        multi-branch region between them: no credit (its families read whole rows)."""
        gap = self._gap(prev_region, region)
        if gap is None:
            return {}
        grid, hw, model = self.grid, self.hw, self.model
        sig, names, in_bytes, out_bytes = gap
        key = ("rows", sig, in_bytes, out_bytes)
        credit = self.saved.get(key)
        if credit is None:
            credit = self.saved[key] = {
                MeshAxis.Z: rows_boundary_comm(in_bytes, out_bytes, grid, hw),
                "compute": model.seconds(names, hw, 1 / self.data) - model.seconds(names, hw, 1 / (self.data * grid.z))}
        return credit

    def _gap(self, prev_region, region):
        """The nodes outside every region between two regions in graph order, as
        ``(their work signature, their names, the bytes entering the second region, the
        bytes leaving the first)``; None when they overlap or a multi-branch region's
        nodes lie between them. Once per pair of regions."""
        key = (prev_region.id, region.id)
        if key not in self.gaps_between:
            model = self.model
            order, (_, branching) = node_order(model), region_structure(model)
            end = max(order[n] for n in prev_region.nodes)
            start = min(order[n] for n in region.nodes)
            gap = [n for n in node_names(model)[end + 1:start] if n not in model.node_region]
            forked = {n for _, fj, _ in branching for n in fj.nodes}
            if start <= end or forked.intersection(gap):
                self.gaps_between[key] = None
            else:
                last = model.table[region_linears(prev_region)[-1][0]]
                entry = match_linear(model.table[region_linears(region)[0][0]], model.gm).input
                self.gaps_between[key] = (model.signature(gap), gap, float(tensor_spec(entry).nbytes),
                                          float(tensor_spec(last).nbytes))
        return self.gaps_between[key]

    def _link(self, prev_region, region) -> tuple[float, float] | None:
        """Whether ``region``'s plain layers read ``prev_region``'s transposed output
        directly: ``(its bytes, the bytes of the exit gather saved)`` (the second 0 when
        something else reads it too), else None. Found once per pair of regions."""
        key = (prev_region.id, region.id)
        if key not in self.links:
            model = self.model
            last = model.table[region_linears(prev_region)[-1][0]]
            plain = [n for n, transposed in region_linears(region) if not transposed]
            entry = match_linear(model.table[plain[0]], model.gm).input
            if entry is not last:
                self.links[key] = None
            else:
                nbytes = float(tensor_spec(last).nbytes)
                self.links[key] = (nbytes, nbytes if all(u.name in plain for u in last.users) else 0.0)
        return self.links[key]
