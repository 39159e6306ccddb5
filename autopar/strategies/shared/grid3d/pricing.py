"""Pricing AxoNN's 3D/4D tensor parallelism (axonn §III, §V) on a ``Gx × Gy × Gz × Gdata`` grid:
what the 3D family (:mod:`autopar.strategies.tensor3d.planner`), Bian's cube
(:mod:`autopar.strategies.cube.planner`, another :class:`Form3D`) and mixed plans' 3D
regions (:mod:`autopar.strategies.mixed.options`) price a grid's regions with.

Per 3D region (attention or linear chain) its linears' collectives by axonn eqs 4-7
(``grid3d.cost.layer_comm``, each group's bandwidth by eq 10), the boundary
re-layout over y where the data flow enters and leaves the region
(``grid3d.cost.boundary_comm``; none between a transposed layer and the next region's
plain layers that read it directly), the linears' compute over all ranks and the ops
between them over x (they are replicated over y), rows over z and data. Everything else
is replicated over x and y with its rows split over z and data. Gradients: 3D weight
shards are all-reduced over data (eq 8), everything else over z and data (the
``replica`` group); both overlap the backward pass as data parallelism does. Overlap
inside a layer (axonn §IV) is priced only as far as the hardware measured it: the
collectives the runtime issues asynchronously (the z all-gather and reduce-scatter, the
backward all-reduce) count ``Hardware.async_exposed`` of their time (1 in the presets,
where eq 9 ranks the grids by their full communication as axonn's model does). A region
is split or replicated, whichever is cheaper; a grid that splits nothing is priced again
splitting every region it divides.

The orientation of each linear follows the data flow (:func:`region_linears`): the ones
reading the region's input are plain (in y, out x), the one reading their output
transposed (in x, out y).

The search prices one region per class of identical regions entering and leaving the
same way (:func:`price_grid` with ``materialize=False``, memoised per grid), then the
winning grid again region by region for its table. Bian's cube
(:mod:`autopar.strategies.cube.planner`) is the same pricing with another
:class:`Form3D`. A tensor group's 3D layouts in a mixed plan or a pipeline's stages are
:func:`tensor_grids`.
"""
from __future__ import annotations

from dataclasses import dataclass

from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.grid import Grid3D, MeshAxis
from autopar.ir import tensor_spec
from autopar.passes.analysis.ops import match_linear
from autopar.planning.model import ModelFacts, exposed_data_comm
from autopar.planning.plan import Cost, RegionChoice
from autopar.planning.strategy import PlanError, divisors
from autopar.strategies.family import PlanContext, RegionTable
from autopar.strategies.shared import levers
from autopar.strategies.shared.grid3d.cost import boundary_comm, layer_comm
from autopar.strategies.shared.grid3d.rewrite import planned_grid3d_shards, region_linears
from autopar.strategies.shared.propagation import TensorParallelError

SPLIT_KINDS = ("attention", "linear_chain")


@dataclass(frozen=True)
class Layout3D:
    """How the splittable regions meet, the same for every grid: the row linears'
    outputs, the plain linears, and per region whether it enters from a row output and
    leaves only into plain linears (then that boundary needs no re-layout)."""

    splittable: list
    row_outputs: set
    plain_linears: set
    flags: dict[str, tuple[bool, bool]]


def layout(model: ModelFacts) -> Layout3D:
    return model.fact("grid3d.layout", lambda: _find_layout(model))


def _find_layout(model: ModelFacts) -> Layout3D:
    splittable = [r for r in model.regions if r.kind in SPLIT_KINDS]
    row_outputs = {region_linears(r)[-1][0] for r in splittable}
    plain = {name for r in splittable for name, transposed in region_linears(r) if not transposed}
    flags = {}
    for r in splittable:
        linears = region_linears(r)
        entry = match_linear(model.table[linears[0][0]], model.gm).input
        flags[r.id] = (entry.name in row_outputs, all(u.name in plain for u in model.table[linears[-1][0]].users))
    return Layout3D(splittable, row_outputs, plain, flags)


