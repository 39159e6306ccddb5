"""A rank's program: the rewrite passes a plan runs on a graph captured at the rank's
share of the batch (:func:`rewrite`), and that share (:func:`local_batch`).

``compile`` plans on a capture of the global batch; every program a rank runs is a
second capture at its local batch (``docs/architecture.md``, "Why capture twice"),
rewritten here by the plan's passes: analysis, then the family's split (D&SP, Megatron,
AxoNN's 3D layers or Bian's cube), recomputation, the data-parallel pass and, when the
plan was priced with it, fusion. :func:`rank_graph_code` prints the result for plan dumps.
"""

from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.ir import CAPTURE, PASSES_RUN
from autopar.analysis.analyse import analyse
from autopar.transforms.fusion import FUSION, fusion_pass
from autopar.analysis.manager import PassRunner, graph_code
from autopar.transforms.recompute import recompute_pass
from autopar.strategies.family import RECOMPUTE, RankBuild, RankPass
from autopar.strategies.registry import FAMILIES
from autopar.planning.plan import Plan
from autopar.planning.strategy import PlanError

def batch_of(inputs: tuple) -> int | None:
    """The batch size: the first dimension of the first tensor input."""
    return next((x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0), None)


def local_batch(data: int, index: int, inputs: tuple, target: Any):
    """Chunk ``index`` of ``data`` of a global batch: every tensor whose first dimension is
    the batch (that of the first tensor input) is split along it; others are replicated."""
    if data == 1:
        return inputs, target
    batch = batch_of(inputs)
    if batch is not None and batch % data:
        raise PlanError(f"input 0: batch {batch} is not divisible by the data degree {data}; give a batch that is a "
                        f"multiple of {data}")

    def take(x):
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch:
            return x.chunk(data, 0)[index]
        return x

    return tuple(take(x) for x in inputs), (take(target) if target is not None else None)


def rewrite(gm: fx.GraphModule, plan_: Plan, rank: int, local_batch: int | None = None,
            recompute: bool = False, fusion: bool = False) -> fx.GraphModule:
    """Rank ``rank``'s program from a graph captured at its local batch: analysis, then
    the passes every family of the plan adds (:meth:`~autopar.strategies.family.Family.rank_passes`,
    in phase order: D&SP's branches, the regions' split, recomputation of the split
    regions under ``recompute``, the data-parallel pass), then fusion. A training graph
    (captured with its loss) keeps its loss local: the runner reduces the reported value
    over the data ranks while backward runs. In D&SP-cSub the ranks off sub-grid 0 get a
    program of their branches only."""
    if local_batch is None:
        local_batch = plan_.global_batch // plan_.batch_parts()
    branch_only = plan_.csub and plan_.subgrid_coordinates(rank)[0] != 0
    build = RankBuild(rank, local_batch, gm.meta[CAPTURE].with_loss, branch_only)
    steps = [p for family in FAMILIES for p in family.rank_passes(plan_, build)]
    if recompute and not branch_only:
        regions = [r for family in FAMILIES for r in family.recompute_regions(plan_)]
        steps.append(RankPass(RECOMPUTE, "recompute", recompute_pass, {"regions": regions}))
    passes = [("analysis", analyse, {"label": f"rank{rank}_analysis"})]
    passes += [(p.name, p.fn, p.options) for p in sorted(steps, key=lambda p: p.phase)]
    if fusion:
        passes.append(("fusion", fusion_pass, {}))
    runner = PassRunner(passes)
    gm = runner.run(gm, label=f"rank{rank}")
    gm.meta[PASSES_RUN] = [r.name for r in runner.records]
    return gm


def planned_shards(plan_: Plan, gm: fx.GraphModule) -> dict:
    """Every parameter the plan's families split, and how (by the captured graph's
    names): what each rank cuts before any rank program exists."""
    shards = {}
    for family in FAMILIES:
        shards.update(family.planned_shards(plan_, gm))
    return shards


def rank_graph_code(gm: fx.GraphModule, plan_: Plan, rank: int) -> str:
    coords = ", ".join(f"{k}={v}" for k, v in plan_.rank_coordinates(rank).items() if k in plan_.mesh)
    if plan_.subgrids > 1:
        s, p = plan_.subgrid_coordinates(rank)
        coords += f"; sub-grid {s}, position {p}, batch chunk {plan_.batch_chunk(rank)}"
    passes = " -> ".join(gm.meta.get(PASSES_RUN, []))
    header = f"rank {rank} of {plan_.world_size} ({coords}); built by passes: {passes}"
    return with_kernels(graph_code(gm, header=header), gm)


def with_kernels(code: str, gm: fx.GraphModule) -> str:
    """``code`` followed by the fusion pass's report and the source of every kernel it generated."""
    report = gm.meta.get(FUSION)
    if report is None:
        return code
    out = code + "\n" + "\n".join(f"# {line}" for line in report.summary().splitlines()) + "\n"
    for kernel in report.kernels:
        out += "\n\n" + kernel.source
    return out


def executable(gm: fx.GraphModule, root: nn.Module, class_name: str) -> fx.GraphModule:
    """The rewritten ``gm`` as the program a rank runs: over ``root``'s module tree
    (this rank's parameters), with every module, parameter and constant under one flat
    name, and ``gm``'s metadata."""
    _copy_missing_attributes(gm, gm.graph, root)
    program = fx.GraphModule(_flat_root(root, gm.graph), gm.graph, class_name=class_name)
    program.meta.update(gm.meta)
    return program


def _copy_missing_attributes(src: fx.GraphModule, graph: fx.Graph, dst: nn.Module) -> None:
    """Give ``dst`` the constants a captured graph reads that the model lacks (export lifts
    tensor constants onto the captured module as ``_tensor_constant0`` and the like)."""
    for node in graph.nodes:
        if node.op != "get_attr":
            continue
        try:
            _getattr_path(dst, node.target)
        except AttributeError:
            owner_path, _, attr = node.target.rpartition(".")
            owner = _getattr_path(dst, owner_path) if owner_path else dst
            value = _getattr_path(src, node.target)
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                owner.register_buffer(attr, value, persistent=False)
            else:
                setattr(owner, attr, value)


def _flat_root(root: nn.Module, graph: fx.Graph) -> nn.Module:
    """A module giving every module, parameter and constant the graph reaches one flat
    name, so the executed program does ``self.model_body_0(x)`` instead of walking
    ``getattr(self.model.body, "0")`` on every call. The objects are ``root``'s own
    (parameters are shared, not copied); the names in the graph are rewritten to match.
    Dumped rank graphs keep the hierarchical names."""
    flat = nn.Module()
    names: dict[int, str] = {}  # object -> its flat name
    for node in graph.nodes:
        if node.op not in ("call_module", "get_attr"):
            continue
        value = _getattr_path(root, node.target)
        if id(value) not in names:
            alias = base = node.target.replace(".", "_")
            suffix = 0
            while hasattr(flat, alias):  # two paths that flatten to one name
                suffix += 1
                alias = f"{base}_{suffix}"
            if isinstance(value, (nn.Module, nn.Parameter)):
                setattr(flat, alias, value)
            else:
                flat.__dict__[alias] = value  # a buffer or constant, shared by reference
            names[id(value)] = alias
        node.target = names[id(value)]
    return flat


def _getattr_path(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj
