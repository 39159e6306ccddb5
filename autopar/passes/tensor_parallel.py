"""Rewrite pass: Megatron tensor parallelism on one rank's graph (megatron §2.3).

Reads the regions written by analysis and the strategy the plan chose for each; for
every region planned as ``megatron`` it

* splits the column linears' weights by output features (per block for a fused QKV
  projection: rank ``r`` keeps ``[q_r, k_r, v_r]``) and inserts
  ``copy_to_tensor_region`` (Megatron's *f*) on their input;
* splits the row linear's weight by input features, removes its bias from the matmul
  and inserts ``reduce_from_tensor_region`` (*g*) followed by the bias add, so the
  bias is added once, after the reduction;
* turns token-embedding lookups into ``vocab_parallel_embedding``, the LM head into a
  column linear over the vocabulary and cross-entropy on vocab-split logits into
  ``vocab_parallel_cross_entropy``;

and carries the resulting layouts through every other node with the rules of
:mod:`autopar.passes.sharding` (rewriting views that bake the head count in). A node no
rule covers gets its split inputs all-gathered first (a logged fallback: correct, and
visible in the rank graph). Values reaching the graph output are gathered, so the rank
program returns full tensors.

The pass records ``gm.meta[PARAM_SHARDS]``: parameter name → :class:`ParamShard`, from
which the runtime cuts each rank's shard out of the user's full weights.
"""
from __future__ import annotations

import logging
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.ir import SPEC, regions, tensor_spec
from autopar.passes import ops
from autopar.passes.sharding import (Shard, map_permute, map_reshape, map_transpose, normalize_dim,
                                     operand_dim_for, scale_literal)
from autopar.runtime import collectives as C
from autopar.runtime import rng
from autopar.runtime.shapes import global_size

log = logging.getLogger("autopar.passes.tensor_parallel")

PARAM_SHARDS = "autopar.param_shards"
"""``gm.meta[PARAM_SHARDS]``: ``dict[parameter name, ParamShard]`` (absent name: replicated)."""

aten = torch.ops.aten


@dataclass(frozen=True)
class ParamShard:
    """Parameter split along ``dim`` over the ``group`` mesh dimension, per block."""

    dim: int
    blocks: int = 1
    group: str = "tensor"


class TensorParallelError(ValueError):
    """A region cannot be split as the plan says; the message names region and sizes."""


def tensor_parallel_pass(gm: fx.GraphModule, *, megatron_regions: list[str], degree: int, rank: int,
                         group: str = "tensor") -> fx.GraphModule:
    """Rewrite ``gm`` into tensor-parallel rank ``rank`` of ``degree`` (see module docstring).

    ``megatron_regions`` are the ids of the regions the plan splits. With ``degree == 1``
    the graph is returned unchanged (and no parameter is split).
    """
    gm.meta[PARAM_SHARDS] = {}
    if degree == 1 or not megatron_regions:
        return gm
    _Rewriter(gm, set(megatron_regions), degree, rank, group).run()
    gm.graph.lint()
    gm.recompile()
    return gm


_IDENTITY_METHODS = {"contiguous", "clone", "float", "half", "bfloat16", "detach", "to", "type_as", "type"}
_IDENTITY_FUNCTIONS = ops._targets("clone", "contiguous", "alias", "detach", "_to_copy", "to", "lift_fresh_copy")
_SPLIT_FUNCTIONS = {torch.split, torch.chunk, torch.unbind} | ops._targets("split", "split_with_sizes", "chunk", "unbind")
_SOFTMAX_FUNCTIONS = ops.SOFTMAX_FUNCTIONS | {F.log_softmax, torch.log_softmax} | ops._targets("log_softmax", "_log_softmax")
_LAYER_NORM_FUNCTIONS = {F.layer_norm} | ops._targets("layer_norm")
_EXPAND = ops._targets("expand")
_PERMUTE = ops._targets("permute")
_T = ops._targets("t")
_SHAPE_ONLY = {torch.flatten, torch.squeeze, torch.unsqueeze} | ops._targets("flatten", "squeeze", "unsqueeze")


class _Unsupported(Exception):
    pass


