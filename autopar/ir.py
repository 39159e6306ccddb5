"""The shared vocabulary of autopar's stages: metadata keys, tensor specs and regions.

Every stage of the flow in ``docs/architecture.md`` reads what the previous one wrote
under the keys defined here and nothing else:

* capture writes :data:`SPEC` on every node (shape and dtype of what the node produces);
* analysis passes append :class:`Region` objects to ``gm.meta[REGIONS]`` and tag each
  member node with ``node.meta[REGION_OF][kind] = region_id``; they never edit the graph;
* the planner reads the regions and writes a :class:`autopar.planning.plan.Plan`;
* rewrite passes read the regions and the plan.

A region's id is ``<kind>:<module path>``, the module that holds it in the user model's
own names (``attention:transformer.h.0.attn``; see :mod:`autopar.passes.analysis.naming`).
Module paths and graph order are the same in every capture of one model, so the same
model captured at another batch size (each rank captures at its local batch) has the
same region ids.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

SPEC = "autopar.spec"
"""``node.meta[SPEC]``: a :class:`TensorSpec`, a tuple of them (multi-output), or None."""

WORK = "autopar.work"
"""``node.meta[WORK]``: ``(spec, NodeWork)``, the node's forward work (FLOPs, bytes moved,
matmul or not, kernel or not) counted by :mod:`autopar.passes.analysis.flops` for the
``node.meta[SPEC]`` it had then; counted again when the spec has changed since."""

REGIONS = "autopar.regions"
"""``gm.meta[REGIONS]``: ``dict[str, Region]`` keyed by region id, in discovery order."""

REGION_OF = "autopar.region_of"
"""``node.meta[REGION_OF]``: ``dict[kind, region_id]`` for every region the node is in."""

CAPTURE = "autopar.capture"
"""``gm.meta[CAPTURE]``: a :class:`CaptureInfo` saying how the graph was obtained."""

# What the rewrite passes leave on a rank program (every key of autopar's metadata is
# defined here and used by name)
PARAM_SHARDS = "autopar.param_shards"
"""``gm.meta[PARAM_SHARDS]``: parameter name -> how the rank's program holds it cut
(Megatron's ``ParamShard``, the 3D grid's ``Grid3DShard``; absent name: replicated),
set by the tensor passes."""

LOSS_REDUCTION = "autopar.loss_reduction"
"""``gm.meta[LOSS_REDUCTION]``: ``"mean"`` or ``"sum"``, how a training graph's loss
reduces over the batch (the runtime weights its backward to match)."""

FUSION = "autopar.fusion"
"""``gm.meta[FUSION]``: the fusion pass's ``FusionReport`` (its generated kernels)."""

BATCH_COUPLINGS = "autopar.batch_couplings"
"""``gm.meta[BATCH_COUPLINGS]``: the nodes where rows of the batch meet, a list of
:class:`autopar.passes.analysis.batch_rows.Coupling` in graph order (``[]``: splitting the batch
is exact), written by the analysis."""

LOSS_TERMS = "autopar.loss_terms"
"""``gm.meta[LOSS_TERMS]``: ``[(node name, "mean" | "sum")]``, the reductions over the batch
the graph's loss is a linear combination of (written with :data:`BATCH_COUPLINGS`)."""

OUTPUT_ROWS = "autopar.output_rows"
"""``node.meta[OUTPUT_ROWS]``: of a value the graph returns, the dimensions that hold the
rows of the batch (``()``: none, the value is the same on every part of the batch), as
the batch-rows analysis read it; the data pass gathers such outputs over the data ranks
along those rows and returns the others as they are."""

VALUE_ROWS = "autopar.value_rows"
"""``node.meta[VALUE_ROWS]``: where the value holds the rows of the batch, as the
batch-rows analysis read it (its ``Rows``, or None). A pipeline stage's input keeps its
producer's, read on the whole graph: the stage's own walk starts from it.

``gm.meta[VALUE_ROWS]``: the batch (rows) that analysis read the graph at; a cut of the
graph (a stage) keeps it."""

RANDOM_SITES = "autopar.random_sites"
"""``gm.meta[RANDOM_SITES]``: the graph's random ops in graph order, each
``{"node", "kind", "shape", "rows"}`` (its name, what it draws, the shape of the value its
draws cover, which dimensions hold rows of the batch), written by the analysis
(:mod:`autopar.passes.analysis.random_sites`); a plan keeps its capture's
(``Plan.random_sites``), whose positions key the draws (:mod:`autopar.runtime.rng`)."""

RANDOM_SITE = "autopar.random_site"
"""``node.meta[RANDOM_SITE]``: the captured name of the random op a node is (kept by the
rewrites that replace it), written by the analysis."""

RANDOM_SPLIT = "autopar.random_split"
"""``node.meta[RANDOM_SPLIT]``: ``{dim: group}``, the dimensions of a random op's value a
rewrite split into contiguous parts over a group (Megatron's heads, sequence
parallelism's tokens), for :mod:`autopar.passes.random_draws`."""

