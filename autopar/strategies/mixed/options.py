"""One region's options in a mixed plan: what running it each way costs on one
``data × tensor`` configuration (``docs/mixed_plans.md``).

A tensor region may run whole on every rank of the tensor group (``replicate``), split
over it Megatron-style (``megatron``, megatron §2.3), or, with a ``Gx × Gy × Gz`` grid
of the group, as AxoNN's 3D layers (``tensor3d``, axonn §III; :class:`RowsOverZ` with
``Gz > 1``); a multi-branch region may spread its branches over the group or over
``g < t`` sub-grids of it (``dsp``, SUPER §III-B with ``g = t``;
``shared.branch_cost.dsp_tensor_cost``). Each option's cost holds the region's conversion from
and to the replicated layout; identical regions share their options (memoised per
class of region). Pins restrict the options (:meth:`RegionOptions.allowed`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autopar.grid import Grid3D, MeshAxis
from autopar.ir import tensor_spec
from autopar.passes.analysis.ops import is_dropout, match_linear
from autopar.planning.model import padded_vocab, padding_details, region_sizes, split_factor
from autopar.planning.plan import Cost
from autopar.planning.strategy import PlanError
from autopar.strategies.family import PlanContext
from autopar.strategies.shared.branch_cost import dsp_tensor_cost
from autopar.strategies.shared.branches import branches_of, unsplittable
from autopar.strategies.shared.mesh import rule_gaps, split_cost
from autopar.strategies.mixed.structure import inner_regions, region_structure, representatives
from autopar.strategies.shared.grid3d.cost import rows_boundary_comm
from autopar.strategies.shared.grid3d.pricing import SPLIT_KINDS, Form3D, GridPricer, Layout3D
from autopar.strategies.shared.grid3d.rewrite import region_linears


class RowsOverZ(Form3D):
    """AxoNN's layer in a mixed plan: on a grid with ``Gz > 1`` a 3D region cuts its rows
    to z blocks where the flow enters and all-gathers them over z where it leaves
    (``grid3d.cost.rows_boundary_comm``), besides the y re-layouts."""

    def boundary(self, enters: float, leaves: float, grid: Grid3D, hw) -> tuple[dict[str, float], str]:
        by_axis, text = super().boundary(enters, leaves, grid, hw)
        if grid.z > 1:
            by_axis[MeshAxis.Z] = rows_boundary_comm(enters, leaves, grid, hw)
            text += "; rows cut to z blocks on entry (backward all-gather over z), all-gathered over z on exit"
        return by_axis, text


MIXED_AXONN = RowsOverZ()


@dataclass
class Option:
    """One way to run one region: its cost (compute, communication by group), the
    parameter elements and activation bytes a rank holds, and the plan's details."""

    cost: Cost
    params: float
    activations: float
    details: dict = field(default_factory=dict)
    reason: str = ""
    gathered: float = 0.0  # of the activations: a 3D region's all-gathered weights kept for backward


@dataclass
class Step:
    """One step of the programme: a tensor region, or a multi-branch region (with the
    tensor regions inside it)."""

    region: object
    options: dict[str, Option]
    inner: list["Step"] = field(default_factory=list)

    @property
    def branching(self) -> bool:
        return self.region.kind == "fork_join"

    def rest(self) -> list[str]:
        """A multi-branch region's nodes outside the tensor regions inside it."""
        inner = {n for s in self.inner for n in s.region.nodes}
        return [n for n in self.region.nodes if n not in inner]


def seconds_of(option: Option) -> float:
    """An option's compute and communication seconds."""
    return option.cost.compute_s + option.cost.total_comm_s


