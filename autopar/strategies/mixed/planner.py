"""Planning mixed plans: each region its own family over one tensor group (``docs/mixed_plans.md``).

On ``world = data × tensor`` the ``t`` ranks of a tensor group are one model-parallel
group that every region may use its own way:

* ``replicate``: the region runs whole on every rank of the group;
* ``megatron``: split over the ``t`` ranks (megatron §2.3);
* ``tensor3d``: split over the group viewed as AxoNN's ``Gx × Gy × Gz`` grid
  (axonn §III; one factorisation of ``t`` per plan, the configuration's; with ``Gz > 1``
  the region splits its rows over z, :class:`RowsOverZ`);
* ``dsp``: a multi-branch region's branches spread over the group, each rank a
  sub-grid (SUPER §III-B with ``g = t``; ``dsp.cost.dsp_tensor_cost``), or over ``g < t``
  sub-grids of ``t/g`` ranks whose branches' regions are Megatron-split inside their
  sub-grid (a configuration's ``tensor_subgrids``; groups ``tensor_seg`` and
  ``tensor_sub``).

Every region keeps the rows of its data replica (the batch is split over the data
ranks only) and meets its neighbours with the activation replicated over the group:
Megatron's f and g, the 3D layers' entry cut and exit all-gather over y, D&SP's fork
all-reduce and join all-gather are each region's conversion from and to that layout,
priced inside its own cost. The other boundary layouts are AxoNN's: a 3D region's
last (transposed) layer leaves its output split over y, which a 3D region whose first
layers read it directly takes as it is (axonn end of §III-B), saving both re-layouts;
and on a grid with ``Gz > 1`` the rows split over z, which stay split through the nodes
between two 3D regions (the residual add, the layer norm), saving both row conversions
and ``1 − 1/Gz`` of those nodes' work.
The search is therefore a dynamic programme over the regions in graph order whose
state is the layout the previous region left (replicated, or split over y or its rows
over z by a 3D region): exact for chains of regions; regions on parallel branches of
the region graph are never directly connected, so they meet at the replicated layout
and the programme prices that. A multi-branch region is one step of the programme with two
choices: D&SP (its inner regions run whole on their branch's rank, or Megatron-split
over their sub-grid) or open (its inner regions choose as any other). Identical
repeated blocks are priced once (the option costs are memoised per class of region),
so planning time grows linearly in layers.

A pipeline's stages are mixed plans too (:class:`StagePlans`): the same programme at one
microbatch's rows, its choices summed per stage for the pipeline family's schedule.

Pins (``strategy={"regions": {PATTERN: SPEC}}``, :class:`~autopar.planning.strategy.Pin`)
restrict a region's choices to one; a pin that cannot run raises :class:`PlanError`
naming the region.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from autopar.cost import model as cost_model
from autopar.grid import Grid3D
from autopar.passes.analysis.ops import is_dropout, match_linear
from autopar.ir import tensor_spec
from autopar.planning.model import (ModelFacts, exposed_data_comm, padded_vocab, padding_details, region_sizes,
                                    split_factor)
from autopar.planning.plan import Cost, Plan, RegionChoice, mixed_form
from autopar.planning.strategy import PlanError, Strategy, divisors
from autopar.strategies.shared import levers
from autopar.strategies.shared.batch_norms import batch_norms
from autopar.strategies.dsp.cost import dsp_tensor_cost
from autopar.strategies.dsp.planner import branches_of, subgraph_regions, unsplittable
from autopar.strategies.family import CompileHooks, PlanContext, Priced, RegionTable, mesh_plan, rejected, too_big
from autopar.strategies.megatron.planner import check_forced_batch, judge, rule_gaps, split_cost
from autopar.strategies.pipeline.cost import spread_over_ends
from autopar.strategies.tensor3d.cost import boundary_comm, rows_boundary_comm
from autopar.strategies.tensor3d.planner import SPLIT_KINDS, Form3D, GridPricer, Layout3D, region_linears


class RowsOverZ(Form3D):
    """AxoNN's layer in a mixed plan: on a grid with ``Gz > 1`` a 3D region cuts its rows
    to z blocks where the flow enters and all-gathers them over z where it leaves
    (``tensor3d.cost.rows_boundary_comm``), besides the y re-layouts."""

    def boundary(self, enters: float, leaves: float, grid: Grid3D, hw) -> tuple[dict[str, float], str]:
        by_axis, text = super().boundary(enters, leaves, grid, hw)
        if grid.z > 1:
            by_axis["z"] = rows_boundary_comm(enters, leaves, grid, hw)
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


class MixedPricer:
    """The options of every region on one ``data × tensor`` (with one ``Gx × Gy`` grid of
    the tensor group for 3D regions, or none) and the programme over them."""

    def __init__(self, ctx: PlanContext, data: int, tensor: int, grid: Grid3D | None,
                 whole: dict[str, str] | None = None, subgrids: int = 0):
        self.ctx, self.model, self.hw = ctx, ctx.model, ctx.hw
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
        self.memo = self.model.memo("mixed.options")
        self.links = self.model.memo("mixed.links")
        self.credits = self.model.memo("mixed.credits")
        self.gaps_between = self.model.memo("mixed.gaps")
        if grid is not None:
            self.pricer = GridPricer(self.model, self.hw, grid, MIXED_AXONN, False, True)
            base = self.pricer.layout  # every boundary priced; the programme credits direct ones
            self.pricer.layout = Layout3D(base.splittable, set(), set(), {})

    # ------------------------------------------------------------------ one region's options
    def pin_of(self, region):
        if not self.pins:
            return None
        return next((p for p in self.pins if p.matches(region)), None)

    def options(self, r) -> dict[str, Option]:
        key = (self.model.region_class[r.id], self.data, self.tensor, self.grid, self.hw, r.id in self.gaps,
               r.id in self.whole, self.grid_only)
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
            priced = self.pricer.region(r)
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
        for r in _representatives(self.model):
            offered.update(k for k in self.options(r) if k != "replicate")
        if self.grid is not None and "tensor3d" not in offered:
            return False
        dsp = any(self.dsp_option(fj) is not None for _, fj, _ in _structure(self.model)[1])
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
        key = (fj.id, self.data, self.tensor, self.hw, g)
        if fj.id in self.whole or self.grid_only:
            return None
        if key not in self.memo:
            self.memo[key] = self._dsp_option(fj, g)
        return self.memo[key]

    def _dsp_option(self, fj, g: int) -> Option | None:
        """SUPER §III-B over the tensor group with ``g`` sub-grids. With ``g < t`` each
        sub-grid has ``t/g`` ranks that split its branches' regions Megatron-style
        (their compute over ``t/g``; each split region's f and g all-reduces over the
        sub-grid, :func:`inner_split`), the branches spread as ``dsp_tensor_cost``
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
        details = {"subgrids": g, "assignment": list(cost.assignment), "branch_params": b.params, "over": "tensor",
                   "join": d["join_op"]}
        what = f"D&SP: branches over the {t} tensor ranks ({share})"
        if g < t:  # Megatron inside each sub-grid
            inner = self.inner_split(fj, g, cost.assignment)
            split = [r for r, _ in inner.values() if r is not None]
            compute = compute - sum(model.seconds(r.nodes, hw, 1 / data) for r in split) / g * (1 - g / t)
            comm["tensor"] = comm.get("tensor", 0.0) + sum(
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
        for r in _inner(self.model, fj):
            owners = {branch_of.get(n) for n in r.nodes}
            if len(owners) != 1 or None in owners:
                continue
            pin = self.pin_of(r)
            splits = (all(size % (t // g) == 0 for _, size in region_sizes(r)) and r.id not in self.gaps
                      and (pin is None or pin.family == "megatron"))
            out[r.id] = (r if splits else None, assignment[owners.pop()])
        return out

    # ------------------------------------------------------------------ the programme
    def steps(self) -> list[Step]:
        """The regions in graph order; each multi-branch region D&SP can split a step of
        its own holding the tensor regions inside it."""
        start, branching = _structure(self.model)
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
            steps.append((first, Step(fj, {"dsp": option}, [Step(r, self.options(r)) for r in inner])))
            placed.update(r.id for r in inner)
        steps += [(start[r.id], Step(r, self.options(r))) for r in self.model.regions if r.id not in placed]
        return [step for _, step in sorted(steps, key=lambda x: x[0])]

    def allowed(self, step: Step) -> dict[str, Option]:
        """The options a pin leaves, or a PlanError naming the region and why."""
        pin = self.pin_of(step.region)
        if pin is None:
            return step.options
        family = {"3d": "tensor3d"}.get(pin.family, pin.family)
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

    def solve(self) -> tuple[list[tuple[Step, str]], float]:
        """The programme: per step the option chosen (``"open"`` for a multi-branch region
        whose inner regions choose for themselves), minimising the summed seconds with
        the 3D boundary credits; ties to the option first in sorted order."""
        flat: list[tuple[Step, list[tuple[str, Option | None]]]] = []
        for step in self.steps():
            allowed = self.allowed(step)
            if not step.branching:
                flat.append((step, sorted(allowed.items())))
                continue
            pinned = self.pin_of(step.region) is not None
            # Megatron pins inside D&SP's sub-grids of several ranks split there
            sub = "dsp" in step.options and step.options["dsp"].details["subgrids"] < self.tensor
            inner_pins = [(s.region.id, p) for s in step.inner
                          if (p := self.pin_of(s.region)) is not None and p.family != "replicate"
                          and not (sub and p.family == "megatron")]
            if pinned and allowed and inner_pins:
                rid, pin = inner_pins[0]
                raise PlanError(f"region {step.region.id}: pinned to D&SP, which runs {rid} whole on one rank, but "
                                f"{rid} is pinned to {pin.describe()}")
            choices = [("dsp", allowed["dsp"])] if "dsp" in allowed and not inner_pins else []
            if not (pinned and allowed):
                choices.append(("open", None))
            flat.append((step, sorted(choices, key=lambda c: c[0])))
        # state key: (option, region id) of the step before -> (seconds, path, state)
        best: dict[tuple, tuple[float, list, tuple]] = {("start", None): (0.0, [], ("start", None))}
        for step, choices in flat:
            nxt: dict[tuple, tuple[float, list, tuple]] = {}
            for seconds, path, (prev, prev_region) in best.values():
                for name, option in choices:
                    if name == "open":
                        cost, inner_path, last = self._open(step, prev, prev_region)
                        state = last or ("replicate", None)
                        total, new_path = seconds + cost, path + [(step, "open")] + inner_path
                    else:
                        total = seconds + _seconds(option) - self._credit(prev, prev_region, name, step.region)
                        state, new_path = (name, step.region), path + [(step, name)]
                    # only a 3D region's exit changes what the next step pays
                    key = (state[0], state[1].id) if state[0] == "tensor3d" else ("other", None)
                    if key not in nxt or total < nxt[key][0] * (1 - 1e-12):
                        nxt[key] = (total, new_path, state)
            best = nxt
        seconds, path, _ = min(best.values(), key=lambda v: v[0])
        return path, seconds

    def _rest(self, step: Step) -> list[str]:
        """A multi-branch region's nodes outside the tensor regions inside it."""
        inner = {n for s in step.inner for n in s.region.nodes}
        return [n for n in step.region.nodes if n not in inner]

    def _open(self, step: Step, prev: str, prev_region):
        """A multi-branch region left open: its nodes outside the inner regions on every
        rank, and its inner regions in order, each its cheapest allowed option given the
        one before (a small programme of its own)."""
        total, path, last = self.model.seconds(self._rest(step), self.hw, 1 / self.data), [], None
        p, pr = prev, prev_region
        for s in step.inner:
            allowed = self.allowed(s)
            name, option = min(sorted(allowed.items()),
                               key=lambda kv: _seconds(kv[1]) - self._credit(p, pr, kv[0], s.region))
            total += _seconds(option) - self._credit(p, pr, name, s.region)
            path.append((s, name))
            p, pr, last = name, s.region, (name, s.region)
        return total, path, last

    def _credit(self, prev: str, prev_region, name: str, region) -> float:
        """What two 3D regions save where the first's transposed layer feeds the second's
        plain layers directly (axonn end of §III-B): the second's entry cut and, when
        nothing else reads it, the first's exit all-gather (over y, and with Gz > 1 the
        rows' over z too)."""
        return sum(self._credits(prev, prev_region, name, region).values())

    def _credits(self, prev: str, prev_region, name: str, region) -> dict[str, float]:
        """:meth:`_credit` by group (``compute``: seconds of work saved)."""
        if prev != "tensor3d" or name != "tensor3d" or self.grid is None:
            return {}
        link = self._link(prev_region, region)
        grid, hw = self.grid, self.hw
        if link is None:
            return self._kept_rows(prev_region, region) if grid.z > 1 else {}
        key = (link, grid, hw)
        credit = self.credits.get(key)
        if credit is None:
            in_bytes, out_bytes = link
            credit = self.credits[key] = {
                "y": boundary_comm(in_bytes, 0.0, grid, hw) + boundary_comm(0.0, out_bytes, grid, hw),
                **({"z": rows_boundary_comm(in_bytes, out_bytes, grid, hw)} if grid.z > 1 else {})}
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
        key = ("rows", sig, in_bytes, out_bytes, grid, hw)
        credit = self.credits.get(key)
        if credit is None:
            credit = self.credits[key] = {
                "z": rows_boundary_comm(in_bytes, out_bytes, grid, hw),
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
            order, (_, branching) = _order(model), _structure(model)
            end = max(order[n] for n in prev_region.nodes)
            start = min(order[n] for n in region.nodes)
            gap = [n for n in _names(model)[end + 1:start] if n not in model.node_region]
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

    # ------------------------------------------------------------------ the table
    def table(self, materialize: bool = True) -> RegionTable:
        """The region table of the programme's choice; ``materialize=False`` (the search)
        keeps the 3D regions' layer details of their class's representative."""
        path, _ = self.solve()
        model, hw, data, t = self.model, self.hw, self.data, self.tensor
        # the families the programme chose (a multi-branch region left open adds none)
        self.uses = {name for _, name in path if name != "open"}
        rows, covered = [], set()
        compute = activations = local = gathered = 0.0
        comm: dict[str, float] = {}
        for step, name in path:
            r = step.region
            if name == "open":
                rest = self._rest(step)
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
                rows.append(self._row(path, step, name, option))
                if step.branching and name == "dsp":
                    rows += self._inner_rows(step, option)
        for a, b in _pairs(path):
            for axis, saved in self._credits(a[1], a[0].region, b[1], b[0].region).items():
                if axis == "compute":
                    compute -= saved
                else:
                    comm[axis] = comm.get(axis, 0.0) - saved
        outside = [n.name for n in model.gm.graph.nodes
                   if n.name not in covered and n.name not in model.node_region]
        outside_compute = model.seconds(outside, hw, 1 / data)
        compute += outside_compute
        # branch parameters outside the inner regions are a D&SP region's (its row holds them)
        outside_params = _outside_params(model) - sum(
            sum(branches_of(model, s.region).counts) - sum(model.region_param_elems(i.region.id) for i in s.inner)
            for s, name in path if s.branching and name == "dsp")
        local += outside_params
        outside_act = model.activation_bytes(outside, 1 / data)
        activations += outside_act
        if materialize:
            rows.append(RegionChoice("(outside regions)", "-", "replicate",
                                     Cost(outside_compute, {}, cost_model.training_memory(outside_params, outside_act)),
                                     {}, "not in a splittable region"))
        comm["data"] = exposed_data_comm(data, t, local * 4, compute, hw)
        total = Cost(compute, comm, cost_model.training_memory(local, activations))
        return RegionTable(rows, total, compute + sum(comm.values()), local, activations, model.largest_params,
                           gathered_bytes=gathered)

    def _row(self, path, step: Step, name: str, option: Option) -> RegionChoice:
        """One region's row of the plan: its choice, cost, alternatives and why."""
        r = step.region
        if step.branching:
            alternatives = {"replicate": self._open(step, "start", None)[0], "dsp": _seconds(step.options["dsp"])}
        else:
            alternatives = {k: _seconds(o) for k, o in step.options.items()}
        strategy, reason, details = ("replicate" if name == "open" else name), option.reason, dict(option.details)
        if name == "tensor3d":  # options are shared by a class: this region's layers
            details = {**self.pricer.region(r).choice.details, "grid": option.details["grid"],
                       "boundary": self._boundary_text(path, step)}
        pin = self.pin_of(r)
        if pin is not None:
            reason = f"pinned by {pin.pattern!r}: " + reason
        elif name != "open" and len(alternatives) > 1:
            reason += "; cheapest predicted step time"
        cost = Cost(option.cost.compute_s, dict(option.cost.comm_s),
                    cost_model.training_memory(option.params, option.activations))
        return RegionChoice(r.id, r.kind, strategy, cost, alternatives, reason, details)

    def _inner_rows(self, step: Step, option: Option) -> list[RegionChoice]:
        """The rows of the tensor regions inside a D&SP region (priced in its row): whole
        on their branch's rank, or with sub-grids of several ranks Megatron-split over
        their sub-grid (``details``: the group ``tensor_sub``, the sub-grid, the degree)."""
        rows, t = [], self.tensor
        g = option.details["subgrids"]
        inner = option.details.get("inner", {})
        for s in step.inner:
            r = s.region
            if r.id in inner:
                rows.append(RegionChoice(r.id, r.kind, "megatron", Cost(0.0, {}, 0.0), {},
                                         f"inside D&SP region {step.region.id}: Megatron over sub-grid {inner[r.id]} "
                                         f"({t // g} tensor ranks)",
                                         {"group": "tensor_sub", "subgrid": inner[r.id], "degree": t // g}))
            else:
                where = "its branch's rank" if g == t else "every rank of its branch's sub-grid"
                rows.append(RegionChoice(r.id, r.kind, "replicate", Cost(0.0, {}, 0.0), {},
                                         f"inside D&SP region {step.region.id}: runs whole on {where}"))
        return rows

    def _boundary_text(self, path, step) -> str:
        names = [(s, n) for s, n in path if n != "open"]
        index = next(i for i, (s, _) in enumerate(names) if s is step)
        before = names[index - 1] if index else None
        after = names[index + 1] if index + 1 < len(names) else None
        enters = self._credits(before[1], before[0].region, "tensor3d", step.region) if before is not None else {}
        leaves = self._credits("tensor3d", step.region, after[1], after[0].region) if after is not None else {}
        z = self.grid.z > 1
        if "y" in enters:
            entry = "read split over y from the previous 3D region" + (" (rows over z)" if z else "")
        else:
            entry = ("cut to y blocks (backward all-gather over y)"
                     + ("; rows kept split over z from the previous 3D region" if "z" in enters else
                        "; rows cut to z blocks (backward all-gather over z)" if z else ""))
        if "y" in leaves:
            exit_ = "read split over y by the next 3D region"
        else:
            exit_ = "all-gathered over y" + (", its rows kept split over z to the next 3D region" if "z" in leaves
                                             else ", then its rows over z" if z else "")
        return f"input {entry}, output {exit_}"


class StagePlans:
    """A pipeline's stages as mixed plans (PTD-P with any family inside its stages,
    ``docs/mixed_plans.md``): the programme of :class:`MixedPricer` over the whole graph
    at one microbatch's rows (``scale = data·m``), its choices summed per stage. A stage
    cut is a replicated boundary (the carried activation is sent whole), so the
    programme's only cross-region credit, AxoNN's split-over-y link, is not taken across
    it: the credits are left out of the stage figures (a conservative price). Regions
    the pipeline keeps whole (tied across stages) and multi-branch regions a cut splits
    are replicated. Recomputing (megatron §3.5) adds one more forward (a third of a
    region's compute) and the all-reduce of g recomputed (half of a region's
    communication), as Megatron's stages price it."""

    def __init__(self, ctx: PlanContext, shape, tensor: int, grid: Grid3D | None, subgrids: int = 0):
        self.ctx, self.shape, self.tensor, self.grid, self.subgrids = ctx, shape, tensor, grid, subgrids
        model = ctx.model
        stage_of = shape.part.stage_of
        self.whole = dict(shape.keep_whole)
        # a tied embedding and head: its nodes on every stage it spans (shape.spanning)
        self.spanning = {r.id: parts for r, parts in shape.spanning}
        # each region's stage as the pipeline found it (a list for a tied vocabulary's ends);
        # a multi-branch region's, that of its first node in graph order
        self.stage = dict(shape.region_stage)
        order = _order(model)
        for fj in _branching(model):
            spans = sorted({stage_of[n] for n in fj.nodes if n in stage_of})
            if len(spans) > 1:
                self.whole[fj.id] = f"pipeline stages {spans} cut it; its branches run whole"
            self.stage[fj.id] = stage_of.get(min(fj.nodes, key=order.__getitem__), 0)
        self.uses: dict[int, set[str]] = {}  # per scale: the families the programme chose

    def tensor_grid(self, scale: int) -> dict:
        """The plan's ``tensor_grid`` at ``scale``: the grid, where a region uses it."""
        g = self.grid
        return {"x": g.x, "y": g.y} if g is not None and "tensor3d" in self.uses.get(scale, ()) else {}

    def pricer(self, scale: int) -> MixedPricer:
        g = self.grid
        return MixedPricer(self.ctx, scale, self.tensor, None if g is None else Grid3D(g.x, g.y, 1, scale),
                           self.whole, self.subgrids)

    def figures(self, scale: int, p: int, recompute: bool):
        """Per stage (for one microbatch of ``1/scale`` of the batch): seconds, their
        communication, the activation bytes saved; per pipeline rank the parameter
        elements it holds, and the elements of the parameters several ranks hold."""
        model, hw, shape = self.ctx.model, self.ctx.hw, self.shape
        path, _ = self.pricer(scale).solve()
        self.uses[scale] = {name for _, name in path}
        stages = len(shape.outside)
        stage_s, stage_comm, stage_act = [0.0] * stages, [0.0] * stages, [0.0] * stages
        covered: set[str] = set()
        factor: dict[str, float] = {}  # parameter (or region) -> the share of it a rank holds
        for step, name in path:
            r = step.region
            if name == "open":
                continue  # its nodes outside the tensor regions are the stage's outside nodes
            option = step.options[name]
            parts = self.spanning.get(r.id)
            again = recompute and parts is None  # the runtime recomputes blocks only, not a tied vocabulary
            comm = option.cost.total_comm_s * (1.5 if again else 1.0)
            compute = option.cost.compute_s * (4 / 3 if again else 1.0)
            ends = (spread_over_ends(model, hw, parts, compute, comm, option.activations) if parts is not None
                    else [(self.stage[r.id], compute, comm, option.activations)])
            for st, c, m, a in ends:
                stage_s[st] += c + m
                stage_comm[st] += m
                stage_act[st] += a
            if step.branching:  # D&SP: the region's nodes and parameters are its option's
                covered.update(r.nodes)
                b = branches_of(model, r)
                share = option.params / max(sum(b.counts), 1)
                factor.update({pn: share for names in b.params for pn in names})
            else:
                factor.setdefault(r.id, option.params / max(model.region_param_elems(r.id), 1))
        for s in range(stages):
            rest = [n for n in shape.outside[s] if n not in covered]
            stage_s[s] += model.seconds(rest, hw, 1 / scale)
            stage_act[s] += model.activation_bytes(rest, 1 / scale)
        rank_params, tied = [0.0] * p, 0.0
        for pname, where in shape.param_stages.items():
            if pname not in model.params:
                continue
            share = factor.get(pname, factor.get(model.param_region.get(pname), 1.0))
            elems = model.params[pname].numel() * share
            ranks = {st % p for st in where}
            for rank in ranks:
                rank_params[rank] += elems
            if len(ranks) > 1:
                tied += elems
        return stage_s, stage_comm, stage_act, rank_params, tied

    def table(self, scale: int) -> RegionTable:
        """The region table at one microbatch's rows, each row with its ``stage``."""
        table = self.pricer(scale).table()
        for row in table.regions[:-1]:
            row.details = {**row.details, "stage": self.stage.get(row.region, 0)}
        return table


def _order(model: ModelFacts) -> dict[str, int]:
    """Each node's index in graph order (once per model)."""
    return model.fact("mixed.order", lambda: {n.name: i for i, n in enumerate(model.gm.graph.nodes)})


def _memory_floor(model: ModelFacts, data: int, t: int) -> float:
    """Bytes every mixed plan on ``data × t`` holds at least (the search skips the
    programme above the device's memory): each region outside the multi-branch ones
    keeps at least ``1/t`` of its parameters and of its data replica's saved activations,
    whatever its family (Megatron and 3D ``1/t``, replicated all)."""
    def base():
        forked = {n for _, fj, _ in _structure(model)[1] for n in fj.nodes}
        in_branches = {name for names in _branch_params(model) for name in names}
        params = sum(p.numel() for name, p in model.params.items() if name not in in_branches)
        return params, model.activation_bytes([n for n in _names(model) if n not in forked], 1.0)
    params, act = model.fact("mixed.floor", base)
    return cost_model.training_memory(params / t, act / (data * t))


def _branch_params(model: ModelFacts) -> list:
    """The parameter names of every multi-branch region's branches."""
    return [names for _, fj, _ in _structure(model)[1] for names in branches_of(model, fj).params]


def _representatives(model: ModelFacts) -> list:
    """One tensor region of each class of identical regions (once per model)."""
    return model.fact("mixed.representatives",
                      lambda: list({model.region_class[r.id]: r for r in model.regions}.values()))


def _names(model: ModelFacts) -> list[str]:
    """The node names in graph order (once per model)."""
    return model.fact("mixed.names", lambda: list(model.table))


def _structure(model: ModelFacts):
    """Once per model: each tensor region's first node (graph order), and the multi-branch
    regions (none with batch-normalising batch norms) as ``(first node, region, the
    tensor regions inside it in graph order)``."""
    def find():
        order = _order(model)
        start = {r.id: min(order[n] for n in r.nodes) for r in model.regions}
        branching = []
        for fj in _branching(model):
            members = set(fj.nodes)
            inner = sorted((r for r in model.regions if set(r.nodes) <= members), key=lambda r: start[r.id])
            branching.append((min(order[n] for n in fj.nodes), fj, inner))
        return start, branching
    return model.fact("mixed.structure", find)


def _inner(model: ModelFacts, fj) -> list:
    """The tensor regions inside multi-branch region ``fj``, in graph order."""
    return next(inner for _, region, inner in _structure(model)[1] if region is fj)


def _branching(model: ModelFacts) -> list:
    """The outermost fork/join regions D&SP may spread over the tensor ranks (none with
    batch-normalising batch norms); their branches keep their data replica's rows, so
    a batch baked into a view (torch.export) does not stop them."""
    return model.fact("mixed.branching", lambda: [] if batch_norms(model) else
                      [r for r in subgraph_regions(model.gm) if r.kind == "fork_join"])


def _outside_params(model: ModelFacts) -> int:
    """Parameter elements outside every tensor region (once per model)."""
    return model.fact("mixed.outside_params", lambda: sum(p.numel() for p in model.params.values())
                      - sum(model.region_param_elems(r.id) for r in model.regions))


def _seconds(option: Option) -> float:
    return option.cost.compute_s + option.cost.total_comm_s


def _pairs(path):
    """Consecutive (step, option) pairs of the flat path, multi-branch rows skipped."""
    flat = [(s, n) for s, n in path if n != "open"]
    return zip(flat, flat[1:])


def tensor_grids(model: ModelFacts, t: int, data: int = 1, rows: bool = True) -> list[Grid3D]:
    """The 3D layouts of a tensor group of ``t`` the model's 3D regions may take: every
    ``Gx × Gy × 1 = t`` with both above 1 and, with ``rows`` (not inside pipeline
    stages), every ``Gx × Gy × Gz = t`` with ``Gz > 1``, whose regions split their rows
    over z (none without attention or linear chains)."""
    if not any(r.kind in SPLIT_KINDS for r in model.regions):
        return []
    flat = [Grid3D(x, t // x, 1, data) for x in divisors(t) if 1 < x < t]
    deep = [Grid3D(x, y, t // (x * y), data) for x in divisors(t) for y in divisors(t // x) if x * y < t]
    return flat + (deep if rows else [])


def grid_dict(grid: Grid3D | None) -> dict:
    """A plan's ``tensor_grid`` for ``grid``: its x and y, and z where above 1."""
    if grid is None:
        return {}
    return {"x": grid.x, "y": grid.y, **({"z": grid.z} if grid.z > 1 else {})}


def widest_branching(model: ModelFacts) -> int:
    """The most branches of a multi-branch region D&SP may spread over the tensor ranks
    (0: none): a D&SP over the group needs as many as it has ranks."""
    return max((len(r.details["branches"]) for r in _branching(model)), default=0)


def _pinnable(model: ModelFacts) -> list:
    """The regions a pin may name: the tensor regions and the multi-branch ones."""
    return list(model.regions) + [r for r in subgraph_regions(model.gm) if r.kind == "fork_join"]


def pinned_subgrids(forced: Strategy, t: int) -> int:
    """The D&SP sub-grid count of several tensor ranks the pins ask for on a tensor group
    of ``t`` (0: each rank one)."""
    return next((p.subgrids for p in forced.regions if p.family == "dsp" and 0 < p.subgrids < t), 0)


def check_pins_name_regions(ctx: PlanContext) -> None:
    """Every pin of the forced strategy names at least one region of the model."""
    regions = _pinnable(ctx.model)
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
    why = _pins_misfit(forced, tensor)
    if why is not None:
        raise PlanError(why)
    return pinned_subgrids(forced, tensor)


def _pins_misfit(forced: Strategy, t: int) -> str | None:
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


class Mixed(CompileHooks):
    """Mixed plans: per region replicate, Megatron, a 3D grid of the tensor group, or
    D&SP over it (see the module docstring). Its plans run through the other families'
    passes (each splits the regions the plan gives it) and layouts."""

    name = "mixed"

    def regions(self, model: ModelFacts) -> list:
        return _pinnable(model)

    def _grids(self, ctx: PlanContext, data: int, t: int) -> list[Grid3D | None]:
        """The tensor group's 3D layouts a configuration may take: none, and every
        ``Gx × Gy = t`` with both above 1 (a pinned grid: that one)."""
        pinned = ctx.forced.grid if ctx.forced is not None else None
        if pinned is not None:  # its x·y·z is t (_pins_misfit)
            return [Grid3D(pinned.x, pinned.y, pinned.z, data)]
        return [None] + tensor_grids(ctx.model, t, data)

    def candidates(self, ctx: PlanContext) -> list[Strategy]:
        model, world, forced = ctx.model, ctx.world, ctx.forced
        if forced is not None and forced.kind() != "mixed":
            return []
        if forced is None:
            widest = widest_branching(model)
            out = []
            for t in divisors(world):
                if t == 1:
                    continue
                for grid in self._grids(ctx, world // t, t):
                    # without a 3D grid and a multi-branch region wide enough this is Megatron's plan
                    if grid is None and widest < t:
                        continue
                    out.append(Strategy(world // t, t, grid=grid, mixed=True))
                # D&SP over g sub-grids of t/g ranks, the branches Megatron-split inside
                out += [Strategy(world // t, t, mixed=True, tensor_subgrids=g) for g in divisors(t)
                        if 1 < g < t and widest >= g]
            return out
        check_pins_name_regions(ctx)
        fixed = forced.data is not None or forced.tensor is not None
        if fixed:
            meshes = [forced.resolve(world)]
            check_forced_batch(model, meshes[0][0])
            if meshes[0][1] == 1:
                raise PlanError("strategy: region pins split regions over the tensor group; give a tensor degree "
                                "above 1 (or leave the degrees to the planner)")
        else:
            meshes = [(world // t, t) for t in divisors(world) if t > 1]
        out = []
        for data, t in meshes:
            why = _pins_misfit(forced, t)
            if why is not None:
                if fixed:
                    raise PlanError(why)
                continue
            grids = self._grids(ctx, data, t)
            if any(p.family == "3d" for p in forced.regions) and forced.grid is None:
                grids = [g for g in grids if g is not None]
            sub = pinned_subgrids(forced, t)
            if sub:
                grids = [None]  # sub-grids of several ranks: no 3D grid beside them (_pins_misfit)
            out += [Strategy(data, t, grid=g, mixed=True, regions=forced.regions, tensor_subgrids=sub)
                    for g in grids]
        if not out:
            raise PlanError(f"strategy['regions']: no mesh of {world} ranks takes these pins "
                            f"({', '.join(p.pattern + ': ' + p.describe() for p in forced.regions)})")
        return out

    def price(self, ctx: PlanContext, config: Strategy) -> Priced:
        model, data, t, grid = ctx.model, config.data, config.tensor, config.grid
        mesh = {"data": data, "tensor": t}
        form = mixed_form(grid_dict(grid), config.tensor_subgrids)
        if model.batch % data:  # a forced data degree was checked by candidates
            return rejected(self.name, config, mesh, f"batch {model.batch} not divisible by data degree {data}",
                            form=form)
        try:
            pricer = MixedPricer(ctx, data, t, grid, subgrids=config.tensor_subgrids)
            if ctx.forced is None:
                # not listed: the same mesh's single-family plans are, with their memory
                floor = _memory_floor(model, data, t)
                why = ("at least " + too_big(floor, ctx.hw) if too_big(floor, ctx.hw) is not None else
                       None if pricer.can_mix() else "a single-family plan")
                if why is not None:
                    return dataclasses.replace(rejected(self.name, config, mesh, why, form=form), listed=False)
            table = pricer.table(materialize=False)
        except PlanError as e:
            if ctx.forced is not None and ctx.forced.tensor is not None:
                raise
            return rejected(self.name, config, mesh, str(e), form=form)
        uses = pricer.uses
        # another family's plan, or the same mesh's without a grid: weighed there
        # D&SP over sub-grids splits its branches with Megatron: two families when it is used
        single = "dsp" not in uses if config.tensor_subgrids else len(uses - {"replicate"}) < 2
        if ctx.forced is None and (single or (grid is not None and "tensor3d" not in uses)):
            return dataclasses.replace(rejected(self.name, config, mesh, "a single-family plan", form=form),
                                       listed=False)
        table, config = self.with_levers(ctx, config, table)
        priced = judge(self.name, ctx, config, mesh, table)
        return dataclasses.replace(priced, form=form)

    def with_levers(self, ctx: PlanContext, config: Strategy, table: RegionTable, materialize: bool = False
                    ) -> tuple[RegionTable, Strategy]:
        """The mixed mesh with the memory levers it runs with
        (:func:`autopar.strategies.shared.levers.weigh`): each microbatch count's
        programme priced again at one microbatch's rows; ZeRO over the data ranks."""
        data, t, hw = config.data, config.tensor, ctx.hw

        def at(m: int) -> RegionTable:
            grid = config.grid
            if grid is not None:
                grid = Grid3D(grid.x, grid.y, grid.z, grid.data * m)
            return MixedPricer(ctx, data * m, t, grid, subgrids=config.tensor_subgrids).table(materialize=materialize)

        space = levers.LeverSpace(
            rows=ctx.model.batch // data, data=data, split=t, at=at,
            data_comm=lambda one, z, m, compute: levers.zero_comm(one.param_elems, data, t, z, m, compute, hw),
            accumulate=not batch_norms(ctx.model))
        return levers.weigh(ctx, config, table, space)

    def to_plan(self, ctx: PlanContext, priced: Priced) -> Plan:
        c = priced.config
        table = MixedPricer(ctx, c.data, c.tensor, c.grid, subgrids=c.tensor_subgrids).table()
        if c.microbatches or c.recompute or c.zero:  # the winner's table with the levers the search chose
            table, _ = self.with_levers(levers.chosen_levers(ctx, c), c, table, materialize=True)
        plan_ = mesh_plan(ctx, priced, table)
        grid = c.grid
        plan_.mixed = True
        plan_.tensor_grid = grid_dict(grid) if plan_.regions_with("tensor3d") else {}
        return plan_
