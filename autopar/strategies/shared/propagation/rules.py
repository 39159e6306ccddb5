"""The per-op layout rules of :class:`~autopar.strategies.shared.propagation.LayoutPropagator`:
for a node with a split input, the layout of its output and the literal arguments that
change on a rank (a view's sizes, a split's sizes, a size read off a split value), or
:class:`~autopar.strategies.shared.propagation.NoSplitRule`."""
from __future__ import annotations

import math
import operator
from dataclasses import replace

import torch
import torch.fx as fx
import torch.nn.functional as F

from autopar.ir import SPEC, tensor_spec
from autopar.passes.analysis import ops
from autopar.runtime.shapes import global_size, padded_part
from autopar.strategies.shared.propagation.state import LayoutState, NoSplitRule
from autopar.strategies.shared.sharding import (Shard, map_permute, map_reshape, map_transpose, normalize_dim,
                                                operand_dim_for, scale_literal)

_PERMUTE = ops._targets("permute")
_T = ops._targets("t")


class LayoutRules(LayoutState):
    """Each op's rule (the methods
    :meth:`~autopar.strategies.shared.propagation.LayoutPropagator.propagate` dispatches to)."""

    def _padded_reshape(self, node: fx.Node, layout: Shard) -> Shard:
        """A reshape of a padded split keeps it when the split dimension stays one
        dimension with the same dimensions inside it (``[B, T, V] -> [B·T, V]``); a
        literal length there becomes each rank's padded length."""
        src, out = tensor_spec(node.args[0]).shape, tensor_spec(node).shape
        inner = math.prod(src[layout.dim:])
        o = next((o for o in range(len(out)) if out[o] == src[layout.dim] and math.prod(out[o:]) == inner), None)
        if o is None:
            raise NoSplitRule(f"reshape {list(src)} -> {list(out)} does not keep the padded split of dim "
                              f"{layout.dim} whole")
        shape = ops.reshape_target(node)
        if shape is not None and len(shape) == len(out):
            value = shape[o]
            if isinstance(value, fx.Node):
                with self.graph.inserting_before(node):
                    value = self.graph.call_function(padded_part, (value, self.t))
            elif value != -1:
                if value != layout.size:
                    raise NoSplitRule(f"a reshape to length {value} of the padded split of length {layout.size}")
                value = layout.local_size(self.t)
            shape[o] = value
            self._set_shape_args(node, shape)
        return Shard(o, 1, layout.size)

    def _size(self, node: fx.Node, layout: Shard) -> None:
        """A size read off a split tensor keeps its global meaning (see runtime.shapes)."""
        dim = node.args[1] if node.op == "call_method" and len(node.args) > 1 else node.kwargs.get("dim")
        ndim = len(tensor_spec(node.args[0]).shape)
        if dim is not None and normalize_dim(dim, ndim) != layout.dim:
            return None  # an unsplit dimension: the local size is the global one
        with self.graph.inserting_before(node):
            new = self.graph.call_function(global_size, (node.args[0], layout.dim, self.t, dim),
                                           {} if layout.size is None else {"length": layout.size})
        node.replace_all_uses_with(new)
        self.graph.erase_node(node)
        self.layout[new] = None
        return None

    def _global_size(self, node: fx.Node, layout: Shard) -> None:
        """Another pass's global size of a value this pass splits too: a size of a
        dimension this pass does not split is right as it stands; when this pass splits
        the rows (dim 0) of a value the other split on another dimension, the size counts
        them with ``rows`` (Bian's cube: columns over x, then rows over y)."""
        x, split_dim = node.args[:2]
        ndim = len(tensor_spec(x).shape)
        dim = node.args[3] if len(node.args) > 3 else node.kwargs.get("dim")
        if dim is not None and normalize_dim(dim, ndim) != layout.dim:
            return None
        if layout.dim == 0 and normalize_dim(split_dim, ndim) != 0 and node.kwargs.get("rows", 1) == 1:
            node.kwargs = {**node.kwargs, "rows": self.t}
            return None
        raise NoSplitRule("a size of a value split twice along one dimension")

    def _only_first_split(self, node: fx.Node, in_layout):
        others = [a for a in self._sharded_inputs(node) if a is not node.args[0]]
        if others or in_layout is None:
            raise NoSplitRule("an argument other than the first is split")
        return in_layout

    def _reshape(self, node: fx.Node, layout: Shard) -> Shard:
        layout = self._only_first_split(node, layout)
        src, out = tensor_spec(node.args[0]), tensor_spec(node)
        mapped = map_reshape(src.shape, out.shape, layout, self.t)
        if mapped is None:
            raise NoSplitRule(f"reshape {list(src.shape)} -> {list(out.shape)} crosses the split of dim {layout.dim}")
        shape = ops.reshape_target(node)
        if len(shape) == len(out.shape):
            shape[mapped.dim] = self._scale(node, shape[mapped.dim])
            self._set_shape_args(node, shape)
        return mapped

    def _unflatten(self, node: fx.Node, layout: Shard) -> Shard:
        """``unflatten(x, dim, sizes)``: a reshape whose new sizes are one list, as
        ``torch.export`` spells ``nn.MultiheadAttention``'s packed projection
        (``unflatten(-1, [3, E])``: the 3 blocks become their own dimension)."""
        layout = self._only_first_split(node, layout)
        src, out = tensor_spec(node.args[0]), tensor_spec(node)
        mapped = map_reshape(src.shape, out.shape, layout, self.t)
        if mapped is None:
            raise NoSplitRule(f"unflatten {list(src.shape)} -> {list(out.shape)} crosses the split of dim {layout.dim}")
        dim = normalize_dim(node.args[1] if len(node.args) > 1 else node.kwargs["dim"], len(src.shape))
        sizes = list(node.args[2] if len(node.args) > 2 else node.kwargs["sizes"])
        if dim <= mapped.dim < dim + len(sizes):
            sizes[mapped.dim - dim] = self._scale(node, sizes[mapped.dim - dim])
            if len(node.args) > 2:
                node.args = (node.args[0], node.args[1], sizes) + tuple(node.args[3:])
            else:
                node.kwargs = {**node.kwargs, "sizes": sizes}
        return mapped

    def _complex_view(self, node: fx.Node, layout: Shard) -> Shard:
        """``view_as_complex(x)`` (``[.., n, 2] -> [.., n]``) and ``view_as_real(z)``
        (``[.., n] -> [.., n, 2]``): every dimension but the pairs' keeps its place, so a
        split of any of them stays where it is (DTensor's rule for both views); the pair
        dimension itself cannot be split (a rank would hold half a complex number)."""
        layout = self._only_first_split(node, layout)
        ndim = len(tensor_spec(node.args[0]).shape)
        if ops.call_name(node) == "view_as_complex" and layout.dim == ndim - 1:
            raise NoSplitRule("view_as_complex of a split of the real and imaginary parts")
        return layout

    def _select(self, node: fx.Node, layout: Shard) -> Shard:
        """``select(x, dim, i)`` of an unsplit dimension keeps the split (one dim fewer)."""
        layout = self._only_first_split(node, layout)
        ndim = len(tensor_spec(node.args[0]).shape)
        dim = normalize_dim(node.args[1] if len(node.args) > 1 else node.kwargs["dim"], ndim)
        if dim == layout.dim:
            raise NoSplitRule("an index into the split dimension")
        return replace(layout, dim=layout.dim - (1 if dim < layout.dim else 0))

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

    def _slice(self, node: fx.Node, layout: Shard) -> Shard:
        """A slice (``aten.slice``, ``narrow``) of an unsplit dimension keeps the split, as
        rotary embeddings slice the head dimension of head-split queries and keys. A
        strided slice of the whole split dimension from one of its first ``step``
        positions (``x[..., ::2]``, ``x[..., 1::2]``: GPT-OSS's alternating gate and up
        columns) keeps it too when each rank's part is a whole number of steps: every rank
        takes the same positions of its own part."""
        layout = self._only_first_split(node, layout)
        ndim = len(tensor_spec(node.args[0]).shape)
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if normalize_dim(dim, ndim) == layout.dim:
            if node.op == "call_function" and ops.call_name(node) == "slice" and layout.blocks == 1 \
                    and layout.size is None:
                start, end, step = (list(node.args[2:5]) + [None, None, 1])[:3]
                width = tensor_spec(node.args[0]).shape[layout.dim]
                if isinstance(step, int) and step > 1 and (start or 0) in range(step) \
                        and (end is None or end >= width) and (width // self.t) % step == 0 and width % self.t == 0:
                    return layout
            raise NoSplitRule("a slice of the split dimension")
        return layout

    def _extreme(self, node: fx.Node, layout: Shard):
        """``max``/``min``/``amax``/``amin``, ``mean``/``sum`` over dimensions other than the
        split one keep the split (the softmax's stabilising max of head-split scores; an
        RMS norm's mean over the features of a sequence-split activation); ``max.dim``
        gives values and indices, split alike. Over the split dimension, or over every
        one: no rule."""
        layout = self._only_first_split(node, layout)
        ndim = len(tensor_spec(node.args[0]).shape)
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        if dims is None or dims == [] or dims == ():
            raise NoSplitRule("a reduction over every dimension")
        if isinstance(dims, fx.Node) or not isinstance(dims, (int, list, tuple)):
            raise NoSplitRule("an elementwise max or min of two values")
        dims = [normalize_dim(d, ndim) for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
        if layout.dim in dims:
            raise NoSplitRule("a reduction over the split dimension")
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        out = replace(layout, dim=layout.dim if keep else layout.dim - sum(d < layout.dim for d in dims))
        return (out, out) if isinstance(node.meta.get(SPEC), tuple) else out

    def _in_place(self, node: fx.Node, layout) -> Shard:
        """An in-place pointwise op (``out.add_(bias[ids])``, as Hugging Face adds the
        experts' biases) on a split value: the pointwise rule, when it keeps the written
        value's split (a replicated value cannot take a split one in place)."""
        if layout is None or isinstance(layout, tuple):
            raise NoSplitRule("an in-place op writing a replicated value with a split one")
        out = self._pointwise(node)
        if out != layout:
            raise NoSplitRule("an in-place op that would change its value's split")
        return out

    def _index(self, node: fx.Node, layout: Shard) -> Shard:
        """``x[ids]``: rows of ``x`` picked along its first dimension by one index tensor
        (an expert's bias for each of its rows) keep a split of a later dimension, which
        moves to where it lands after the index's dimensions."""
        layout = self._only_first_split(node, layout)
        indices = list(node.args[1]) if len(node.args) > 1 else []
        at = [d for d, i in enumerate(indices) if i is not None]
        index = indices[at[0]] if len(at) == 1 else None
        # one index tensor, replicated, along another dimension than the split one (Falcon's
        # ``qkv[:, :, :, [-2]]`` of a group-split view): its dimensions take that one's place
        if index is None or at[0] == layout.dim or not isinstance(index, fx.Node) \
                or self.layout.get(index) is not None or tensor_spec(index) is None:
            raise NoSplitRule("an index into the split dimension, or by more than one index")
        if layout.dim < at[0]:
            return layout
        return replace(layout, dim=layout.dim - 1 + len(tensor_spec(index).shape))

    def _getitem(self, node: fx.Node, layout: Shard) -> Shard:
        """``x[index]`` in Python's indexing (symbolic tracing keeps it one ``getitem``):
        each entry of the index takes one dimension of ``x`` (an int drops it, a slice
        keeps it, a list or tensor of ints picks along it), ``None`` adds one, ``...``
        stands for the dimensions no entry names. The split dimension moves to where its
        entry puts it when that entry is a whole slice (``qkv[..., :-2, :]``,
        ``qkv[..., -2, :]`` and ``qkv[:, :, :, [-2]]`` of a group-split view, Falcon's);
        an entry that indexes or slices the split dimension itself has no rule. With one
        list or tensor index and no int, its dimensions take its entry's place (NumPy's
        advanced indexing); other mixes of them move dimensions to the front: no rule."""
        layout = self._only_first_split(node, layout)
        index = node.args[1]
        entries = list(index) if isinstance(index, tuple) else [index]
        ndim = len(tensor_spec(node.args[0]).shape)

        def advanced(entry) -> int | None:   # the dimensions a list or tensor index adds
            if isinstance(entry, list) and entry and all(isinstance(i, int) and not isinstance(i, bool)
                                                          for i in entry):
                return 1
            spec = tensor_spec(entry) if isinstance(entry, fx.Node) else None
            if spec is not None and not spec.dtype.is_floating_point and spec.dtype not in (torch.bool, torch.uint8) \
                    and self.layout.get(entry) is None:   # (a bool or uint8 tensor is a mask)
                return len(spec.shape)
            return None

        if any(isinstance(e, bool) for e in entries):
            raise NoSplitRule("an index by True or False (a new dimension of one or no element)")
        picks = [e for e in entries if isinstance(e, (list, fx.Node))]
        if any(advanced(e) is None for e in picks) or len(picks) > 1 or \
                (picks and any(isinstance(e, int) for e in entries)) or entries.count(Ellipsis) > 1 or \
                not all(e is None or e is Ellipsis or isinstance(e, (int, slice, list, fx.Node)) for e in entries):
            raise NoSplitRule("an index with more than one list or tensor, a mask, or a list beside an int")
        taking = sum(1 for e in entries if e is not None and e is not Ellipsis)
        if Ellipsis in entries:
            at = entries.index(Ellipsis)
            entries[at:at + 1] = [slice(None)] * (ndim - taking)
        entries += [slice(None)] * (ndim - sum(1 for e in entries if e is not None))
        dim, out = 0, 0
        for entry in entries:
            if entry is None:
                out += 1
                continue
            if dim == layout.dim:
                if entry != slice(None):
                    raise NoSplitRule("an index or slice of the split dimension")
                return replace(layout, dim=out)
            dim += 1
            out += 0 if isinstance(entry, int) else advanced(entry) if isinstance(entry, (list, fx.Node)) else 1
        raise NoSplitRule("an index the graph's shapes do not match")

    def _cat(self, node: fx.Node, stack: bool = False) -> Shard:
        """A concatenation along an unsplit dimension of values split alike keeps the
        split (rotary embeddings' ``rotate_half``: ``cat((-x2, x1), -1)`` of head-split
        halves); a replicated operand is sliced to match. ``stack``: a stack along a new
        dimension (GPT-J's ``rotate_every_two``: ``stack((-x2, x1), -1)``) keeps it too,
        one further out when the new dimension comes before it (DTensor's rule)."""
        pieces = node.args[0] if node.args else node.kwargs["tensors"]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        split = [self.layout.get(p) for p in pieces if isinstance(p, fx.Node) and self.layout.get(p) is not None]
        if any(isinstance(x, tuple) for x in split) or len({(x.dim, x.blocks) for x in split}) != 1:
            raise NoSplitRule("the concatenated values are split differently")
        layout = split[0]
        if stack:
            at = normalize_dim(dim, len(tensor_spec(node).shape))
            layout = replace(layout, dim=layout.dim + (1 if at <= layout.dim else 0))
        elif normalize_dim(dim, len(tensor_spec(node).shape)) == layout.dim or layout.blocks != 1:
            raise NoSplitRule("a concatenation along the split dimension")
        new = [self._scatter(p, split[0].dim) if isinstance(p, fx.Node) and self.layout.get(p) is None else p
               for p in pieces]
        if node.args:
            node.args = (type(pieces)(new),) + tuple(node.args[1:])
        else:
            node.kwargs = {**node.kwargs, "tensors": type(pieces)(new)}
        return layout

    def _expand(self, node: fx.Node, layout: Shard) -> Shard:
        layout = self._only_first_split(node, layout)
        sizes = list(node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else node.args[1:])
        if len(sizes) == 1 and _whole_shape(sizes[0]):   # a whole shape, ``broadcast_to(k, q.shape)``:
            whole = sizes[0]                            # its sizes one by one, the split one scaled
            with self.graph.inserting_before(node):
                sizes = [self.graph.call_function(operator.getitem, (whole, d))
                         for d in range(len(tensor_spec(node).shape))]
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
        n_out = len(node.meta.get(SPEC) or ())
        if dim != layout.dim:
            if is_unbind and dim < layout.dim:
                return tuple(Shard(layout.dim - 1, layout.blocks) for _ in range(n_out))
            return tuple(layout for _ in range(n_out))
        # splitting the fused blocks apart: each piece is one block, split by rank
        if n_out != layout.blocks or is_unbind:
            raise NoSplitRule(f"split of dim {dim} into {n_out} pieces does not follow its {layout.blocks} blocks")
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
            raise NoSplitRule("layer norm over the split dimension")
        if node.op == "call_module":
            # functional form so the affine parameters can carry Megatron f (their
            # gradients are partial sums when the activations are split)
            mod = self.gm.get_submodule(node.target)
            with self.graph.inserting_before(node):
                w = self.graph.get_attr(f"{node.target}.weight") if mod.weight is not None else None
                b = self.graph.get_attr(f"{node.target}.bias") if getattr(mod, "bias", None) is not None else None
                if isinstance(mod, torch.nn.RMSNorm):
                    new = self.graph.call_function(F.rms_norm, (x, tuple(mod.normalized_shape),
                                                                w and self._copy_to(w), mod.eps))
                else:
                    new = self.graph.call_function(F.layer_norm, (x, tuple(mod.normalized_shape), w and self._copy_to(w),
                                                                  b and self._copy_to(b), mod.eps))
            new.meta.update(node.meta)
            node.replace_all_uses_with(new)
            self.graph.erase_node(node)
            self.layout[new] = layout
            return layout
        # the affine parameters, positional or by keyword (``F.rms_norm(x, (d,), weight=w)``,
        # as the tracer records it): their gradients are partial sums over the split
        affine = [a for a in node.args[2:4] if isinstance(a, fx.Node)]
        affine += [node.kwargs[k] for k in ("weight", "bias") if isinstance(node.kwargs.get(k), fx.Node)]
        for arg in affine:
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
            raise NoSplitRule("operands split along different dimensions")
        out_dim = out_dims.pop()
        if out_dim >= out_ndim - 2:
            raise NoSplitRule("matmul over a split row/column dimension")
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
                raise NoSplitRule("multi-output operand")
            if layout is not None:
                out_dims.add((layout.dim + out_ndim - len(tensor_spec(a).shape), layout.blocks))
        if len(out_dims) != 1:
            raise NoSplitRule("operands split along different dimensions")
        out_dim, blocks = out_dims.pop()
        for a in node.all_input_nodes:
            if self.layout.get(a) is None:
                if blocks != 1 and self._operand_size(a, out_dim, out_ndim) > 1:
                    raise NoSplitRule("a replicated operand meets a block-split one")
                self._align_operand(node, a, out_dim, out_ndim)
        return Shard(out_dim, blocks)

    @staticmethod
    def _operand_size(a: fx.Node, out_dim: int, out_ndim: int) -> int:
        spec = tensor_spec(a)
        if spec is None:
            return 1
        d = operand_dim_for(out_dim, out_ndim, spec.shape)
        return 1 if d is None else spec.shape[d]


def _whole_shape(value) -> bool:
    """Whether ``value`` is a whole shape read off a tensor in the graph (``x.shape``,
    ``x.size()``, a :func:`global_size` of every dimension), not one size."""
    if not isinstance(value, fx.Node):
        return False
    if value.op == "call_function" and value.target is getattr:
        return value.args[1] == "shape"
    if value.op == "call_method" and value.target == "size":
        return len(value.args) == 1 and "dim" not in value.kwargs
    if value.op == "call_function" and value.target is global_size:
        return (value.args[3] if len(value.args) > 3 else value.kwargs.get("dim")) is None
    return False