TARGET_COUNT = "autopar.target_count"
"""``gm.meta[TARGET_COUNT]``: an ``fx.GraphModule`` taking (by name) the graph inputs its
loss's targets are computed from and returning how many of them count (not ignored);
``runtime.target_count`` divides the loss by the whole batch's count."""

PASSES_RUN = "autopar.passes_run"
"""``gm.meta[PASSES_RUN]``: the names of the passes that built the program, in order."""

ROOT_OUTPUT = "autopar.root_output"
"""``gm.meta[ROOT_OUTPUT]``: the spec of the value a D&SP-cSub branch program returns in
place of the model's output."""

STAGE = "autopar.stage"
"""``gm.meta[STAGE]``: which pipeline stage a stage program is."""

LAST = "autopar.last"
"""``gm.meta[LAST]``: whether a stage program is the pipeline's last (it computes the loss)."""

REGION_KINDS = ("vocab", "attention", "linear_chain", "fork_join", "block", "experts")


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one tensor value in the graph (global, unsharded)."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        return f"{dt}[{', '.join(map(str, self.shape))}]"


def concrete_size(size) -> int:
    """A dimension as an int. A size that depends on values a capture without them does
    not have (an unbacked symbol of a fake tensor: the rows ``nonzero`` selects) is its
    upper bound where one is known (every row), else 1: what analysis and pricing read
    of it; the graph itself keeps the symbol."""
    if isinstance(size, int):
        return size
    try:
        return int(size)
    except Exception:  # noqa: BLE001 - a data-dependent size
        node = size.node
        upper = node.shape_env.bound_sympy(node.expr).upper
        return int(upper) if upper.is_finite else 1


def spec_from_value(value: Any):
    """Turn a runtime value (tensor, fake tensor, tuple of them) into SPEC metadata."""
    if isinstance(value, torch.Tensor):
        return TensorSpec(tuple(concrete_size(s) for s in value.shape), value.dtype)
    if isinstance(value, (tuple, list)):
        specs = tuple(spec_from_value(v) for v in value)
        return specs if any(s is not None for s in specs) else None
    return None


def tensor_spec(node: fx.Node) -> TensorSpec | None:
    """The single-tensor spec of ``node``, or None when it produces no single tensor."""
    spec = node.meta.get(SPEC)
    return spec if isinstance(spec, TensorSpec) else None


@dataclass
class Region:
    """A part of the graph that a strategy can split as one unit.

    ``nodes`` are node names in topological order. ``details`` holds the kind-specific
    facts the planner and the rewrite need (JSON-serialisable values only), e.g. for an
    attention region the projection nodes, head count and head dimension.
    """

    id: str
    kind: str
    nodes: list[str]
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> "Region":
        return Region(**data)


def regions(gm: fx.GraphModule, kind: str | None = None) -> list[Region]:
    """The regions analysis wrote on ``gm`` (of one kind, or all), in discovery order."""
    found = gm.meta.get(REGIONS, {})
    return [r for r in found.values() if kind is None or r.kind == kind]


def node_index(gm: fx.GraphModule) -> dict[str, fx.Node]:
    """``gm``'s nodes by name: what :func:`add_region` tags by, made once by a pass that
    records many regions on a graph it does not change."""
    return {n.name: n for n in gm.graph.nodes}


def add_region(gm: fx.GraphModule, region: Region, index: dict[str, fx.Node] | None = None) -> Region:
    """Record ``region`` on ``gm`` and tag its nodes (found by name in ``index``, the
    pass's :func:`node_index`, or in a fresh one). Analysis passes call this only."""
    if region.kind not in REGION_KINDS:
        raise ValueError(f"unknown region kind {region.kind!r}; expected one of {REGION_KINDS}")
    table = gm.meta.setdefault(REGIONS, {})
    if region.id in table:
        raise ValueError(f"region id {region.id!r} recorded twice")
    table[region.id] = region
    by_name = index if index is not None else node_index(gm)
    for name in region.nodes:
        by_name[name].meta.setdefault(REGION_OF, {})[region.kind] = region.id
    return region


def clear_regions(gm: fx.GraphModule, kind: str) -> None:
    """Forget regions of ``kind`` (an analysis pass re-run replaces its own results)."""
    table = gm.meta.get(REGIONS, {})
    for rid in [rid for rid, r in table.items() if r.kind == kind]:
        del table[rid]
    for n in gm.graph.nodes:
        n.meta.get(REGION_OF, {}).pop(kind, None)


def region_of(node: fx.Node, kind: str) -> str | None:
    return node.meta.get(REGION_OF, {}).get(kind)


@dataclass(frozen=True)
class CaptureInfo:
    """How a graph was captured: which tracer, for which model class, at which shapes."""

    tracer: str  # "symbolic_trace" | "export"
    model_class: str
    input_names: tuple[str, ...]
    with_loss: bool
    symbolic_trace_error: str | None = None
