"""The plan: a mesh factorisation, one strategy per region, and the predicted costs.

A :class:`Plan` is plain data: deterministic, serialisable to JSON and back
(byte-identical for the same inputs), printable as a table with :meth:`Plan.explain`,
and saved with :meth:`Plan.save` as a directory a reviewer can read::

    plan_dir/
      plan.json            the plan (this module's to_json)
      plan.txt             explain() output
      report.html          the plan as one self-contained page (autopar.planning.report)
      regions.dot          a drawing of the regions (regions.svg too when graphviz is installed)
      rank0.py, rank1.py…  each rank's rewritten graph as code, with a header naming the pass
      timeline.txt/.svg    a pipeline plan's schedule per rank (megatron Figure 4 style)

Rank order: ``rank = data_index · tensor + tensor_index``, so the ranks of one tensor
group are adjacent (inside a node), as Megatron places them (megatron §3.2, takeaway #1).
A family that lays the ranks out otherwise (sub-grids, a 3D grid, a pipeline, expert
groups) says so in its declaration (:mod:`autopar.planning.declared`): the rank grid, the
process groups, the plan's form and how the batch is split come from there, so this
module names no family; the fields are plan.json's.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass, field

from autopar.grid import Grid3D, GroupSpec, MeshAxis, RankGrid
from autopar.planning import explain
from autopar.planning.declared import declarations, first
from autopar.planning.forms import experts_form
from autopar.planning.timeline import simulate
from autopar.planning.report import report_html

PLAN_FORMAT_VERSION = 3
OLDEST_FORMAT_VERSION = 2
"""The oldest plan.json format that still loads: a region strategy it spelled otherwise
is read by its family's one name now (``Language.renamed``)."""
MESH_ORDER = tuple(a.value for a in (MeshAxis.PIPELINE, MeshAxis.DATA, MeshAxis.CONTEXT, MeshAxis.Z, MeshAxis.Y,
                                      MeshAxis.X, MeshAxis.TENSOR))
"""Mesh dimensions from outermost to innermost (JSON sorts keys; this fixes the order).
A plan uses ``data × tensor`` (Megatron), ``pipeline × data × tensor`` (PTD-P: pipeline
ranks furthest apart, across nodes, megatron §3.2) or AxoNN's ``data × z × y × x`` grid,
whose layout ``rank = ((d·Gz + z)·Gy + y)·Gx + x`` this order gives (axonn §V-B)."""


@dataclass
class Cost:
    """Predicted per-step cost of one region (or the whole model) on one rank."""

    compute_s: float = 0.0
    comm_s: dict[str, float] = field(default_factory=dict)  # by mesh dimension ("tensor", "data")
    memory_bytes: float = 0.0
    # of compute_s and comm_s: the host's overheads (per kernel pass, per collective call;
    # docs/planner.md "Overheads"), set on the chosen plan's regions by the planner
    overhead_s: float = 0.0

    @property
    def total_comm_s(self) -> float:
        return sum(self.comm_s.values())

    def __add__(self, other: "Cost") -> "Cost":
        comm = dict(self.comm_s)
        for k, v in other.comm_s.items():
            comm[k] = comm.get(k, 0.0) + v
        return Cost(self.compute_s + other.compute_s, comm, self.memory_bytes + other.memory_bytes,
                    self.overhead_s + other.overhead_s)


@dataclass
class RegionChoice:
    """The strategy chosen for one region, with its cost and the alternatives weighed."""

    region: str
    kind: str
    strategy: str  # "megatron" | "replicate"
    cost: Cost
    alternatives: dict[str, float] = field(default_factory=dict)  # strategy -> predicted seconds
    reason: str = ""
    details: dict = field(default_factory=dict)  # strategy-specific, e.g. D&SP's branch assignment


def _in_stage(choice: RegionChoice, stage: int | None) -> bool:
    """Whether a region runs in pipeline stage ``stage`` (None: any); a region whose
    nodes several stages compute (a tied embedding and head) lists them all."""
    if stage is None:
        return True
    where = choice.details.get("stage")
    return where == stage or (isinstance(where, list) and stage in where)


