"""Repeated layers exported once: a model whose body is one stack of repeated layers (a
Hugging Face decoder's ``layers``) is exported with its first few layers only, and the
graph of the others is stamped from the last unit of them.

``torch.export`` costs the same for every layer it traces (about 0.3 s a Llama layer on
a CPU core), and a rank exports its model twice (the global batch in ``compile``, its
own batch at the first step): tracing 80 layers to find 80 copies of one layer's graph is
most of the time to the first step of a deep model. Here the stack (:func:`find_stack`:
a ``ModuleList`` of at least :data:`MIN_LAYERS` modules) is cut while exporting
(:func:`shallow`), and :func:`stamp` builds the whole graph from that export: the nodes
before and after the stack as exported, the kept layers as exported, and every later
layer a copy of a template layer, each reading its own parameters and the layer before
it. The result is the graph the whole model's export gives, node for node: the same
operations and arguments, the same names (fx's namespace numbers them in the same
order), each node's module path its own layer's; the node metadata torch keeps beside
(``val``, ``tensor_meta``) is the template node's, of the same shape.

The layers repeat in *units* of ``period`` layers (:class:`Stack`): from some layer on,
each layer is alike the one a unit later in class, parameters, buffers and plain
attributes (an attribute holding the layer's own index aside). A stack of copies has
units of one layer and keeps layers 0 to 2 (:data:`SHALLOW`); Gemma 3's five local
layers and one global are units of six, GPT-OSS's sliding and full layers units of two,
and DeepSeek-V3's dense first layers come before its units of one. The export keeps the
layers before the stamped units' ``start`` (at least one of them a unit's), the unit
checked and the template unit (:attr:`Stack.kept`, the fewest that stamp).

A stack is stamped only where its export shows the units are copies: the checked unit's
nodes stamped onto the template unit must give the template's exactly (so a literal
that depends on the layer's index, as a loop over experts has, refuses it), every node
between the first and the last layer belongs to one of them, a unit reads nothing of
the layers before the one just before it, the nodes after the stack read only the last
layer, and rebuilding the export as it is gives back its names; and what the shallow
export cannot show is checked apart: a layer whose code computes with its own index is
no stack (:func:`autopar.trace.stacks.index_read`), and the model exported once more at
the whole depth with stub layers must run its layers in order with nothing of its own
between them and its own operations those of the stamped graph
(:mod:`autopar.trace.loop_check`). Where any of these fails the whole model is exported
(:func:`stamp` returns None, or the check refuses, and says why at DEBUG).
``AUTOPAR_STAMP_LAYERS=0`` turns stamping off.
"""
from __future__ import annotations

import logging
import re
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from autopar._torch_compat import children_of, graph_codegen, non_persistent_buffers
from autopar.trace.stacks import COMPUTE_OPS, MIN_LAYERS, SHALLOW, Stack, find_stack, shallow, stamping_enabled

log = logging.getLogger("autopar.capture")

_SUFFIX = re.compile(r"(.*)_(\d+)$")


class _Refused(Exception):
    """The shallow export does not show copies of one layer: export the whole model."""


def stamp(gm: fx.GraphModule, model: nn.Module, stack: Stack, prefix: str = "model.") -> fx.GraphModule | None:
    """``gm`` (the unlifted export of ``model`` with ``stack`` cut :func:`shallow`, the
    wrapper's ``prefix`` before the model's names) made the export of the whole stack:
    its graph replaced, the stamped layers' parameters and buffers (``model``'s own)
    registered. None, with ``gm`` untouched, where the export does not show the layers
    as copies of one another."""
    try:
        layout = _Layout(gm, f"{prefix}{stack.path}" if stack.path else prefix.rstrip("."), stack.kept)
        _Builder(gm, layout, stack, stack.kept).build()   # rebuilt as it is, it must keep every name
        graph, stamped = _Builder(gm, layout, stack, stack.depth).build()
    except (_Refused, IndexError, KeyError) as e:   # (a unit whose layers hold their parameters otherwise)
        log.debug("the layers of %s are exported whole: %s", stack.path, e)
        return None
    for target, template in stamped:
        _register(gm, target, _getattr(model, target[len(prefix):]), template)
    graph.lint()
    gm.graph = graph   # (compiles the module's code)
    return gm


