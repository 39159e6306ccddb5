"""Region names: ``<kind>:<module path>``, in the names of the user's own model.

Users read ``plan.explain()``, review plan dumps against the model they know and match
region names with patterns (``linear_chain:transformer.h.*.mlp``), so a region is named by
the module that holds it, not by an fx node name (``linear_chain:addmm_2``)::

    HF GPT-2         vocab:transformer.wte  attention:transformer.h.0.attn
                     linear_chain:transformer.h.0.mlp  block:transformer.h.0
    Inception        fork_join:b1 (the branches meet in the root module: see region_path)
    MLP              linear_chain:body  linear_chain:body#1  (two chains in one Sequential)

Every analysis pass names its regions here: :func:`region_path` finds the module,
:class:`RegionNames` makes the id unique in the graph. Both tracers produce the same
paths (``node.meta["nn_module_stack"]``, see :func:`module_paths`), and a pipeline
stage's graph keeps its nodes' metadata, so every capture of one model names its regions
alike (the rewrite finds the plan's regions by these ids in each rank's graph).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch.fx as fx

from autopar.trace.capture import MODEL_PREFIX
from autopar.ir import CAPTURE, Region, add_region, clear_regions, node_index, regions

_COMPUTING_OPS = ("call_function", "call_method", "call_module")


def module_paths(node: fx.Node) -> tuple[str, ...]:
    """The module paths ``node`` was traced inside, outermost first, root excluded.

    Both tracers write ``node.meta["nn_module_stack"]`` as ``{key: (path, class)}``; the
    keys differ (``L__self__model.h.0`` under export, ``model.h.0@1`` for a second call
    under symbolic_trace) while the path does not, so the path is read. Parameters read
    through ``get_attr`` carry no stack under export, nor do nodes of a graph built by
    hand; for those the owner is in the target's name.
    """
    stack = node.meta.get("nn_module_stack")
    if node.op == "get_attr" or (node.op == "call_module" and not stack):  # hand-built graphs have no stack
        parts = str(node.target).split(".")[:None if node.op == "call_module" else -1]
        return tuple(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    paths: list[str] = []
    for value in (stack or {}).values():
        path = value[0] if isinstance(value, tuple) else str(value)
        if path and path not in paths:
            paths.append(path)
    return tuple(paths)


def user_path(gm: fx.GraphModule, path: str) -> str:
    """``path``, a module path in ``gm``, as the user's model names it: a graph captured by
    :func:`autopar.trace.capture.capture` holds the model behind a wrapper (``model.`` +
    the user's name; the model itself is ``model``), whose prefix is taken off. Paths
    of other graphs are returned as they are. ``""`` is the user model's root."""
    if CAPTURE not in gm.meta:
        return path
    if path == MODEL_PREFIX.rstrip("."):
        return ""
    return path[len(MODEL_PREFIX):] if path.startswith(MODEL_PREFIX) else path


def _innermost(gm: fx.GraphModule, node: fx.Node) -> str | None:
    """The user's path of the innermost module ``node`` was traced in (``""``: the root),
    or None when the node says nothing of its module (no ``nn_module_stack``: a graph
    built by hand, or symbolic tracing's nodes outside the user's model)."""
    if not node.meta.get("nn_module_stack") and node.op != "call_module":
        return None
    paths = module_paths(node)
    return user_path(gm, paths[-1]) if paths else ""


def region_path(gm: fx.GraphModule, nodes: Iterable[fx.Node]) -> str:
    """The name a region made of ``nodes`` takes after its kind.

    The deepest module holding all of the region's computing nodes (its ``call_function``,
    ``call_method`` and ``call_module`` nodes; parameters and inputs are no part of it):
    the longest common dotted prefix of their innermost module paths, in the user's
    names (:func:`user_path`). Nodes that carry no module stack are left out of it.

    When that is the root (the region spans modules that meet only in the root: an
    Inception block's branches ``b1``, ``b2``, ``b3``, joined in the model's own forward),
    the name is the innermost module of the region's first computing node (in graph
    order) that lies in a module (``b1``; a functional op of the root's forward, such as a
    ``max_pool2d`` branch computed first, is passed over), or, when no computing node lies
    in a module (the root's own functional code, graphs built by hand), the name of the
    first computing node (``matmul``).
    """
    computing = [n for n in nodes if n.op in _COMPUTING_OPS]
    if not computing:
        raise ValueError("a region without computing nodes has no name")
    known = [p for p in (_innermost(gm, n) for n in computing) if p is not None]
    common: list[str] = []
    if known:
        split = [p.split(".") if p else [] for p in known]
        for parts in zip(*split):
            if any(part != parts[0] for part in parts):
                break
            common.append(parts[0])
    if common:
        return ".".join(common)
    return next((p for p in (_innermost(gm, n) for n in computing) if p), computing[0].name)


class RegionNames:
    """Unique region ids for one pass over one graph: ``<kind>:<path>``; a path that is
    already taken (two linear chains inside one module) gets ``#1``, ``#2``, ... in the
    order the pass names its regions, which is graph order."""

    def __init__(self, kind: str):
        self.kind = kind
        self.taken: set[str] = set()

    def id_for(self, path: str) -> str:
        base = f"{self.kind}:{path}"
        rid, k = base, 0
        while rid in self.taken:
            k += 1
            rid = f"{base}#{k}"
        self.taken.add(rid)
        return rid

    def of(self, gm: fx.GraphModule, nodes: Iterable[fx.Node]) -> str:
        """The id of a region of :attr:`kind` made of ``nodes`` (see :func:`region_path`)."""
        return self.id_for(region_path(gm, nodes))


def adopt_region_ids(gm: fx.GraphModule, known: dict[tuple[str, str], str]) -> None:
    """Give ``gm``'s regions the ids ``known`` names them by, keyed by ``(kind, first node
    name)``: the ids the analysis of a larger graph that ``gm`` was cut from gave them.

    A pipeline stage's graph holds only part of the model, so its own analysis can number
    the regions of one module differently (``linear_chain:enc#1`` of the whole graph is
    ``linear_chain:enc`` in a stage without ``linear_chain:enc``); node names survive the
    cut, so the first node identifies the region. Regions ``known`` does not name keep
    their id (with a further ``#k`` if a renamed one took it); fork/join parents follow.
    Regions stay in order and nodes are tagged again (:func:`autopar.ir.add_region`).
    """
    found = regions(gm)

    def key(r: Region) -> tuple[str, str]:
        return r.kind, r.nodes[0] if r.nodes else ""

    counts = Counter(key(r) for r in found)
    matched = {r.id: known[key(r)] for r in found if key(r) in known and counts[key(r)] == 1}
    taken = set(matched.values())
    renamed: dict[str, str] = {}
    for r in found:
        rid, k = matched.get(r.id, r.id), 0
        while r.id not in matched and rid in taken:
            k += 1
            rid = f"{r.id}#{k}"
        taken.add(rid)
        renamed[r.id] = rid
    if all(old == new for old, new in renamed.items()):
        return
    for kind in {r.kind for r in found}:
        clear_regions(gm, kind)
    index = node_index(gm)
    for r in found:
        details = dict(r.details)
        if details.get("parent") in renamed:
            details["parent"] = renamed[details["parent"]]
        add_region(gm, Region(renamed[r.id], r.kind, list(r.nodes), details), index)
