"""The layouts of a rank graph's values as a walk finds them, and the collective nodes it
inserts around them, each once per value: all-gathers (a block or padded split put back
in the single-device order), slices of replicated operands (``scatter_to_tensor_region``)
and Megatron's f (``copy_to_tensor_region``)."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from autopar.ir import SPEC, spec_from_value, tensor_spec
from autopar.runtime import collectives
from autopar.runtime.shapes import blocks_in_order
from autopar.strategies.shared.sharding import Shard, operand_dim_for


class TensorParallelError(ValueError):
    """A graph cannot be split as the plan says; the message names the node or region."""


class NoSplitRule(Exception):
    """Raised by a rule that cannot carry the split through a node; caught by the walk."""


class LayoutState:
    """Layouts of the values of ``gm`` over a tensor group of ``degree`` ranks, and the
    collectives that gather, slice or route them."""

    def __init__(self, gm: fx.GraphModule, degree: int, group: str):
        self.gm, self.graph, self.t, self.group = gm, gm.graph, degree, group
        self.layout: dict[fx.Node, Any] = {}
        # parameters the graph reads already split (by name): a per-head parameter cut with
        # its heads (attention sinks), an expert bias cut with its columns; the rest whole
        self.param_layouts: dict[str, Shard] = {}
        self.cache: dict[tuple, fx.Node] = {}
        # (node name, op, why) of every node no rule covered (see _fallback)
        self.fallbacks: list[tuple[str, str, str]] = []
        self.quiet = False

    def _call(self, fn, args, after: fx.Node | None = None, before: fx.Node | None = None) -> fx.Node:
        ctx = self.graph.inserting_after(after) if after is not None else self.graph.inserting_before(before)
        with ctx:
            node = self.graph.call_function(fn, args)
        # SPEC keeps its meaning on rank graphs: the global shape of the value
        node.meta[SPEC] = self._spec(args[0])
        return node

    def _spec(self, value: fx.Node):
        """``value``'s SPEC; a parameter read by a ``get_attr`` a rule inserted (a layer
        norm's weight, made functional) gets its own first."""
        if SPEC not in value.meta and value.op == "get_attr":
            owner, _, name = str(value.target).rpartition(".")
            tensor = getattr(self.gm.get_submodule(owner) if owner else self.gm, name, None)
            if isinstance(tensor, torch.Tensor):
                value.meta[SPEC] = spec_from_value(tensor)
        return value.meta.get(SPEC)

    def _cached(self, key: tuple, make) -> fx.Node:
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def _copy_to(self, value: fx.Node) -> fx.Node:
        """Megatron f on ``value``: identity forward, all-reduce of its gradient backward."""
        return self._cached(("f", value), lambda: self._call(collectives.copy_to_tensor_region, (value, self.group),
                                                             after=value))

    def _gather(self, value: fx.Node, layout: Shard, reason: str) -> fx.Node:
        def gather() -> fx.Node:
            gathered = self._call(collectives.gather_from_tensor_region, (value, layout.dim, self.group), after=value)
            if layout.size is not None:  # a padded split: the single-device length, the padding dropped
                return self._call(torch.narrow, (gathered, layout.dim, 0, layout.size), after=gathered)
            if layout.blocks == 1:
                return gathered
            # the ranks' pieces arrive rank-major; a block split wants them block-major
            return self._call(blocks_in_order, (gathered, layout.dim, self.t, layout.blocks), after=gathered)
        return self._cached(("gather", value), gather)

    def _scatter(self, value: fx.Node, dim: int) -> fx.Node:
        return self._cached(("scatter", value, dim), lambda: self._call(
            collectives.scatter_to_tensor_region, (value, dim, self.group), after=value))

    def _replicated(self, value: fx.Node, reason: str) -> fx.Node:
        layout = self.layout.get(value)
        return value if layout is None else self._gather(value, layout, reason)

    def _sharded_inputs(self, node: fx.Node) -> list[fx.Node]:
        return [a for a in node.all_input_nodes if self.layout.get(a) is not None]

    def _align_operand(self, node: fx.Node, a: fx.Node, out_dim: int, out_ndim: int) -> None:
        """A replicated operand of a split op: slice it when it spans the split dim
        (the slice's backward all-gathers), else route it through f when it can carry a
        gradient (each rank's gradient is a partial sum over its split)."""
        spec = tensor_spec(a)
        if spec is None:
            return
        d = operand_dim_for(out_dim, out_ndim, spec.shape)
        if d is not None and spec.shape[d] > 1:
            node.replace_input_with(a, self._scatter(a, d))
        elif spec.dtype.is_floating_point:
            node.replace_input_with(a, self._copy_to(a))
