"""The region table of a mixed plan: the programme's choice
(:func:`autopar.strategies.mixed.solver.solve`) as the plan's rows, each region's
choice, cost, alternatives and why, with its totals: compute and communication by
group less the 3D boundary credits, the nodes outside every region on every rank, the
data group's exposed all-reduce (:func:`autopar.planning.model.exposed_data_comm`) and
the memory per rank (``cost.training_memory``).
"""
from __future__ import annotations

from autopar.cost import model as cost_model
from autopar.grid import MeshAxis
from autopar.planning.model import exposed_data_comm
from autopar.planning.plan import Cost, RegionChoice
from autopar.strategies.family import RegionTable
from autopar.strategies.shared.branches import branches_of
from autopar.strategies.mixed.credits import BoundaryCredits
from autopar.strategies.mixed.options import Option, RegionOptions, Step, seconds_of
from autopar.strategies.mixed.solver import open_region
from autopar.strategies.mixed.structure import params_outside_regions


def region_table(options: RegionOptions, credits: BoundaryCredits, path: list, materialize: bool = True
                 ) -> RegionTable:
    """The region table of the programme's choice ``path`` (:func:`~.solver.solve`);
    ``materialize=False`` (the search) gives the totals alone, without the rows."""
    model, hw, data, t = options.model, options.hw, options.data, options.tensor
    rows, covered = [], set()
    compute = activations = local = gathered = 0.0
    comm: dict[str, float] = {}
    for step, name in path:
        r = step.region
        if name == "open":
            rest = step.rest()
            option = Option(Cost(model.seconds(rest, hw, 1 / data), {}, 0.0), 0.0,
                            model.activation_bytes(rest, 1 / data),
                            reason="branches not split: the regions inside choose for themselves")
            covered.update(rest)
        else:
            option = step.options[name]
            covered.update(r.nodes)
        compute += option.cost.compute_s
        for k, v in option.cost.comm_s.items():
            comm[k] = comm.get(k, 0.0) + v
        activations += option.activations
        gathered += option.gathered
        local += option.params
        if materialize:
            rows.append(_row(options, credits, path, step, name, option))
            if step.branching and name == "dsp":
                rows += _inner_rows(t, step, option)
    for a, b in _pairs(path):
        for axis, saved in credits.by_group(a[1], a[0].region, b[1], b[0].region).items():
            if axis == "compute":
                compute -= saved
            else:
                comm[axis] = comm.get(axis, 0.0) - saved
    outside = [n for n in unregioned(model) if n not in covered]
    outside_compute = model.seconds(outside, hw, 1 / data)
    compute += outside_compute
    # branch parameters outside the inner regions are a D&SP region's (its row holds them)
    outside_params = params_outside_regions(model) - sum(
        sum(branches_of(model, s.region).counts) - sum(model.region_param_elems(i.region.id) for i in s.inner)
        for s, name in path if s.branching and name == "dsp")
    local += outside_params
    outside_act = model.activation_bytes(outside, 1 / data)
    activations += outside_act
    if materialize:
        rows.append(RegionChoice("(outside regions)", "-", "replicate",
                                 Cost(outside_compute, {}, cost_model.training_memory(outside_params, outside_act)),
                                 {}, "not in a splittable region"))
    comm[MeshAxis.DATA] = exposed_data_comm(data, t, local * 4, compute, hw)
    total = Cost(compute, comm, cost_model.training_memory(local, activations))
    return RegionTable(rows, total, compute + sum(comm.values()), local, activations, model.largest_params,
                       gathered_bytes=gathered)


def unregioned(model) -> list[str]:
    """The names of the graph's nodes in no tensor region, in graph order (once per model)."""
    return model.fact("mixed.unregioned", lambda: [n.name for n in model.gm.graph.nodes
                                                   if n.name not in model.node_region])


