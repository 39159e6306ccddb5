"""Analysis pass: repeated blocks, the units a pipeline schedule assigns to stages.

Transformer layers (``transformer.h.0``, ``transformer.h.1``, ...) and the identical
blocks of a ResNet stage are consecutive, structurally identical children of one
``nn.ModuleList``/``nn.Sequential``. Pipeline parallelism (megatron-ptd-p §2.2) cuts the
model between such blocks, so the planner needs them with their cost: one ``block``
region per child, its parameter count and forward FLOPs.

Example (GPT-2 with two layers of width 32 on ``ids: [2, 8]``, captured through torch.export)::

    block:transformer.h.0: GPT2Block group=model.transformer.h index=0 signature=413c1a82c310
        nodes=52 params=12704 flops=409600
    block:transformer.h.1: GPT2Block group=model.transformer.h index=1 signature=413c1a82c310
        nodes=52 params=12704 flops=409600

A block's id is its module path in the user's model (the capture wrapper's ``model.``
off, :func:`autopar.passes.analysis.naming.user_path`); ``details`` keep the graph's own paths.
"""
from __future__ import annotations

import hashlib
import logging
import re
from collections import defaultdict

import torch.fx as fx

from autopar._torch_compat import is_aten_op
from autopar.ir import SPEC, Region, add_region, clear_regions, node_index, regions
from autopar.passes.manager import examining
from autopar.passes.analysis.flops import node_flops
from autopar.passes.analysis.naming import module_paths, user_path

log = logging.getLogger("autopar.analysis.repeated_blocks")


def _class_name(gm: fx.GraphModule, node: fx.Node, path: str) -> str:
    """The block's class as the tracer saw it (export's module tree has generic classes)."""
    for value in (node.meta.get("nn_module_stack") or {}).values():
        if isinstance(value, tuple) and value[0] == path:
            cls = value[1]
            return getattr(cls, "__name__", str(cls).rsplit(".", 1)[-1])
    return type(gm.get_submodule(path)).__name__


def _target_name(target) -> str:
    if isinstance(target, str):
        return target
    if is_aten_op(target):
        return str(target)
    return f"{getattr(target, '__module__', None)}.{getattr(target, '__qualname__', None) or target}"


