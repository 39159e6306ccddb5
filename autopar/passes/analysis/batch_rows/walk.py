"""The batch-rows walk: every node in graph order, its rows from its inputs' by the rule
of its op (:mod:`.view_rules`, :mod:`.compute_rules`, the module calls and factories here)."""
from __future__ import annotations

from typing import Any

import torch.fx as fx
import torch.nn as nn

from autopar.ir import SPEC, VALUE_ROWS
from autopar.passes.analysis import ops
from autopar.passes.analysis.batch_rows.compute_rules import ComputeRules
from autopar.passes.analysis.batch_rows.op_tables import (ALONG, FACTORIES, IDENTITY, LEADING_BATCH, LINEAR_MODULES,
                                                          LOSSES, MATMUL, NO_VALUE, POINTWISE_MODULES, REDUCTIONS,
                                                          SDPA, TRANSPOSES, VIEWS, bare_name, is_pointwise_name,
                                                          shape_of)
from autopar.passes.analysis.batch_rows.rows import Rows
from autopar.passes.analysis.batch_rows.view_rules import ViewRules


class Walk(ViewRules, ComputeRules):
    """The rows of every value of ``gm``, node by node, and where rows of the batch meet."""

    def run(self) -> None:
        for node in self.gm.graph.nodes:
            try:
                self.state[node] = self._still_sorted(node, self.visit(node))
            except Exception as e:  # a rule that cannot read its node: said, and taken as a meeting of rows
                if any(self.rows(a) is not None for a in node.all_input_nodes):
                    self.couple(node, "unknown", f"its rule could not read it ({type(e).__name__}: {e})")
                self.state[node] = self._fallback_rows(node)

    def _still_sorted(self, node: fx.Node, out):
        """Rows in an order of the rank's own (a sort's) stay so through any op that does not
        index by positions (a stack, a reduction, a module): only an index by the inverse
        order puts them back in the batch's order."""
        if not isinstance(out, Rows) or not out.dims or out.perm:
            return out
        name = bare_name(node)
        if any(word in name for word in ("index", "scatter", "gather", "put", "take", "getitem")):
            return out
        ins = [self.state.get(a) for a in node.all_input_nodes]
        ins = [r for r in ins if isinstance(r, Rows)]
        if any(r.perm for r in ins) and not any(r.inverse for r in ins):
            return Rows(out.dims, out.pos, out.inner, True, out.inverse)
        return out

    def visit(self, node: fx.Node):
        """The rows of ``node``'s value (a tuple for a multi-output op): inputs, a tuple's
        items, factories and module calls here, every other op by :meth:`op_rule`."""
        if node.op == "placeholder":
            if VALUE_ROWS in node.meta:   # a stage's input: its producer's rows on the whole graph
                return node.meta[VALUE_ROWS]
            shape = shape_of(node)
            return Rows.of({0}) if shape and shape[0] == self.batch else None
        if node.op in ("get_attr", "output"):
            return None
        inputs = self.tensor_args(node)
        tuple_in = [a for a in node.all_input_nodes if isinstance(self.state.get(a), tuple)]
        name = bare_name(node)
        if name == "getattr" and node.args and isinstance(self.state.get(node.args[0]), tuple) \
                and node.args[1] in ("values", "indices"):   # a named tuple's field (sort, topk, max)
            return self.state[node.args[0]][0 if node.args[1] == "values" else 1]
        if name in ("getitem",) and node.args and isinstance(self.state.get(node.args[0]), tuple):
            items = self.state[node.args[0]]
            i = node.args[1]
            return items[i] if isinstance(i, int) and -len(items) <= i < len(items) else None
        if name in FACTORIES:
            return self.factory(node, name)
        if not inputs and not tuple_in:
            return None
        if node.op == "call_module":
            return self.module_rule(node, inputs)
        if name in NO_VALUE:
            return None
        return self.op_rule(node, name, inputs)

    def op_rule(self, node: fx.Node, name: str, inputs: list[fx.Node]):
        """The rule of the function or method ``name`` that reads the batch tensors ``inputs``."""
        if name in IDENTITY:
            return self._like(node, node.args[0] if node.args and isinstance(node.args[0], fx.Node) else inputs[0])
        if name in TRANSPOSES:
            return self.permute(node, None, transpose=(-2, -1))
        if name in ("transpose", "swapaxes", "swapdims"):
            return self.permute(node, None, transpose=(node.args[1], node.args[2]))
        if name == "permute":
            order = node.args[1:] if len(node.args) > 2 else node.args[1]
            return self.permute(node, list(order))
        if name == "movedim" or name == "moveaxis":
            return self.movedim(node)
        if name in VIEWS or name in ("squeeze", "unsqueeze", "expand", "expand_as", "broadcast_to", "repeat",
                                     "tile", "atleast_2d", "atleast_3d"):
            return self.regroup(node, name)
        if name in ("select", "narrow", "slice", "index_select", "select_scatter", "slice_scatter"):
            return self.select(node, name)
        if name in ("split", "split_with_sizes", "chunk", "unbind", "tensor_split", "unsafe_split"):
            return self.split(node, name)
        if name in ("cat", "concat", "concatenate", "stack", "hstack", "vstack"):
            return self.cat(node, name)
        if name == "getitem":
            return self.getitem(node)
        if name == "index":
            return self.index(node)
        if name.rstrip("_") in ("gather", "take_along_dim", "scatter", "scatter_add", "scatter_reduce", "index_add",
                                "index_copy", "index_fill", "index_put", "index_reduce", "masked_scatter") \
                or name == "index_put_":
            return self.gather(node, name)
        if name == "embedding":
            return self.embedding(node)
        if name in MATMUL or (node.op == "call_function" and node.target in ops.LINEAR_FUNCTIONS):
            return self.matmul(node, name)
        if name in SDPA:
            return self.attention(node)
        if name in ("tril", "triu", "diagonal", "diag", "diag_embed"):
            return self.positional_read(node, name)
        if name in ("broadcast_tensors",):
            return self.broadcast(node, name)
        if name in ("one_hot",):
            return self.rows(node.args[0])
        if name in ("cosine_similarity", "pairwise_distance", "dist", "cdist", "inner", "tensordot", "kron",
                    "outer", "ger"):
            return self.binary_rows(node, name)
        if name == "repeat_interleave" and node.args and isinstance(node.args[0], fx.Node):
            return self.repeat_rows(node)
        if name in ("histc", "bincount"):
            return self.count(node)
        if name in ("grouped_mm_fallback", "_grouped_mm", "grouped_mm"):
            r = self.rows(node.args[0])
            return Rows.of(r.dims, (), r.inner, r.perm) if r else None
        if name in LOSSES:
            return self.loss(node, name)
        if name in ("min", "max") and len([a for a in node.args[1:2] if isinstance(a, fx.Node)]) == 1:
            return self.pointwise(node, name)   # the elementwise minimum / maximum of two tensors
        if name in REDUCTIONS:
            return self.reduction(node, name)
        if name in ALONG:
            return self.along(node, name)
        if name in ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "local_response_norm"):
            return self.layer_norm(node)
        if name in LEADING_BATCH:
            return self.leading(node, inputs[0] if not isinstance(node.args[0], fx.Node) else node.args[0])
        if is_pointwise_name(name):
            return self.pointwise(node, name)
        return self.unknown_op(node, name, inputs)

    def _like(self, node: fx.Node, src) -> Any:
        s = self.state.get(src) if isinstance(src, fx.Node) else None
        if isinstance(s, tuple):
            return s
        shape_in, shape_out = shape_of(src), shape_of(node)
        if s is None or shape_in is None or shape_out is None or len(shape_in) == len(shape_out):
            return s if not isinstance(node.meta.get(SPEC), tuple) else (s, s)
        return self._fallback_rows(node)

    def factory(self, node: fx.Node, name: str):
        shape = shape_of(node)
        if name == "arange" and shape is not None and len(shape) == 1 and shape[0] == self.batch and self.batch > 1:
            return Rows.of(pos={0})
        if name == "eye" and shape is not None and shape[:1] == (self.batch,) and self.batch > 1:
            return Rows.of(pos={0, 1})
        if name in _SIZED_FACTORIES:   # made at a batch value's shape: as rows (each rank makes its share's)
            sizes = _factory_sizes(node, name)
            if _whole_shape(sizes):   # x.shape, x.size(): the shape of a batch value
                r = self.rows(sizes.args[0])
                return Rows.of(r.dims) if r is not None and r.dims else None
            dims = {i for i, size in enumerate(sizes) if self.size_of_rows(size)}
            return Rows.of(dims) if dims else None
        return None

    def module_rule(self, node: fx.Node, inputs: list[fx.Node]):
        module = self.gm.get_submodule(node.target)
        x = node.args[0] if node.args else None
        r = self.rows(x)
        if isinstance(module, LINEAR_MODULES):
            return self._contract_last(node, r, shape_of(x))
        if isinstance(module, POINTWISE_MODULES) or isinstance(module, (nn.Identity, nn.Flatten, nn.Unflatten)):
            if isinstance(module, (nn.Flatten, nn.Unflatten)):
                return self.regroup(node, "flatten")
            return r
        if isinstance(module, nn.Embedding):
            return Rows.of(r.dims, (), r.inner, r.perm) if r else None
        if isinstance(module, nn.EmbeddingBag) and len(node.args) == 1 and not node.kwargs and \
                len(shape_of(x) or ()) == 2:
            return self.leading(node, x)   # a bag per row of 2-D ids: each row's bag its own
        if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            k = len(module.normalized_shape)
            return self._normalize_last(node, r, shape_of(x), k)
        if isinstance(module, (nn.Softmax, nn.LogSoftmax)):
            return self._along_dim(node, r, shape_of(x), module.dim if module.dim is not None else -1, "softmax")
        if isinstance(module, (nn.modules.conv._ConvNd, nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd,
                               nn.modules.pooling._AdaptiveAvgPoolNd, nn.modules.pooling._AdaptiveMaxPoolNd,
                               nn.GroupNorm, nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm,
                               nn.Upsample, nn.PixelShuffle, nn.ZeroPad2d, nn.ConstantPad2d, nn.ReflectionPad2d)):
            return self.leading(node, x)
        if isinstance(module, nn.MultiheadAttention):
            axis = 0 if module.batch_first else 1
            rs = [self.rows(a) for a in node.args[:3]]
            dims = set().union(*(x.dims for x in rs if x))
            if dims and dims != {axis}:
                self.couple(node, "attention", "attention runs over the batch dimension (its sequence is the batch)")
            out = Rows.of({axis}) if dims else None
            return (out, Rows.of({0}) if dims else None)
        if isinstance(module, nn.modules.loss._Loss) and not isinstance(module, nn.CTCLoss):
            return self.loss(node, "cross_entropy" if isinstance(module, (nn.CrossEntropyLoss, nn.NLLLoss))
                             else "mse_loss", reduction=module.reduction)
        return self.unknown_op(node, f"module {type(module).__name__}", inputs)


_SIZED_FACTORIES = {"zeros", "ones", "empty", "full", "rand", "randn", "new_zeros", "new_ones", "new_empty", "new_full"}


def _whole_shape(value) -> bool:
    """Whether ``value`` is a tensor's whole shape (``x.shape``, ``x.size()``)."""
    return isinstance(value, fx.Node) and (bare_name(value) == "getattr" and value.args[1:] == ("shape",) or
                                           bare_name(value) == "size" and not value.args[1:])


def _factory_sizes(node: fx.Node, name: str):
    """The size a factory is called with: a sequence of sizes, or a whole shape node."""
    at = 1 if name.startswith("new_") else 0
    first = node.args[at] if len(node.args) > at else node.kwargs.get("size", ())
    if isinstance(first, (list, tuple)) or _whole_shape(first):
        return first
    return () if name in ("full", "new_full") else node.args[at:]   # zeros(4, 8): sizes as arguments
