"""A lower bound on a mixed configuration's step without the programme
(``docs/planner.md`` "Bounds").

The programme's seconds (:func:`~.solver.solve`) are the chosen options' seconds less
the 3D boundary credits (:mod:`.credits`); the region table adds the nodes outside every
region and the data group's exposed all-reduce (never negative); the memory levers only
add time. So the step is at least, per region, its cheapest option with every credit it
could take subtracted, plus the outside nodes' compute where no credit can save it:

* a credit between two 3D regions saves the second's entry re-layout and at most the
  first's exit all-gather, over y (:func:`~autopar.strategies.shared.grid3d.cost.boundary_comm`,
  one all-gather each way) and with ``Gz > 1`` over z
  (:func:`~autopar.strategies.shared.grid3d.cost.rows_boundary_comm`); assigning each half to
  its region, no region is credited more than its own boundary on both axes plus one
  empty all-gather's latency per side (``boundary_comm(0, 0)``);
* with ``Gz > 1`` a credit also saves work of the outside nodes between two 3D regions,
  at most all of it: the outside nodes then count 0.

Identical regions share their options (:meth:`~.options.RegionOptions.of`), so the
bound is a sum over the classes of regions entering and leaving with the same bytes.
None where the bound does not hold as written: pins, regions kept whole, D&SP sub-grids
or multi-branch steps (the programme's ``open`` choice)."""
from __future__ import annotations

from autopar.ir import tensor_spec
from autopar.passes.analysis.ops import match_linear
from autopar.planning.model import ModelFacts
from autopar.strategies.mixed.options import RegionOptions, seconds_of
from autopar.strategies.mixed.structure import region_structure
from autopar.strategies.mixed.tables import unregioned
from autopar.strategies.shared.grid3d.cost import boundary_comm, rows_boundary_comm
from autopar.strategies.shared.grid3d.pricing import SPLIT_KINDS
from autopar.strategies.shared.grid3d.rewrite import region_linears


def lower_bound(options: RegionOptions) -> float | None:
    """Seconds the configuration's step takes at least (module docstring), or None."""
    model, hw, grid = options.model, options.hw, options.grid
    if options.pins or options.whole or options.subgrids or region_structure(model)[1]:
        return None
    total = 0.0
    for rep, entry, exit_, count in _classes(model, options.gaps):
        cheapest = None
        for name, option in options.of(rep).items():
            seconds = seconds_of(option)
            if name == "tensor3d":
                seconds -= (boundary_comm(entry, exit_, grid, hw) + boundary_comm(0.0, 0.0, grid, hw)
                            + rows_boundary_comm(entry, exit_, grid, hw))
            cheapest = seconds if cheapest is None else min(cheapest, seconds)
        total += cheapest * count
    if grid is None or grid.z == 1:
        total += model.seconds(unregioned(model), hw, 1 / options.data)
    return total


def _classes(model: ModelFacts, gaps: dict) -> list[tuple[object, float, float, int]]:
    """The regions by what their options and boundaries depend on (their class, whether a
    rule gap keeps them from Megatron, the bytes entering and leaving their 3D layers):
    ``(a representative, entry bytes, exit bytes, how many)``, once per model and gaps."""
    def find():
        groups: dict[tuple, list] = {}
        for r in model.regions:
            entry = exit_ = 0.0
            if r.kind in SPLIT_KINDS:
                linears = region_linears(r)
                entry = float(tensor_spec(match_linear(model.table[linears[0][0]], model.gm).input).nbytes)
                exit_ = float(tensor_spec(model.table[linears[-1][0]]).nbytes)
            key = (model.region_class[r.id], r.id in gaps, entry, exit_)
            if key in groups:
                groups[key][3] += 1
            else:
                groups[key] = [r, entry, exit_, 1]
        return [tuple(g) for g in groups.values()]
    return model.fact(("mixed.bound_classes", tuple(sorted(gaps))), find)