class Form3D:
    """AxoNN's 3D layer on the grid: what Bian's cube form
    (:class:`autopar.strategies.cube.planner.CubeForm`) does differently it overrides."""

    strategy = "tensor3d"  # the regions' strategy in the plan
    label = "3D grid"      # in the reasons
    form = ""              # the configuration's form in the plan's candidates
    vectors_sharded = False  # whether bias/norm vectors count as 3D shards (gradients over data only)

    def shards(self, model: ModelFacts, r, grid: Grid3D, parts: int) -> dict:
        """The parameter cuts of region ``r``; raises TensorParallelError when it cannot be split."""
        return planned_grid3d_shards(model.gm, regions=[r.id], grid=grid)

    def layer_comm(self, rows: int, match, spec, grid: Grid3D, hw: Hardware, transposed: bool) -> dict[str, float]:
        """Seconds by group of one linear (axonn eqs 4-8)."""
        return layer_comm(rows, match.in_features, match.out_features, grid, hw, transposed=transposed,
                          element_bytes=spec.dtype.itemsize).by_group()

    def boundary(self, enters: float, leaves: float, grid: Grid3D, hw: Hardware) -> tuple[dict[str, float], str]:
        """Seconds by group of the re-layouts where the flow enters and leaves, and their description."""
        text = ("input " + ("cut to y blocks (backward all-gather over y)" if enters else
                            "read split over y from the previous region (no re-layout)")
                + ", output " + ("all-gathered over y" if leaves else
                                 "read split over y by the next region (no re-layout)"))
        return {MeshAxis.Y: boundary_comm(enters, leaves, grid, hw)}, text

    def row_split(self, grid: Grid3D) -> int:
        """Over how many ranks of one batch chunk the ops between the linears split (x)."""
        return grid.x

    def vector_elems(self, numel: int, out_group: int, grid: Grid3D) -> float:
        """The elements of a bias or norm vector a rank holds."""
        return numel / out_group

    def details(self) -> dict:
        return {}


AXONN = Form3D()


@dataclass(frozen=True)
class RegionPrice:
    """One region's choice on a grid, with what the totals need: the parameter
    elements a rank holds, its activation bytes, and the 3D shards among them."""

    choice: RegionChoice
    param_elems: float
    activation_bytes: float
    shard_elems: float
    gathered_bytes: float = 0.0  # of the activations: the layers' all-gathered weights
    layers: int = 0              # 3D layers (linears split over the grid)