class _Layout:
    """Where the ``kept`` layers of the shallow export are: each node's layer, each
    layer's compute nodes (one run each, in order, nothing between them) and its runs of
    parameter nodes."""

    def __init__(self, gm: fx.GraphModule, path: str, kept: int):
        self.path = path
        self.attr = re.compile(re.escape(path) + r"\.(\d+)(?=\.|$)")
        self._renamed: dict[tuple[str, int, int], str] = {}
        self._patterns: dict[int, re.Pattern] = {}
        self.layer: dict[fx.Node, int] = {}
        self.runs: list[list[fx.Node]] = [[] for _ in range(kept)]
        self.attribute_runs: list[list[list[fx.Node]]] = [[] for _ in range(kept)]
        nodes = list(gm.graph.nodes)
        before = None
        for node in nodes:
            index = self._index(node)
            if index is not None:
                if index >= kept:
                    raise _Refused(f"node {node.name} is in layer {index} of a stack cut to {kept}")
                self.layer[node] = index
                if node.op in COMPUTE_OPS:
                    self.runs[index].append(node)
                elif node.op == "get_attr":
                    if before is None or before.op != "get_attr" or self.layer.get(before) != index:
                        self.attribute_runs[index].append([])
                    self.attribute_runs[index][-1].append(node)
            before = node
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
        elif node.op in COMPUTE_OPS:
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
    """The whole stack's graph (``depth`` layers), built node by node in the order the
    whole model's export makes them: the kept layers as exported, after the last of them
    every later layer a copy of the template layer of its place in the unit."""

    def __init__(self, gm: fx.GraphModule, layout: _Layout, stack: Stack, depth: int):
        self.gm, self.layout, self.stack, self.depth = gm, layout, stack, depth
        self.graph = fx.Graph()
        self.graph.set_codegen(graph_codegen(gm.graph))
        self.new: dict[fx.Node, fx.Node] = {}          # shallow node -> its node in the new graph
        self.copies: dict[tuple[int, fx.Node], fx.Node] = {}   # (layer, template node) -> stamped node
        self.stamped: list[tuple[str, str]] = []       # (stamped target, template target)
        self._check_copies()

    def build(self) -> tuple[fx.Graph, list[tuple[str, str]]]:
        layout, last, kept = self.layout, self.stack.kept - 1, self.stack.kept
        nodes = list(self.gm.graph.nodes)
        stamped = False
        for i, node in enumerate(nodes):
            self.new[node] = self._copy(node, self.new.__getitem__, self._exact_name(node))
            if not stamped and node.name != self.new[node].name:
                raise _Refused(f"rebuilt, node {node.name} is named {self.new[node].name}")
            after = nodes[i + 1] if i + 1 < len(nodes) else None
            if layout.layer.get(node) != last or layout.layer.get(after) == last:
                continue   # not the end of a run of the last kept layer's nodes
            if node.op == "get_attr":
                self._stamp_attributes(node)
            else:
                for layer in range(kept, self.depth):
                    self._stamp_layer(layer)
                stamped = self.depth > kept
        return self.graph, self.stamped

    def _check_copies(self) -> None:
        """Each checked layer stamped as the template layer a unit later must be that
        layer, and nothing but the last layer may be read after the stack."""
        layout, st = self.layout, self.stack
        for source in st.checked:
            one, two = layout.runs[source], layout.runs[source + st.period]
            if len(one) != len(two):
                raise _Refused(f"layers {source} and {source + st.period} have {len(one)} and {len(two)} nodes")
            if len(layout.attribute_runs[source]) != len(layout.attribute_runs[source + st.period]):
                raise _Refused(f"layers {source} and {source + st.period} hold their parameters apart otherwise")
            for a, b in zip(one, two):
                mapped = self._shift(a, source, lambda n: layout.runs[layout.layer[n] + st.period][layout.position[n]],
                                     lambda n, source=source: self._attribute_node(n, source, source + st.period))
                if mapped != _signature(b):
                    raise _Refused(f"node {b.name} of layer {source + st.period} is not node {a.name} of layer "
                                   f"{source} shifted by {st.period} layer(s)")
        last = set(layout.runs[st.kept - 1])
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
        """The signature of ``node`` (of checked layer ``source``) moved one unit on:
        ``counterpart(n)`` is the moved node of ``n`` (of the checked unit or the layer
        before it), ``attribute(n)`` the moved parameter."""
        layout, st = self.layout, self.stack

        def moved(n: fx.Node):
            index = layout.layer.get(n)
            if index is None:
                return n
            if n.op == "get_attr":
                if index != source:
                    raise _Refused(f"node {node.name} reads another layer's {n.target}")
                return attribute(n)
            if not st.start - 1 <= index <= source:
                raise _Refused(f"node {node.name} reads layer {index}")
            return counterpart(n)
        return _signature(node, moved, lambda text: layout.renamed(text, source, source + st.period))

    # -- emitting
    def _exact_name(self, node: fx.Node) -> str:
        if node.op in COMPUTE_OPS:
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

    def _stamp_attributes(self, end: fx.Node) -> None:
        """After a run of the last kept layer's parameters (or buffers): every later
        layer's same run, copied from its template layer's."""
        layout, last = self.layout, self.stack.kept - 1
        which = next(i for i, run in enumerate(layout.attribute_runs[last]) if run[-1] is end)
        for layer in range(self.stack.kept, self.depth):
            template = self.stack.template_of(layer)
            rename = (lambda text, layer=layer, template=template: layout.renamed(text, template, layer))
            for node in layout.attribute_runs[template][which]:
                target = rename(node.target)
                copy = self._copy(node, self.new.__getitem__, target.replace(".", "_"), rename)
                if copy.name != target.replace(".", "_") or node.name != node.target.replace(".", "_"):
                    raise _Refused(f"parameter node {node.name} is not named after its target")
                self.copies[(layer, node)] = copy
                self.stamped.append((target, node.target))

    def _stamp_layer(self, layer: int) -> None:
        """Layer ``layer``'s nodes, copies of its template layer's."""
        layout, st = self.layout, self.stack
        template = self.stack.template_of(layer)
        run = layout.runs[template]
        rename = (lambda text: layout.renamed(text, template, layer))
        before_unit = layer - (layer - st.start) % st.period - 1   # the last layer of the unit before

        def reference(n: fx.Node) -> fx.Node:
            index = layout.layer.get(n)
            if index is None:
                return self.new[n]
            if n.op == "get_attr":
                return self.copies[(layer, n)]
            if index >= st.start + st.period:   # the template unit: this unit's counterpart
                return self.copies[(layer - template + index, n)]
            if index != st.start + st.period - 1:
                raise _Refused(f"template node {n.name} of layer {index} is read by layer {template}")
            before = layout.runs[st.kept - 1][layout.position[n]]   # the unit before's counterpart of n
            return self.new[before] if before_unit == st.kept - 1 else self.copies[(before_unit, before)]

        for node in run:
            self.copies[(layer, node)] = self._copy(node, reference, self._exact_name(node), rename)
        if layer == self.depth - 1:   # what follows the stack reads the last layer
            for node in layout.runs[st.kept - 1]:
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