def _row(options: RegionOptions, credits: BoundaryCredits, path, step: Step, name: str, option: Option
         ) -> RegionChoice:
    """One region's row of the plan: its choice, cost, alternatives and why."""
    r = step.region
    if step.branching:
        alternatives = {"replicate": open_region(options, credits, step, "start", None)[0],
                        "dsp": seconds_of(step.options["dsp"])}
    else:
        alternatives = {k: seconds_of(o) for k, o in step.options.items()}
    strategy, reason, details = ("replicate" if name == "open" else name), option.reason, dict(option.details)
    if name == "tensor3d":  # options are shared by a class: this region's layers
        details = {**options.grid_pricer.region(r).choice.details, "grid": option.details["grid"],
                   "boundary": _boundary_text(credits, path, step)}
    pin = options.pin_of(r)
    if pin is not None:
        reason = f"pinned by {pin.pattern!r}: " + reason
    elif name != "open" and len(alternatives) > 1:
        reason += "; cheapest predicted step time"
    cost = Cost(option.cost.compute_s, dict(option.cost.comm_s),
                cost_model.training_memory(option.params, option.activations))
    return RegionChoice(r.id, r.kind, strategy, cost, alternatives, reason, details)


def _inner_rows(t: int, step: Step, option: Option) -> list[RegionChoice]:
    """The rows of the tensor regions inside a D&SP region (priced in its row): whole
    on their branch's rank, or with sub-grids of several ranks Megatron-split over
    their sub-grid (``details``: the group ``tensor_sub``, the sub-grid, the degree)."""
    rows = []
    g = option.details["subgrids"]
    inner = option.details.get("inner", {})
    for s in step.inner:
        r = s.region
        if r.id in inner:
            rows.append(RegionChoice(r.id, r.kind, "megatron", Cost(0.0, {}, 0.0), {},
                                     f"inside D&SP region {step.region.id}: Megatron over sub-grid {inner[r.id]} "
                                     f"({t // g} tensor ranks)",
                                     {"group": MeshAxis.TENSOR_SUB, "subgrid": inner[r.id], "degree": t // g}))
        else:
            where = "its branch's rank" if g == t else "every rank of its branch's sub-grid"
            rows.append(RegionChoice(r.id, r.kind, "replicate", Cost(0.0, {}, 0.0), {},
                                     f"inside D&SP region {step.region.id}: runs whole on {where}"))
    return rows


def _boundary_text(credits: BoundaryCredits, path, step) -> str:
    """How a 3D region's input enters and its output leaves, by the credits it shares
    with the regions before and after it."""
    names = [(s, n) for s, n in path if n != "open"]
    index = next(i for i, (s, _) in enumerate(names) if s is step)
    before = names[index - 1] if index else None
    after = names[index + 1] if index + 1 < len(names) else None
    enters = credits.by_group(before[1], before[0].region, "tensor3d", step.region) if before is not None else {}
    leaves = credits.by_group("tensor3d", step.region, after[1], after[0].region) if after is not None else {}
    z = credits.grid.z > 1
    if MeshAxis.Y in enters:
        entry = "read split over y from the previous 3D region" + (" (rows over z)" if z else "")
    else:
        entry = ("cut to y blocks (backward all-gather over y)"
                 + ("; rows kept split over z from the previous 3D region" if MeshAxis.Z in enters else
                    "; rows cut to z blocks (backward all-gather over z)" if z else ""))
    if MeshAxis.Y in leaves:
        exit_ = "read split over y by the next 3D region"
    else:
        exit_ = "all-gathered over y" + (", its rows kept split over z to the next 3D region" if MeshAxis.Z in leaves
                                         else ", then its rows over z" if z else "")
    return f"input {entry}, output {exit_}"


def _pairs(path):
    """Consecutive (step, option) pairs of the flat path, multi-branch rows skipped."""
    flat = [(s, n) for s, n in path if n != "open"]
    return zip(flat, flat[1:])

