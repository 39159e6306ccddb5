"""The walk that carries tensor-parallel layouts through a rank graph
(:class:`LayoutPropagator`), and which rule each op takes (:meth:`LayoutPropagator.propagate`)."""
from __future__ import annotations

import logging
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.ir import RANDOM_SITE, RANDOM_SPLIT, tensor_spec
from autopar.passes.analysis import ops
from autopar.runtime.shapes import global_size
from autopar.strategies.shared.propagation.rules import LayoutRules
from autopar.strategies.shared.propagation.state import NoSplitRule, TensorParallelError
from autopar.strategies.shared.sharding import Shard, map_reshape, normalize_dim

log = logging.getLogger("autopar.strategies.megatron.rewrite")

_IDENTITY_METHODS = {"contiguous", "clone", "float", "half", "bfloat16", "detach", "to", "type_as", "type"}
_IDENTITY_FUNCTIONS = ops._targets("clone", "contiguous", "alias", "detach", "_to_copy", "to", "lift_fresh_copy")
_SPLIT_FUNCTIONS = {torch.split, torch.chunk, torch.unbind} | ops._targets("split", "split_with_sizes", "chunk", "unbind")
_SOFTMAX_FUNCTIONS = ops.SOFTMAX_FUNCTIONS | {F.log_softmax, torch.log_softmax} | ops._targets("log_softmax", "_log_softmax")
_LAYER_NORM_FUNCTIONS = {F.layer_norm, F.rms_norm} | ops._targets("layer_norm", "rms_norm")
_EXPAND = ops._targets("expand", "broadcast_to") | {torch.broadcast_to}
_SLICE = ops.SLICE_FUNCTIONS
_CAT = ops.CONCAT_FUNCTIONS
_STACK = {torch.stack} | ops._targets("stack")
_SHAPE_ONLY = {torch.flatten, torch.squeeze, torch.unsqueeze} | ops._targets("flatten", "squeeze", "unsqueeze")
_FACTORIES = {"new_ones", "new_zeros", "new_empty", "new_full"}
_UNFLATTEN = {torch.unflatten} | ops._targets("unflatten")
_COMPLEX_VIEWS = {torch.view_as_complex, torch.view_as_real} | ops._targets("view_as_complex", "view_as_real")
_EXTREMES = {torch.max, torch.min, torch.amax, torch.amin} | ops._targets("max", "min", "amax", "amin")
_REDUCTIONS = {torch.mean, torch.sum} | ops._targets("mean", "sum")


