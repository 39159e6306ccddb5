"""Repeated layers exported once: a model whose body is one stack of identical layers
(a Hugging Face decoder's ``layers``) is exported with its first :data:`SHALLOW` layers
only, and the graph of the others is stamped from the last of them.

``torch.export`` costs the same for every layer it traces (about 0.3 s a Llama layer on
a CPU core), and a rank exports its model twice (the global batch in ``compile``, its
own batch at the first step): tracing 80 layers to find 80 copies of one layer's graph is
most of the time to the first step of a deep model. Here the stack
(:func:`find_stack`: a ``ModuleList`` of at least :data:`MIN_LAYERS` modules alike in
class, parameters, buffers and plain attributes, an attribute holding the layer's own
index aside) is cut to its first three layers while exporting (:func:`shallow`), and
:func:`stamp` builds the whole graph from that export: the nodes before and after the
stack as exported, layers 0 to 2 as exported, and layers 3 to N-1 as copies of layer 2,
each reading its own parameters and the layer before it. The result is the graph the
whole model's export gives, node for node: the same operations and arguments, the same
names (fx's namespace numbers them in the same order), each node's module path its own
layer's; the node metadata torch keeps beside (``val``, ``tensor_meta``) is the template
node's, of the same shape.

A stack is stamped only where its export shows the layers are copies: layer 1's nodes
stamped onto layer 2 must give layer 2's exactly (so a literal that depends on the
layer's index, as a loop over experts has, refuses it), every node between the first
and the last layer belongs to one of them, a layer reads nothing of the layers before
the previous one, the nodes after the stack read only the last layer, and rebuilding the
export as it is gives back its names. Where any of these fails the whole model is
exported (:func:`stamp` returns None and says why at DEBUG). ``AUTOPAR_STAMP_LAYERS=0``
turns stamping off.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
from typing import Any, Iterator

import torch
import torch.fx as fx
import torch.nn as nn

from autopar._torch_compat import (children_of, forward_hooks, graph_codegen, non_persistent_buffers,
                                   set_children)

log = logging.getLogger("autopar.capture")

SHALLOW = 3
"""The layers of a stamped stack that are exported: layer 2 is the template, layer 1
checks it."""

MIN_LAYERS = SHALLOW + 1
"""The shortest stack worth stamping."""

_PLAIN = (bool, int, float, complex, str, type(None), torch.dtype, torch.device)
_SUFFIX = re.compile(r"(.*)_(\d+)$")
_COMPUTE = ("call_function", "call_method", "call_module")


@dataclasses.dataclass(frozen=True)
class Stack:
    """A stack of identical layers: the ``ModuleList``'s path in the model, its length."""

    path: str
    depth: int


def stamping_enabled() -> bool:
    return os.environ.get("AUTOPAR_STAMP_LAYERS", "1") not in ("0", "false", "False", "no")


# ------------------------------------------------------------------ finding the stack


def find_stack(model: nn.Module) -> Stack | None:
    """The model's stack of identical layers holding the most parameters (None: none of
    at least :data:`MIN_LAYERS` layers)."""
    best, best_size = None, 0
    owners = _parameter_owners(model)
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < MIN_LAYERS:
            continue
        layers = list(module)
        size = sum(p.numel() for layer in layers for p in layer.parameters())
        if size > best_size and _alike(layers) and _own_parameters(path, layers, owners):
            best, best_size = Stack(path, len(layers)), size
    return best


