"""A mixed plan's form (``Plan.form``, and in the configurations weighed), which a
pipeline of mixed stages shows too: the mixed and the pipeline families share it."""
from __future__ import annotations

from autopar.grid import MeshAxis


def mixed_form(tensor_grid: dict, subgrids: int = 0) -> str:
    """A mixed plan's form in the configurations weighed: ``"mixed"``, with its 3D
    regions' grid of the tensor group (``"mixed tensor3d 2x2"``; ``"mixed tensor3d 2x1x2"`` with Gz > 1) or its D&SP sub-grids of
    several tensor ranks (``"mixed dsp 2 sub-grids"``)."""
    z = f"x{tensor_grid[MeshAxis.Z]}" if tensor_grid.get(MeshAxis.Z, 1) > 1 else ""
    return ("mixed" + (f" tensor3d {tensor_grid[MeshAxis.X]}x{tensor_grid[MeshAxis.Y]}{z}" if tensor_grid else "")
            + (f" dsp {subgrids} sub-grids" if subgrids else ""))