class _Rewriter:
    def __init__(self, gm: fx.GraphModule, chosen: set[str], degree: int, rank: int, group: str):
        self.gm, self.graph, self.t, self.rank, self.group = gm, gm.graph, degree, rank, group
        self.layout: dict[fx.Node, Any] = {}
        self.shards: dict[str, ParamShard] = gm.meta[PARAM_SHARDS]
        self.columns: dict[str, int] = {}      # node name -> blocks
        self.rows: set[str] = set()
        self.embeddings: dict[str, int] = {}   # node name -> vocab size
        self.cache: dict[tuple, fx.Node] = {}
        known = {r.id: r for r in regions(gm)}
        missing = sorted(chosen - set(known))
        if missing:
            raise TensorParallelError(f"the plan names regions {missing} that analysis did not find in this graph")
        for rid, region in known.items():
            if rid in chosen:
                self._claim(region)

    # ------------------------------------------------------------------ planning of shards
    def _check(self, region, what: str, size: int) -> None:
        if size % self.t:
            raise TensorParallelError(
                f"region {region.id}: {what} = {size} is not divisible by the tensor degree {self.t}; "
                f"choose a tensor degree that divides it, or let the planner choose (strategy='auto')")

    def _column(self, node_name: str, blocks: int = 1) -> None:
        match = ops.match_linear(self._node(node_name), self.gm)
        self.columns[node_name] = blocks
        self.shards[match.weight] = ParamShard(match.out_dim_of_weight, blocks)
        if match.bias:
            self.shards[match.bias] = ParamShard(0, blocks)

    def _row(self, node_name: str) -> None:
        match = ops.match_linear(self._node(node_name), self.gm)
        self.rows.add(node_name)
        self.shards[match.weight] = ParamShard(1 - match.out_dim_of_weight)

    def _claim(self, region) -> None:
        d = region.details
        if region.kind == "linear_chain":
            self._check(region, "hidden width", d["hidden"])
            for name in d["column"]:
                self._column(name)
            self._row(d["row"])
        elif region.kind == "attention":
            self._check(region, "attention heads", d["heads"])
            self._check(region, "key/value heads", d["kv_heads"])
            for name in dict.fromkeys((d["q_proj"], d["k_proj"], d["v_proj"])):
                self._column(name, d["qkv_blocks"])
            self._row(d["out_proj"])
        elif region.kind == "vocab":
            self._check(region, "vocabulary size", d["vocab_size"])
            for name in d["embeddings"]:
                self.embeddings[name] = d["vocab_size"]
            self.shards[d["weight"]] = ParamShard(0)
            if d["head"]:
                self._column(d["head"])
        else:
            raise TensorParallelError(f"region {region.id}: Megatron tensor parallelism does not apply to "
                                      f"{region.kind} regions")

    def _node(self, name: str) -> fx.Node:
        for n in self.graph.nodes:
            if n.name == name:
                return n
        raise TensorParallelError(f"node {name} named by a region is missing from the graph")

    # ------------------------------------------------------------------ graph helpers
    def _call(self, fn, args, after: fx.Node | None = None, before: fx.Node | None = None) -> fx.Node:
        ctx = self.graph.inserting_after(after) if after is not None else self.graph.inserting_before(before)
        with ctx:
            node = self.graph.call_function(fn, args)
        # SPEC keeps its meaning on rank graphs: the global shape of the value
        node.meta[SPEC] = args[0].meta.get(SPEC)
        return node

    def _cached(self, key: tuple, make) -> fx.Node:
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def _copy_to(self, value: fx.Node) -> fx.Node:
        """Megatron f on ``value``: identity forward, all-reduce of its gradient backward."""
        return self._cached(("f", value), lambda: self._call(C.copy_to_tensor_region, (value, self.group), after=value))

    def _gather(self, value: fx.Node, layout: Shard, reason: str) -> fx.Node:
        if layout.blocks != 1:
            raise _Unsupported(f"{value.name} is split in {layout.blocks} blocks and cannot be gathered for {reason}")
        return self._cached(("gather", value), lambda: self._call(
            C.gather_from_tensor_region, (value, layout.dim, self.group), after=value))

    def _scatter(self, value: fx.Node, dim: int) -> fx.Node:
        return self._cached(("scatter", value, dim), lambda: self._call(
            C.scatter_to_tensor_region, (value, dim, self.group), after=value))

    def _replicated(self, value: fx.Node, reason: str) -> fx.Node:
        layout = self.layout.get(value)
        return value if layout is None else self._gather(value, layout, reason)

    # ------------------------------------------------------------------ the walk
    def run(self) -> None:
        for node in list(self.graph.nodes):
            if node.op in ("placeholder", "get_attr"):
                self.layout[node] = None
            elif node.op == "output":
                self._output(node)
            elif node.name in self.columns:
                self._rewrite_column(node)
            elif node.name in self.rows:
                self._rewrite_row(node)
            elif node.name in self.embeddings:
                self._rewrite_embedding(node)
            elif ops.is_dropout(node, self.gm):
                self._rewrite_dropout(node)
            elif ops.is_cross_entropy(node, self.gm) and self._sharded_inputs(node):
                self._rewrite_cross_entropy(node)
            elif self._sharded_inputs(node):
                try:
                    self.layout[node] = self._propagate(node)
                except (_Unsupported, ValueError) as e:
                    self._fallback(node, str(e))
            else:
                self.layout[node] = None

    def _sharded_inputs(self, node: fx.Node) -> list[fx.Node]:
        return [a for a in node.all_input_nodes if self.layout.get(a) is not None]

    def _fallback(self, node: fx.Node, why: str) -> None:
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

    # ------------------------------------------------------------------ region rewrites
    def _rewrite_column(self, node: fx.Node) -> None:
        match = ops.match_linear(node, self.gm)
        x = self._replicated(match.input, node.name)
        node.replace_input_with(match.input, self._copy_to(x))
        spec = tensor_spec(node)
        self.layout[node] = Shard(len(spec.shape) - 1, self.columns[node.name])

    def _rewrite_row(self, node: fx.Node) -> None:
        match = ops.match_linear(node, self.gm)
        x_layout = self.layout.get(match.input)
        x = match.input
        if x_layout != Shard(len(tensor_spec(x).shape) - 1):
            x = self._scatter(self._replicated(x, node.name), len(tensor_spec(x).shape) - 1)
        with self.graph.inserting_before(node):
            if node.op == "call_module":
                weight = self.graph.get_attr(match.weight)
                product = self.graph.call_function(F.linear, (x, weight))
            elif node.target in ops.ADDMM_FUNCTIONS:
                product = self.graph.call_function(aten.mm.default, (x, node.args[2]))
            else:  # F.linear / aten.linear without the bias, or a plain matmul
                product = self.graph.call_function(node.target, (x, node.args[1]))
            reduced = self.graph.call_function(C.reduce_from_tensor_region, (product, self.group))
            result = reduced
            if match.bias is not None:
                bias = self.graph.get_attr(match.bias)
                result = self.graph.call_function(operator.add, (reduced, bias))
        for new in (product, reduced, result):
            new.meta.update(node.meta)
        node.replace_all_uses_with(result)
        self.graph.erase_node(node)
        for n in (product, reduced, result):
            self.layout[n] = None

    def _rewrite_embedding(self, node: fx.Node) -> None:
        ids, weight_name = ops.is_embedding(node, self.gm)
        vocab = self.embeddings[node.name]
        local = vocab // self.t
        padding_idx = None
        if node.op == "call_module":
            padding_idx = self.gm.get_submodule(node.target).padding_idx
        elif node.target is F.embedding:
            padding_idx = node.kwargs.get("padding_idx", node.args[2] if len(node.args) > 2 else None)
        elif len(node.args) > 2 and node.args[2] != -1:
            padding_idx = node.args[2]
        with self.graph.inserting_before(node):
            weight = self.graph.get_attr(weight_name)
            lookup = self.graph.call_function(C.vocab_parallel_embedding,
                                              (ids, weight, self.rank * local, self.group, padding_idx))
        lookup.meta.update(node.meta)
        node.replace_all_uses_with(lookup)
        self.graph.erase_node(node)
        self.layout[lookup] = None

    def _rewrite_dropout(self, node: fx.Node) -> None:
        x = node.args[0]
        if node.op == "call_module":
            mod = self.gm.get_submodule(node.target)
            p, training = mod.p, mod.training
        elif node.op == "call_method":
            self._fallback(node, "dropout as a method")
            return
        elif node.target is F.dropout:
            p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
            training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
        else:
            p, training = node.args[1], node.args[2]
        layout = self.layout.get(x)
        fn = rng.replicated_dropout if layout is None else rng.sharded_dropout
        with self.graph.inserting_before(node):
            new = self.graph.call_function(fn, (x, p, training, self.group))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        self.graph.erase_node(node)
        self.layout[new] = layout

    def _rewrite_cross_entropy(self, node: fx.Node) -> None:
        logits, target = node.args[0], node.args[1]
        layout = self.layout.get(logits)
        spec = tensor_spec(logits)
        if node.op == "call_module":
            mod = self.gm.get_submodule(node.target)
            weight, ignore_index, reduction, smoothing = mod.weight, mod.ignore_index, mod.reduction, mod.label_smoothing
        elif node.target is F.cross_entropy:
            kw = node.kwargs
            weight, ignore_index = kw.get("weight"), kw.get("ignore_index", -100)
            reduction, smoothing = kw.get("reduction", "mean"), kw.get("label_smoothing", 0.0)
            if kw.get("size_average") is not None or kw.get("reduce") is not None:
                reduction = None
        else:
            args = list(node.args) + [None] * 6
            weight = args[2]
            reduction = {0: "none", 1: "mean", 2: "sum"}[args[3] if args[3] is not None else 1]
            ignore_index = args[4] if args[4] is not None else -100
            smoothing = args[5] or 0.0
        usable = (isinstance(layout, Shard) and layout.blocks == 1 and len(spec.shape) == 2 and layout.dim == 1
                  and weight is None and not smoothing and reduction in ("mean", "sum", "none"))
        if not usable:
            self._fallback(node, "cross-entropy form without a vocab-parallel rule")
            return
        with self.graph.inserting_before(node):
            loss = self.graph.call_function(
                C.vocab_parallel_cross_entropy,
                (logits, target, self.rank * (spec.shape[1] // self.t), self.group, ignore_index, reduction))
        loss.meta.update(node.meta)
        node.replace_all_uses_with(loss)
        self.graph.erase_node(node)
        self.layout[loss] = None

    # ------------------------------------------------------------------ propagation rules
    def _propagate(self, node: fx.Node):
        first = node.args[0] if node.args else None
        in_layout = self.layout.get(first) if isinstance(first, fx.Node) else None
        if node.op == "call_function" and node.target is operator.getitem and isinstance(in_layout, tuple):
            return in_layout[node.args[1]]
        if isinstance(in_layout, tuple):
            raise _Unsupported("indexing into a split multi-output value")
        target, kind = node.target, node.op
        if (kind == "call_method" and target == "size") or (kind == "call_function" and target is getattr
                                                             and node.args[1] == "shape"):
            return self._size(node, in_layout)
        if (kind == "call_method" and target in _IDENTITY_METHODS) or (kind == "call_function" and target in _IDENTITY_FUNCTIONS):
            return self._only_first_split(node, in_layout)
        if ops.reshape_target(node) is not None:
            return self._reshape(node, in_layout)
        if (kind == "call_method" and target in ("flatten", "squeeze", "unsqueeze")) or (kind == "call_function" and target in _SHAPE_ONLY):
            out = map_reshape(tensor_spec(first).shape, tensor_spec(node).shape, self._only_first_split(node, in_layout), self.t)
            if out is None:
                raise _Unsupported("the split dimension would be merged with an inner one")
            return out
        if (kind == "call_method" and target in ("transpose", "permute", "t")) or (kind == "call_function" and target in ops.TRANSPOSE_FUNCTIONS):
            return self._transpose(node, in_layout)
        if (kind == "call_method" and target == "expand") or (kind == "call_function" and target in _EXPAND):
            return self._expand(node, in_layout)
        if (kind == "call_method" and target in ("split", "chunk", "unbind")) or (kind == "call_function" and target in _SPLIT_FUNCTIONS):
            return self._split(node, in_layout)
        if (kind == "call_method" and target in ("softmax", "log_softmax")) or (kind == "call_function" and target in _SOFTMAX_FUNCTIONS):
            ndim = len(tensor_spec(node).shape)
            dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
            if dim is None or normalize_dim(dim, ndim) == in_layout.dim:
                raise _Unsupported("softmax over the split dimension")
            return self._only_first_split(node, in_layout)
        if kind == "call_function" and target in _LAYER_NORM_FUNCTIONS or \
                (kind == "call_module" and isinstance(ops.module_of(self.gm, node), nn.LayerNorm)):
            return self._layer_norm(node, in_layout)
        if ops.is_sdpa(node) or ops.is_activation_matmul(node):
            return self._batched(node)
        if ops.is_pointwise(node, self.gm) or (kind == "call_function" and target in (torch.where,)):
            return self._pointwise(node)
        raise _Unsupported("no split rule for this op")

    def _size(self, node: fx.Node, layout: Shard) -> None:
        """A size read off a split tensor keeps its global meaning (see runtime.shapes)."""
        dim = node.args[1] if node.op == "call_method" and len(node.args) > 1 else node.kwargs.get("dim")
        ndim = len(tensor_spec(node.args[0]).shape)
        if dim is not None and normalize_dim(dim, ndim) != layout.dim:
            return None  # an unsplit dimension: the local size is the global one
        with self.graph.inserting_before(node):
            new = self.graph.call_function(global_size, (node.args[0], layout.dim, self.t, dim))
        node.replace_all_uses_with(new)
        self.graph.erase_node(node)
        self.layout[new] = None
        return None

    def _only_first_split(self, node: fx.Node, in_layout):
        others = [a for a in self._sharded_inputs(node) if a is not node.args[0]]
        if others or in_layout is None:
            raise _Unsupported("an argument other than the first is split")
        return in_layout

    def _reshape(self, node: fx.Node, layout: Shard) -> Shard:
        layout = self._only_first_split(node, layout)
        src, out = tensor_spec(node.args[0]), tensor_spec(node)
        mapped = map_reshape(src.shape, out.shape, layout, self.t)
        if mapped is None:
            raise _Unsupported(f"reshape {list(src.shape)} -> {list(out.shape)} crosses the split of dim {layout.dim}")
        shape = ops.reshape_target(node)
        if len(shape) == len(out.shape):
            shape[mapped.dim] = self._scale(node, shape[mapped.dim])
            self._set_shape_args(node, shape)
        return mapped

    def _scale(self, node: fx.Node, value):
        if isinstance(value, fx.Node):  # a size computed in the graph (symbolic tracing)
            with self.graph.inserting_before(node):
                return self.graph.call_function(operator.floordiv, (value, self.t))
        return scale_literal(value, self.t)

    @staticmethod
    def _set_shape_args(node: fx.Node, shape: list) -> None:
        args = list(node.args)
        if len(args) == 2 and isinstance(args[1], (list, tuple)):
            args[1] = type(args[1])(shape) if isinstance(args[1], tuple) else list(shape)
        else:
            args[1:] = shape
        node.args = tuple(args)

    def _transpose(self, node: fx.Node, layout: Shard) -> Shard:
        layout = self._only_first_split(node, layout)
        ndim = len(tensor_spec(node).shape)
        if node.target in ("permute", torch.permute) or node.target in _PERMUTE:
            perm = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else node.args[1:]
            return map_permute([normalize_dim(p, ndim) for p in perm], layout)
        if node.target in ("t", torch.t) or node.target in _T:
            return map_transpose(0, 1, ndim, layout)
        return map_transpose(node.args[1], node.args[2], ndim, layout)

    def _expand(self, node: fx.Node, layout: Shard) -> Shard:
        layout = self._only_first_split(node, layout)
        sizes = list(node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else node.args[1:])
        in_ndim = len(tensor_spec(node.args[0]).shape)
        out_dim = layout.dim + len(sizes) - in_ndim
        sizes[out_dim] = self._scale(node, sizes[out_dim])
        node.args = (node.args[0], sizes)
        return Shard(out_dim, layout.blocks)

    def _split(self, node: fx.Node, layout: Shard):
        layout = self._only_first_split(node, layout)
        spec = tensor_spec(node.args[0])
        ndim = len(spec.shape)
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", str(node.target))
        is_unbind = "unbind" in str(name)
        default_dim = 0
        dim = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else (node.args[1] if is_unbind and len(node.args) > 1 else default_dim))
        dim = normalize_dim(dim, ndim)
        n_out = len(node.meta.get("autopar.spec") or ())
        if dim != layout.dim:
            if is_unbind and dim < layout.dim:
                return tuple(Shard(layout.dim - 1, layout.blocks) for _ in range(n_out))
            return tuple(layout for _ in range(n_out))
        # splitting the fused blocks apart: each piece is one block, split by rank
        if n_out != layout.blocks or is_unbind:
            raise _Unsupported(f"split of dim {dim} into {n_out} pieces does not follow its {layout.blocks} blocks")
        if "chunk" not in str(name):
            sizes = node.args[1]
            new = [scale_literal(s, self.t) for s in sizes] if isinstance(sizes, (list, tuple)) else scale_literal(sizes, self.t)
            node.args = (node.args[0], new) + tuple(node.args[2:])
        return tuple(Shard(dim, 1) for _ in range(n_out))

    def _layer_norm(self, node: fx.Node, layout: Shard) -> Shard:
        x = node.args[0]
        ndim = len(tensor_spec(x).shape)
        if node.op == "call_module":
            mod = self.gm.get_submodule(node.target)
            normalized = len(mod.normalized_shape)
        else:
            normalized = len(node.args[1])
        if layout is None or layout.dim >= ndim - normalized:
            raise _Unsupported("layer norm over the split dimension")
        if node.op == "call_module":
            # functional form so the affine parameters can carry Megatron f (their
            # gradients are partial sums when the activations are split)
            mod = self.gm.get_submodule(node.target)
            with self.graph.inserting_before(node):
                w = self.graph.get_attr(f"{node.target}.weight") if mod.weight is not None else None
                b = self.graph.get_attr(f"{node.target}.bias") if mod.bias is not None else None
                new = self.graph.call_function(F.layer_norm, (x, tuple(mod.normalized_shape),
                                                              w and self._copy_to(w), b and self._copy_to(b), mod.eps))
            new.meta.update(node.meta)
            node.replace_all_uses_with(new)
            self.graph.erase_node(node)
            self.layout[new] = layout
            return layout
        for arg in node.args[2:4]:
            if isinstance(arg, fx.Node):
                node.replace_input_with(arg, self._copy_to(arg))
        return layout

    def _batched(self, node: fx.Node) -> Shard:
        """sdpa and activation matmuls: split only along a batch (head) dimension."""
        tensors = [a for a in node.args[: (4 if ops.is_sdpa(node) else 2)] if isinstance(a, fx.Node)]
        out_ndim = len(tensor_spec(node).shape)
        layouts = {a: self.layout.get(a) for a in tensors}
        split = [l for l in layouts.values() if l is not None]
        out_dims = {l.dim + out_ndim - len(tensor_spec(a).shape) for a, l in layouts.items() if l is not None}
        if len(out_dims) != 1 or any(l.blocks != 1 for l in split):
            raise _Unsupported("operands split along different dimensions")
        out_dim = out_dims.pop()
        if out_dim >= out_ndim - 2:
            raise _Unsupported("matmul over a split row/column dimension")
        for a in tensors:
            if layouts[a] is None:
                self._align_operand(node, a, out_dim, out_ndim)
        return Shard(out_dim)

    def _pointwise(self, node: fx.Node) -> Shard:
        out_ndim = len(tensor_spec(node).shape)
        out_dims = set()
        for a in node.all_input_nodes:
            layout = self.layout.get(a)
            if isinstance(layout, tuple):
                raise _Unsupported("multi-output operand")
            if layout is not None:
                out_dims.add((layout.dim + out_ndim - len(tensor_spec(a).shape), layout.blocks))
        if len(out_dims) != 1:
            raise _Unsupported("operands split along different dimensions")
        out_dim, blocks = out_dims.pop()
        for a in node.all_input_nodes:
            if self.layout.get(a) is None:
                if blocks != 1 and self._operand_size(a, out_dim, out_ndim) > 1:
                    raise _Unsupported("a replicated operand meets a block-split one")
                self._align_operand(node, a, out_dim, out_ndim)
        return Shard(out_dim, blocks)

    @staticmethod
    def _operand_size(a: fx.Node, out_dim: int, out_ndim: int) -> int:
        spec = tensor_spec(a)
        if spec is None:
            return 1
        d = operand_dim_for(out_dim, out_ndim, spec.shape)
        return 1 if d is None else spec.shape[d]

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