class GridPricer:
    """Prices the regions of one model on one grid in one form (see :func:`price_grid`)."""

    def __init__(self, model: ModelFacts, hw: Hardware, grid: Grid3D, form: Form3D, forced: bool, split_all: bool):
        self.model, self.hw, self.grid, self.form = model, hw, grid, form
        self.forced, self.split_all = forced, split_all
        self.parts = grid.z * grid.data  # the batch chunks
        self.label = f"{grid.x}x{grid.y}x{grid.z}x{grid.data}"
        self.layout = layout(model)

    def _shards(self, r) -> tuple[dict, str | None]:
        """The region's parameter cuts, or why it stays replicated."""
        if r.kind == "vocab":
            return {}, "vocabulary regions stay replicated in 3D plans"
        grid = self.grid
        # memoised per class of identical regions and grid, not its data degree (the cuts
        # do not depend on it; the batch chunks do for the cube's row check: another
        # form); read for their sizes only (_held), which a class shares
        key = (self.model.region_class[r.id], grid.x, grid.y, grid.z, self.parts if self.form.form else None,
               self.form)
        memo = self.model.memo("grid3d.shards")
        if key not in memo:
            try:
                memo[key] = (self.form.shards(self.model, r, grid, self.parts), None, r.id)
            except TensorParallelError as e:
                memo[key] = ({}, str(e), r.id)
        shards, why, found_on = memo[key]
        if why is not None and found_on != r.id:  # the reason in this region's own words (its ids and nodes)
            own = self.model.memo("grid3d.shards_refused")
            if (r.id, key) not in own:
                try:
                    self.form.shards(self.model, r, grid, self.parts)
                    own[(r.id, key)] = why.replace(found_on, r.id)
                except TensorParallelError as e:
                    own[(r.id, key)] = str(e)
            why = own[(r.id, key)]
        if why is not None and self.forced:
            raise PlanError(f"strategy: grid {self.label}: {why}")
        return shards, why

    def _split(self, r) -> tuple[Cost, list[dict], str]:
        """The split region's cost (compute and communication by axis), its layers'
        orientations and its boundary."""
        model, grid, table = self.model, self.grid, self.model.table
        linears = region_linears(r)
        names = {n for n, _ in linears}
        comm = {MeshAxis.X: 0.0, MeshAxis.Y: 0.0, MeshAxis.Z: 0.0}
        layers = []
        for name, transposed in linears:
            match = match_linear(table[name], model.gm)
            spec = tensor_spec(match.input)
            rows = spec.numel // spec.shape[-1] // grid.data
            for axis, seconds in self.form.layer_comm(rows, match, spec, grid, self.hw, transposed).items():
                if axis != MeshAxis.DATA:  # eq 8 goes with the data all-reduce
                    comm[axis] += seconds
            layers.append({"linear": name, "orientation": "transposed (in x, out y)" if transposed
                           else "plain (in y, out x)"})
        first, last = table[linears[0][0]], table[linears[-1][0]]
        entry = match_linear(first, model.gm).input
        enters = 0.0 if entry.name in self.layout.row_outputs else tensor_spec(entry).nbytes
        leaves = 0.0 if all(u.name in self.layout.plain_linears for u in last.users) else tensor_spec(last).nbytes
        by_axis, boundary = self.form.boundary(enters, leaves, grid, self.hw)
        for axis, seconds in by_axis.items():
            comm[axis] += seconds
        split = model.seconds([n for n in r.nodes if n in names], self.hw, 1 / grid.size)
        between = model.seconds([n for n in r.nodes if n not in names], self.hw,
                                1 / (self.form.row_split(grid) * self.parts))
        return Cost(split + between, comm, 0.0), layers, boundary

    def _held(self, r, shards: dict) -> tuple[float, float, float]:
        """(parameter elements a rank holds, the 3D shards among them, bytes of the
        all-gathered weight blocks kept from forward to backward) of a split region."""
        grid, params = self.grid, self.model.params
        per_rank = shard_part = gathered = 0.0
        for name, shard in shards.items():
            numel = params[name].numel()
            if shard.vector:  # a diagonal rank of the cube holds 1/(p·Gz) of it, others none
                per_rank += self.form.vector_elems(numel, grid.y if shard.transposed else grid.x, grid)
            else:
                per_rank += numel / (grid.x * grid.y * grid.z)
                if grid.z > 1:  # on one z rank the gathered block is the shard itself
                    gathered += numel / (grid.x * grid.y)
            if not shard.vector or self.form.vectors_sharded:
                shard_part += numel / (grid.x * grid.y * grid.z)
        per_rank += self.model.region_param_elems(r.id) - sum(params[n].numel() for n in shards)
        return per_rank, shard_part, gathered * 4

    def region(self, r) -> RegionPrice:
        """Region ``r`` split over the grid or replicated, with its memory."""
        model, form = self.model, self.form
        replicate = Cost(model.seconds(r.nodes, self.hw, 1 / self.parts), {}, 0.0)
        options = {"replicate": replicate}
        shards, why_not = self._shards(r)
        layers, boundary = [], ""
        if why_not is None:
            options[form.strategy], layers, boundary = self._split(r)
        seconds = {k: c.compute_s + c.total_comm_s for k, c in options.items()}
        if form.strategy in options and (self.forced or self.split_all):
            chosen = form.strategy
            reason = f"{form.label} {self.label}, " + ("forced" if self.forced else "split wherever it divides")
        elif why_not is not None:
            chosen, reason = "replicate", why_not
        else:
            chosen = min(sorted(seconds), key=seconds.__getitem__)
            reason = f"{form.label} {self.label}: cheapest predicted step time"
        c = options[chosen]
        details = {}
        gathered, n_layers = 0.0, 0
        if chosen == form.strategy:
            per_rank, shard_part, gathered = self._held(r, shards)
            n_layers = len(layers)
            act = model.activation_bytes(r.nodes, 1 / (form.row_split(self.grid) * self.parts)) + gathered
            details = {"grid": self.label, "layers": layers, "boundary": boundary, **form.details()}
        else:
            per_rank, shard_part = float(model.region_param_elems(r.id)), 0.0
            act = model.activation_bytes(r.nodes, 1 / self.parts)
        c.memory_bytes = cost_model.training_memory(per_rank, act)
        return RegionPrice(RegionChoice(r.id, r.kind, chosen, c, seconds, reason, details), per_rank, act, shard_part,
                           gathered, n_layers)