@dataclass
class MeshCandidate:
    """One mesh factorisation the planner weighed."""

    mesh: dict[str, int]
    step_s: float | None
    memory_bytes: float | None
    feasible: bool
    reason: str = ""
    subgrids: int = 1  # D&SP sub-grids of the data ranks (1: none)
    topology_aware: bool = True
    csub: bool = False  # D&SP-cSub: common layers on sub-grid 0
    comm_s: dict[str, float] = field(default_factory=dict)  # predicted communication by group
    form: str = ""  # "cube": Bian's load-balanced cube; "pipeline <schedule>[ v=..]": PTD-P; "" otherwise


@dataclass
class Plan:
    """How one model runs on one mesh. See the module docstring for the saved form."""

    model: str
    world_size: int
    mesh: dict[str, int]  # ordered outermost → innermost, e.g. {"data": 2, "tensor": 2}
    hardware: str
    global_batch: int
    regions: list[RegionChoice]
    total: Cost
    step_s: float
    forced: bool = False
    candidates: list[MeshCandidate] = field(default_factory=list)
    tracer: str = ""
    subgrids: int = 1  # D&SP: the data ranks form this many sub-grids (SUPER §III-B)
    topology_aware: bool = True  # D&SP rank order: round-robin (SUPER §V) or contiguous sub-grids
    csub: bool = False  # D&SP-cSub (SUPER §III-C): the common layers run on sub-grid 0 only
    pipeline: dict = field(default_factory=dict)  # PTD-P: stages, schedule, microbatches... ({} without)
    recompute: bool = False  # the planner recomputes activations to fit memory (megatron §3.5)
    # the memory levers (docs/memory.md): gradient accumulation of a plan without a
    # pipeline (a step runs its batch as this many microbatches; a pipeline's are in
    # ``pipeline``), and ZeRO's stage over the data group (0: off)
    microbatches: int = 1
    zero: int = 0
    selective_recompute: bool = False  # the attention cores recomputed in backward (not whole blocks)
    # Megatron-SP (docs/sequence.md): between the tensor-parallel regions, values split over the sequence
    sequence_parallel: bool = False
    # context parallelism (docs/context.md): the mesh's ``context`` ranks split the sequence
    # of ``seq`` tokens (``balanced``: chunks r and 2c-1-r), attention by ``mode`` ("ring", "allgather")
    context: dict = field(default_factory=dict)
    # under recomputation, the 3D layers whose all-gathered weights the cache keeps for
    # the second forward (axonn §IV-D), at most this many at once; None: all of them
    gather_cache: int | None = None
    # of step_s: the runtime's fixed cost per step (Hardware.step_overhead_s, measured by
    # autopar calibrate; 0 with the presets)
    step_overhead_s: float = 0.0
    # of step_s: every host overhead (per kernel pass, per collective call, per pipeline
    # action, the runner's per step); 0 with the presets
    overhead_s: float = 0.0
    flops_per_step: float = 0.0  # the model's training FLOPs per step (forward x3, x4 recomputing)
    # what the plan was made for (autopar.planning.reviewed checks a reviewed plan against
    # it): each graph input's [shape, dtype] and the parameters' bytes; empty in older plans
    inputs: list = field(default_factory=list)
    param_bytes: float = 0.0
    fusion: bool = False  # priced with pointwise chains fused into generated kernels (GPU hardware)
    # a mixed plan (docs/mixed_plans.md): each region's own family over the tensor group;
    # tensor_grid: the group's x × y (× z, given when above 1) layout its 3D regions use
    # ({} without 3D regions)
    mixed: bool = False
    tensor_grid: dict = field(default_factory=dict)
    # where ``hardware`` came from (cost.profiles.resolve): "preset", "file PATH", "given",
    # this machine's calibrated profile and its path, or the default preset and why
    hardware_source: str = ""
    # expert parallelism (docs/experts.md): the MoE regions' experts over expert groups of
    # this many consecutive data ranks (1: none); the regions that use it say "experts"
    experts: int = 1
    # where rows of the batch meet (autopar.passes.analysis.batch_rows.Coupling as JSON dicts) and
    # what the plan does about each: the remedy runs under a batch split, else none is split;
    # None: not known (a plan saved before the analysis existed: each rank reads its own graph)
    batch_couplings: list | None = None
    # the reductions over the batch the loss is a linear combination of ([node, "mean" | "sum"],
    # read on the whole batch); None: each rank reads its own graph's
    loss_terms: list | None = None
    # the random ops of the capture in graph order ({"node", "kind", "op", "shape", "rows"}):
    # a site's position keys its draws (autopar.runtime.rng), the same under every plan
    random_sites: list = field(default_factory=list)
    # what the step's and the memory's reconciliation reads beside the regions and totals
    # (autopar.driver.breakdown; docs/plan_format.md); {} in plans made before it
    breakdown: dict = field(default_factory=dict)
    version: int = PLAN_FORMAT_VERSION
    # the registered family that made the plan (autopar.register_family; "" for the
    # built-in families, whose plans the fields above describe) and its options
    family: str = ""
    family_options: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ queries
    def degree(self, dim: str) -> int:
        return self.mesh.get(dim, 1)

    def regions_with(self, strategy: str, stage: int | None = None) -> list[str]:
        """The regions run under ``strategy``; with ``stage``, those of that pipeline stage."""
        return [r.region for r in self.regions if r.strategy == strategy and _in_stage(r, stage)]

    def region_details(self, strategy: str, stage: int | None = None) -> dict[str, dict]:
        """The regions run under ``strategy``: id → the choice's details (with ``stage``,
        those of that pipeline stage)."""
        return {r.region: r.details for r in self.regions if r.strategy == strategy and _in_stage(r, stage)}

    def partial_rank(self, rank: int) -> bool:
        """Whether ``rank`` runs a part of the program that takes no inputs, the call's
        outputs and loss sent to it (a family's ``partial_rank``: D&SP-cSub's ranks off
        sub-grid 0)."""
        return any(d.partial_rank(self, rank) for d in declarations())

    def subgrid_coordinates(self, rank: int) -> tuple[int, int]:
        """``(sub-grid, position in it)`` of ``rank`` under D&SP (``(0, data index)`` without)."""
        if self.subgrids == 1:
            return 0, self.rank_coordinates(rank)[MeshAxis.DATA]
        coords = self.rank_grid().coordinates(rank)
        return coords["subgrid"], coords["position"]

    @property
    def tensor_subgrids(self) -> int:
        """In a mixed plan whose regions run over ``g`` sub-grids of several tensor ranks
        each (a region's details ``subgrids``, ``g < t``: D&SP's branches, Megatron-split
        over a sub-grid): ``g``; else 0. The tensor index is then ``sub-grid · t/g + position``."""
        if not self.mixed:
            return 0
        t = self.degree(MeshAxis.TENSOR)
        return next((r.details["subgrids"] for r in self.regions if 1 < r.details.get("subgrids", t) < t), 0)

    def tensor_subgrid_coordinates(self, rank: int) -> tuple[int, int]:
        """``(sub-grid, place in it)`` of ``rank`` in the tensor group's D&SP sub-grids
        (:attr:`tensor_subgrids`; ``(tensor index, 0)`` without them)."""
        tensor, g = self.rank_coordinates(rank)[MeshAxis.TENSOR], self.tensor_subgrids
        if not g:
            return tensor, 0
        size = self.degree(MeshAxis.TENSOR) // g
        return tensor // size, tensor % size

    def rank_grid(self, members=None) -> RankGrid:
        """How this plan lays its ranks out (:mod:`autopar.grid`): the mesh's dimensions in
        :data:`MESH_ORDER` (``data × tensor``, ``pipeline × data × tensor``), or the first
        family's that lays them out (``Language.rank_dims``: AxoNN's ``data × z × y × x``,
        D&SP's sub-grids, a mixed plan's tensor group), each family's own dimensions then
        set within them (``refine_dims``: expert groups within data). ``members``: the
        global ranks, in grid order."""
        dims = first(d.rank_dims(self) for d in declarations())
        if dims is None:
            dims = {dim: self.degree(dim) for dim in MESH_ORDER if dim in self.mesh or dim in (MeshAxis.DATA,
                                                                                              MeshAxis.TENSOR)}
        for d in declarations():
            dims = d.refine_dims(self, dims)
        return RankGrid(dims, members)

    def expert_coordinates(self, rank: int) -> tuple[int, int]:
        """``(expert replica, place in the expert group)`` of ``rank`` under expert
        parallelism: its data index ``replica·E + place`` (``(data index, 0)`` without)."""
        data = self.rank_coordinates(rank)[MeshAxis.DATA]
        e = max(self.experts, 1)
        return data // e, data % e

    def group_specs(self, tied_positions=()) -> dict[str, GroupSpec | None]:
        """The process groups this plan's rank programs name (``autopar.runtime.groups``),
        as groups of :meth:`rank_grid`: ``data`` and ``tensor``, or the first family's that
        lays them out (``Language.group_specs``: the 3D grid's axes and ``replica``, D&SP's
        ``segment`` and ``subgrid``, a mixed plan's tensor group); then each family's
        around them, the innermost first (``refine_groups``: a pipeline's ``pipeline`` and
        a ``tied:<positions>`` group per set of pipeline positions in ``tied_positions``
        that share a weight, context parallelism's, the expert groups within data).
        None: no group."""
        tied = tuple(tied_positions)
        specs = first(d.group_specs(self, tied) for d in declarations())
        if specs is None:
            specs = {MeshAxis.DATA: GroupSpec((MeshAxis.DATA,)), MeshAxis.TENSOR: GroupSpec((MeshAxis.TENSOR,))}
        for d in reversed(declarations()):
            specs = d.refine_groups(self, specs, tied)
        return specs

    @property
    def form(self) -> str:
        """A family's form (``Language.form``: ``"cube"`` when the grid runs Bian's cube
        form, a pipeline's schedule, ``"pipeline 1f1b"``, ``"pipeline interleaved v=2"``, a
        mixed plan's, ``"replicate"``); else ``""``; then ``"experts P"`` under expert
        parallelism (``"pipeline 1f1b, experts 2"``) and context parallelism's attention."""
        form = experts_form(self._family_form(), self.experts)
        if self.degree(MeshAxis.CONTEXT) > 1:   # context parallelism's attention: "context ring" (docs/context.md)
            form = (form + ", " if form else "") + f"context {self.context.get('mode', 'ring')}"
        return form

    def _family_form(self) -> str:
        """A registered family's name, or the first family's form (``Language.form``), or ``""``."""
        if self.family:
            return self.family
        return first(d.form(self) for d in declarations()) or ""

    @property
    def replica_group(self) -> str:
        """The group over which the gradients of the parameters every data rank holds are
        averaged (and ZeRO shards them): ``data``, or ``data_context`` under context
        parallelism (its ranks hold the same rows' other tokens)."""
        return (MeshAxis.DATA_CONTEXT if self.degree(MeshAxis.CONTEXT) > 1 else MeshAxis.DATA).value

    def batch_group(self) -> str:
        """The group of ranks that split the common layers' batch: ``data``, or on a 3D
        grid ``replica`` (the ranks of one (x, y): z × data split the rows)."""
        return (MeshAxis.REPLICA if self.grid is not None else MeshAxis.DATA).value

    @property
    def region_grid(self):
        """The grid the plan's 3D regions run on: a 3D plan's :attr:`grid`, or in a mixed
        plan the tensor group as ``Gx × Gy × Gz`` over the data ranks; None without."""
        if self.tensor_grid:
            g = self.tensor_grid
            return Grid3D(g[MeshAxis.X], g[MeshAxis.Y], g.get(MeshAxis.Z, 1), self.degree(MeshAxis.DATA))
        return self.grid

    def region_coordinates(self, rank: int) -> dict[str, int]:
        """``rank``'s ``x``, ``y``, ``z``, ``data`` on :attr:`region_grid` (a pipeline's
        position, outermost, left out)."""
        grid = self.region_grid
        return grid.coordinates(rank % grid.size)

    @property
    def grid(self):
        """AxoNN's ``Gx × Gy × Gz × Gdata`` grid of a 3D plan, else None."""
        if not any(axis in self.mesh for axis in (MeshAxis.X, MeshAxis.Y, MeshAxis.Z)):
            return None
        return Grid3D(*(self.degree(axis) for axis in (MeshAxis.X, MeshAxis.Y, MeshAxis.Z, MeshAxis.DATA)))

    def batch_parts(self) -> int:
        """Into how many equal chunks the common layers split the batch: the data degree
        (times Gz on a 3D grid: z splits the rows too), or a family's
        (``Language.batch_parts``: under D&SP-cSub the ranks of one sub-grid)."""
        parts = first(d.batch_parts(self) for d in declarations())
        return parts if parts is not None else self.degree(MeshAxis.DATA) * self.degree(MeshAxis.Z)

    def batch_chunk(self, rank: int) -> int:
        """Which of the :meth:`batch_parts` batch chunks ``rank`` takes: its data index
        (``data·Gz + z`` on a 3D grid), or a family's (``Language.batch_chunk``: under
        D&SP ``p·g + s``, docs/dsp_design.md)."""
        chunk = first(d.batch_chunk(self, rank) for d in declarations())
        if chunk is not None:
            return chunk
        coords = self.rank_coordinates(rank)
        return coords[MeshAxis.DATA] * self.degree(MeshAxis.Z) + coords.get(MeshAxis.Z, 0)

    def rank_coordinates(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of ``rank`` (the innermost dimension varies fastest); under
        D&SP ``data`` is the rank itself (every rank is a data rank)."""
        mesh = {dim: self.degree(dim) for dim in MESH_ORDER if dim in self.mesh or dim in (MeshAxis.DATA,
                                                                                              MeshAxis.TENSOR)}
        return RankGrid(mesh).coordinates(rank)

    # ------------------------------------------------------------------ serialisation
    def to_json(self) -> str:
        data = asdict(self)
        if not self.family:   # a built-in family's plan: the fields it always had
            del data["family"], data["family_options"]
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @staticmethod
    def from_json(text: str) -> "Plan":
        data = json.loads(text)
        version = data.get("version")
        if not isinstance(version, int) or not OLDEST_FORMAT_VERSION <= version <= PLAN_FORMAT_VERSION:
            raise ValueError(f"plan format version {version} is not {PLAN_FORMAT_VERSION}; "
                             f"re-plan with this autopar")
        renamed = {old: new for d in declarations() for since, old, new in d.renamed if version <= since}
        word = lambda w: renamed.get(w, w)  # noqa: E731
        data["version"] = PLAN_FORMAT_VERSION
        data["regions"] = [RegionChoice(**{**r, "strategy": word(r["strategy"]),
                                           "alternatives": {word(k): v for k, v in r.get("alternatives", {}).items()},
                                           "cost": Cost(**r["cost"])}) for r in data["regions"]]
        if renamed:
            data["candidates"] = [{**c, "form": " ".join(map(word, c.get("form", "").split(" ")))}
                                  for c in data["candidates"]]
        data["total"] = Cost(**data["total"])
        def ordered(mesh: dict) -> dict:   # JSON sorts the keys: the mesh's order back
            return {**{dim: mesh[dim] for dim in MESH_ORDER if dim in mesh}, **mesh}
        data["candidates"] = [MeshCandidate(**{**c, "mesh": ordered(c["mesh"])}) for c in data["candidates"]]
        data["mesh"] = ordered(data["mesh"])
        return Plan(**data)

    def save(self, directory: str, *, rank_graphs: dict[int, str] | None = None,
             region_dot: str | None = None, max_ranks: int = 8, measured_step_s: float | None = None) -> str:
        """Write the plan directory (see module docstring) and return its path.

        A plan made by ``autopar.plan``/``compile`` builds the rank graphs (of the first
        ``max_ranks`` ranks) and the drawing itself; a plan loaded from JSON writes only
        what it is given. ``report.html``: the plan as a page
        (:mod:`autopar.planning.report`), with ``measured_step_s`` beside the prediction.
        """
        source = getattr(self, "artifact_source", None)
        if rank_graphs is None and region_dot is None and source is not None:
            rank_graphs, region_dot = source(max_ranks)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "plan.json"), "w") as f:
            f.write(self.to_json())
        with open(os.path.join(directory, "plan.txt"), "w") as f:
            f.write(self.explain() + "\n")
        with open(os.path.join(directory, "report.html"), "w") as f:
            f.write(report_html(self, measured_step_s))
        if self.pipeline:
            timeline = self.timeline()
            with open(os.path.join(directory, "timeline.txt"), "w") as f:
                f.write(timeline.text() + "\n")
            with open(os.path.join(directory, "timeline.svg"), "w") as f:
                f.write(timeline.svg())
        for rank, code in sorted((rank_graphs or {}).items()):
            with open(os.path.join(directory, f"rank{rank}.py"), "w") as f:
                f.write(code)
        if region_dot is not None:
            dot_path = os.path.join(directory, "regions.dot")
            with open(dot_path, "w") as f:
                f.write(region_dot)
            if shutil.which("dot"):
                subprocess.run(["dot", "-Tsvg", dot_path, "-o", os.path.join(directory, "regions.svg")],
                               check=False, capture_output=True)
        return directory

    @staticmethod
    def load(directory: str) -> "Plan":
        with open(os.path.join(directory, "plan.json")) as f:
            return Plan.from_json(f.read())

    # ------------------------------------------------------------------ explanation
    def explain(self) -> str:
        """A readable table: mesh, predicted step, per-region strategy and costs
        (:func:`autopar.planning.explain.explain`)."""
        return explain.explain(self)

    def timeline(self):
        """The simulated schedule of a pipeline plan (:class:`autopar.planning.timeline.Timeline`,
        with ``text()`` and ``svg()``), in units of one chunk's forward; None without a pipeline."""
        if not self.pipeline:
            return None
        pp = self.pipeline
        return simulate(pp["schedule"], pp["stages"], pp["microbatches"], pp["chunks"])

    def top(self, k: int = 5) -> str:
        """The ``k`` fastest feasible configurations weighed, with the predicted step and
        its communication split by group (``autopar plan --top K``)."""
        return explain.top(self, k)

    def flops_per_device(self) -> float:
        """Predicted FLOP/s per device: the model's training FLOPs over the step and the ranks."""
        return self.flops_per_step / self.step_s / self.world_size if self.step_s else 0.0

    def why_not(self, family: str, region: str | None = None) -> str:
        """Why a family of strategies lost or was infeasible (``autopar plan --why-not``):
        ``data``, ``megatron`` (or ``tensor``), ``dsp``, ``tensor3d``, ``cube``, ``pipeline`` or
        ``mixed`` (:func:`autopar.planning.explain.why_not`); with ``region``, why that
        region does not run under it (:func:`autopar.planning.explain.why_not_region`)."""
        if region is not None:
            return explain.why_not_region(self, family, region)
        return explain.why_not(self, family)

    def _same_layout(self, c: MeshCandidate) -> bool:
        """Whether candidate ``c`` has this plan's mesh, form and what the families add to
        the layout (``Language.layout_key``: D&SP's sub-grids, their order, cSub)."""
        def key(layout) -> tuple:
            return tuple(part for d in declarations() for part in d.layout_key(layout))
        return (c.mesh, c.form, key(c)) == (self.mesh, self.form, key(self))

    def _chosen_candidate(self) -> "MeshCandidate | None":
        for c in self.candidates:
            if c.feasible and self._same_layout(c) and abs(c.step_s - self.step_s) <= 1e-9 * self.step_s:
                return c
        return None

    def __str__(self) -> str:
        return self.explain()
