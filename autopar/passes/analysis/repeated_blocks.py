"""Analysis pass: repeated blocks, the units a pipeline schedule assigns to stages.

Transformer layers (``transformer.h.0``, ``transformer.h.1``, ...) and the identical
blocks of a ResNet stage are consecutive, structurally identical children of one
``nn.ModuleList``/``nn.Sequential``. Pipeline parallelism (megatron-ptd-p §2.2) cuts the
model between such blocks, so the planner needs them with their cost: one ``block``
region per child, its parameter count and forward FLOPs. A stack of unlike layers that
repeats with a period (Jamba's Mamba and attention layers, Gemma 3's local and global
ones, dense and MoE layers in turn) gives one ``block`` region per unit of ``period``
layers, so that a cut falls only between units.

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
from dataclasses import dataclass

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


_LIFTED = re.compile(r"(lifted_tensor_|_tensor_constant)\d+")


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
        if n.op == "get_attr" and _LIFTED.fullmatch(str(n.target).rsplit(".", 1)[-1]):
            target = "<constant>"   # a tensor the capture lifted (an index list): its name counts up per use
        elif n.op in ("call_module", "get_attr"):
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
    """Record one ``block`` region per unit in a run of alike consecutive units of a stack.

    Candidates are the children of a module list or sequence (a path ending in an
    integer: ``model.transformer.h.3``); a node belongs to every module on its
    ``nn_module_stack``, a ``get_attr`` parameter to the modules its name lies in. A
    *unit* is ``k`` consecutive children (the stack's period); a run is a longest sequence
    of units alike position by position (each child the same class and
    :func:`block_signature` as the child ``k`` before it), of children with consecutive
    indices, non-overlapping graph spans, and each reading what the one before it computed
    (so a ``ModuleList`` of parallel heads is no run: that is a fork/join). Of each group
    the run covering the most children with two or more units is recorded (ties: the
    smallest period, then the first run), and only outermost groups: the layers inside a
    recorded block are not blocks themselves, so every node is in at most one block.
    Identical children give ``k = 1``, one block per child; Jamba's Mamba and attention
    layers, Gemma 3's local and global ones or interleaved dense and MoE layers give
    ``k = 2`` or more, one block per unit. In a unit of several children every child
    holds parameters: the activation between the linears of a ``Sequential`` is part of
    a layer, not one. Children of the group outside the run (a first layer unlike the
    others, a last one short of a unit) are in no block.

    ``nodes``: the block's nodes in graph order, ``get_attr`` parameters included (under
    export they sit at the top of the graph). ``details``: ``module_path`` (its first
    child), ``index`` (that child's index in its list), ``group`` (the list's path),
    ``module_class`` (the children's, joined by ``+``), ``signature``, ``params``
    (element count), ``flops`` (forward, approximate), and for ``k > 1`` ``period`` and
    ``layers`` (the children's paths). A unit's id names its first and last child:
    ``block:model.layers.0-1``. Regions are in graph order. The graph is not changed.

    Example: ``nn.Sequential(Block(), Block(), Block())`` inside the captured wrapper gives
    ``block:0``, ``block:1``, ``block:2`` (module paths ``model.0``, ...), all with group
    ``model`` and one signature; ``ModuleList([Attn(), Mlp(), Attn(), Mlp()])`` at
    ``layers`` gives ``block:layers.0-1`` and ``block:layers.2-3``.
    """
    clear_regions(gm, "block")
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    members: dict[str, list[fx.Node]] = defaultdict(list)
    for n in gm.graph.nodes:
        for path in module_paths(n):
            members[path].append(n)
    groups = _stacks(members)
    found: list[Region] = []
    recorded: list[str] = []
    named = list(gm.named_parameters())  # read once: every block sums its own
    for group in sorted(groups, key=lambda g: (g.count(".") + bool(g), g)):
        if any(group == b or group.startswith(b + ".") for b in recorded):
            continue  # inside a block already recorded
        with examining("repeated_blocks", f"module {group or '(root)'}", "children"):
            run = _best_run(gm, sorted(groups[group]), members, order, named)
            if len(run) < 2:
                log.debug("group %s: no unit of consecutive children repeats among %d children", group,
                          len(groups[group]))
                continue
            log.debug("group %s: %d alike units of %d %s", group, len(run), len(run[0]),
                      [[c.path for c in unit] for unit in run])
            blocks = []  # the group's regions, kept only when every block of it was read
            for unit in run:
                first, last = unit[0], unit[-1]
                nodes = sorted({n for c in unit for n in members[c.path]}, key=order.__getitem__)
                rid = f"block:{user_path(gm, first.path)}" + (f"-{last.index}" if len(unit) > 1 else "")
                details = {
                    "module_path": first.path, "index": first.index, "group": group,
                    "module_class": "+".join(c.cls for c in unit),
                    "signature": _unit_signature(unit),
                    "params": sum(c.params for c in unit), "flops": sum(node_flops(gm, n) for n in nodes)}
                if len(unit) > 1:
                    details.update(period=len(unit), layers=[c.path for c in unit])
                blocks.append(Region(id=rid, kind="block", nodes=[n.name for n in nodes], details=details))
            found.extend(blocks)
            recorded.extend(c.path for unit in run for c in unit)
    table = node_index(gm)
    first = {r.id: min(order[table[name]] for name in r.nodes if table[name].op != "get_attr") for r in found}
    found.sort(key=lambda r: first[r.id])
    for region in found:
        add_region(gm, region, table)
    log.info("found %d repeated blocks", len(found))
    return gm


def _stacks(members: dict[str, list[fx.Node]]) -> dict[str, list[tuple[int, str]]]:
    """The module lists and sequences of a graph: their paths and their children's
    ``(index, path)`` (those with a node in the graph)."""
    groups: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for path in members:
        group, _, name = path.rpartition(".")
        if name.isdigit():
            groups[group].append((int(name), path))
    return groups


@dataclass
class _Child:
    """A child of a stack, as the run search compares it."""

    index: int
    path: str
    compute: list[fx.Node]            # its computing nodes, in graph order
    key: tuple[str, str]              # (class, signature): alike children have equal keys
    params: int                       # parameter elements

    @property
    def cls(self) -> str:
        return self.key[0]


def _unit_signature(unit: list[_Child]) -> str:
    if len(unit) == 1:
        return unit[0].key[1]
    return hashlib.sha1("+".join(c.key[1] for c in unit).encode()).hexdigest()[:12]


def _best_run(gm, children: list[tuple[int, str]], members, order, named) -> list[list[_Child]]:
    """The units of the run covering most children (module docstring): each unit a list
    of its ``k`` children."""
    kids: list[_Child | None] = []
    for index, path in children:
        compute = [n for n in members[path] if n.op != "get_attr"]
        if not compute:
            kids.append(None)
            continue
        kids.append(_Child(index, path, compute, (_class_name(gm, compute[0], path),
                                                  block_signature(gm, path, members[path])),
                           sum(p.numel() for name, p in named if name.startswith(path + "."))))
    flows: dict[int, bool] = {}

    def follows(i: int) -> bool:  # kids[i + 1] comes after kids[i] and reads what it computed
        if i not in flows:
            a, b = kids[i], kids[i + 1]
            flows[i] = (a is not None and b is not None and b.index == a.index + 1
                        and order[a.compute[-1]] < order[b.compute[0]] and _reads_from(a.compute, set(b.compute), order))
        return flows[i]

    n = len(kids)
    best: list[list[_Child]] = []
    covered = 0
    for k in range(1, n // 2 + 1):
        if (n // k) * k <= covered:
            continue  # cannot cover more than the run found
        for offset in range(k):
            run: list[list[_Child]] = []
            for start in range(offset, n - k + 1, k):
                unit = kids[start:start + k]
                if any(c is None for c in unit) or (k > 1 and not all(c.params for c in unit)) \
                        or not all(follows(start + j) for j in range(k - 1)):
                    run = []
                    continue
                if run and not ([c.key for c in run[-1]] == [c.key for c in unit] and follows(start - 1)):
                    run = []
                run.append(unit)
                if len(run) >= 2 and len(run) * k > covered:
                    best, covered = list(run), len(run) * k
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


def describe_stacks(gm: fx.GraphModule, limit: int = 3) -> str:
    """The outermost module lists and sequences of ``gm`` with two or more children, each
    with its children's classes (``layers: Attn, Mlp, Attn``), the longest ``limit``
    first: what an error that found no repeated blocks shows of the model."""
    members: dict[str, list[fx.Node]] = defaultdict(list)
    for n in gm.graph.nodes:
        for path in module_paths(n):
            members[path].append(n)
    groups = _stacks(members)
    outer = [g for g in groups if len(groups[g]) > 1 and not any(g.startswith(o + ".") for o in groups if o != g)]
    lines = []
    for group in sorted(outer, key=lambda g: (-len(groups[g]), g))[:limit]:
        classes = []
        for _, path in sorted(groups[group]):
            compute = [n for n in members[path] if n.op != "get_attr"]
            classes.append(_class_name(gm, compute[0], path) if compute else "(no computation)")
        shown = ", ".join(classes[:12]) + (f", ... ({len(classes)} in all)" if len(classes) > 12 else "")
        lines.append(f"{user_path(gm, group) or '(root)'}: {shown}")
    return "; ".join(lines)


def format_regions(gm: fx.GraphModule) -> str:
    """One line per ``block`` region of ``gm``, for logs and golden tests."""
    return "\n".join(
        f"{r.id}: {d['module_class']} group={d['group']} index={d['index']} signature={d['signature']} "
        f"nodes={len(r.nodes)} params={d['params']} flops={d['flops']}" + (f" period={d['period']}" if "period" in d else "")
        for r in regions(gm, "block") for d in [r.details])
