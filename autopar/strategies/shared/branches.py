"""The multi-branch regions D&SP spreads over sub-grids, as every family that reads them
sees them: which regions those are (:func:`subgraph_regions`: explicit fork/join
branches, or attention heads), why a region's explicit branches cannot be split
(:func:`unsplittable`), what pricing its branches reads (:func:`branches_of`), and the
fork/join regions a mixed plan may spread over its tensor group (:func:`branching_regions`,
:func:`widest_branching`: D&SP's own sub-grids, :mod:`autopar.strategies.dsp.planner`;
mixed plans and pipelines of mixed stages, :mod:`autopar.strategies.mixed`,
:mod:`autopar.strategies.pipeline.planner`). Their branches' costs are :mod:`.branch_cost`."""
from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from autopar.ir import regions, tensor_spec
from autopar.planning.model import ModelFacts
from autopar.strategies.shared.batch_norms import batch_norms


def _branch_parameters(model: ModelFacts, names: list[str]) -> list[str]:
    """Qualified names of the parameters the nodes ``names`` use (get_attr or module)."""
    gm, table, params = model.gm, model.table, model.params
    found: dict[str, None] = {}
    for name in names:
        node = table[name]
        targets = [a for a in node.all_input_nodes if a.op == "get_attr"] + ([node] if node.op == "get_attr" else [])
        for arg in targets:
            found[str(arg.target)] = None
        if node.op == "call_module":
            for pname, _ in gm.get_submodule(node.target).named_parameters():
                found[f"{node.target}.{pname}"] = None
    return [n for n in found if n in params]


def subgraph_regions(gm: fx.GraphModule) -> list:
    """The regions D&SP can split: outermost fork/join regions (explicit branches) and
    attention regions (heads) not inside one of them."""
    explicit = [r for r in regions(gm, "fork_join") if r.details.get("parent") is None]
    inside = {name for r in explicit for name in r.nodes}
    heads = [r for r in regions(gm, "attention") if not set(r.details["core"]) & inside]
    return explicit + heads


def unsplittable(region) -> str | None:
    """Why the explicit branches of fork/join ``region`` cannot be split over sub-grids in
    this version (None: they can)."""
    d = region.details
    if d["side_inputs"] or (d["passthrough"] and d["join_op"] == "concat"):
        return (f"region {region.id}: its branches read values from outside the region ({d['side_inputs']}) or "
                f"the concat takes a value no branch computes; D&SP does not split it in this version")
    if d["join_op"] == "concat" and d["concat_dim"] == 0:
        return f"region {region.id}: concatenates along the batch dimension; D&SP cannot split it"
    return None


@dataclass(frozen=True)
class Branches:
    """What pricing a fork/join region's branches reads: each branch's work (global batch)
    and parameters (names, element counts), and the bytes of the fork and join values."""

    works: list
    params: list
    counts: list
    fork_bytes: float
    join_bytes: float


def branches_of(model: ModelFacts, region) -> Branches:
    """The :class:`Branches` of ``region``, found once per model."""
    memo = model.memo("dsp.branches")
    if region.id not in memo:
        d = region.details
        params = [_branch_parameters(model, branch) for branch in d["branches"]]
        memo[region.id] = Branches([[model.work[n] for n in branch] for branch in d["branches"]], params,
                                   [sum(model.params[p].numel() for p in names) for names in params],
                                   float(tensor_spec(model.table[d["fork"]]).nbytes),
                                   float(tensor_spec(model.table[d["join"]]).nbytes))
    return memo[region.id]


def branching_regions(model: ModelFacts) -> list:
    """The outermost fork/join regions D&SP may spread over the tensor ranks (none with
    batch-normalising batch norms); their branches keep their data replica's rows, so
    a batch baked into a view (torch.export) does not stop them."""
    return model.fact("mixed.branching", lambda: [] if batch_norms(model) else
                      [r for r in subgraph_regions(model.gm) if r.kind == "fork_join"])


def widest_branching(model: ModelFacts) -> int:
    """The most branches of a multi-branch region D&SP may spread over the tensor ranks
    (0: none): a D&SP over the group needs as many as it has ranks."""
    return max((len(r.details["branches"]) for r in branching_regions(model)), default=0)
