"""The planner: choose the mesh factorisation and each region's strategy with the cost model.

For every factorisation ``world = data × tensor`` the planner prices each region two ways
— split Megatron-style over the tensor group, or replicated within it — and keeps the
cheaper (regions meet at replicated boundaries in 1D Megatron, so the per-region choice
is exact). The step time of a factorisation is

    compute (1 forward + backward per kernel, cost.step_compute_time)
  + tensor communication (per split region: Megatron's g in forward, f in backward,
    each an all-reduce of the region's boundary activation — megatron §2.3, axonn eq 3)
  + the exposed part of the data-parallel gradient all-reduce (axonn eq 3 over the
    data group, stride = tensor degree), which overlaps the backward pass bucket by
    bucket: what exceeds the backward compute, and at least the last bucket.

A factorisation is infeasible when the data degree does not divide the global batch or
the memory per rank (cost.training_memory) exceeds the device's. The fastest feasible
one wins; ties go to the smaller tensor degree. The same inputs give the same plan.

A forced strategy (``{"data": d, "tensor": t}``) skips the search and splits every region
Megatron can split, raising :class:`PlanError` naming the region and sizes when one does
not divide.
"""
from __future__ import annotations

import dataclasses

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from autopar.ir import CAPTURE, REGION_OF, regions, tensor_spec
from autopar.analysis.ops import is_embedding, match_linear
from autopar.cost import model as cm
from autopar.analysis.flops import graph_work
from autopar.strategies.tensor3d.cost import Grid3D, boundary_comm, cube_boundary_comm, cube_layer_comm, grids_of, layer_comm
from autopar.cost.hardware import Hardware
from autopar.planning.plan import Cost, MeshCandidate, Plan, RegionChoice
from autopar.strategies.dsp.cost import dsp_heads_cost, dsp_region_cost, head_widths, split_messages

log = logging.getLogger("autopar.planning")

TENSOR_KINDS = ("vocab", "attention", "linear_chain")
PIPELINE_KEYS = ("microbatches", "schedule", "chunks", "scatter_gather")
GRADIENT_BUCKET_BYTES = 25 * 2**20


class PlanError(ValueError):
    """A forced strategy that cannot run; the message names the argument or region."""


