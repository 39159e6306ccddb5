"""The model as the mixed programme reads it, each found once per model
(:meth:`~autopar.planning.model.ModelFacts.fact`): the nodes in graph order, the
multi-branch regions D&SP may spread over the tensor group with the tensor regions
inside them, one tensor region of each class of identical regions and the regions a pin
may name (the 3D layouts a tensor group may take are
:func:`autopar.strategies.shared.grid3d.pricing.tensor_grids`)."""
from __future__ import annotations

from autopar.planning.model import ModelFacts
from autopar.strategies.shared.branches import branching_regions, subgraph_regions


def node_order(model: ModelFacts) -> dict[str, int]:
    """Each node's index in graph order (once per model)."""
    return model.fact("mixed.order", lambda: {n.name: i for i, n in enumerate(model.gm.graph.nodes)})


def node_names(model: ModelFacts) -> list[str]:
    """The node names in graph order (once per model)."""
    return model.fact("mixed.names", lambda: list(model.table))


def region_structure(model: ModelFacts):
    """Once per model: each tensor region's first node (graph order), and the multi-branch
    regions (none with batch-normalising batch norms) as ``(first node, region, the
    tensor regions inside it in graph order)``."""
    def find():
        order = node_order(model)
        start = {r.id: min(order[n] for n in r.nodes) for r in model.regions}
        branching = []
        for fj in branching_regions(model):
            members = set(fj.nodes)
            inner = sorted((r for r in model.regions if set(r.nodes) <= members), key=lambda r: start[r.id])
            branching.append((min(order[n] for n in fj.nodes), fj, inner))
        return start, branching
    return model.fact("mixed.structure", find)


def inner_regions(model: ModelFacts, fj) -> list:
    """The tensor regions inside multi-branch region ``fj``, in graph order."""
    return next(inner for _, region, inner in region_structure(model)[1] if region is fj)


def params_outside_regions(model: ModelFacts) -> int:
    """Parameter elements outside every tensor region (once per model)."""
    return model.fact("mixed.outside_params", lambda: sum(p.numel() for p in model.params.values())
                      - sum(model.region_param_elems(r.id) for r in model.regions))


def representatives(model: ModelFacts) -> list:
    """One tensor region of each class of identical regions (once per model)."""
    return model.fact("mixed.representatives",
                      lambda: list({model.region_class[r.id]: r for r in model.regions}.values()))


def pinnable(model: ModelFacts) -> list:
    """The regions a pin may name: the tensor regions and the multi-branch ones."""
    return list(model.regions) + [r for r in subgraph_regions(model.gm) if r.kind == "fork_join"]
