"""One mixed configuration priced: ``data × tensor`` with one grid of the tensor group
for its 3D regions (or none) and its D&SP sub-grids, the options of its regions
(:mod:`.options`), the 3D boundary credits (:mod:`.credits`), the programme over them
(:mod:`.solver`) and the region table of its choice (:mod:`.tables`)."""
from __future__ import annotations

from autopar.grid import Grid3D
from autopar.strategies.family import PlanContext, RegionTable
from autopar.strategies.mixed.credits import BoundaryCredits
from autopar.strategies.mixed.options import RegionOptions, Step
from autopar.strategies.mixed.solver import solve
from autopar.strategies.mixed.tables import region_table


class MixedPricer:
    """The options of every region on one ``data × tensor`` (with one ``Gx × Gy × Gz``
    grid of the tensor group for 3D regions, or none) and the programme over them;
    ``whole``: regions kept whole and why (a pipeline's), ``subgrids``: D&SP's sub-grids
    of the tensor group (0: each rank one)."""

    def __init__(self, ctx: PlanContext, data: int, tensor: int, grid: Grid3D | None,
                 whole: dict[str, str] | None = None, subgrids: int = 0):
        self.options = RegionOptions(ctx, data, tensor, grid, whole, subgrids)
        self.credits = BoundaryCredits(ctx.model, ctx.hw, grid, data)
        self.uses: set[str] = set()  # the families the programme chose (a multi-branch region left open adds none)

    def can_mix(self) -> bool:
        """Whether the programme could choose a mixed plan here at all
        (:meth:`RegionOptions.can_mix`)."""
        return self.options.can_mix()

    def solve(self) -> tuple[list[tuple[Step, str]], float]:
        """The programme's choice per step and its seconds (:func:`solve`)."""
        return solve(self.options, self.credits)

    def table(self, materialize: bool = True) -> RegionTable:
        """The region table of the programme's choice; ``materialize=False`` (the search)
        gives the totals alone, without the rows."""
        path, _ = self.solve()
        self.uses = {name for _, name in path if name != "open"}
        return region_table(self.options, self.credits, path, materialize)