@dataclass(frozen=True)
class Strategy:
    """Forced degrees. ``None`` for a degree means: whatever the world size leaves."""

    data: int | None = None
    tensor: int | None = None
    subgrids: int = 1
    topology_aware: bool = True
    csub: bool = False
    grid: Grid3D | None = None  # AxoNN's Gx x Gy x Gz x Gdata (3D/4D tensor parallelism)
    cube: bool = False  # the grid is Bian's p x p x p cube form (its data degree: None = what the world leaves)
    # pipeline parallelism (megatron §2.2): stages (pipeline ranks), chunks per rank,
    # microbatches (None: the planner chooses), schedule, §4.1's scatter/gather
    pipeline: int = 1
    chunks: int = 1
    microbatches: int | None = None
    schedule: str = "1f1b"
    scatter_gather: bool = True

    @staticmethod
    def parse(strategy: Any) -> "Strategy | None":
        """``"auto"`` → None; ``"data"``; ``"tensor"``; ``{"data": 2, "tensor": 2}``; a Strategy."""
        if strategy is None or strategy == "auto":
            return None
        if isinstance(strategy, Strategy):
            return strategy
        if strategy == "data":
            return Strategy(tensor=1)
        if strategy == "tensor":
            return Strategy(data=1)
        if isinstance(strategy, dict):
            if "pipeline" in strategy:
                return Strategy._parse_pipeline(strategy)
            stray = set(strategy) & set(PIPELINE_KEYS)
            if stray:
                raise PlanError(f"strategy: {sorted(stray)} set up a pipeline; add 'pipeline': p (the number of "
                                f"pipeline ranks)")
            unknown = set(strategy) - {"data", "tensor", "subgrids", "topology_aware", "csub", "x", "y", "z", "cube"}
            if unknown:
                raise PlanError(f"strategy: unknown mesh dimension(s) {sorted(unknown)}; this version plans "
                                f"'data', 'tensor', D&SP 'subgrids' (with 'topology_aware' and 'csub'), the 3D "
                                f"grid 'x', 'y', 'z' (with 'data') and Bian's 'cube' (with 'data')")
            if "cube" in strategy:
                if set(strategy) - {"cube", "data"}:
                    raise PlanError(f"strategy: the cube form {strategy} combines only with 'data'; drop "
                                    f"{sorted(set(strategy) - {'cube', 'data'})}")
                p, data = int(strategy["cube"]), strategy.get("data")
                if p < 2 or (data is not None and int(data) < 1):
                    raise PlanError(f"strategy: cube={p}, data={data}: the cube's edge p must be at least 2 and "
                                    f"the data degree at least 1")
                return Strategy(None if data is None else int(data), 1, grid=Grid3D(p, p, p, int(data or 1)),
                                cube=True)
            if set(strategy) & {"x", "y", "z"}:
                if set(strategy) - {"x", "y", "z", "data"}:
                    raise PlanError(f"strategy: a 3D grid {strategy} combines only with 'data'; drop "
                                    f"{sorted(set(strategy) - {'x', 'y', 'z', 'data'})}")
                try:
                    grid = Grid3D(*(int(strategy.get(a, 1)) for a in ("x", "y", "z", "data")))
                except ValueError as e:
                    raise PlanError(f"strategy: {e}") from None
                return Strategy(grid.data, 1, grid=grid)
            return Strategy(strategy.get("data"), strategy.get("tensor"), int(strategy.get("subgrids", 1)),
                            bool(strategy.get("topology_aware", True)), bool(strategy.get("csub", False)))
        raise PlanError(f"strategy={strategy!r}: expected 'auto', 'data', 'tensor' or a dict like "
                        f"{{'data': 2, 'tensor': 2}}")

    @staticmethod
    def _parse_pipeline(strategy: dict) -> "Strategy":
        """``{"pipeline": p, "microbatches": m, "schedule": "1f1b", "chunks": v, "data": d,
        "tensor": t, "scatter_gather": True}``: PTD-P (megatron §2-§4)."""
        from autopar.strategies.pipeline.schedules import SCHEDULES
        unknown = set(strategy) - {"pipeline", "data", "tensor"} - set(PIPELINE_KEYS)
        if unknown:
            raise PlanError(f"strategy: a pipeline combines with 'data' and 'tensor' (PTD-P) in this version, not "
                            f"{sorted(unknown)}; drop them")
        p, v = int(strategy["pipeline"]), int(strategy.get("chunks", 1))
        name = strategy.get("schedule", "interleaved" if v > 1 else "1f1b")
        m = strategy.get("microbatches")
        if p < 2 or v < 1 or (m is not None and int(m) < 1):
            raise PlanError(f"strategy: pipeline={p}, chunks={v}, microbatches={m}: a pipeline needs at least 2 "
                            f"ranks, and chunks and microbatches at least 1")
        if name not in SCHEDULES:
            raise PlanError(f"strategy: unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
        if v > 1 and name != "interleaved":
            raise PlanError(f"strategy: chunks={v} needs the interleaved schedule, not {name!r}")
        return Strategy(strategy.get("data"), strategy.get("tensor"), pipeline=p, chunks=v,
                        microbatches=None if m is None else int(m), schedule=name,
                        scatter_gather=bool(strategy.get("scatter_gather", True)))

    def resolve(self, world: int) -> tuple[int, int]:
        data, tensor = self.data, self.tensor
        if data is None and tensor is None:
            data, tensor = world, 1
        elif data is None:
            data = world // tensor if world % tensor == 0 else 0
        elif tensor is None:
            tensor = world // data if world % data == 0 else 0
        if data * tensor != world or data < 1 or tensor < 1:
            raise PlanError(f"strategy: the forced degrees data={self.data} x tensor={self.tensor} do not match "
                            f"the world size {world}; give degrees whose product is {world}")
        return data, tensor


def _region_sizes(region) -> list[tuple[str, int]]:
    d = region.details
    if region.kind == "attention":
        return [("attention heads", d["heads"]), ("key/value heads", d["kv_heads"])]
    if region.kind == "linear_chain":
        return [("hidden width", d["hidden"])]
    if region.kind == "vocab":
        return [("vocabulary size", d["vocab_size"])]
    return []


def _boundary_bytes(gm: fx.GraphModule, region) -> float:
    """Bytes of the activation entering the region's column linears (= its output size)."""
    table = {n.name: n for n in gm.graph.nodes}
    d = region.details
    first = {"attention": d.get("q_proj"), "linear_chain": (d.get("column") or [None])[0],
             "vocab": (d.get("embeddings") or [None])[0]}[region.kind]
    node = table[first]
    if region.kind == "vocab":
        spec = tensor_spec(node)  # the looked-up rows [.., hidden]
    else:
        arg = next(iter(node.all_input_nodes))
        spec = tensor_spec(arg)
    return float(spec.nbytes) if spec is not None else 0.0


def _fuse_work(gm: fx.GraphModule, work: dict) -> int:
    """Price each chain the fusion pass would generate a kernel for as one kernel
    (megatron §4.2): it reads the chain's inputs and writes the values read outside it
    once, instead of every op reading and writing its own. The first kernel of the chain
    carries the chain's FLOPs and bytes; the others become free (no launch, no bytes,
    nothing saved for backward: the kernel's backward recomputes from its inputs).
    Returns the number of chains."""
    from autopar.transforms.fusion import fusible_chains
    chains = fusible_chains(gm)
    for nodes in chains:
        inside = set(nodes)
        kernels = [n for n in nodes if work.get(n.name) is not None and work[n.name].is_kernel]
        if not kernels:
            continue
        read = {a for n in nodes for a in n.all_input_nodes if a not in inside}
        written = [n for n in nodes if any(u not in inside for u in n.users)]
        moved = sum(s.nbytes for a in read if (s := tensor_spec(a)) is not None) + \
            sum(s.nbytes for n in written if (s := tensor_spec(n)) is not None)
        flops = sum(work[n.name].flops for n in kernels)
        work[kernels[0].name] = dataclasses.replace(work[kernels[0].name], flops=flops, bytes_moved=moved)
        for n in kernels[1:]:
            work[n.name] = dataclasses.replace(work[n.name], flops=0, bytes_moved=0, is_kernel=False)
    return len(chains)


class _Model:
    """Per-node work and per-region facts of one analysed graph, computed once."""

    def __init__(self, gm: fx.GraphModule, fusion: bool = False):
        self.gm = gm
        self.work = graph_work(gm)
        self.fused_chains = _fuse_work(gm, self.work) if fusion else 0
        self.regions = [r for r in regions(gm) if r.kind in TENSOR_KINDS]
        self.params = {name: p for name, p in gm.named_parameters(remove_duplicate=True)}
        self.param_region: dict[str, str] = {}
        for node in gm.graph.nodes:
            rid = next((node.meta.get(REGION_OF, {}).get(k) for k in TENSOR_KINDS
                        if node.meta.get(REGION_OF, {}).get(k)), None)
            if rid is None:
                continue
            match = match_linear(node, gm)
            names = [match.weight, match.bias] if match else []
            emb = is_embedding(node, gm)
            if emb:
                names.append(emb[1])
            for name in names:
                if name:
                    self.param_region.setdefault(name, rid)
        self.node_region = {}
        for r in self.regions:
            for name in r.nodes:
                self.node_region.setdefault(name, r.id)
        self.boundary = {r.id: _boundary_bytes(gm, r) for r in self.regions}
        spec0 = next((tensor_spec(n) for n in gm.graph.nodes if n.op == "placeholder"), None)
        self.batch = spec0.shape[0] if spec0 is not None and spec0.shape else 1
        self._table = {n.name: n for n in gm.graph.nodes}
        # the search prices thousands of layouts: what depends only on a set of nodes is
        # computed once per set and per scale (see _Model.seconds)
        self._node_bytes = {}
        for name, w in self.work.items():
            spec = tensor_spec(self._table[name]) if w.is_kernel and name in self._table else None
            if spec is not None:
                self._node_bytes[name] = float(spec.nbytes)
        self._sigs: dict[tuple, int] = {}      # interned keys (region classes, work signatures) -> ids
        self._sig_of: dict[tuple, int] = {}    # tuple of node names -> signature id
        self._seconds: dict[tuple, float] = {}
        self._bytes: dict[tuple, float] = {}
        self._region_params = self._param_elems_by_region()
        self.region_class = {r.id: self._class_of(r) for r in self.regions}
        # filled by the searches that need them, the same for every configuration
        self.memo_3d: dict[tuple, tuple] = {}         # 3D pricing per region class and grid
        self.layout_3d: tuple | None = None           # splittable regions, row outputs, plain linears
        self.flags_3d: dict[str, tuple] | None = None  # how each splittable region meets its neighbours
        self.pipeline_shapes: dict[int, object] = {}  # stage count -> _PipelineShape or its PlanError
        self.node_flops: dict[str, float] | None = None
        self._rule_gaps: dict[str, str] | None = None
        from autopar.strategies.data.rewrite import batch_norm_arguments
        # batch norms that normalise over the batch (training mode): exact only when the
        # whole batch is synchronised at once (data parallelism, sync_batch_norm)
        self.batch_norms = [n.name for n in gm.graph.nodes if batch_norm_arguments(n) is not None]

    def rule_gaps(self) -> dict[str, str]:
        """Region id → why it stays replicated: it holds an op that no split rule covers
        (:func:`autopar.strategies.megatron.rewrite.regions_without_rules`), so splitting it
        would all-gather unpriced values mid-region. Found once per model, probing each
        region at the smallest degree that divides its sizes, and logged."""
        if self._rule_gaps is None:
            from autopar.strategies.megatron.rewrite import regions_without_rules
            by_degree: dict[int, list[str]] = {}
            for r in self.regions:
                sizes = [size for _, size in _region_sizes(r)]
                degree = next((k for k in range(2, max(sizes, default=1) + 1) if all(s % k == 0 for s in sizes)), 0)
                if degree:
                    by_degree.setdefault(degree, []).append(r.id)
            self._rule_gaps = {}
            for degree, ids in sorted(by_degree.items()):
                self._rule_gaps.update(regions_without_rules(self.gm, ids, degree))
            for rid, why in self._rule_gaps.items():
                log.warning("region %s: %s", rid, why)
        return self._rule_gaps

    def _param_elems_by_region(self) -> dict[str, int]:
        seen, total = set(), {}
        for name, rid in self.param_region.items():
            p = self.params.get(name)
            if p is not None and (rid, id(p)) not in seen:
                seen.add((rid, id(p)))
                total[rid] = total.get(rid, 0) + p.numel()
        return total

    def _class_of(self, region) -> int:
        """Regions of identical repeated blocks get the same class: same kind, sizes, work,
        node shapes and parameter count; the search prices one region per class."""
        shapes = []
        for name in region.nodes:
            n = self._table[name]
            what = type(self.gm.get_submodule(n.target)).__name__ if n.op == "call_module" else str(n.target)
            spec = tensor_spec(n)
            shapes.append((n.op, what, None if spec is None else tuple(spec.shape)))
        key = (region.kind, tuple(_region_sizes(region)), self.boundary[region.id],
               self.region_param_elems(region.id), tuple(shapes))
        return self._sigs.setdefault(("class", key), len(self._sigs))

    def signature(self, names) -> int:
        """An id shared by node sets with the same kernels (same work, same bytes)."""
        key = tuple(names)
        sig = self._sig_of.get(key)
        if sig is None:
            works = sorted((w.is_matmul, w.flops, w.bytes_moved, cm.passes_per_step(w), self._node_bytes.get(n, 0.0))
                           for n in key if (w := self.work.get(n)) is not None and w.is_kernel)
            sig = self._sigs.setdefault(("works", tuple(works)), len(self._sigs))
            self._sig_of[key] = sig
        return sig

    def seconds(self, names, hw: Hardware, scale: float, recompute: bool = False) -> float:
        """Step compute seconds of the nodes ``names`` with their work scaled by ``scale``
        (1 forward + backward per kernel, one forward more when ``recompute``), memoised
        per work signature and scale."""
        sig = self.signature(names)
        key = (sig, scale, hw, recompute)
        t = self._seconds.get(key)
        if t is None:
            t = 0.0
            for name in names:
                w = self.work.get(name)
                if w is None or not w.is_kernel:
                    continue
                forward = (cm.matmul_time(w.flops * scale, hw) if w.is_matmul
                           else cm.memory_bound_time(w.bytes_moved * scale, hw))
                t += forward * cm.passes_per_step(w, recompute=recompute)
            self._seconds[key] = t
        return t

    def region_param_elems(self, rid: str) -> int:
        return self._region_params.get(rid, 0)

    def activation_bytes(self, names, scale: float) -> float:
        """Bytes the kernels among ``names`` save for backward, times ``scale``."""
        key = tuple(names)
        total = self._bytes.get(key)
        if total is None:
            total = self._bytes[key] = sum(self._node_bytes.get(n, 0.0) for n in key)
        return total * scale


def _compute(model: _Model, names, hw: Hardware, scale: float, recompute: bool = False) -> float:
    """Step compute seconds of the named nodes with their work scaled by ``scale``."""
    return model.seconds(names, hw, scale, recompute)


def _price(model: _Model, hw: Hardware, data: int, tensor: int, force_split: bool,
           keep_whole: dict[str, str] | None = None, recompute: bool = False):
    """(region choices, total cost, step seconds) of one factorisation; ``keep_whole``:
    region id → why it stays replicated whatever the tensor degree; ``recompute``: the
    regions' forward runs twice (a pipeline's blocks, megatron §3.5)."""
    keep_whole = {**(model.rule_gaps() if tensor > 1 else {}), **(keep_whole or {})}
    choices: list[RegionChoice] = []
    in_region: set[str] = set()
    split_param_elems = 0
    tensor_comm = 0.0
    activations = 0.0
    compute = 0.0
    for r in model.regions:
        in_region.update(r.nodes)
        divisible = all(size % tensor == 0 for _, size in _region_sizes(r))
        replicate = Cost(_compute(model, r.nodes, hw, 1 / data, recompute), {}, 0.0)
        options = {"replicate": replicate}
        if tensor > 1 and divisible:
            comm = 2 * cm.all_reduce_time(tensor, model.boundary[r.id] / data, hw) * (1.5 if recompute else 1)
            options["megatron"] = Cost(_compute(model, r.nodes, hw, 1 / (data * tensor), recompute),
                                       {"tensor": comm}, 0.0)
        seconds = {k: c.compute_s + c.total_comm_s for k, c in options.items()}
        if r.id in keep_whole:
            options = {"replicate": replicate}
            seconds = {"replicate": replicate.compute_s}
            chosen, reason = "replicate", keep_whole[r.id]
        elif force_split and "megatron" in options:
            chosen, reason = "megatron", "split wherever the tensor degree divides"
        elif tensor == 1:
            chosen, reason = "replicate", "tensor degree 1: data parallel only"
        elif not divisible:
            sizes = ", ".join(f"{n} {s}" for n, s in _region_sizes(r))
            chosen, reason = "replicate", f"{sizes} not divisible by tensor degree {tensor}"
        else:
            chosen = min(sorted(seconds), key=seconds.__getitem__)
            reason = "cheapest predicted step time"
        c = options[chosen]
        params = model.region_param_elems(r.id)
        local_params = params / tensor if chosen == "megatron" else params
        if chosen == "megatron":
            split_param_elems += params
        act = model.activation_bytes(r.nodes, 1 / data / (tensor if chosen == "megatron" else 1))
        activations += act
        c.memory_bytes = cm.training_memory(local_params, act)
        compute += c.compute_s
        tensor_comm += c.comm_s.get("tensor", 0.0)
        choices.append(RegionChoice(r.id, r.kind, chosen, c, seconds, reason))
    outside = [n.name for n in model.gm.graph.nodes if n.name not in in_region]
    outside_compute = _compute(model, outside, hw, 1 / data)
    compute += outside_compute
    total_params = sum(p.numel() for p in model.params.values())
    local_params = total_params - split_param_elems + split_param_elems / tensor
    outside_act = model.activation_bytes(outside, 1 / data)
    activations += outside_act
    exposed = _exposed_data_comm(data, tensor, local_params * 4, compute, hw)
    memory = cm.training_memory(local_params, activations)
    outside_params = total_params - sum(model.region_param_elems(r.id) for r in model.regions)
    choices.append(RegionChoice("(outside regions)", "-", "replicate",
                                Cost(outside_compute, {}, cm.training_memory(outside_params, outside_act)),
                                {}, "not in a splittable region"))
    total = Cost(compute, {"tensor": tensor_comm, "data": exposed}, memory)
    return choices, total, compute + tensor_comm + exposed


def _region_linears(region) -> list[tuple[str, bool]]:
    """The linears of a 3D region with their orientation (transposed?) by data flow: the
    ones reading the region's input are plain, the one reading their output transposed."""
    d = region.details
    if region.kind == "linear_chain":
        return [(n, False) for n in d["column"]] + [(d["row"], True)]
    return [(n, False) for n in dict.fromkeys((d["q_proj"], d["k_proj"], d["v_proj"]))] + [(d["out_proj"], True)]


def _price_3d(model: _Model, hw: Hardware, grid: Grid3D, forced: bool, split_all: bool = False,
              cube: bool = False, materialize: bool = True):
    """(region choices, total cost, step seconds) of a ``Gx × Gy × Gz × Gdata`` grid.

    Per 3D region: its linears' collectives by axonn eqs 4-7 (``grid3d.layer_comm``, each
    group's bandwidth by eq 10), the boundary re-layout over y (``grid3d.boundary_comm``),
    the linears' compute over all ranks and the ops between them over x (they are
    replicated over y), rows over z and data. Everything else is replicated over x and y
    with its rows split over z and data. Gradients: 3D weight shards are all-reduced over
    data (eq 8), everything else over z and data (the ``replica`` group); both overlap
    the backward pass as data parallelism does. Overlap inside a layer (axonn §IV) is not
    subtracted: like axonn's model, eq 9 ranks the grids by their full communication.
    ``forced``: split every region and raise on one the grid does not divide;
    ``split_all``: split every region the grid divides, cheaper or not.

    ``cube``: Bian's form on the same (cubic) grid (``cube3d``): each layer's collectives
    by ``grid3d.cube_layer_comm``, its boundary by ``grid3d.cube_boundary_comm``, the ops
    between the layers split over y as well (their rows), activations and biases
    balanced over the cube, and the biases' gradients summed over data only.

    ``materialize=False`` (the search over grids): regions of one class (identical
    repeated blocks) entering and leaving the same way are priced once and the returned
    choices are those shared representatives; the winner is priced again with
    ``materialize=True`` for its per-region table."""
    from autopar.strategies.cube.rewrite import check_rows, planned_cube_shards
    from autopar.strategies.propagation import TensorParallelError
    from autopar.strategies.tensor3d.rewrite import planned_grid3d_shards
    split_name = "cube3d" if cube else "tensor3d"
    planned = planned_cube_shards if cube else planned_grid3d_shards
    table = {n.name: n for n in model.gm.graph.nodes}
    parts = grid.z * grid.data  # the batch chunks
    world = grid.size
    label = f"{grid.x}x{grid.y}x{grid.z}x{grid.data}"
    choices: list[RegionChoice] = []
    in_region: set[str] = set()
    comm = {"x": 0.0, "y": 0.0, "z": 0.0}
    if model.layout_3d is None:  # the same for every grid
        splittable = [r for r in model.regions if r.kind in ("attention", "linear_chain")]
        model.layout_3d = (splittable, {_region_linears(r)[-1][0] for r in splittable},
                           {name for r in splittable for name, transposed in _region_linears(r) if not transposed})
    splittable, row_outputs, plain_linears = model.layout_3d
    compute = activations = 0.0
    local_elems = 0.0
    shard_elems = 0.0  # 3D weight shards per rank (all-reduced over data only)

    def price_region(r):
        shard_part = 0.0
        replicate = Cost(_compute(model, r.nodes, hw, 1 / parts), {}, 0.0)
        options = {"replicate": replicate}
        why_not = "vocabulary regions stay replicated in 3D plans" if r.kind == "vocab" else None
        shards = {}
        if why_not is None:
            try:
                shards = planned(model.gm, regions=[r.id], grid=grid)
                if cube:  # the rows of each rank's batch chunk split over x and y
                    first = match_linear(table[_region_linears(r)[0][0]], model.gm).input
                    spec = tensor_spec(first)
                    rows = spec.shape[0] // parts if spec is not None and len(spec.shape) > 1 else None
                    check_rows(rows, grid, f"region {r.id}")
            except TensorParallelError as e:
                if forced:
                    raise PlanError(f"strategy: grid {label}: {e}") from None
                why_not = str(e)
        layers, boundary = [], ""
        if why_not is None:
            linears = _region_linears(r)
            names = {n for n, _ in linears}
            region_comm = {"x": 0.0, "y": 0.0, "z": 0.0}
            for name, transposed in linears:
                match = match_linear(table[name], model.gm)
                spec = tensor_spec(match.input)
                rows = spec.numel // spec.shape[-1] // grid.data
                if cube:
                    by_group = cube_layer_comm(rows, match.in_features, match.out_features, grid, hw,
                                               transposed=transposed, bias=match.bias is not None,
                                               element_bytes=spec.dtype.itemsize)
                else:
                    by_group = layer_comm(rows, match.in_features, match.out_features, grid, hw,
                                          transposed=transposed, element_bytes=spec.dtype.itemsize).by_group()
                for axis, seconds in by_group.items():
                    if axis != "data":  # eq 8 goes with the data all-reduce below
                        region_comm[axis] += seconds
                layers.append({"linear": name, "orientation": "transposed (in x, out y)" if transposed
                               else "plain (in y, out x)"})
            # the re-layouts where the flow enters and leaves the region; none between a
            # transposed layer and the next region's plain layers that read it directly
            first, last = table[linears[0][0]], table[linears[-1][0]]
            entry = match_linear(first, model.gm).input
            enters = 0.0 if entry.name in row_outputs else tensor_spec(entry).nbytes
            leaves = 0.0 if all(u.name in plain_linears for u in last.users) else tensor_spec(last).nbytes
            if cube:
                for axis, seconds in cube_boundary_comm(enters, leaves, grid, hw).items():
                    region_comm[axis] += seconds
                boundary = ("input " + ("cut to y column blocks and x row blocks (backward all-gathers over y "
                                        "and x)" if enters else
                                        "read as A_ijl from the previous region (no re-layout)")
                            + ", output " + ("all-gathered over y, then x" if leaves else
                                             "read as A_ijl by the next region (no re-layout)"))
            else:
                region_comm["y"] += boundary_comm(enters, leaves, grid, hw)
                boundary = ("input " + ("cut to y blocks (backward all-gather over y)" if enters else
                                        "read split over y from the previous region (no re-layout)")
                            + ", output " + ("all-gathered over y" if leaves else
                                             "read split over y by the next region (no re-layout)"))
            split = _compute(model, [n for n in r.nodes if n in names], hw, 1 / world)
            between_share = 1 / (grid.x * grid.y * parts) if cube else 1 / (grid.x * parts)
            between = _compute(model, [n for n in r.nodes if n not in names], hw, between_share)
            options[split_name] = Cost(split + between, region_comm, 0.0)
        seconds = {k: c.compute_s + c.total_comm_s for k, c in options.items()}
        if split_name in options and (forced or split_all):
            chosen = split_name
            reason = (f"{'cube' if cube else '3D grid'} {label}, "
                      + ("forced" if forced else "split wherever it divides"))
        elif why_not is not None:
            chosen, reason = "replicate", why_not
        else:
            chosen = min(sorted(seconds), key=seconds.__getitem__)
            reason = f"{'cube' if cube else '3D grid'} {label}: cheapest predicted step time"
        c = options[chosen]
        params = model.region_param_elems(r.id)
        details = {}
        per_rank = float(params)
        if chosen == split_name:
            per_rank = 0.0
            gathered = 0.0  # each layer's all-gathered block, kept from forward to backward
            for name, shard in shards.items():
                numel = model.params[name].numel()
                out_g = grid.y if shard.transposed else grid.x
                if shard.vector:  # a diagonal rank of the cube holds 1/(p·Gz) of it, others none
                    per_rank += numel / (out_g * grid.z) if cube else numel / out_g
                else:
                    per_rank += numel / (grid.x * grid.y * grid.z)
                    gathered += numel / (grid.x * grid.y)
                if not shard.vector or cube:
                    shard_part += numel / (grid.x * grid.y * grid.z)
            per_rank += params - sum(model.params[n].numel() for n in shards)
            act = model.activation_bytes(r.nodes, 1 / (grid.x * (grid.y if cube else 1) * parts)) + gathered * 4
            details = {"grid": label, "layers": layers, "boundary": boundary}
            if cube:
                details["form"] = "cube (Bian et al.)"
        else:
            act = model.activation_bytes(r.nodes, 1 / parts)
        c.memory_bytes = cm.training_memory(per_rank, act)
        return RegionChoice(r.id, r.kind, chosen, c, seconds, reason, details), per_rank, act, shard_part

    memo = model.memo_3d
    flags = model.flags_3d
    if flags is None:  # how each splittable region meets its neighbours: the same for every grid
        flags = model.flags_3d = {}
        for r in splittable:
            linears = _region_linears(r)
            entry = match_linear(table[linears[0][0]], model.gm).input
            flags[r.id] = (entry.name in row_outputs,
                           all(u.name in plain_linears for u in table[linears[-1][0]].users))
    for r in model.regions:
        in_region.update(r.nodes)
        if materialize:
            priced = price_region(r)
        else:
            key = (model.region_class[r.id], flags.get(r.id), grid, forced, split_all, cube, hw)
            priced = memo.get(key)
            if priced is None:
                priced = memo[key] = price_region(r)
        choice, per_rank, act, shard_part = priced
        local_elems += per_rank
        activations += act
        shard_elems += shard_part
        compute += choice.cost.compute_s
        for axis, v in choice.cost.comm_s.items():
            comm[axis] += v
        choices.append(choice)
    outside = [n.name for n in model.gm.graph.nodes if n.name not in in_region]
    outside_compute = _compute(model, outside, hw, 1 / parts)
    compute += outside_compute
    outside_params = sum(p.numel() for p in model.params.values()) - sum(model.region_param_elems(r.id)
                                                                        for r in model.regions)
    local_elems += outside_params
    outside_act = model.activation_bytes(outside, 1 / parts)
    activations += outside_act
    replicated_elems = local_elems - shard_elems
    if grid.z == 1:  # one group: the replica group is the data group
        data = _exposed_data_comm(grid.data, grid.x * grid.y, local_elems * 4, compute, hw)
    else:
        data = (_exposed_data_comm(parts, grid.x * grid.y, replicated_elems * 4, compute, hw)
                + _exposed_data_comm(grid.data, grid.x * grid.y * grid.z, shard_elems * 4, compute, hw))
    choices.append(RegionChoice("(outside regions)", "-", "replicate",
                                Cost(outside_compute, {}, cm.training_memory(outside_params, outside_act)),
                                {}, "not in a splittable region"))
    total = Cost(compute, {**comm, "data": data}, cm.training_memory(local_elems, activations))
    return choices, total, compute + sum(comm.values()) + data


def _branch_parameters(gm: fx.GraphModule, names: list[str]) -> list[str]:
    """Qualified names of the parameters the nodes ``names`` use (get_attr or module)."""
    table = {n.name: n for n in gm.graph.nodes}
    found: dict[str, None] = {}
    for name in names:
        node = table[name]
        targets = [a for a in node.all_input_nodes if a.op == "get_attr"] + ([node] if node.op == "get_attr" else [])
        for arg in targets:
            found[str(arg.target)] = None
        if node.op == "call_module":
            for pname, _ in gm.get_submodule(node.target).named_parameters():
                found[f"{node.target}.{pname}"] = None
    params = dict(gm.named_parameters())
    return [n for n in found if n in params]


def subgraph_regions(gm: fx.GraphModule) -> list:
    """The regions D&SP can split: outermost fork/join regions (explicit branches) and
    attention regions (heads) not inside one of them."""
    explicit = [r for r in regions(gm, "fork_join") if r.details.get("parent") is None]
    inside = {name for r in explicit for name in r.nodes}
    heads = [r for r in regions(gm, "attention") if not set(r.details["core"]) & inside]
    return explicit + heads


def _batch_baked(gm: fx.GraphModule) -> bool:
    """Whether D&SP (branches on more rows than the common layers) cannot run this graph:
    explicit branches captured by torch.export, whose views and constants hold the batch.
    Attention cores (matmuls, softmax, sdpa) hold none; cSub keeps the rows unchanged."""
    capture = gm.meta.get(CAPTURE)
    exported = capture is not None and capture.tracer != "symbolic_trace"
    return exported and any(r.kind == "fork_join" for r in subgraph_regions(gm))


def _branch_count(region) -> int:
    return region.details["heads"] if region.kind == "attention" else len(region.details["branches"])


def _price_subgraph(model: _Model, hw: Hardware, data: int, g: int, topology_aware: bool, csub: bool):
    """D&SP (or D&SP-cSub) choices for the regions of :func:`subgraph_regions`, and the
    compute they replace in the common layers' pricing (SUPER §III-B/C; priced by
    ``subgraph.dsp_region_cost`` and ``subgraph.dsp_heads_cost``). The common layers
    split the batch ``data`` ways, or ``data / g`` ways in cSub (on sub-grid 0)."""
    common_parts = data // g if csub else data
    found = subgraph_regions(model.gm)
    if not found:
        raise PlanError(f"strategy: subgrids={g} asks for D&SP, but the model has no multi-branch region (several "
                        f"branches from one value rejoined by a sum or a concat, or attention heads); use data or "
                        f"tensor parallelism")
    table = {n.name: n for n in model.gm.graph.nodes}
    name = "D&SP-cSub" if csub else "D&SP"
    order = "topology-aware" if topology_aware else "naive"
    # SUPER eqs 3-7: messages of one segmented split on this placement
    messages = split_messages(data, g, hw.devices_per_node, topology_aware)
    counted = (f"messages per split/join {messages.intra_node} intra-node, {messages.inter_node} inter-node "
               f"({hw.devices_per_node} per node)")
    choices, replaced = [], {}
    for r in found:
        d = r.details
        if _branch_count(r) < g:
            raise PlanError(f"region {r.id}: {_branch_count(r)} {'heads' if r.kind == 'attention' else 'branches'} "
                            f"cannot fill {g} sub-grids; force subgrids <= {_branch_count(r)}")
        if r.kind == "attention":
            core = [model.work[n] for n in d["core"]]
            bundle = sum(tensor_spec(table[n]).nbytes for n in d["core_inputs"])
            out = tensor_spec(table[d["core"][-1]]).nbytes
            cost = dsp_heads_cost(core, bundle, out, data, g, hw, topology_aware=topology_aware, csub=csub)
            dp = _compute(model, d["core"], hw, 1 / data)
            common = _compute(model, d["core"], hw, 1 / common_parts)
            widths = head_widths(d["heads"], g)
            starts = [sum(widths[:s]) for s in range(g)]
            share = ", ".join(f"s{s}:heads {starts[s]}-{starts[s] + widths[s] - 1}" for s in range(g))
            details = {"subgrids": g, "heads": widths, "branch_params": [], "topology_aware": topology_aware}
            params_per_rank = 0
        else:
            if d["side_inputs"] or (d["passthrough"] and d["join_op"] == "concat"):
                raise PlanError(f"region {r.id}: its branches read values from outside the region "
                                f"({d['side_inputs']}) or the concat takes a value no branch computes; D&SP does "
                                f"not split it in this version")
            if d["join_op"] == "concat" and d["concat_dim"] == 0:
                raise PlanError(f"region {r.id}: concatenates along the batch dimension; D&SP cannot split it")
            works = [[model.work[n] for n in branch] for branch in d["branches"]]
            params = [_branch_parameters(model.gm, branch) for branch in d["branches"]]
            counts = [sum(model.params[p].numel() for p in names) for names in params]
            fork = tensor_spec(table[d["fork"]])
            join = tensor_spec(table[d["join"]])
            cost = dsp_region_cost(works, counts, fork.nbytes, join.nbytes, d["join_op"], data, g, hw,
                                   topology_aware=topology_aware, csub=csub)
            dp = _compute(model, r.nodes, hw, 1 / data)
            common = _compute(model, r.nodes, hw, 1 / common_parts)
            share = ", ".join(f"s{s}:{[b for b, o in enumerate(cost.assignment) if o == s]}" for s in range(g))
            details = {"subgrids": g, "assignment": list(cost.assignment), "branch_params": params,
                       "topology_aware": topology_aware}
            params_per_rank = cost.branch_param_elems_per_rank
        details.update(intra_node_messages=messages.intra_node, inter_node_messages=messages.inter_node)
        replaced[r.id] = common
        choices.append(RegionChoice(
            r.id, r.kind, "dsp", Cost(cost.compute_s, dict(cost.comm_s), cm.training_memory(params_per_rank, 0.0)),
            {"data": dp}, f"{name} over {g} sub-grids ({order} order); branches {share}; {counted}", details))
    return choices, replaced


def _exposed_data_comm(data: int, stride: int, grad_bytes: float, compute: float, hw: Hardware) -> float:
    """The data-parallel gradient all-reduce (axonn eq 3 over the data group; ``stride``
    between its ranks: the tensor degree, or g for a topology-aware sub-grid) left after
    overlapping the backward pass bucket by bucket: what exceeds the backward compute
    (about 2/3 of a step's), and at least the last bucket."""
    if data == 1:
        return 0.0
    data_comm = cm.all_reduce_time(data, grad_bytes, hw, stride=stride)
    last_bucket = cm.all_reduce_time(data, min(grad_bytes, GRADIENT_BUCKET_BYTES), hw, stride=stride)
    return max(data_comm - compute * 2 / 3, last_bucket)


def _check_forced_sizes(model: _Model, data: int, tensor: int) -> None:
    """A forced data degree must divide the batch, a forced tensor degree every region's
    split sizes: name the argument or region otherwise."""
    if model.batch % data:
        raise PlanError(f"example_inputs: the batch {model.batch} is not divisible by the data degree {data}; "
                        f"give a batch that is a multiple of {data}, or another strategy")
    for r in model.regions:
        for what, size in _region_sizes(r):
            if tensor > 1 and size % tensor:
                raise PlanError(f"region {r.id}: {what} = {size} is not divisible by the tensor degree "
                                f"{tensor}; force a tensor degree that divides it or use strategy='auto'")


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


class Progress:
    """Counts the configurations priced and reports, at most every ``every`` seconds once
    a search has run ``after`` seconds, ``report(done, total, elapsed)``."""

    def __init__(self, report, *, after: float = 1.0, every: float = 0.5):
        self.report, self.after, self.every = report, after, every
        self.total = self.done = 0
        self._start = self._last = time.perf_counter()

    def tick(self) -> None:
        self.done += 1
        now = time.perf_counter()
        if now - self._start >= self.after and (now - self._last >= self.every or self.done == self.total):
            self._last = now
            self.report(self.done, self.total, now - self._start)


def plan_graph(gm: fx.GraphModule, world_size: int, hw: Hardware, strategy: Any = "auto",
               *, model_name: str | None = None, progress: Progress | None = None) -> Plan:
    """Plan an analysed graph (captured at the global batch) for ``world_size`` ranks;
    ``progress`` hears of every configuration priced."""
    model = _Model(gm, fusion=hw.fused_kernels)
    plan_ = _plan_graph(model, world_size, hw, strategy, model_name, progress or Progress(lambda *a: None))
    plan_.fusion = hw.fused_kernels
    forward = sum(w.flops for w in model.work.values() if w.is_kernel)
    plan_.flops_per_step = float(forward * (4 if plan_.recompute else 3))
    return plan_


def _plan_graph(model: _Model, world_size: int, hw: Hardware, strategy: Any, model_name: str | None,
                progress: Progress) -> Plan:
    gm = model.gm
    forced = Strategy.parse(strategy)
    capture = gm.meta.get(CAPTURE)
    name = model_name or (capture.model_class if capture else type(gm).__name__)
    if forced is not None and (forced.pipeline > 1 or forced.subgrids > 1) and model.batch_norms:
        how = "a pipeline runs microbatches" if forced.pipeline > 1 else "D&SP runs branches on other rows"
        raise PlanError(f"strategy: {how}, and batch norm {model.batch_norms[0]} normalises over the rows it sees in "
                        f"training mode, so the result would differ from single-device training; use data and tensor "
                        f"parallelism (autopar synchronises batch norm over the data ranks), or GroupNorm/LayerNorm")
    if forced is not None and forced.pipeline > 1:
        return _plan_pipeline(model, world_size, hw, forced, name)
    candidates: list[MeshCandidate] = []
    best = None
    grids: list[tuple[Grid3D, bool]] = []  # (grid, Bian's cube form?)
    if forced is not None and forced.cube:
        p = forced.grid.x
        if world_size % p ** 3 or (forced.data is not None and p ** 3 * forced.data != world_size):
            raise PlanError(f"strategy: the cube form with p={p} needs p^3 x data = {p ** 3} x "
                            f"{forced.data if forced.data is not None else 'd'} ranks, and the world has "
                            f"{world_size}, which is not {'that' if forced.data is not None else 'a multiple of it'};"
                            f" give a world of p^3·d ranks, or AxoNN's grid {{'x', 'y', 'z'}}, which need not be a "
                            f"cube")
        forced = Strategy(world_size // p ** 3, 1, grid=Grid3D(p, p, p, world_size // p ** 3), cube=True)
    if forced is not None and forced.grid is not None:
        if forced.grid.size != world_size:
            raise PlanError(f"strategy: the grid {forced.grid.x}x{forced.grid.y}x{forced.grid.z}x{forced.grid.data} "
                            f"has {forced.grid.size} ranks, the world {world_size}; give sizes whose product is "
                            f"{world_size}")
        grids, layouts = [(forced.grid, forced.cube)], []
        parts = forced.grid.z * forced.grid.data
        if model.batch % parts:
            raise PlanError(f"example_inputs: the batch {model.batch} is not divisible by Gz x Gdata = {parts}, "
                            f"which split the rows; give a batch that is a multiple of {parts}, or another grid")
        if not any(r.kind in ("attention", "linear_chain") for r in model.regions):
            raise PlanError(f"strategy: a 3D grid needs a linear chain or attention region; {name} has none")
    elif forced is not None:
        data, tensor = forced.resolve(world_size)
        layouts = [(data, tensor, forced.subgrids, forced.topology_aware, forced.csub)]
        if forced.csub and forced.subgrids == 1:
            raise PlanError("strategy: csub=True (D&SP-cSub) needs subgrids > 1")
        if forced.subgrids > 1 and (tensor != 1 or data % forced.subgrids):
            raise PlanError(f"strategy: D&SP with subgrids={forced.subgrids} needs tensor=1 and a data degree it "
                            f"divides (got data={data}, tensor={tensor})")
        if forced.subgrids > 1 and not forced.csub and _batch_baked(gm):
            raise PlanError(f"strategy: D&SP of explicit branches needs a model torch.fx.symbolic_trace captures in "
                            f"this version; {name} was captured by torch.export, which bakes the batch size into "
                            f"the branch ops (they run on more rows than the common layers). Use csub=True "
                            f"(D&SP-cSub runs them on the common layers' rows)")
        _check_forced_sizes(model, data, tensor)
    else:
        layouts = [(world_size // t, t, 1, True, False) for t in divisors(world_size)]
        # D&SP and D&SP-cSub (SUPER §III-B/C) beside them: sub-grid counts of the
        # data-only mesh, both rank orders
        branching = subgraph_regions(gm)
        if branching and not model.batch_norms:  # see the forced check above
            fewest = min(_branch_count(r) for r in branching)
            modes = (True,) if _batch_baked(gm) else (False, True)
            layouts += [(world_size, 1, g, topology_aware, csub) for g in divisors(world_size) if 1 < g <= fewest
                        for csub in modes for topology_aware in (True, False)]
        # AxoNN's 3D/4D grids (axonn §III, §V): every Gx x Gy x Gz x Gdata of the world
        # and Bian's cube on every p x p x p x Gdata of them (bian §3)
        if any(r.kind in ("attention", "linear_chain") for r in model.regions):
            grids = [(g, False) for g in grids_of(world_size)]
            grids += [(g, True) for g, _ in grids if g.x == g.y == g.z > 1]
            if not any(cube for _, cube in grids):
                candidates.append(MeshCandidate({"data": world_size}, None, None, False,
                                                f"Bian's cube form: {world_size} ranks are no p^3 x data with p >= 2",
                                                form="cube"))
    options = _pipeline_options(model, world_size) if forced is None else []
    progress.total = len(layouts) + len(grids) + len(options)
    for data, tensor, subgrids, topology_aware, csub in layouts:
        progress.tick()
        mesh = {"data": data, "tensor": tensor}
        layout = {"subgrids": subgrids, "topology_aware": topology_aware, "csub": csub} if subgrids > 1 else {}
        if model.batch % data:
            candidates.append(MeshCandidate(mesh, None, None, False,
                                            f"batch {model.batch} not divisible by data degree {data}", **layout))
            continue
        # cSub: the common layers are data parallel over sub-grid 0 only
        common_parts = data // subgrids if csub else data
        choices, total, step = _price(model, hw, common_parts, tensor, forced is not None)
        if subgrids > 1:
            try:
                dsp, replaced = _price_subgraph(model, hw, data, subgrids, topology_aware, csub)
            except PlanError as e:
                if forced is not None:
                    raise
                candidates.append(MeshCandidate(mesh, None, None, False, str(e), **layout))
                continue
            total.compute_s -= sum(replaced.values())
            for c in dsp:
                total = total + Cost(c.cost.compute_s, c.cost.comm_s, 0.0)
            # one row per region: an attention region whose heads are split keeps its
            # projections' compute (common layers) beside the split core; explicit
            # branches were priced among the nodes outside regions
            split = {c.region: c for c in dsp}
            rows = []
            for c in choices[:-1]:
                d = split.pop(c.region, None)
                if d is not None:
                    d.cost.compute_s += c.cost.compute_s - replaced[c.region]
                    d.cost.memory_bytes += c.cost.memory_bytes
                    d.alternatives = {"data": c.cost.compute_s + c.cost.total_comm_s}
                rows.append(d or c)
            outside = choices[-1]
            outside.cost.compute_s -= sum(replaced[rid] for rid in split)
            # branch parameters are synchronised inside their sub-grid ("subgrid"), not
            # over all data ranks: take them out of the data all-reduce
            branch_elems = sum(model.params[name].numel() for c in dsp for names in c.details["branch_params"]
                               for name in names)
            all_elems = sum(p.numel() for p in model.params.values())
            stride = subgrids if topology_aware and csub else 1
            total.comm_s["data"] = _exposed_data_comm(common_parts, stride, (all_elems - branch_elems) * 4,
                                                      total.compute_s, hw)
            step = total.compute_s + total.total_comm_s
            choices = rows + list(split.values()) + [outside]
        if tensor > 1 and not any(c.strategy == "megatron" for c in choices):
            # No region pays for its communication on its own, but a tensor group that
            # splits nothing only repeats work: price splitting every region that divides.
            choices, total, step = _price(model, hw, data, tensor, True)
            gaps = [c.region for c in choices if c.region in model.rule_gaps()]
            if not any(c.strategy == "megatron" for c in choices) and not (forced is not None and gaps):
                candidates.append(MeshCandidate(mesh, None, None, False,
                                                f"no region can be split over tensor={tensor}" +
                                                (f" (regions {gaps} hold ops with no split rule)" if gaps else "")))
                continue
            # forced degrees whose regions all fell back: the tensor group replicates them
        if total.memory_bytes > hw.memory_bytes:
            candidates.append(MeshCandidate(mesh, step, total.memory_bytes, False,
                                            f"needs {total.memory_bytes / 2**30:.1f} GiB per rank, device has "
                                            f"{hw.memory_bytes / 2**30:.1f} GiB", **layout))
            continue
        candidates.append(MeshCandidate(mesh, step, total.memory_bytes, True, comm_s=dict(total.comm_s), **layout))
        if best is None or step < best[2] * (1 - 1e-9):
            best = (mesh, choices, step, total, subgrids, topology_aware, csub)
    for grid, cube in grids:
        progress.tick()
        mesh = {"data": grid.data, "z": grid.z, "y": grid.y, "x": grid.x}
        form = "cube" if cube else ""
        split = "cube3d" if cube else "tensor3d"
        if model.batch % (grid.z * grid.data):
            candidates.append(MeshCandidate(mesh, None, None, False, f"batch {model.batch} not divisible by "
                                            f"Gz x Gdata = {grid.z * grid.data}", form=form))
            continue
        how = {"forced": forced is not None, "split_all": False, "cube": cube}
        choices, total, step = _price_3d(model, hw, grid, materialize=False, **how)
        if not any(c.strategy == split for c in choices):
            # as for Megatron: a grid that splits nothing only repeats work; price splitting
            # every region it divides
            how = {"forced": False, "split_all": True, "cube": cube}
            choices, total, step = _price_3d(model, hw, grid, materialize=False, **how)
        if not any(c.strategy == split for c in choices):
            why = next((c.reason for c in choices if c.kind in ("attention", "linear_chain")), "no region")
            candidates.append(MeshCandidate(mesh, None, None, False, f"no region split over the grid: {why}",
                                            form=form))
            continue
        if total.memory_bytes > hw.memory_bytes:
            candidates.append(MeshCandidate(mesh, step, total.memory_bytes, False,
                                            f"needs {total.memory_bytes / 2**30:.1f} GiB per rank, device has "
                                            f"{hw.memory_bytes / 2**30:.1f} GiB", comm_s=dict(total.comm_s),
                                            form=form))
            continue
        candidates.append(MeshCandidate(mesh, step, total.memory_bytes, True, comm_s=dict(total.comm_s), form=form))
        if best is None or step < best[2] * (1 - 1e-9):
            # the search priced each class of regions once; the winner gets its own table
            best = (mesh, (grid, how), step, total, 1, True, False)
    pipelined = None
    if forced is None:
        # PTD-P beside them (megatron §2-§4): every pipeline degree the blocks allow, with
        # data x tensor inside, 1F1B and (where the blocks allow) interleaved 1F1B with two
        # chunks; the microbatch count by eq (1)
        for option in options:
            progress.tick()
            mesh = _pipeline_mesh(option, world_size)
            try:
                shape, numbers = _search_pipeline(model, world_size, hw, option, name)
            except PlanError as e:
                candidates.append(MeshCandidate(mesh, None, None, False, str(e), form=_pipeline_label(option)))
                continue
            c = MeshCandidate(mesh, numbers["step"], numbers["memory_bytes"], True, comm_s=dict(numbers["comm_s"]),
                              form=_pipeline_label(option),
                              reason=f"m={numbers['m']}" + (", recomputing" if numbers["recompute"] else ""))
            if c.memory_bytes > hw.memory_bytes:
                c.feasible, c.reason = False, (f"needs {c.memory_bytes / 2**30:.1f} GiB per rank, device "
                                               f"has {hw.memory_bytes / 2**30:.1f} GiB")
            candidates.append(c)
            if c.feasible and (best is None or c.step_s < best[2] * (1 - 1e-9)) and \
                    (pipelined is None or c.step_s < pipelined[2]["step"] * (1 - 1e-9)):
                pipelined = (option, shape, numbers)
        if pipelined is not None and (best is None or pipelined[2]["step"] < best[2] * (1 - 1e-9)):
            plan_p = _pipeline_plan(model, world_size, hw, pipelined[0], name, pipelined[1], pipelined[2])
            plan_p.forced = False
            plan_p.candidates = candidates
            return plan_p
    if best is None:
        raise PlanError(_no_plan_message(name, world_size, candidates))
    mesh, choices, step, total, subgrids, topology_aware, csub = best
    if isinstance(choices, tuple):  # a 3D grid
        choices, total, step = _price_3d(model, hw, choices[0], materialize=True, **choices[1])
    log.info("planned %s on %d ranks: %s, %.3f ms", name, world_size, mesh, step * 1e3)
    return Plan(model=name, world_size=world_size, mesh=mesh, hardware=hw.name, global_batch=model.batch,
                regions=choices, total=total, step_s=step, forced=forced is not None,
                candidates=candidates, tracer=capture.tracer if capture else "", subgrids=subgrids,
                topology_aware=topology_aware, csub=csub)


def _no_plan_message(name: str, world: int, candidates: list[MeshCandidate]) -> str:
    """Why nothing fits, short enough to read with thousands of candidates: the reasons
    counted, the configuration closest to fitting, and what to change."""
    if len(candidates) <= 8:
        reasons = "; ".join(f"{c.mesh}: {c.reason}" for c in candidates)
        return f"no feasible plan for {name} on {world} ranks: {reasons}"
    from autopar.planning.explain import closest_to_fitting, rejections
    closest = closest_to_fitting(candidates)
    near = f"; the closest: {closest.mesh}{' ' + closest.form if closest.form else ''} {closest.reason}" \
        if closest is not None else ""
    return (f"no feasible plan for {name} on {world} ranks: all {len(candidates)} configurations rejected: "
            f"{rejections(candidates)}{near}. Give more ranks, a device with more memory (memory_limit / --memory-limit), or a "
            f"smaller batch")


# ---------------------------------------------------------------------- pipeline (PTD-P)

def _pipeline_layout(model: _Model, world: int, forced: Strategy, name: str):
    """(p, data, tensor, pipeline shape, local batch) of a forced pipeline, its sizes checked."""
    p, v = forced.pipeline, forced.chunks
    if world % p:
        raise PlanError(f"strategy: pipeline={p} does not divide the world of {world} ranks; give a pipeline degree "
                        f"that divides it")
    data, tensor = Strategy(forced.data, forced.tensor).resolve(world // p)
    shape = _pipeline_shape(model, p * v)
    _check_forced_sizes(model, data, tensor)
    return p, data, tensor, shape, model.batch // data


class _PipelineShape:
    """What pricing a pipeline of ``stages`` stages needs that no degree changes: the
    partition, which stage reads each parameter, the carried bytes at the full batch,
    each stage's nodes outside regions and its regions grouped by class (identical
    blocks priced once), and the regions kept whole (tied across stages)."""

    def __init__(self, model: _Model, stages: int):
        from autopar.strategies.pipeline.stages import boundary_values, parameter_stages, partition
        if model.node_flops is None:
            from autopar.analysis.fork_join import node_flops
            model.node_flops = {n.name: float(node_flops(model.gm, n)) for n in model.gm.graph.nodes}
        self.part = part = partition(model.gm, stages, flops=model.node_flops)
        self.param_stages = parameter_stages(model.gm, part)
        self.keep_whole: dict[str, str] = dict(model.rule_gaps())
        names_of: dict[str, list[str]] = {}
        for n, rid in model.param_region.items():
            names_of.setdefault(rid, []).append(n)
        for r in model.regions:
            names = names_of.get(r.id, [])
            spread = sorted(set().union(*(self.param_stages.get(n, set()) for n in names)) if names else set())
            if len(spread) > 1:
                self.keep_whole[r.id] = (f"its parameters are read by pipeline stages {spread} (tied); kept whole so "
                                         f"that every stage holds them the same way")
        self.region_stage = {r.id: part.stage_of.get(r.nodes[0], 0) for r in model.regions}
        in_region = {name for r in model.regions for name in r.nodes}
        self.outside = [tuple(n for n in part.nodes_of(s) if n not in in_region) for s in range(stages)]
        self.outside_all = tuple(n for n in part.stage_of if n not in in_region)
        groups: list[dict] = [{} for _ in range(stages)]
        for r in model.regions:
            spans = sorted({part.stage_of[n] for n in r.nodes if n in part.stage_of})
            if len(spans) > 1:  # a tied embedding and head: each stage computes its own nodes
                for s in spans:
                    self.outside[s] += tuple(n for n in r.nodes if part.stage_of.get(n) == s)
                continue
            key = (model.region_class[r.id], r.id in self.keep_whole)
            rep, count = groups[self.region_stage[r.id]].get(key, (r, 0))
            groups[self.region_stage[r.id]][key] = (rep, count + 1)
        self.groups = [list(g.values()) for g in groups]
        # parameters grouped by (stages reading them, the split sizes of their region if it
        # can be split): what a rank holds is a sum over a few groups
        params: dict[tuple, float] = {}
        sizes_of = {r.id: tuple(_region_sizes(r)) for r in model.regions}
        for pname, where in self.param_stages.items():
            if pname not in model.params:
                continue
            rid = model.param_region.get(pname)
            sizes = sizes_of[rid] if rid is not None and rid not in self.keep_whole else ()
            key = (tuple(sorted(where)), sizes)
            params[key] = params.get(key, 0.0) + model.params[pname].numel()
        self.params = [(where, sizes, elems) for (where, sizes), elems in params.items()]
        table = {n.name: n for n in model.gm.graph.nodes}
        self.carried = [float(sum(tensor_spec(table[v]).nbytes for v in values if tensor_spec(table[v]) is not None))
                        for values in boundary_values(model.gm, part)]


def _pipeline_shape(model: _Model, stages: int) -> _PipelineShape:
    from autopar.strategies.pipeline.stages import StageError
    cache = model.pipeline_shapes
    if stages not in cache:
        try:
            cache[stages] = _PipelineShape(model, stages)
        except StageError as e:
            cache[stages] = PlanError(str(e))
    if isinstance(cache[stages], PlanError):
        raise cache[stages]
    return cache[stages]


def _pipeline_options(model: _Model, world: int) -> list[Strategy]:
    """The pipeline layouts ``"auto"`` weighs: p > 1 dividing the world and at most the
    number of blocks, every data x tensor of the rest, 1F1B, and interleaved with v = 2
    where there are 2p blocks."""
    from autopar.strategies.pipeline.stages import blocks_of
    if model.batch_norms:  # microbatches would normalise over fewer rows (see _plan_graph)
        return []
    blocks = len(blocks_of(model.gm))
    out = []
    for p in divisors(world):
        if p < 2 or p > blocks:
            continue
        for t in divisors(world // p):
            out.append(Strategy(world // p // t, t, pipeline=p))
            if 2 * p <= blocks:
                out.append(Strategy(world // p // t, t, pipeline=p, chunks=2, schedule="interleaved"))
    return out


def _pipeline_mesh(option: Strategy, world: int) -> dict[str, int]:
    return {"pipeline": option.pipeline, "data": option.data, "tensor": option.tensor}


def _pipeline_label(option: Strategy) -> str:
    return f"pipeline {option.schedule}" + (f" v={option.chunks}" if option.chunks > 1 else "")


def _plan_pipeline(model: _Model, world: int, hw: Hardware, forced: Strategy, name: str) -> Plan:
    """A PTD-P plan: ``pipeline × data × tensor`` (megatron §2-§4), Megatron inside every
    stage wherever the tensor degree divides; the microbatch count is the given one or
    the fastest predicted (megatron eq (1), :mod:`autopar.strategies.pipeline.cost`)."""
    shape, numbers = _search_pipeline(model, world, hw, forced, name)
    return _pipeline_plan(model, world, hw, forced, name, shape, numbers)


def _search_pipeline(model: _Model, world: int, hw: Hardware, forced: Strategy, name: str):
    """(pipeline shape, the numbers of :func:`_pipeline_numbers` at the best microbatch
    count) of one pipeline layout, its sizes checked."""
    from autopar.strategies.pipeline import cost as pp
    p, data, tensor, shape, local = _pipeline_layout(model, world, forced, name)
    v, schedule = forced.chunks, forced.schedule
    if forced.microbatches is not None:
        m = forced.microbatches
        if local % m:
            raise PlanError(f"strategy: microbatches={m} does not divide the batch of each data rank "
                            f"({model.batch} / data {data} = {local}); give a microbatch count that divides {local}")
        if schedule == "interleaved" and v > 1 and m % p:
            raise PlanError(f"strategy: the interleaved schedule needs the number of microbatches to be a multiple "
                            f"of the pipeline ranks (megatron §2.2.2); microbatches={m} is not a multiple of "
                            f"pipeline={p}")
        counts = [m]
    else:
        counts = pp.microbatch_choices(local, p, v, schedule)
        if not counts:
            raise PlanError(f"strategy: the interleaved schedule needs a microbatch count that is a multiple of "
                            f"pipeline={p} and divides the batch of each data rank ({local}); give a batch that "
                            f"is a multiple of {p * data}")
    # the fastest microbatch count whose memory fits, recomputing the blocks' activations
    # (megatron §3.5) only where keeping them does not fit; none fitting: the smallest
    best = smallest = None
    for m in counts:
        for recompute in (False, True):
            numbers = _pipeline_numbers(model, hw, shape, p, v, m, schedule, data, tensor, forced.scatter_gather,
                                        recompute)
            fits = numbers["memory_bytes"] <= hw.memory_bytes
            if fits and (best is None or numbers["step"] < best["step"] * (1 - 1e-9)):
                best = numbers
            if smallest is None or numbers["memory_bytes"] < smallest["memory_bytes"] * (1 - 1e-9):
                smallest = numbers
            if fits:
                break
    best = best or smallest
    return shape, best


def _pipeline_numbers(model: _Model, hw: Hardware, shape: _PipelineShape, p: int, v: int, m: int, schedule: str,
                      data: int, tensor: int, scatter_gather: bool, recompute: bool = False) -> dict:
    """The predicted figures of ``p`` ranks × ``v`` chunks with ``m`` microbatches of
    ``B/(d·m)`` rows, each stage's regions priced once per class: per-stage seconds per
    microbatch (compute, Megatron all-reduces), point-to-point sends, per-rank seconds,
    the step with its bubble (megatron §2.2), the data and tied-weight all-reduces, and
    memory per rank with and without recomputation. ``recompute``: the blocks' forward
    runs twice (megatron §3.5) and the memory that counts is the recomputing one."""
    from autopar.strategies.pipeline import cost as pp
    stages = p * v
    scale = data * m  # the work of one microbatch on one data rank is the batch's 1/(d·m)
    stage_s = [0.0] * stages       # forward + backward seconds of one microbatch per stage
    stage_comm = [0.0] * stages    # its tensor-parallel part
    stage_act = [0.0] * stages     # bytes saved for backward per microbatch
    for s in range(stages):
        for rep, count in shape.groups[s]:
            divisible = tensor > 1 and rep.id not in shape.keep_whole and \
                all(size % tensor == 0 for _, size in _region_sizes(rep))
            if divisible:
                comm = 2 * cm.all_reduce_time(tensor, model.boundary[rep.id] / scale, hw) * (1.5 if recompute else 1)
                seconds = _compute(model, rep.nodes, hw, 1 / (scale * tensor), recompute) + comm
                act = model.activation_bytes(rep.nodes, 1 / scale / tensor)
                stage_comm[s] += comm * count
            else:
                seconds = _compute(model, rep.nodes, hw, 1 / scale, recompute)
                act = model.activation_bytes(rep.nodes, 1 / scale)
            stage_s[s] += seconds * count
            stage_act[s] += act * count
        stage_s[s] += _compute(model, shape.outside[s], hw, 1 / scale)  # the runtime recomputes blocks only
        stage_act[s] += model.activation_bytes(shape.outside[s], 1 / scale)
    carried = [b / scale for b in shape.carried]
    inter_node = data * tensor >= hw.devices_per_node
    sends = [cm.point_to_point_time(b / tensor if scatter_gather else b, hw, inter_node=inter_node)
             + (cm.all_gather_time(tensor, b / tensor, hw) if scatter_gather and tensor > 1 else 0.0)
             for b in carried]
    rank_s, rank_p2p, rank_comm = [], [], []
    for r in range(p):
        mine = [c * p + r for c in range(v)]
        p2p = sum((sends[s] if s < stages - 1 else 0.0) + (sends[s - 1] if s > 0 else 0.0) for s in mine)
        rank_p2p.append(p2p)
        rank_comm.append(sum(stage_comm[s] for s in mine))
        rank_s.append(sum(stage_s[s] for s in mine) + p2p)
    pipe_step, bubble = pp.step_time(rank_s, p, m, v)
    # parameters per rank (split ones over the tensor group); gradients all-reduced over the
    # data ranks after the last microbatch, tied ones summed over their stages' ranks
    rank_params = [0.0] * p
    tied_elems = 0.0
    for where, sizes, elems in shape.params:
        if sizes and tensor > 1 and all(size % tensor == 0 for _, size in sizes):
            elems = elems / tensor
        ranks = {s % p for s in where}
        for r in ranks:
            rank_params[r] += elems
        if len(ranks) > 1:
            tied_elems += elems
    data_s = max(cm.all_reduce_time(data, e * 4, hw, stride=tensor) for e in rank_params)
    tied_s = cm.all_reduce_time(2, tied_elems * 4, hw, stride=data * tensor) if tied_elems else 0.0
    memory = []
    for r in range(p):
        mine = [c * p + r for c in range(v)]
        inputs = [carried[s - 1] if s > 0 else 0.0 for s in mine]
        act = pp.activation_memory(schedule, p, m, v, r, [stage_act[s] for s in mine], inputs)
        act_recompute = pp.activation_memory(schedule, p, m, v, r, [stage_act[s] for s in mine], inputs, True)
        memory.append((cm.training_memory(rank_params[r], act), cm.training_memory(rank_params[r], act_recompute)))
    slow = max(range(p), key=lambda r: rank_s[r])
    return {"p": p, "v": v, "m": m, "schedule": schedule, "data": data, "tensor": tensor,
            "scatter_gather": scatter_gather, "step": pipe_step + data_s + tied_s, "bubble": bubble,
            "stage_s": stage_s, "carried": carried, "rank_s": rank_s, "slow": slow,
            "rank_p2p": rank_p2p, "rank_comm": rank_comm, "data_s": data_s, "tied_s": tied_s,
            "memory": memory, "memory_bytes": max(mem[1 if recompute else 0] for mem in memory),
            "recompute": recompute,
            "comm_s": {"tensor": rank_comm[slow] * m, "pipeline": rank_p2p[slow] * m + bubble,
                       "data": data_s + tied_s}}


def _pipeline_plan(model: _Model, world: int, hw: Hardware, forced: Strategy, name: str, shape: _PipelineShape,
                   n: dict) -> Plan:
    """The plan of one priced pipeline layout: its region table (per step: ``m``
    microbatches of each region), its cost and its pipeline details."""
    from autopar.strategies.pipeline import cost as pp
    p, v, m, data, tensor, schedule = n["p"], n["v"], n["m"], n["data"], n["tensor"], n["schedule"]
    choices, _, _ = _price(model, hw, data * m, tensor, True, shape.keep_whole, n["recompute"])
    for c in choices[:-1]:  # the table reads per step: m microbatches of each region
        c.details = {**c.details, "stage": shape.region_stage[c.region]}
        c.cost = Cost(c.cost.compute_s * m, {k: x * m for k, x in c.cost.comm_s.items()}, c.cost.memory_bytes)
        c.alternatives = {k: x * m for k, x in c.alternatives.items()}
    choices[-1].cost = Cost(_compute(model, shape.outside_all, hw, 1 / (data * m)) * m, {},
                            choices[-1].cost.memory_bytes)
    slow = n["slow"]
    total = Cost((n["rank_s"][slow] - n["rank_p2p"][slow] - n["rank_comm"][slow]) * m, dict(n["comm_s"]),
                 n["memory_bytes"])
    part = shape.part
    details = {
        "stages": p, "chunks": v, "microbatches": m, "microbatch_size": model.batch // (data * m),
        "schedule": schedule, "scatter_gather": n["scatter_gather"] and tensor > 1, "recompute": n["recompute"],
        "blocks": [r.id for r in part.blocks], "assignment": list(part.assignment),
        "bubble_fraction": (p - 1) / (v * m), "bubble_s": n["bubble"],
        "stage_s": n["stage_s"], "p2p_bytes": n["carried"], "rank_s": n["rank_s"],
        "in_flight": [pp.in_flight(schedule, p, m, v, r) for r in range(p)],
        "memory_bytes": [mem for mem, _ in n["memory"]], "memory_bytes_recompute": [mem for _, mem in n["memory"]],
        "tied": sorted(k for k, where in shape.param_stages.items() if len({s % p for s in where}) > 1),
    }
    mesh = {"pipeline": p, "data": data, "tensor": tensor}
    candidate = MeshCandidate(mesh, n["step"], total.memory_bytes, True, comm_s=dict(total.comm_s),
                              form=_pipeline_label(forced), reason=f"m={m}" + (", recomputing" if n["recompute"] else ""))
    log.info("planned %s on %d ranks: %s, %.3f ms", name, world, mesh, n["step"] * 1e3)
    capture = model.gm.meta.get(CAPTURE)
    return Plan(model=name, world_size=world, mesh=mesh, hardware=hw.name, global_batch=model.batch,
                regions=choices, total=total, step_s=n["step"], forced=True, candidates=[candidate],
                tracer=capture.tracer if capture else "", pipeline=details, recompute=n["recompute"])