def price_grid(model: ModelFacts, hw: Hardware, grid: Grid3D, form: Form3D, forced: bool, split_all: bool = False,
               materialize: bool = True) -> RegionTable:
    """The region table, total cost and step of ``grid`` in ``form``. ``forced``: split
    every region and raise on one the grid does not divide; ``split_all``: split every
    region the grid divides, cheaper or not. ``materialize=False`` (the search over
    grids): regions of one class (identical repeated blocks) entering and leaving the
    same way are priced once and the choices are those shared representatives; the
    winner is priced again with ``materialize=True`` for its per-region table."""
    pricer = GridPricer(model, hw, grid, form, forced, split_all)
    # per configuration a memo of its region classes' prices (the grid, form and hardware
    # hashed once here, not once per region)
    memo = model.memo("grid3d.regions").setdefault((grid, forced, split_all, form, hw), {}) if not materialize else {}
    parts = pricer.parts
    if materialize:
        prices = [pricer.region(r) for r in model.regions]
    else:
        keys, first = _class_keys(model)
        for key, r in first.items():
            if key not in memo:
                memo[key] = pricer.region(r)
        prices = [memo[key] for key in keys]
    # summed region by region in graph order (the same sums whether priced per class or not)
    choices: list[RegionChoice] = [p.choice for p in prices]
    local_elems = sum((p.param_elems for p in prices), 0.0)
    activations = sum((p.activation_bytes for p in prices), 0.0)
    shard_elems = sum((p.shard_elems for p in prices), 0.0)
    gathered = sum((p.gathered_bytes for p in prices), 0.0)
    layers = sum(p.layers for p in prices)
    compute = sum((c.cost.compute_s for c in choices), 0.0)
    comm = {MeshAxis.X: 0.0, MeshAxis.Y: 0.0, MeshAxis.Z: 0.0}
    for c in choices:
        for axis, v in c.cost.comm_s.items():
            comm[axis] += v
    outside, outside_params = model.fact("grid3d.outside", lambda: _outside(model))
    outside_compute = model.seconds(outside, hw, 1 / parts)
    compute += outside_compute
    local_elems += outside_params
    outside_act = model.activation_bytes(outside, 1 / parts)
    activations += outside_act
    data = data_comm_3d(grid, local_elems, shard_elems, compute, hw)
    choices.append(RegionChoice("(outside regions)", "-", "replicate",
                                Cost(outside_compute, {}, cost_model.training_memory(outside_params, outside_act)),
                                {}, "not in a splittable region"))
    total = Cost(compute, {**comm, MeshAxis.DATA: data}, cost_model.training_memory(local_elems, activations))
    return Table3D(choices, total, compute + sum(comm.values()) + data, local_elems, activations,
                   gathered_bytes=gathered, shard_elems=shard_elems, layers=layers)


def _class_keys(model: ModelFacts) -> tuple[list, dict]:
    """Per region in graph order the key its price is shared by (its class and how it
    enters and leaves, :func:`layout`), and the first region of each key (once per model)."""
    def find():
        flags = layout(model).flags
        keys = [(model.region_class[r.id], flags.get(r.id)) for r in model.regions]
        first: dict = {}
        for key, r in zip(keys, model.regions):
            first.setdefault(key, r)
        return keys, first
    return model.fact("grid3d.class_keys", find)