class RegionOptions:
    """The options of every region on one ``data × tensor`` (with one ``Gx × Gy × Gz``
    grid of the tensor group for 3D regions, or none), as the pins leave them, and the
    programme's steps over them (:meth:`steps`)."""

    def __init__(self, ctx: PlanContext, data: int, tensor: int, grid: Grid3D | None,
                 whole: dict[str, str] | None = None, subgrids: int = 0):
        self.model, self.hw = ctx.model, ctx.hw
        self.data, self.tensor, self.grid = data, tensor, grid
        forced = ctx.forced
        self.pins = forced.regions if forced is not None else ()
        # a pipeline forced onto a grid without pins ({"pipeline": p, "x": .., "y": ..}):
        # every region the grid can split is split on it, the rest replicated
        self.grid_only = forced is not None and forced.pipeline > 1 and forced.grid is not None and not self.pins
        self.gaps = rule_gaps(self.model) if tensor > 1 else {}
        # regions kept whole, and why (a pipeline's: tied across stages, or cut by a stage)
        self.whole = whole or {}
        # D&SP's sub-grids of the tensor group (0: each rank one; g < t: g of t/g ranks)
        self.subgrids = subgrids
        # the model's memo of options, one dict per configuration (hashing the hardware
        # once here, not once per region asked)
        memo = self.model.memo("mixed.options")
        self.memo = memo.setdefault(("options", data, tensor, grid, self.hw, self.grid_only), {})
        self.dsp_memo = memo.setdefault(("dsp", data, tensor, self.hw), {})
        if grid is not None:
            self.grid_pricer = GridPricer(self.model, self.hw, grid, MIXED_AXONN, False, True)
            base = self.grid_pricer.layout  # every boundary priced; the programme credits direct ones
            self.grid_pricer.layout = Layout3D(base.splittable, set(), set(), {})

    def pin_of(self, region):
        """The pin that names ``region`` (the first), or None."""
        if not self.pins:
            return None
        return next((p for p in self.pins if p.matches(region)), None)

    def of(self, r) -> dict[str, Option]:
        """Region ``r``'s options, priced once per class of identical regions."""
        key = (self.model.region_class[r.id], r.id in self.gaps, r.id in self.whole)
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = self._options(r)
        return found  # shared by the class: read only (the table copies what it keeps)

    def _options(self, r) -> dict[str, Option]:
        model, hw, data, t = self.model, self.hw, self.data, self.tensor
        params = float(model.region_param_elems(r.id))
        out = {"replicate": Option(Cost(model.seconds(r.nodes, hw, 1 / data), {}, 0.0), params,
                                   model.activation_bytes(r.nodes, 1 / data),
                                   reason=self.whole.get(r.id, "runs whole on every rank"))}
        if r.id in self.whole:
            return out
        # forced onto a grid, a region the grid cannot split (a vocabulary) may still take Megatron
        divisible = all(size % t == 0 for _, size in region_sizes(r)) and r.id not in self.gaps
        if divisible and (not self.grid_only or r.kind not in SPLIT_KINDS):
            pad = split_factor(r, t)  # a padded vocabulary's V'/t rows per rank
            out["megatron"] = Option(split_cost(model, hw, r, data, t), params / t * pad,
                                     model.activation_bytes(r.nodes, pad / (data * t)), padding_details(r, t),
                                     reason=f"Megatron over tensor={t}" + (
                                         f"; vocab {r.details['vocab_size']} padded to {padded_vocab(r, t)}"
                                         if padded_vocab(r, t) else ""))
        g = self.grid
        if g is not None and r.kind in SPLIT_KINDS and self.rows_blocker(r) is None:
            priced = self.grid_pricer.region(r)
            if priced.choice.strategy == "tensor3d":
                out["tensor3d"] = Option(priced.choice.cost, priced.param_elems, priced.activation_bytes,
                                         {**priced.choice.details, "grid": f"{g.x}x{g.y}x{g.z}x{g.data}"},
                                         f"3D grid {g.x}x{g.y}x{g.z} of the tensor group"
                                         + (" (its rows split over z)" if g.z > 1 else ""), priced.gathered_bytes)
                if self.grid_only:  # forced onto the grid where it can run
                    del out["replicate"]
        return out

    def can_mix(self) -> bool:
        """Whether the programme could choose a mixed plan here at all (the search skips
        it otherwise, as it would be listed as a single-family plan): with a grid, some
        region takes it; with D&SP sub-grids, some multi-branch region takes them;
        else the options offer two families. One region of each class is asked."""
        offered = set()
        for r in representatives(self.model):
            offered.update(k for k in self.of(r) if k != "replicate")
        if self.grid is not None and "tensor3d" not in offered:
            return False
        dsp = any(self.dsp_option(fj) is not None for _, fj, _ in region_structure(self.model)[1])
        if self.subgrids:
            return dsp
        return len(offered) + dsp >= 2

    def rows_blocker(self, r) -> str | None:
        """Why the grid's z cannot split region ``r``'s rows (None: it can, or Gz = 1):
        the rows of a data replica (dim 0 of the region's input) must divide by Gz."""
        g = self.grid
        if g is None or g.z == 1:
            return None
        first = match_linear(self.model.table[region_linears(r)[0][0]], self.model.gm).input
        rows = tensor_spec(first).shape[0] // self.data
        if rows % g.z:
            return f"its {rows} rows per data rank (dim 0 of its input) do not divide by Gz = {g.z}"
        return None

    def dsp_option(self, fj, g: int | None = None) -> Option | None:
        """A multi-branch region's branches over ``g`` sub-grids of the tensor group
        (None: ``t``, each rank a sub-grid), or None when it cannot (priced once per
        region, mesh and ``g``)."""
        g = g or self.subgrids or self.tensor
        key = (fj.id, g)
        if fj.id in self.whole or self.grid_only:
            return None
        if key not in self.dsp_memo:
            self.dsp_memo[key] = self._dsp_option(fj, g)
        return self.dsp_memo[key]

    def _dsp_option(self, fj, g: int) -> Option | None:
        """SUPER §III-B over the tensor group with ``g`` sub-grids. With ``g < t`` each
        sub-grid has ``t/g`` ranks that split its branches' regions Megatron-style
        (their compute over ``t/g``; each split region's f and g all-reduces over the
        sub-grid, :meth:`inner_split`), the branches spread as ``dsp_tensor_cost``
        spreads them over ``g`` ranks."""
        model, hw, t, data = self.model, self.hw, self.tensor, self.data
        d = fj.details
        if self.dsp_blocker(fj, g) is not None:
            return None
        b = branches_of(model, fj)
        cost = dsp_tensor_cost(b.works, b.counts, b.fork_bytes, b.join_bytes, d["join_op"], data, g, hw)
        in_branches = {n for branch in d["branches"] for n in branch}
        rest = [n for n in fj.nodes if n not in in_branches]
        mine = [n for branch, owner in enumerate(cost.assignment) if owner == 0 for n in d["branches"][branch]]
        share = ", ".join(f"{'t' if g == t else 'sub-grid '}{s}:{[i for i, o in enumerate(cost.assignment) if o == s]}"
                          for s in range(g))
        compute, comm, params = cost.compute_s, dict(cost.comm_s), cost.branch_param_elems_per_rank
        details = {"subgrids": g, "assignment": list(cost.assignment), "branch_params": b.params,
                   "over": MeshAxis.TENSOR, "join": d["join_op"]}
        what = f"D&SP: branches over the {t} tensor ranks ({share})"
        if g < t:  # Megatron inside each sub-grid
            inner = self.inner_split(fj, g, cost.assignment)
            split = [r for r, _ in inner.values() if r is not None]
            compute = compute - sum(model.seconds(r.nodes, hw, 1 / data) for r in split) / g * (1 - g / t)
            comm[MeshAxis.TENSOR] = comm.get(MeshAxis.TENSOR, 0.0) + sum(
                split_cost(model, hw, r, data, t // g).total_comm_s for r in split) / g
            params = params - sum(model.region_param_elems(r.id) for r in split) / g * (1 - g / t)
            details["inner"] = {rid: s for rid, (r, s) in inner.items() if r is not None}
            what = (f"D&SP: branches over {g} sub-grids of {t // g} tensor ranks ({share}), their regions split "
                    f"Megatron-style inside a sub-grid")
        return Option(Cost(compute + model.seconds(rest, hw, 1 / data), comm, 0.0), params,
                      model.activation_bytes(mine + rest, 1 / data), details, what)

    def dsp_blocker(self, fj, g: int) -> str | None:
        """Why D&SP cannot spread ``fj``'s branches over ``g`` sub-grids of the tensor
        group (None: it can)."""
        d = fj.details
        if fj.id in self.whole:
            return self.whole[fj.id]
        if len(d["branches"]) < g:
            return f"its {len(d['branches'])} branches cannot fill {g} sub-grids of the tensor group"
        if unsplittable(fj) or any(len(names) != 1 for names in d["branch_outputs"]):
            return "its branches read values from outside the region or have several outputs"
        dropout = next((n for branch in d["branches"] for n in branch
                        if is_dropout(self.model.table[n], self.model.gm)), None)
        if dropout is not None:
            return (f"its branches hold dropout ({dropout}): the tensor ranks run different branches, so they "
                    f"would draw their later dropout masks from different points of the stream")
        return None

    def inner_split(self, fj, g: int, assignment) -> dict:
        """The tensor regions inside ``fj``'s branches when ``g < t`` sub-grids run them:
        region id -> (the region, when Megatron splits it over its sub-grid's ``t/g``
        ranks, else None; the sub-grid). A region splits where ``t/g`` divides its
        sizes and no pin keeps it whole."""
        t, out = self.tensor, {}
        branch_of = {n: i for i, branch in enumerate(fj.details["branches"]) for n in branch}
        for r in inner_regions(self.model, fj):
            owners = {branch_of.get(n) for n in r.nodes}
            if len(owners) != 1 or None in owners:
                continue
            pin = self.pin_of(r)
            splits = (all(size % (t // g) == 0 for _, size in region_sizes(r)) and r.id not in self.gaps
                      and (pin is None or pin.family == "megatron"))
            out[r.id] = (r if splits else None, assignment[owners.pop()])
        return out

    def steps(self) -> list[Step]:
        """The regions in graph order; each multi-branch region D&SP can split a step of
        its own holding the tensor regions inside it. Without pins, found once per
        configuration and regions kept whole (read only)."""
        if self.pins:
            return self._steps()
        key = ("steps", tuple(sorted(self.whole.items())), self.subgrids)
        if key not in self.memo:
            self.memo[key] = self._steps()
        return self.memo[key]

    def _steps(self) -> list[Step]:
        """:meth:`steps`, built."""
        start, branching = region_structure(self.model)
        placed: set[str] = set()
        steps = []
        for first, fj, inner in branching:
            pin = self.pin_of(fj)
            option = self.dsp_option(fj, pin.subgrids if pin is not None and pin.family == "dsp" else None)
            if option is None:
                if pin is not None and pin.family != "replicate":
                    g = pin.subgrids if pin.family == "dsp" and pin.subgrids else self.tensor
                    why = self.dsp_blocker(fj, g) or "a grid-forced plan"
                    raise PlanError(f"region {fj.id}: pinned to {pin.describe()} ({pin.pattern!r}), which cannot run "
                                    f"it: {why}")
                continue
            steps.append((first, Step(fj, {"dsp": option}, [Step(r, self.of(r)) for r in inner])))
            placed.update(r.id for r in inner)
        steps += [(start[r.id], Step(r, self.of(r))) for r in self.model.regions if r.id not in placed]
        return [step for _, step in sorted(steps, key=lambda x: x[0])]

    def allowed(self, step: Step) -> dict[str, Option]:
        """The options a pin leaves, or a PlanError naming the region and why."""
        pin = self.pin_of(step.region)
        if pin is None:
            return step.options
        family = pin.family
        if family == "replicate" and step.branching:  # a multi-branch region left open
            return {}
        if family in step.options:
            return {family: step.options[family]}
        r = step.region
        if r.kind == "fork_join":
            why = "a multi-branch region is split by D&SP ('dsp') or left to the regions inside it ('replicate')"
        elif family == "dsp":
            why = f"it is no multi-branch region (a {r.kind})"
        elif r.id in self.whole:
            why = self.whole[r.id]
        elif family == "megatron":
            sizes = ", ".join(f"{n} {s}" for n, s in region_sizes(r))
            why = self.gaps.get(r.id) or f"{sizes or 'nothing'} not divisible by the tensor degree {self.tensor}"
        elif family == "tensor3d":
            why = (f"a {r.kind} region has no 3D layout" if r.kind not in SPLIT_KINDS else
                   "no 3D grid" if self.grid is None else
                   self.rows_blocker(r) or "the plan's grid does not divide its sizes")
        else:
            why = "not offered"
        raise PlanError(f"region {r.id}: pinned to {pin.describe()} ({pin.pattern!r}), which cannot run it: {why}")