def block_signature(gm: fx.GraphModule, path: str, nodes: list[fx.Node]) -> str:
    """A short hash of the structure of the block at ``path`` made of ``nodes``: ops,
    their arguments (nodes as positions in the block or as ordinal external inputs),
    output shapes and the shapes of the parameters, with ``path`` itself left out, so
    identical blocks at different positions hash alike."""
    position = {n: i for i, n in enumerate(nodes)}
    external: dict[fx.Node, int] = {}
    prefix = path + "."

    def ref(a: fx.Node) -> str:
        return f"%{position[a]}" if a in position else f"$in{external.setdefault(a, len(external))}"

    items = []
    for n in nodes:
        if n.op in ("call_module", "get_attr"):
            target = "" if n.target == path else str(n.target).removeprefix(prefix)
        else:
            target = _target_name(n.target)
        shapes = ()
        if n.op == "call_module":
            mod = gm.get_submodule(n.target)
            shapes = (type(mod).__name__,) + tuple((k, tuple(p.shape)) for k, p in mod.named_parameters())
        items.append((n.op, target, shapes, fx.node.map_arg((n.args, n.kwargs), ref), str(n.meta.get(SPEC))))
    # an object's default repr holds its address, which differs between equal blocks
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(items))
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def find_repeated_blocks_pass(gm: fx.GraphModule) -> fx.GraphModule:
    """Record one ``block`` region per child in a run of identical consecutive blocks.

    Candidates are the children of a module list or sequence (a path ending in an
    integer: ``model.transformer.h.3``); a node belongs to every module on its
    ``nn_module_stack``, a ``get_attr`` parameter to the modules its name lies in. A run is
    a longest sequence of children with consecutive indices, equal
    :func:`block_signature`, non-overlapping graph spans, and each reading what the one
    before it computed (so a ``ModuleList`` of parallel heads is no run: that is a
    fork/join). Only the longest run of each group (ties: the first) with two or more
    blocks is recorded, and only outermost groups: the layers inside a recorded block are
    not blocks themselves, so every node is in at most one block.

    ``nodes``: the block's nodes in graph order, ``get_attr`` parameters included (under
    export they sit at the top of the graph). ``details``: ``module_path``, ``index`` (the
    child's index in its list), ``group`` (the list's path), ``module_class``,
    ``signature``, ``params`` (element count), ``flops`` (forward, approximate). Regions are
    in graph order. The graph is not changed.

    Example: ``nn.Sequential(Block(), Block(), Block())`` inside the captured wrapper gives
    ``block:0``, ``block:1``, ``block:2`` (module paths ``model.0``, ...), all with group
    ``model`` and one signature.
    """
    clear_regions(gm, "block")
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    members: dict[str, list[fx.Node]] = defaultdict(list)
    for n in gm.graph.nodes:
        for path in module_paths(n):
            members[path].append(n)
    groups: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for path in members:
        group, _, name = path.rpartition(".")
        if name.isdigit():
            groups[group].append((int(name), path))
    found: list[Region] = []
    recorded: list[str] = []
    named = list(gm.named_parameters())  # read once: every block sums its own
    for group in sorted(groups, key=lambda g: (g.count(".") + bool(g), g)):
        if any(group == b or group.startswith(b + ".") for b in recorded):
            continue  # inside a block already recorded
        with examining("repeated_blocks", f"module {group or '(root)'}", "children"):
            run = _longest_run(gm, sorted(groups[group]), members, order)
            if len(run) < 2:
                log.debug("group %s: no two consecutive identical blocks among %d children", group, len(groups[group]))
                continue
            log.debug("group %s: %d identical blocks %s", group, len(run), [p for _, p, _ in run])
            blocks = []  # the group's regions, kept only when every block of it was read
            for index, path, signature in run:
                nodes = members[path]
                params = sum(p.numel() for name, p in named if name.startswith(path + "."))
                anchor = next(n for n in nodes if n.op != "get_attr")
                rid = f"block:{user_path(gm, path)}"
                blocks.append(Region(id=rid, kind="block", nodes=[n.name for n in nodes], details={
                    "module_path": path, "index": index, "group": group,
                    "module_class": _class_name(gm, anchor, path), "signature": signature,
                    "params": params, "flops": sum(node_flops(gm, n) for n in nodes),
                }))
            found.extend(blocks)
            recorded.extend(r.details["module_path"] for r in blocks)
    first = {r.id: min(order[n] for n in members[r.details["module_path"]] if n.op != "get_attr") for r in found}
    found.sort(key=lambda r: first[r.id])
    index = node_index(gm)
    for region in found:
        add_region(gm, region, index)
    log.info("found %d repeated blocks", len(found))
    return gm


def _longest_run(gm, children: list[tuple[int, str]], members, order) -> list[tuple[int, str, str]]:
    best: list[tuple[int, str, str]] = []
    run: list[tuple[int, str, str]] = []
    for index, path in children:
        compute = [n for n in members[path] if n.op != "get_attr"]
        if not compute:
            run = []
            continue
        signature = block_signature(gm, path, members[path])
        if run:
            last_index, last_path, last_signature = run[-1]
            previous = [n for n in members[last_path] if n.op != "get_attr"]
            follows = (index == last_index + 1 and signature == last_signature
                       and order[previous[-1]] < order[compute[0]] and _reads_from(previous, set(compute), order))
            if not follows:
                run = []
        run.append((index, path, signature))
        if len(run) > len(best):
            best = list(run)
    return best


def _reads_from(previous: list[fx.Node], block: set[fx.Node], order) -> bool:
    """Whether a node of ``block`` depends on a node of ``previous`` (the data flows on)."""
    limit = max(order[n] for n in block)
    seen, stack = set(previous), list(previous)
    while stack:
        for user in stack.pop().users:
            if user in block:
                return True
            if user not in seen and order[user] <= limit:
                seen.add(user)
                stack.append(user)
    return False


def format_regions(gm: fx.GraphModule) -> str:
    """One line per ``block`` region of ``gm``, for logs and golden tests."""
    return "\n".join(
        f"{r.id}: {d['module_class']} group={d['group']} index={d['index']} signature={d['signature']} "
        f"nodes={len(r.nodes)} params={d['params']} flops={d['flops']}"
        for r in regions(gm, "block") for d in [r.details])
