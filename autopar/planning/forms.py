"""A configuration's *form* in the plan and in the configurations weighed, beside its
mesh: ``"cube"``, ``"pipeline 1f1b"``, a mixed plan's (:func:`mixed_form`), ``"replicate"``
(:func:`replicated`), with expert parallelism's ``"experts P"`` after it (:func:`experts_form`)."""
from __future__ import annotations


def mixed_form(tensor_grid: dict, subgrids: int = 0) -> str:
    """A mixed plan's form in the configurations weighed: ``"mixed"``, with its 3D
    regions' grid of the tensor group (``"mixed 3d 2x2"``; ``"mixed 3d 2x1x2"`` with Gz > 1) or its D&SP sub-grids of
    several tensor ranks (``"mixed dsp 2 sub-grids"``)."""
    z = f"x{tensor_grid['z']}" if tensor_grid.get("z", 1) > 1 else ""
    return ("mixed" + (f" 3d {tensor_grid['x']}x{tensor_grid['y']}{z}" if tensor_grid else "")
            + (f" dsp {subgrids} sub-grids" if subgrids else ""))


def replicated(mesh: dict, regions) -> bool:
    """Whether a ``data × tensor`` mesh's tensor group splits nothing: every rank of it
    runs the whole of its data rank's work (the form ``"replicate"``)."""
    return mesh.get("tensor", 1) > 1 and set(mesh) <= {"data", "tensor"} and \
        all(r.strategy == "replicate" for r in regions)


def experts_form(base: str, experts: int) -> str:
    """A form with expert parallelism's ``experts P`` after the base's (``"experts 2"``,
    ``"pipeline 1f1b, experts 2"``); the base alone without it."""
    if experts <= 1:
        return base
    return (base + ", " if base else "") + f"experts {experts}"