def _parameter_owners(model: nn.Module) -> dict[int, set[str]]:
    owners: dict[int, set[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        owners.setdefault(id(t), set()).add(name)
    return owners


def _own_parameters(path: str, layers: list[nn.Module], owners: dict[int, set[str]]) -> bool:
    """No module twice in the stack, and every tensor of a layer held by that layer only
    (a weight tied across layers would be one parameter under several names)."""
    if len({id(layer) for layer in layers}) != len(layers):
        return False
    for i, layer in enumerate(layers):
        inside = f"{path}.{i}." if path else f"{i}."
        for t in [*layer.parameters(), *layer.buffers()]:
            if any(not name.startswith(inside) for name in owners.get(id(t), ())):
                return False
    return True


def _plain(value) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN)


def _facts(layer: nn.Module) -> tuple[dict, tuple]:
    """A layer's plain attributes by ``(module, attribute)``, and everything else a
    capture of it depends on (classes, hooks, parameters, buffers, other attributes'
    identities)."""
    attributes, rest = {}, []
    for name, m in layer.named_modules(remove_duplicate=False):
        others = []
        for key, value in vars(m).items():
            if key.startswith("_") and key not in ("_version",):
                continue
            if _plain(value):
                attributes[(name, key)] = value
            elif not isinstance(value, (nn.Module, torch.Tensor)):
                others.append((key, id(value)))   # a config object: the same one in every layer
        rest.append((name, type(m), forward_hooks(m), tuple(others), "forward" in vars(m)))
    for name, p in layer.named_parameters(remove_duplicate=False):
        rest.append((name, type(p), tuple(p.shape), p.dtype, p.device, p.requires_grad))
    for name, b in layer.named_buffers(remove_duplicate=False):
        rest.append((name, tuple(b.shape), b.dtype, b.device))
    return attributes, tuple(rest)


def _alike(layers: list[nn.Module]) -> bool:
    """Whether the layers are copies of one another: the same facts, an integer attribute
    that is every layer's own index (``layer_idx``) aside."""
    facts = [_facts(layer) for layer in layers]
    if any(f[1] != facts[0][1] or f[0].keys() != facts[0][0].keys() for f in facts):
        return False
    for key, first in facts[0][0].items():
        values = [f[0][key] for f in facts]
        if all(v == first and type(v) is type(first) for v in values):
            continue
        if not all(type(v) is int and v == i for i, v in enumerate(values)):
            return False
    return True


@contextlib.contextmanager
def shallow(model: nn.Module, stack: Stack) -> Iterator[None]:
    """The model with its stack cut to its first :data:`SHALLOW` layers, inside."""
    module = model.get_submodule(stack.path)
    children = children_of(module)
    set_children(module, dict(list(children.items())[:SHALLOW]))
    try:
        yield
    finally:
        set_children(module, children)


# ------------------------------------------------------------------ stamping


class _Refused(Exception):
    """The shallow export does not show copies of one layer: export the whole model."""


def stamp(gm: fx.GraphModule, model: nn.Module, stack: Stack, prefix: str = "model.") -> fx.GraphModule | None:
    """``gm`` (the unlifted export of ``model`` with ``stack`` cut :func:`shallow`, the
    wrapper's ``prefix`` before the model's names) made the export of the whole stack:
    its graph replaced, the stamped layers' parameters and buffers (``model``'s own)
    registered. None, with ``gm`` untouched, where the export does not show the layers
    as copies of one another."""
    try:
        layout = _Layout(gm, f"{prefix}{stack.path}" if stack.path else prefix.rstrip("."))
        _Builder(gm, layout, SHALLOW).build()   # rebuilt as it is, it must keep every name
        graph, stamped = _Builder(gm, layout, stack.depth).build()
    except _Refused as e:
        log.debug("the layers of %s are exported whole: %s", stack.path, e)
        return None
    for target, template in stamped:
        _register(gm, target, _getattr(model, target[len(prefix):]), template)
    graph.lint()
    gm.graph = graph   # (compiles the module's code)
    return gm


class _Layout:
    """Where the layers of the shallow export are: each node's layer, each layer's
    compute nodes (one run each, in order, nothing between them) and parameters."""

    def __init__(self, gm: fx.GraphModule, path: str):
        self.path = path
        self.attr = re.compile(re.escape(path) + r"\.(\d+)(?=\.|$)")
        self._renamed: dict[tuple[str, int, int], str] = {}
        self._patterns: dict[int, re.Pattern] = {}
        self.layer: dict[fx.Node, int] = {}
        self.runs: list[list[fx.Node]] = [[] for _ in range(SHALLOW)]
        nodes = list(gm.graph.nodes)
        for node in nodes:
            index = self._index(node)
            if index is not None:
                self.layer[node] = index
                if node.op in _COMPUTE:
                    self.runs[index].append(node)
        if any(not run for run in self.runs):
            raise _Refused("a layer has no nodes of its own")
        position = {node: i for i, node in enumerate(nodes)}
        first, last = position[self.runs[0][0]], position[self.runs[-1][-1]]
        expected = [node for run in self.runs for node in run]
        if nodes[first:last + 1] != expected:
            raise _Refused("nodes between the layers, or a layer's nodes interleaved with another's")
        self.position = {node: i for run in self.runs for i, node in enumerate(run)}

    def _index(self, node: fx.Node) -> int | None:
        if node.op == "get_attr":
            paths = [node.target]
        elif node.op in _COMPUTE:
            paths = [path for path, _ in (node.meta.get("nn_module_stack") or {}).values()]
        else:
            return None
        found = {int(m.group(1)) for path in paths if (m := self.attr.match(path)) is not None}
        if len(found) > 1:
            raise _Refused(f"node {node.name} is in two layers")
        return found.pop() if found else None

    def renamed(self, text: str, source: int, layer: int) -> str:
        """``text`` (a target or module path) with layer ``source``'s path made ``layer``'s."""
        key = (text, source, layer)
        found = self._renamed.get(key)
        if found is None:
            pattern = self._patterns.get(source)
            if pattern is None:
                pattern = self._patterns[source] = re.compile(re.escape(f"{self.path}.{source}") + r"(?=\.|$)")
            found = self._renamed[key] = pattern.sub(f"{self.path}.{layer}", text)
        return found


class _Builder:
    """The whole stack's graph, built node by node in the order the whole model's export
    makes them."""

    def __init__(self, gm: fx.GraphModule, layout: _Layout, depth: int):
        self.gm, self.layout, self.depth = gm, layout, depth
        self.graph = fx.Graph()
        self.graph.set_codegen(graph_codegen(gm.graph))
        self.new: dict[fx.Node, fx.Node] = {}          # shallow node -> its node in the new graph
        self.copies: dict[tuple[int, fx.Node], fx.Node] = {}   # (layer, template node) -> stamped node
        self.stamped: list[tuple[str, str]] = []       # (stamped target, template target)
        self._check_copies()

    def build(self) -> tuple[fx.Graph, list[tuple[str, str]]]:
        layout, template = self.layout, SHALLOW - 1
        nodes = list(self.gm.graph.nodes)
        stamped = False
        for i, node in enumerate(nodes):
            self.new[node] = self._copy(node, self.new.__getitem__, self._exact_name(node))
            if not stamped and node.name != self.new[node].name:
                raise _Refused(f"rebuilt, node {node.name} is named {self.new[node].name}")
            after = nodes[i + 1] if i + 1 < len(nodes) else None
            if layout.layer.get(node) != template or layout.layer.get(after) == template:
                continue   # not the end of a run of the template layer's nodes
            if node.op == "get_attr":
                self._stamp_attributes(node, nodes)
            else:
                for layer in range(SHALLOW, self.depth):
                    self._stamp_layer(layer)
                stamped = self.depth > SHALLOW
        return self.graph, self.stamped

    def _check_copies(self) -> None:
        """Layer 1 stamped as layer 2 must be layer 2, and nothing but the last layer may
        be read after the stack."""
        layout = self.layout
        one, two = layout.runs[SHALLOW - 2], layout.runs[SHALLOW - 1]
        if len(one) != len(two):
            raise _Refused(f"layers {SHALLOW - 2} and {SHALLOW - 1} have {len(one)} and {len(two)} nodes")
        for a, b in zip(one, two):
            mapped = self._shift(a, SHALLOW - 2, lambda n, o: layout.runs[SHALLOW - 1 + o][layout.position[n]],
                                 lambda n: self._attribute_node(n, SHALLOW - 2, SHALLOW - 1))
            if mapped != _signature(b):
                raise _Refused(f"node {b.name} of layer {SHALLOW - 1} is not node {a.name} of layer {SHALLOW - 2} "
                               f"shifted by one layer")
        last = set(layout.runs[SHALLOW - 1])
        for node in self.gm.graph.nodes:
            if node in layout.layer:
                continue
            for read in node.all_input_nodes:
                if read in layout.layer and read not in last:
                    raise _Refused(f"node {node.name} outside the stack reads {read.name} of layer "
                                   f"{layout.layer[read]}")

    def _attribute_node(self, node: fx.Node, source: int, layer: int) -> fx.Node:
        target = self.layout.renamed(node.target, source, layer)
        found = next((n for n in self.gm.graph.nodes if n.op == "get_attr" and n.target == target), None)
        if found is None:
            raise _Refused(f"layer {layer} has no {target}")
        return found

    def _shift(self, node: fx.Node, source: int, counterpart, attribute) -> tuple:
        """The signature of ``node`` (of layer ``source``) moved one layer on:
        ``counterpart(n, offset)`` is the moved node of layer ``source + offset``'s ``n``
        (offset 0: this layer, -1: the layer before), ``attribute(n)`` the moved
        parameter."""
        layout = self.layout

        def moved(n: fx.Node):
            index = layout.layer.get(n)
            if index is None:
                return n
            if n.op == "get_attr":
                if index != source:
                    raise _Refused(f"node {node.name} reads another layer's {n.target}")
                return attribute(n)
            if index not in (source, source - 1):
                raise _Refused(f"node {node.name} reads layer {index}")
            return counterpart(n, index - source)
        return _signature(node, moved, lambda text: layout.renamed(text, source, source + 1))

    # -- emitting
    def _exact_name(self, node: fx.Node) -> str:
        if node.op in _COMPUTE:
            m = _SUFFIX.match(node.name)
            return m.group(1) if m else node.name
        return node.name

    def _copy(self, node: fx.Node, reference, name: str, rename=None) -> fx.Node:
        args = fx.map_arg(node.args, reference)
        kwargs = fx.map_arg(node.kwargs, reference)
        target = rename(node.target) if rename is not None and isinstance(node.target, str) else node.target
        new = self.graph.create_node(node.op, target, args, kwargs, name=name, type_expr=node.type)
        new.meta = dict(node.meta)
        if rename is not None and "nn_module_stack" in node.meta:
            new.meta["nn_module_stack"] = {rename(k): (rename(path), cls)
                                           for k, (path, cls) in node.meta["nn_module_stack"].items()}
        return new

    def _stamp_attributes(self, last: fx.Node, nodes: list[fx.Node]) -> None:
        """After the template layer's run of parameters (or buffers): every later layer's."""
        template = SHALLOW - 1
        end = nodes.index(last)
        start = end
        while start > 0 and self.layout.layer.get(nodes[start - 1]) == template and nodes[start - 1].op == "get_attr":
            start -= 1
        run = nodes[start:end + 1]
        for layer in range(SHALLOW, self.depth):
            rename = (lambda text, layer=layer: self.layout.renamed(text, template, layer))
            for node in run:
                target = rename(node.target)
                copy = self._copy(node, self.new.__getitem__, target.replace(".", "_"), rename)
                if copy.name != target.replace(".", "_") or node.name != node.target.replace(".", "_"):
                    raise _Refused(f"parameter node {node.name} is not named after its target")
                self.copies[(layer, node)] = copy
                self.stamped.append((target, node.target))

    def _stamp_layer(self, layer: int) -> None:
        """Layer ``layer``'s nodes, copies of the template layer's."""
        layout, template = self.layout, SHALLOW - 1
        run = layout.runs[template]
        rename = (lambda text: layout.renamed(text, template, layer))

        def reference(n: fx.Node) -> fx.Node:
            index = layout.layer.get(n)
            if index is None:
                return self.new[n]
            if n.op == "get_attr":
                return self.copies[(layer, n)]
            if index == template:
                return self.copies[(layer, n)]
            before = run[layout.position[n]]   # the layer before's counterpart of n
            return self.new[before] if layer == SHALLOW else self.copies[(layer - 1, before)]

        for node in run:
            self.copies[(layer, node)] = self._copy(node, reference, self._exact_name(node), rename)
        if layer == self.depth - 1:   # what follows the stack reads the last layer
            for node in run:
                self.new[node] = self.copies[(layer, node)]


def _signature(node: fx.Node, moved=None, rename=None) -> tuple:
    """What makes a node the node it is: its operation, target, arguments (the nodes it
    reads, through ``moved``), name without its number, and module paths (through
    ``rename``)."""
    moved = moved or (lambda n: n)
    rename = rename or (lambda text: text)
    target = rename(node.target) if isinstance(node.target, str) else node.target
    stack = tuple((rename(k), rename(path), cls) for k, (path, cls) in (node.meta.get("nn_module_stack") or {}).items())
    m = _SUFFIX.match(node.name)
    return (node.op, target, fx.map_arg(node.args, moved), fx.map_arg(node.kwargs, moved),
            m.group(1) if m else node.name, stack)


def _getattr(obj, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _register(gm: fx.GraphModule, target: str, value: torch.Tensor, template: str) -> None:
    """Put ``value`` at ``target`` on ``gm`` as the export put the template layer's:
    a parameter, or a buffer as persistent as the template's."""
    owner_path, _, name = target.rpartition(".")
    owner = gm
    for part in owner_path.split(".") if owner_path else ():
        if part not in children_of(owner):
            owner.add_module(part, nn.Module())
        owner = children_of(owner)[part]
    if isinstance(value, nn.Parameter):
        owner.register_parameter(name, value)
        return
    template_owner_path, _, template_name = template.rpartition(".")
    template_owner = gm.get_submodule(template_owner_path)
    owner.register_buffer(name, value, persistent=template_name not in non_persistent_buffers(template_owner))


__all__ = ["MIN_LAYERS", "SHALLOW", "Stack", "find_stack", "shallow", "stamp", "stamping_enabled"]