class LayoutPropagator(LayoutRules):
    """Layouts of the values of ``gm`` over a tensor group of ``degree`` ranks, carried
    through the graph node by node (:meth:`run`)."""

    def _fallback(self, node: fx.Node, why: str) -> None:
        self.fallbacks.append((node.name, ops.op_name(node), why))
        if self.boundary(node):
            log.debug("tensor parallel: %s (%s) reads its split inputs gathered: %s", node.name, ops.op_name(node), why)
        elif not self.quiet:
            log.warning("tensor parallel: no split rule for %s (%s): %s; its split inputs are all-gathered",
                        node.format_node(), ops.op_name(node), why)
        for arg in self._sharded_inputs(node):
            layout = self.layout[arg]
            if isinstance(layout, tuple):
                raise TensorParallelError(f"node {node.format_node()} consumes a split multi-output value; "
                                          f"no rule covers it")
            node.replace_input_with(arg, self._gather(arg, layout, node.name))
        self.layout[node] = None

    def _output(self, node: fx.Node) -> None:
        for arg in self._sharded_inputs(node):
            node.replace_input_with(arg, self._gather(arg, self.layout[arg], "the graph output"))

    # ------------------------------------------------------------------ the walk over the graph (run)
    def run(self) -> None:
        """Every node in graph order: inputs and attributes replicated, the output's split
        values gathered, a node :meth:`rewrite` takes rewritten by it, a node reading split
        values carried by its op's rule (:meth:`propagate`, or the logged fallback)."""
        for node in list(self.graph.nodes):
            if node.op == "get_attr":
                self.layout[node] = self.param_layouts.get(str(node.target))
            elif node.op == "placeholder":
                self.layout[node] = None
            elif node.op == "output":
                self._output(node)
            elif self.rewrite(node):
                pass
            elif not self._sharded_inputs(node):
                self.layout[node] = None
            else:
                try:
                    self.layout[node] = self.propagate(node)
                except (NoSplitRule, ValueError) as e:
                    self._fallback(node, str(e))
            if RANDOM_SITE in node.meta:
                self._random_split(node)

    def _random_split(self, node: fx.Node) -> None:
        """A random op whose value this walk splits: the dimension and group, for the
        random draws (:mod:`autopar.passes.random_draws`), which draw the rank's part of
        the single device's value; a split its draws cannot follow (in blocks, padded) is
        gathered first."""
        layout = self.layout.get(node)
        if layout is None:
            return
        if not isinstance(layout, Shard) or layout.blocks > 1 or layout.size is not None:
            self._fallback(node, "a random op's value split in blocks or padded: its draws are placed on "
                                 "contiguous parts only")
            return
        node.meta.setdefault(RANDOM_SPLIT, {})[layout.dim] = self.group

    def rewrite(self, node: fx.Node) -> bool:
        """A subclass's own rewrite of ``node`` (setting its layout); False: not its node."""
        return False

    def boundary(self, node: fx.Node) -> bool:
        """Whether gathering ``node``'s split inputs is where the strategy's layout ends by
        design (sequence parallelism's values meeting an unsplit layer), not a missing
        rule: logged at debug level, not warned."""
        return False

    # ------------------------------------------------------------------ region rewrites
    def propagate(self, node: fx.Node):
        """The layout of ``node``'s output given its inputs' (rewriting its arguments), or
        :class:`NoSplitRule`."""
        first = node.args[0] if node.args else None
        in_layout = self.layout.get(first) if isinstance(first, fx.Node) else None
        if node.op == "call_function" and node.target is operator.getitem and isinstance(in_layout, tuple):
            return in_layout[node.args[1]]
        if isinstance(in_layout, tuple):
            raise NoSplitRule("indexing into a split multi-output value")
        if node.op == "call_function" and node.target is operator.getitem and isinstance(in_layout, Shard):
            return self._getitem(node, in_layout)
        if any(getattr(self.layout[a], "size", None) is not None for a in self._sharded_inputs(node)):
            return self._padded(node, in_layout)
        target, kind = node.target, node.op
        if (kind == "call_method" and target == "size") or (kind == "call_function" and target is getattr
                                                             and node.args[1] == "shape"):
            return self._size(node, in_layout)
        if kind == "call_method" and target in _FACTORIES:
            return None  # a new tensor from the value's dtype and device only: nothing of it is read
        if kind == "call_function" and target is global_size:
            return self._global_size(node, in_layout)
        if (kind == "call_method" and target in _IDENTITY_METHODS) or (kind == "call_function" and target in _IDENTITY_FUNCTIONS):
            return self._only_first_split(node, in_layout)
        if ops.reshape_target(node) is not None:
            return self._reshape(node, in_layout)
        if (kind == "call_method" and target in ("flatten", "squeeze", "unsqueeze")) or (kind == "call_function" and target in _SHAPE_ONLY):
            out = map_reshape(tensor_spec(first).shape, tensor_spec(node).shape, self._only_first_split(node, in_layout), self.t)
            if out is None:
                raise NoSplitRule("the split dimension would be merged with an inner one")
            return out
        if (kind == "call_method" and target == "unflatten") or (kind == "call_function" and target in _UNFLATTEN):
            return self._unflatten(node, in_layout)
        if ops.is_select(node):
            return self._select(node, in_layout)
        if kind == "call_function" and target in _COMPLEX_VIEWS:
            return self._complex_view(node, in_layout)
        if (kind == "call_method" and target in ("transpose", "permute", "t")) or (kind == "call_function" and target in ops.TRANSPOSE_FUNCTIONS):
            return self._transpose(node, in_layout)
        if kind == "call_function" and target in _CAT:
            return self._cat(node)
        if kind == "call_function" and target in _STACK:
            return self._cat(node, stack=True)
        if (kind == "call_method" and target == "narrow") or (kind == "call_function" and target in _SLICE):
            return self._slice(node, in_layout)
        if (kind == "call_method" and target in ("expand", "broadcast_to")) or (kind == "call_function" and target in _EXPAND):
            return self._expand(node, in_layout)
        if (kind == "call_method" and target in ("split", "chunk", "unbind")) or (kind == "call_function" and target in _SPLIT_FUNCTIONS):
            return self._split(node, in_layout)
        if (kind == "call_method" and target in ("max", "min", "amax", "amin", "mean", "sum")) or \
                (kind == "call_function" and target in _EXTREMES | _REDUCTIONS):
            return self._extreme(node, in_layout)
        if kind == "call_function" and target is ops.aten.index.Tensor:
            return self._index(node, in_layout)
        if kind == "call_function" and ops.call_name(node) in ("add_", "sub_", "mul_", "div_"):
            return self._in_place(node, in_layout)
        if (kind == "call_method" and target in ("softmax", "log_softmax")) or (kind == "call_function" and target in _SOFTMAX_FUNCTIONS):
            ndim = len(tensor_spec(node).shape)
            dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
            if dim is None or normalize_dim(dim, ndim) == in_layout.dim:
                raise NoSplitRule("softmax over the split dimension")
            return self._only_first_split(node, in_layout)
        if kind == "call_function" and target in _LAYER_NORM_FUNCTIONS or \
                (kind == "call_module" and isinstance(ops.module_of(self.gm, node), (nn.LayerNorm, nn.RMSNorm))):
            return self._layer_norm(node, in_layout)
        if ops.is_sdpa(node) or ops.is_activation_matmul(node):
            return self._batched(node)
        if ops.is_pointwise(node, self.gm) or (kind == "call_function" and target in (torch.where,)):
            return self._pointwise(node)
        raise NoSplitRule("no split rule for this op")

    def _padded(self, node: fx.Node, layout: Shard):
        """A padded split (a padded vocabulary's logits, :class:`Shard` ``size``) is carried
        only by data movement that keeps its dimension whole and never reads across it:
        size queries, identity ops, reshapes that keep the dimension with what lies
        inside it, selects, slices and transposes of other dimensions. Any other op
        (softmax, a reduction, arithmetic with other values) reads it gathered, the
        padding dropped, so no padded column enters what the single-device program
        computes; the vocab-parallel cross-entropy masks them itself
        (:func:`autopar.runtime.collectives.vocab_parallel_cross_entropy`)."""
        layout = self._only_first_split(node, layout)
        target, kind = node.target, node.op
        if (kind == "call_method" and target == "size") or (kind == "call_function" and target is getattr
                                                             and node.args[1] == "shape"):
            return self._size(node, layout)
        if (kind == "call_method" and target in _IDENTITY_METHODS) or \
                (kind == "call_function" and target in _IDENTITY_FUNCTIONS):
            return layout
        if ops.reshape_target(node) is not None or (kind == "call_method" and target in ("flatten", "squeeze",
                                                                                          "unsqueeze")) \
                or (kind == "call_function" and target in _SHAPE_ONLY):
            return self._padded_reshape(node, layout)
        if ops.is_select(node):
            return self._select(node, layout)
        if (kind == "call_method" and target in ("transpose", "permute", "t")) or \
                (kind == "call_function" and target in ops.TRANSPOSE_FUNCTIONS):
            return self._transpose(node, layout)
        if (kind == "call_method" and target == "narrow") or (kind == "call_function" and target in _SLICE):
            return self._slice(node, layout)
        raise NoSplitRule(f"a padded vocabulary split (length {layout.size}) is read only gathered by this op")
