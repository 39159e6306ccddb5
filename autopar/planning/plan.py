"""The plan: a mesh factorisation, one strategy per region, and the predicted costs.

A :class:`Plan` is plain data: deterministic, serialisable to JSON and back
(byte-identical for the same inputs), printable as a table with :meth:`Plan.explain`,
and saved with :meth:`Plan.save` as a directory a reviewer can read::

    plan_dir/
      plan.json            the plan (this module's to_json)
      plan.txt             explain() output
      regions.dot          a drawing of the regions (regions.svg too when graphviz is installed)
      rank0.py, rank1.py…  each rank's rewritten graph as code, with a header naming the pass
      timeline.txt/.svg    a pipeline plan's schedule per rank (megatron Figure 4 style)

Rank order: ``rank = data_index · tensor + tensor_index``, so the ranks of one tensor
group are adjacent (inside a node), as Megatron places them (megatron §3.2, takeaway #1).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field

from autopar.grid import GroupSpec, RankGrid, subgrid_dims
from autopar.strategies.tensor3d.cost import Grid3D
from autopar.strategies.dsp.cost import subgrid_group_specs

PLAN_FORMAT_VERSION = 1
MESH_ORDER = ("pipeline", "data", "z", "y", "x", "tensor")
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

    @property
    def total_comm_s(self) -> float:
        return sum(self.comm_s.values())

    def __add__(self, other: "Cost") -> "Cost":
        comm = dict(self.comm_s)
        for k, v in other.comm_s.items():
            comm[k] = comm.get(k, 0.0) + v
        return Cost(self.compute_s + other.compute_s, comm, self.memory_bytes + other.memory_bytes)


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
    flops_per_step: float = 0.0  # the model's training FLOPs per step (forward x3, x4 recomputing)
    fusion: bool = False  # priced with pointwise chains fused into generated kernels (GPU hardware)
    version: int = PLAN_FORMAT_VERSION

    # ------------------------------------------------------------------ queries
    def degree(self, dim: str) -> int:
        return self.mesh.get(dim, 1)

    def regions_with(self, strategy: str) -> list[str]:
        return [r.region for r in self.regions if r.strategy == strategy]

    def dsp_regions(self) -> dict[str, dict]:
        """The regions split over sub-grids (D&SP or D&SP-cSub): id → the choice's details."""
        return {r.region: r.details for r in self.regions if r.strategy == "dsp"}

    def subgrid_coordinates(self, rank: int) -> tuple[int, int]:
        """``(sub-grid, position in it)`` of ``rank`` under D&SP (``(0, data index)`` without)."""
        if self.subgrids == 1:
            return 0, self.rank_coordinates(rank)["data"]
        coords = self.rank_grid().coordinates(rank)
        return coords["subgrid"], coords["position"]

    def rank_grid(self, members=None) -> RankGrid:
        """How this plan lays its ranks out (:mod:`autopar.grid`): ``data × tensor``,
        ``pipeline × data × tensor``, AxoNN's ``data × z × y × x`` (the cube's too), or
        D&SP's sub-grids, ``position × subgrid`` when topology-aware (round-robin, SUPER
        §V) else ``subgrid × position``. ``members``: the global ranks, in grid order."""
        if self.subgrids > 1:
            dims = subgrid_dims(self.world_size, self.subgrids, self.topology_aware)
        elif self.grid is not None:
            dims = {axis: self.degree(axis) for axis in ("data", "z", "y", "x")}
        else:
            dims = {dim: self.degree(dim) for dim in MESH_ORDER if dim in self.mesh or dim in ("data", "tensor")}
        return RankGrid(dims, members)

    def group_specs(self, tied_positions=()) -> dict[str, GroupSpec | None]:
        """The process groups this plan's rank programs name (``autopar.runtime.groups``),
        as groups of :meth:`rank_grid`: Megatron's ``data`` and ``tensor``; PTD-P's
        ``pipeline``, ``data``, ``tensor`` and a ``tied:<positions>`` group per set of
        pipeline positions in ``tied_positions`` that share a weight; the 3D grid's axes
        and ``replica`` (the ranks of one (x, y): they split the batch, ordered by batch
        chunk ``data·Gz + z``); D&SP's ``segment`` (one position of every sub-grid, in
        sub-grid order), ``subgrid`` (one sub-grid, in position order) and ``data`` (every
        rank in batch-chunk order ``p·g + s``; under cSub the sub-grid). None: no group."""
        one = GroupSpec
        if self.subgrids > 1:
            return {"tensor": None, **subgrid_group_specs(self.csub)}
        if self.grid is not None:
            return {**self.grid.group_specs(), "tensor": None, "segment": None, "subgrid": None}
        if self.pipeline:
            from autopar.runtime.groups import tied_group_name
            tied = {tied_group_name(p): one(("pipeline",), ("pipeline", tuple(p)))
                    for p in sorted({tuple(sorted(h)) for h in tied_positions if len(h) > 1})}
            return {"pipeline": one(("pipeline",)), "data": one(("data",)), "tensor": one(("tensor",)),
                    "segment": None, "subgrid": None, **tied}
        return {"data": one(("data",)), "tensor": one(("tensor",))}

    @property
    def form(self) -> str:
        """``"cube"`` when the grid runs Bian's cube form (``cube3d`` regions); a pipeline's
        schedule (``"pipeline 1f1b"``, ``"pipeline interleaved v=2"``); else ``""``."""
        if self.pipeline:
            v = self.pipeline["chunks"]
            return f"pipeline {self.pipeline['schedule']}" + (f" v={v}" if v > 1 else "")
        return "cube" if self.regions_with("cube3d") else ""

    @property
    def grid(self):
        """AxoNN's ``Gx × Gy × Gz × Gdata`` grid of a 3D plan, else None."""
        if not any(axis in self.mesh for axis in ("x", "y", "z")):
            return None
        return Grid3D(self.degree("x"), self.degree("y"), self.degree("z"), self.degree("data"))

    def batch_parts(self) -> int:
        """Into how many equal chunks the common layers split the batch: the data degree
        (times Gz on a 3D grid: z splits the rows too), or under D&SP-cSub the ranks of
        one sub-grid (sub-grid 0 runs them)."""
        if self.csub:
            return self.degree("data") // self.subgrids
        return self.degree("data") * self.degree("z")

    def batch_chunk(self, rank: int) -> int:
        """Which of the :meth:`batch_parts` batch chunks ``rank`` takes: its data index;
        under D&SP ``p·g + s``, so that a segment group's chunks are one sub-grid chunk
        (``docs/dsp_design.md``); under D&SP-cSub its position ``p`` (every sub-grid's
        rank ``p`` works on the rows of sub-grid 0's rank ``p``)."""
        if self.subgrids == 1:
            coords = self.rank_coordinates(rank)
            return coords["data"] * self.degree("z") + coords.get("z", 0)
        s, p = self.subgrid_coordinates(rank)
        return p if self.csub else p * self.subgrids + s

    def rank_coordinates(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of ``rank`` (the innermost dimension varies fastest); under
        D&SP ``data`` is the rank itself (every rank is a data rank)."""
        mesh = {dim: self.degree(dim) for dim in MESH_ORDER if dim in self.mesh or dim in ("data", "tensor")}
        return RankGrid(mesh).coordinates(rank)

    # ------------------------------------------------------------------ serialisation
    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @staticmethod
    def from_json(text: str) -> "Plan":
        data = json.loads(text)
        if data.get("version") != PLAN_FORMAT_VERSION:
            raise ValueError(f"plan format version {data.get('version')} is not {PLAN_FORMAT_VERSION}; "
                             f"re-plan with this autopar")
        data["regions"] = [RegionChoice(**{**r, "cost": Cost(**r["cost"])}) for r in data["regions"]]
        data["total"] = Cost(**data["total"])
        data["candidates"] = [MeshCandidate(**c) for c in data["candidates"]]
        data["mesh"] = {dim: data["mesh"][dim] for dim in MESH_ORDER if dim in data["mesh"]}
        return Plan(**data)

    def save(self, directory: str, *, rank_graphs: dict[int, str] | None = None,
             region_dot: str | None = None, max_ranks: int = 8) -> str:
        """Write the plan directory (see module docstring) and return its path.

        A plan made by ``autopar.plan``/``compile`` builds the rank graphs (of the first
        ``max_ranks`` ranks) and the drawing itself; a plan loaded from JSON writes only
        what it is given.
        """
        source = getattr(self, "artifact_source", None)
        if rank_graphs is None and region_dot is None and source is not None:
            rank_graphs, region_dot = source(max_ranks)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "plan.json"), "w") as f:
            f.write(self.to_json())
        with open(os.path.join(directory, "plan.txt"), "w") as f:
            f.write(self.explain() + "\n")
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
        """A readable table: mesh, predicted step, per-region strategy and costs."""
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.items())
        lines = [
            f"autopar plan: {self.model} on {self.world_size} rank(s), hardware {self.hardware}, "
            f"global batch {self.global_batch}{' (forced)' if self.forced else ''}",
            f"mesh: {mesh}   " + (f"({'Bian cube' if self.form == 'cube' else '3D grid'} Gx={self.degree('x')} "
                                    f"Gy={self.degree('y')} Gz={self.degree('z')} "
                                    f"Gdata={self.degree('data')}; rank = ((data*Gz + z)*Gy + y)*Gx + x)"
                                    if self.grid is not None else
                                    f"(rank = (pipeline*{self.degree('data')} + data)*{self.degree('tensor')} + "
                                    f"tensor; tensor ranks adjacent, pipeline outermost)" if self.pipeline else
                                    f"(rank = data*{self.degree('tensor')} + tensor; tensor ranks adjacent)")
            + (f"; {'D&SP-cSub' if self.csub else 'D&SP'}: {self.subgrids} sub-grids of "
               f"{self.world_size // self.subgrids} rank(s), {'topology-aware' if self.topology_aware else 'naive'} "
               f"order" + (", common layers on sub-grid 0" if self.csub else "") if self.subgrids > 1 else ""),
            f"predicted step {_ms(self.step_s)}: compute {_ms(self.total.compute_s)}, "
            + ", ".join(f"{k} comm {_ms(v)}" for k, v in sorted(self.total.comm_s.items()))
            + f"; memory per rank {_mb(self.total.memory_bytes)}"
            + ("; activations recomputed in backward to fit" if self.recompute else "")
            + ("; pointwise chains fused into generated kernels" if self.fusion else ""),
            *([f"model: {self.flops_per_step:.4g} FLOP per step -> {self.flops_per_device():.4g} FLOP/s per device "
               f"predicted"] if self.flops_per_step else []),
            "",
        ]
        if self.grid is not None:
            groups = ["x", "y", "z", "data"]
        else:
            groups = ["tensor", "data"] + sorted({k for r in self.regions for k in r.cost.comm_s} - {"tensor", "data"})
        header = ("region", "kind", "strategy", "compute", *(f"comm {g}" for g in groups), "memory", "alternatives")
        rows = [header]
        for first, last, count, r in _runs(self.regions):
            alts = ", ".join(f"{k} {_ms(v)}" for k, v in sorted(r.alternatives.items()) if k != r.strategy)
            comm = (_ms(r.cost.comm_s.get(g, 0.0)) for g in groups)
            name = r.region if count == 1 else f"{first} .. {last} (x{count}, each)"
            rows.append((name, r.kind, r.strategy, _ms(r.cost.compute_s), *comm, _mb(r.cost.memory_bytes),
                         alts or "-"))
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
        for i, row in enumerate(rows):
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        split_branches = [r for r in self.regions if r.strategy == "dsp"]
        if split_branches:
            lines.append("")
            lines.append("branches on sub-grids:")
            lines.extend(f"  {r.region}: {r.reason}" for r in split_branches)
        layered = [r for r in self.regions if r.strategy in ("tensor3d", "cube3d")]
        if layered:
            lines.append("")
            if self.regions_with("cube3d"):
                lines.append("cube layers (Bian et al.; orientation by data flow; Algorithms 1/3: all-gather A's rows "
                             "over the out axis and W over z, reduce-scatter the output's rows over the in axis; "
                             "backward (2/4): all-gather dC over the in axis, reduce-scatter dA over the out axis "
                             "and dW over z; biases on the diagonal ranks, Algorithms 7-8):")
            else:
                lines.append("3D layers (orientation by data flow; Algorithm 1: all-gather W over z, all-reduce the "
                             "output over the in axis; backward: all-reduce dI over the out axis, reduce-scatter dW "
                             "over z):")
            for r in layered:
                lines.append(f"  {r.region}: " + "; ".join(f"{layer['linear']} {layer['orientation']}"
                                                          for layer in r.details.get("layers", [])))
                lines.append(f"    boundary: {r.details.get('boundary', '-')}")
        if self.pipeline:
            lines.append("")
            lines.extend(self.pipeline_text())
        kept_whole = [r for r in self.regions if r.strategy == "replicate" and r.kind != "-"
                      and (self.degree("tensor") > 1 or self.grid is not None)]
        if kept_whole:
            lines.append("")
            lines.append("regions not split over the tensor group:")
            for first, last, count, r in _runs(kept_whole, key=lambda r: r.reason):
                lines.append(f"  {first if count == 1 else f'{first} .. {last} (x{count})'}: {r.reason}")
        if len(self.candidates) > LONG_CANDIDATE_LIST:
            lines.append("")
            lines.append(self.top(8))
            lines.append("rejected: " + rejections(self.candidates))
        elif self.candidates:
            lines.append("")
            lines.append("meshes weighed:")
            for c in self.candidates:
                mesh_c = _mesh_text(c)
                mark = "*" if self._same_layout(c) else " "
                if c.feasible:
                    lines.append(f" {mark} {mesh_c}: step {_ms(c.step_s)}, memory {_mb(c.memory_bytes)}")
                else:
                    lines.append(f" {mark} {mesh_c}: rejected: {c.reason}")
        return "\n".join(lines)

    def timeline(self):
        """The simulated schedule of a pipeline plan (:class:`autopar.strategies.pipeline.timeline.Timeline`,
        with ``text()`` and ``svg()``), in units of one chunk's forward; None without a pipeline."""
        if not self.pipeline:
            return None
        from autopar.strategies.pipeline.timeline import simulate
        pp = self.pipeline
        return simulate(pp["schedule"], pp["stages"], pp["microbatches"], pp["chunks"])

    def pipeline_text(self) -> list[str]:
        """The pipeline part of :meth:`explain`: stages, schedule, bubble, memory, timeline."""
        pp = self.pipeline
        p, v, m = pp["stages"], pp["chunks"], pp["microbatches"]
        lines = [f"pipeline (megatron sec. 2.2): {p * v} stages on {p} pipeline ranks"
                 + (f", {v} chunks per rank (stage c*{p} + r on rank r)" if v > 1 else "")
                 + f"; schedule {pp['schedule']}, {m} microbatch(es) of {pp['microbatch_size']} row(s); predicted "
                 f"bubble (p-1)/(v*m) = {pp['bubble_fraction']:.3f} ({_ms(pp['bubble_s'])}); scatter/gather "
                 f"{'on' if pp['scatter_gather'] else 'off'}"]
        for s in range(p * v):
            blocks = [b for b, a in zip(pp["blocks"], pp["assignment"]) if a == s]
            ends = (" + embedding" if s == 0 else "") + (" + head and loss" if s == p * v - 1 else "")
            sends = (f"; sends {pp['p2p_bytes'][s] / 2**10:.1f} KiB per microbatch" if s < p * v - 1 else "")
            lines.append(f"  stage {s} (rank {s % p}): {', '.join(blocks)}{ends}; "
                         f"{_ms(pp['stage_s'][s])} per microbatch{sends}")
        if pp["tied"]:
            lines.append(f"  tied parameters (gradients summed over their stages' ranks): {', '.join(pp['tied'])}")
        shown = range(p) if p <= 8 else [0, 1, p - 2, p - 1]
        lines.append("  per rank: " + "; ".join(
            (f"... rank {r}" if p > 8 and r == p - 2 else f"rank {r}") + f" {_ms(pp['rank_s'][r])}/microbatch, "
            f"{sum(pp['in_flight'][r])} in flight, {_mb(pp['memory_bytes'][r])} "
            f"({_mb(pp['memory_bytes_recompute'][r])} recomputing)" for r in shown))
        if p <= 8 and m * v <= 32:
            lines.append("timeline (unit: one chunk's forward; backward = 2 units):")
            lines.extend("  " + line for line in self.timeline().text().splitlines())
        else:
            lines.append(f"timeline: {p} ranks x {m * v} chunk-passes, too wide to print here; plan.save() writes "
                         f"timeline.txt and timeline.svg")
        return lines

    def top(self, k: int = 5) -> str:
        """The ``k`` fastest feasible configurations weighed, with the predicted step and
        its communication split by group (``autopar plan --top K``)."""
        feasible = sorted((c for c in self.candidates if c.feasible), key=lambda c: (c.step_s, _mesh_text(c)))
        groups = [g for g in ("tensor", "x", "y", "z", "pipeline", "data") if any(g in c.comm_s for c in feasible)]
        header = ("#", "configuration", "step", *(f"comm {g}" for g in groups), "memory")
        rows = [header]
        for i, c in enumerate(feasible[:k], 1):
            rows.append((str(i), _mesh_text(c), _ms(c.step_s), *(_ms(c.comm_s.get(g, 0.0)) for g in groups),
                         _mb(c.memory_bytes)))
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = [f"the {min(k, len(feasible))} best of {len(feasible)} feasible configuration(s) "
                 f"({len(self.candidates) - len(feasible)} rejected):"]
        for i, row in enumerate(rows):
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def flops_per_device(self) -> float:
        """Predicted FLOP/s per device: the model's training FLOPs over the step and the ranks."""
        return self.flops_per_step / self.step_s / self.world_size if self.step_s else 0.0

    def why_not(self, family: str) -> str:
        """Why a family of strategies lost or was infeasible (``autopar plan --why-not``):
        ``data``, ``megatron`` (or ``tensor``), ``dsp``, ``3d``, ``cube`` or ``pipeline``.
        Names the binding constraint of an infeasible family (the most frequent reason,
        and the configuration closest to fitting), or, for one that lost, its best
        configuration against the chosen one, group by group."""
        family = {"tensor": "megatron", "axonn": "3d", "ptd-p": "pipeline", "d&sp": "dsp"}.get(family.lower(),
                                                                                            family.lower())
        if family not in FAMILIES:
            raise ValueError(f"why_not: unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
        mine = [c for c in self.candidates if _family(c, self.world_size) == family]
        chosen = self._chosen_candidate()
        if not mine:
            return f"{family}: not weighed: {FAMILY_ABSENT[family]}"
        feasible = sorted((c for c in mine if c.feasible), key=lambda c: (c.step_s, _mesh_text(c)))
        if chosen is not None and _family(chosen, self.world_size) == family and feasible and \
                feasible[0].step_s >= chosen.step_s * (1 - 1e-9):
            return f"{family}: chosen: {_mesh_text(chosen)}, step {_ms(chosen.step_s)}"
        if not feasible:
            return f"{family}: infeasible: all {len(mine)} configuration(s) rejected: {rejections(mine)}" + \
                (f"; the closest to fitting: {_mesh_text(c)}: {c.reason}" if (c := closest_to_fitting(mine)) else "")
        best = feasible[0]
        lines = [f"{family}: lost: its best, {_mesh_text(best)}, is predicted at {_ms(best.step_s)} per step "
                 f"against {_ms(self.step_s)} for the plan ({best.step_s / self.step_s:.2f}x)"]
        if chosen is not None:
            groups = sorted(set(best.comm_s) | set(chosen.comm_s))
            rows = [("", "step", "compute+other", *groups, "memory")]
            for label, c in (("plan", chosen), (family, best)):
                rows.append((label, _ms(c.step_s), _ms(c.step_s - sum(c.comm_s.values())),
                             *(_ms(c.comm_s.get(g, 0.0)) for g in groups), _mb(c.memory_bytes)))
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            lines.extend("  " + "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows)
            worse = {g: best.comm_s.get(g, 0.0) - chosen.comm_s.get(g, 0.0) for g in groups}
            worse["compute+other"] = (best.step_s - sum(best.comm_s.values())) - \
                (chosen.step_s - sum(chosen.comm_s.values()))
            g, by = max(sorted(worse.items()), key=lambda kv: kv[1])
            lines.append(f"  the most it loses: {g} (+{_ms(by)})")
        rejected = [c for c in mine if not c.feasible]
        if rejected:
            lines.append(f"  {len(rejected)} other {family} configuration(s) rejected: {rejections(rejected)}")
        return "\n".join(lines)

    def _same_layout(self, c: MeshCandidate) -> bool:
        """Whether candidate ``c`` has this plan's mesh and layout (sub-grids, order, form)."""
        return (c.mesh, c.subgrids, c.topology_aware or c.subgrids == 1, c.csub, c.form) == \
            (self.mesh, self.subgrids, self.topology_aware or self.subgrids == 1, self.csub, self.form)

    def _chosen_candidate(self) -> "MeshCandidate | None":
        for c in self.candidates:
            if c.feasible and self._same_layout(c) and abs(c.step_s - self.step_s) <= 1e-9 * self.step_s:
                return c
        return None

    def __str__(self) -> str:
        return self.explain()


LONG_CANDIDATE_LIST = 40
"""Beyond this many configurations weighed, explain() shows the best few and counts the rest."""

FAMILIES = ("data", "megatron", "dsp", "3d", "cube", "pipeline")
FAMILY_ABSENT = {
    "data": "the batch is the only thing to split; it is always weighed unless a strategy was forced",
    "megatron": "a strategy was forced, or the world has one rank",
    "dsp": "the model has no multi-branch region (fork/join branches or attention heads), or a strategy was forced",
    "3d": "the model has no linear chain or attention region, or a strategy was forced",
    "cube": "a strategy was forced",
    "pipeline": "the model has no repeated blocks to cut between stages, or a strategy was forced",
}


def _family(c: MeshCandidate, world: int) -> str:
    if c.form.startswith("pipeline"):
        return "pipeline"
    if c.form == "cube":
        return "cube"
    if "x" in c.mesh:
        return "3d"
    if c.subgrids > 1:
        return "dsp"
    return "megatron" if c.mesh.get("tensor", 1) > 1 else "data"


def reason_kind(reason: str) -> str:
    """A rejection reason with its numbers taken out, to count rejections by kind."""
    if reason.startswith("needs "):
        return "memory"
    return re.sub(r"\d+", "N", re.split(r"[;.] ", reason)[0])[:100]


def rejections(candidates) -> str:
    """The infeasible candidates counted by :func:`reason_kind`, most frequent first."""
    kinds: dict[str, int] = {}
    for c in candidates:
        if not c.feasible:
            kind = reason_kind(c.reason)
            kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{k} ({n})" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def closest_to_fitting(candidates) -> "MeshCandidate | None":
    """The infeasible candidate needing the least memory (None when none was sized)."""
    sized = [c for c in candidates if not c.feasible and c.memory_bytes is not None]
    return min(sized, key=lambda c: (c.memory_bytes, _mesh_text(c)), default=None)


def _runs(regions, key=None):
    """The rows of a region table, consecutive regions that read the same (identical
    repeated blocks) folded into one: ``(first id, last id, count, representative)``."""
    key = key or (lambda r: (r.kind, r.strategy, round(r.cost.compute_s, 12),
                             tuple(sorted((k, round(v, 12)) for k, v in r.cost.comm_s.items())),
                             round(r.cost.memory_bytes, 3),
                             tuple(sorted((k, round(v, 12)) for k, v in r.alternatives.items())), r.reason))
    runs: list[list] = []
    for r in regions:
        if runs and key(runs[-1][0]) == key(r) and r.kind != "-":
            runs[-1].append(r)
        else:
            runs.append([r])
    out = []
    for run in runs:  # two rows read as easily as one; three and more are folded
        if len(run) >= 3:
            out.append((run[0].region, run[-1].region, len(run), run[0]))
        else:
            out.extend((r.region, r.region, 1, r) for r in run)
    return out


def _mesh_text(c: MeshCandidate) -> str:
    if c.form == "cube":
        if "x" not in c.mesh:
            return "3D cube (Bian)"
        return f"3D cube (Bian) p={c.mesh['x']} data={c.mesh['data']}"
    if "x" in c.mesh:
        text = f"3D x={c.mesh['x']} y={c.mesh['y']} z={c.mesh['z']} data={c.mesh['data']}"
    else:
        text = " x ".join(f"{k}={v}" for k, v in c.mesh.items())
    if c.form.startswith("pipeline"):
        text += f", {c.form}" + (f", {c.reason}" if c.feasible and c.reason else "")
    if c.subgrids > 1:
        text += (f", {'D&SP-cSub' if c.csub else 'D&SP'} {c.subgrids} sub-grids "
                 f"({'topology-aware' if c.topology_aware else 'naive'})")
    return text


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _mb(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.2f} MiB"

