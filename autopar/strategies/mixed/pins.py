"""Region pins in a mixed plan (``strategy={"regions": {PATTERN: SPEC}}``,
:class:`~autopar.planning.strategy.Pin`): the checks a forced strategy's pins get before
anything is priced (each names a region of the model, its D&SP sub-grids divide the
tensor group, its 3D grid has as many ranks as the group), each raising a
:class:`PlanError` that names the pin. Which options a pin leaves a region is the
options' (:meth:`autopar.strategies.mixed.options.RegionOptions.allowed`)."""
from __future__ import annotations

from autopar.planning.strategy import PlanError, Strategy
from autopar.strategies.family import PlanContext
from autopar.strategies.mixed.structure import pinnable


def pinned_subgrids(forced: Strategy, t: int) -> int:
    """The D&SP sub-grid count of several tensor ranks the pins ask for on a tensor group
    of ``t`` (0: each rank one)."""
    return next((p.subgrids for p in forced.regions if p.family == "dsp" and 0 < p.subgrids < t), 0)


def check_pins_name_regions(ctx: PlanContext) -> None:
    """Every pin of the forced strategy names at least one region of the model."""
    regions = pinnable(ctx.model)
    for pin in ctx.forced.regions:
        if not any(pin.matches(r) for r in regions):
            names = ", ".join(r.id for r in regions[:6]) + (" ..." if len(regions) > 6 else "")
            raise PlanError(f"strategy['regions'][{pin.pattern!r}]: names no region of {ctx.name}; its "
                            f"regions are {names or 'none'} (autopar.plan(...).explain() lists them)")


def check_forced_stages(ctx: PlanContext, tensor: int) -> int:
    """A pipeline forced with region pins or a grid inside its stages, on a tensor group
    of ``tensor`` ranks: the checks a mixed plan's pins get (they name regions, their
    sub-grids divide the group, their grid has ``x·y = t``), raising a PlanError naming
    the pin; returns the D&SP sub-grid count the pins ask for (0: one rank each)."""
    forced = ctx.forced
    if tensor == 1:
        raise PlanError("strategy: region pins and 3D grids inside pipeline stages split regions over the tensor "
                        "group; give 'tensor' above 1")
    check_pins_name_regions(ctx)
    why = pins_misfit(forced, tensor)
    if why is not None:
        raise PlanError(why)
    return pinned_subgrids(forced, tensor)


def pins_misfit(forced: Strategy, t: int) -> str | None:
    """Why the pins cannot run on a tensor group of ``t`` ranks (None: they can)."""
    grid = forced.grid
    counts = {pin.subgrids for pin in forced.regions if pin.family == "dsp" and pin.subgrids}
    for pin in forced.regions:
        if pin.family == "dsp" and pin.subgrids and t % pin.subgrids:
            return (f"strategy['regions'][{pin.pattern!r}]: D&SP in a mixed plan spreads the branches over "
                    f"sub-grids of the tensor group, so subgrids={pin.subgrids} must divide the tensor degree {t}")
        if pin.family == "dsp" and pin.subgrids and pin.subgrids < t and (grid is not None or len(counts) > 1):
            return (f"strategy['regions'][{pin.pattern!r}]: D&SP sub-grids of several tensor ranks "
                    f"(subgrids={pin.subgrids} < tensor {t}) take the tensor group's layout for the whole plan, "
                    f"so they combine with no 3D grid and no other sub-grid count in this version")
    if grid is not None and grid.x * grid.y * grid.z != t:
        return (f"strategy['regions']: the pinned 3D grid {grid.x}x{grid.y}x{grid.z} has {grid.x * grid.y * grid.z} "
                f"ranks, the tensor group {t}; give x·y·z = {t}")
    return None