@dataclass
class Table3D(RegionTable):
    """A grid's region table with what its levers need: the 3D shard elements (their
    gradients reduced over data only) and the number of 3D layers."""

    shard_elems: float = 0.0
    layers: int = 0


def data_comm_3d(grid: Grid3D, local_elems: float, shard_elems: float, compute: float, hw: Hardware) -> float:
    """The data gradients' exposed seconds (axonn eq 8): the 3D shards over data, the
    rest over z and data (the replica group); one group when z is 1."""
    if grid.z == 1:  # one group: the replica group is the data group
        return exposed_data_comm(grid.data, grid.x * grid.y, local_elems * 4, compute, hw)
    return (exposed_data_comm(grid.z * grid.data, grid.x * grid.y, (local_elems - shard_elems) * 4, compute, hw)
            + exposed_data_comm(grid.data, grid.x * grid.y * grid.z, shard_elems * 4, compute, hw))


def cache_settings(one: "Table3D", blocks: int, z: int) -> list[levers.Again]:
    """Full recomputation of a 3D grid's blocks with the all-gather cache holding the
    first ``k`` of ``blocks`` blocks' layers (axonn §IV-D: 28 of 32 where all did not
    fit; :func:`autopar.strategies.shared.levers.weigh` keeps the most that fit): the
    forward's in-axis all-reduces run again (the layers' x and y communication x1.5,
    megatron §3.5); the weights of an uncached block are gathered again over z (half of
    its layers' z communication, the other half being the weight gradients'
    reduce-scatter); while some block is uncached, the block being recomputed holds its
    own gathered weights. Where the layers do not fall evenly into blocks, or there is
    nothing to gather (Gz = 1), every layer's weights stay (unbounded)."""
    per_block = one.layers // blocks if blocks and one.layers % blocks == 0 else 0
    comm = {k: v * (1.5 if k in (MeshAxis.X, MeshAxis.Y) else 1.0) for k, v in one.total.comm_s.items()
            if k != MeshAxis.DATA}
    if not per_block or z == 1 or one.gathered_bytes == 0:
        return [levers.Again(comm, one.gathered_bytes)]
    block_s = 0.5 * comm.get(MeshAxis.Z, 0.0) / blocks
    comm[MeshAxis.Z] = comm.get(MeshAxis.Z, 0.0) + block_s * blocks  # none cached; each cached block saves block_s
    return [levers.Again(comm, 0.0, cache_blocks=blocks, block_bytes=one.gathered_bytes / blocks, block_s=block_s,
                         layers_per_block=per_block)]


def _outside(model: ModelFacts) -> tuple[list[str], float]:
    """The nodes outside every region, and the parameter elements outside them."""
    in_region = {n for r in model.regions for n in r.nodes}
    outside = [n.name for n in model.gm.graph.nodes if n.name not in in_region]
    return outside, sum(p.numel() for p in model.params.values()) - sum(model.region_param_elems(r.id)
                                                                       for r in model.regions)


def check_forced_grid(ctx: PlanContext, grid: Grid3D) -> None:
    """A forced grid must have the world's ranks, split the batch's rows over Gz ×
    Gdata, and find a region to split."""
    if grid.size != ctx.world:
        raise PlanError(f"strategy: the grid {grid.x}x{grid.y}x{grid.z}x{grid.data} has {grid.size} ranks, the "
                        f"world {ctx.world}; give sizes whose product is {ctx.world}")
    parts = grid.z * grid.data
    if ctx.model.batch % parts:
        raise PlanError(f"example_inputs: the batch {ctx.model.batch} is not divisible by Gz x Gdata = {parts}, "
                        f"which split the rows; give a batch that is a multiple of {parts}, or another grid")
    if not any(r.kind in SPLIT_KINDS for r in ctx.model.regions):
        raise PlanError(f"strategy: a 3D grid needs a linear chain or attention region; {ctx.name} has none")


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
