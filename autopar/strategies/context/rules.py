"""The context-parallel walk's rules for ops that keep tokens apart or regroup them
(:mod:`.walk`): dropout at p = 0, transposes, views, selections, splits, concatenations,
pointwise ops, norms, ops along one dimension and reductions. A rule returns where the
output holds the rank's tokens, or raises :class:`Whole` with the reason the op runs on
the whole sequence."""
from __future__ import annotations

import inspect
import math
import operator

import torch.fx as fx

from autopar._torch_compat import argument_names, is_aten_op
from autopar.ir import SPEC
from autopar.passes.analysis.batch_rows.op_tables import (ALONG, REDUCTIONS, TRANSPOSES, argument, bare_name,
                                                          norm_dims, shape_of)
from autopar.strategies.context.collectives import context_sum
from autopar.strategies.context.shapes import Tokens, aligned, reshaped


class Whole(Exception):
    """The op runs on the whole sequence (its split operands gathered); the reason."""


class Rules:
    """The rules of :class:`.walk.Walk` that read one op (the walk's state and helpers:
    ``tok``, ``take``, ``gather``, ``_after``, ``seq``, ``c``, ``group``)."""

    # ------------------------------------------------------------------ rules
    def dropout(self, node: fx.Node):
        p = argument(node, 1, "p", 0.5)
        train = node.kwargs.get("training", argument(node, 2, "train", True))
        if p == 0 or train is False:
            out = self.tok(node.args[0])
            return (out, out) if bare_name(node) == "native_dropout" else out
        raise Whole(f"dropout with p={p}: its masks are drawn for the whole sequence")

    def keep_unless(self, node: fx.Node, dim):
        tok = self.tok(node.args[0])
        shape = shape_of(node.args[0])
        if tok is None or shape is None or not isinstance(dim, int) or dim % len(shape) == tok.dim:
            raise Whole("along the sequence")
        return tok

    def permute(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, n = self.tok(x), len(shape_of(x) or ())
        if tok is None or not n:
            raise Whole("an operand that is not the first")
        if name in ("T", "numpy_T", "H") and n > 2:   # every dimension reversed
            return Tokens(n - 1 - tok.dim, tok.inner)
        if name in TRANSPOSES or name in ("transpose", "swapaxes", "swapdims"):
            a, b = (n - 2, n - 1) if name in TRANSPOSES else (argument(node, 1, "dim0", None) % n,
                                                              argument(node, 2, "dim1", None) % n)
            d = b if tok.dim == a else a if tok.dim == b else tok.dim
            return Tokens(d, tok.inner)
        order = node.kwargs.get("dims") or (node.args[1] if len(node.args) == 2 and
                                            isinstance(node.args[1], (list, tuple)) else node.args[1:])
        order = [o % n for o in order]
        if sorted(order) != list(range(n)):
            raise Whole("a permutation that was not read")
        return Tokens(order.index(tok.dim), tok.inner)

    def regroup(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, shape_in, shape_out = self.tok(x), shape_of(x), shape_of(node)
        if tok is None or shape_in is None or shape_out is None:
            raise Whole("a view whose shapes were not recorded")
        if name in ("expand", "broadcast_to"):
            out = Tokens(aligned(tok.dim, len(shape_in), len(shape_out)), tok.inner)
        elif name in ("view_as", "reshape_as"):
            out = reshaped(tok, shape_in, shape_out, self.seq)
            if out is None or self.tok(node.args[1]) != out:
                raise Whole("a view as a value not split the same way")
            return out
        else:
            out = reshaped(tok, shape_in, shape_out, self.seq)
        if out is None:
            raise Whole("a view that cuts through the sequence")
        self.original.setdefault(node, (node.args, node.kwargs))   # the global sizes, for a later gather
        self._local_sizes(node, name, out, shape_out)
        return out

    def _local_sizes(self, node: fx.Node, name: str, out: Tokens, shape_out) -> None:
        """Literal sizes of the split dimension in a view's arguments, made the rank's."""
        if name in ("squeeze", "unsqueeze", "flatten", "_reshape_alias"):
            return
        if name == "unflatten":
            dim, sizes = node.args[1], list(node.args[2])
            j = out.dim - (dim % len(shape_of(node.args[0])))
            if 0 <= j < len(sizes):
                sizes[j] = self._local(sizes[j], shape_out[out.dim])
                node.args = (node.args[0], dim, sizes)
            return
        if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)):
            sizes = list(node.args[1])
            sizes[out.dim] = self._local(sizes[out.dim], shape_out[out.dim])
            node.args = (node.args[0], type(node.args[1])(sizes))
        elif len(node.args) > 1:
            sizes = list(node.args[1:])
            sizes[out.dim] = self._local(sizes[out.dim], shape_out[out.dim])
            node.args = (node.args[0], *sizes)
        elif "size" in node.kwargs or "shape" in node.kwargs:
            key = "size" if "size" in node.kwargs else "shape"
            sizes = list(node.kwargs[key])
            sizes[out.dim] = self._local(sizes[out.dim], shape_out[out.dim])
            node.kwargs = {**node.kwargs, key: sizes}

    def _local(self, size, global_size: int):
        if size == -1:
            return size
        if size == global_size:
            return global_size // self.c
        raise Whole(f"a view whose size {size!r} of the split dimension is not a literal")

    def select(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, shape = self.tok(x), shape_of(x)
        if tok is None or shape is None or any(self.tok(a) for a in node.all_input_nodes if a is not x):
            raise Whole("an index that is split")
        dim = argument(node, 1, "dim", 0) % len(shape)
        if dim != tok.dim:
            return Tokens(tok.dim - 1, tok.inner) if name == "select" and dim < tok.dim else tok
        if name == "slice":
            start, end, step = argument(node, 2, "start", None), argument(node, 3, "end", None), argument(node, 4, "step", 1)
            if (start in (None, 0)) and (end is None or end >= shape[dim]) and step in (None, 1):
                return tok
        raise Whole(f"{name} along the sequence")

    def index(self, node: fx.Node):
        """``x[..., idx]`` (``aten.index`` with index tensors after the split dimension,
        held whole): the dimensions before the first index stay where they were."""
        x, indices = node.args[0], node.args[1] if len(node.args) > 1 else None
        tok, shape, out = self.tok(x), shape_of(x), _first_shape(node)
        if tok is None or shape is None or out is None or not isinstance(indices, (list, tuple)):
            raise Whole("an index of a split value")
        used = [i for i, a in enumerate(indices) if a is not None]
        if not used or tok.dim >= used[0] or any(self.tok(a) is not None for a in indices if isinstance(a, fx.Node)) \
                or out[tok.dim] != shape[tok.dim]:
            raise Whole("an index along the sequence, or by split indices")
        return tok

    def split(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, shape, out = self.tok(x), shape_of(x), node.meta.get(SPEC)
        if tok is None or shape is None or not isinstance(out, tuple):
            raise Whole("a split whose shapes were not recorded")
        default = 0
        dim = argument(node, 2 if name != "unbind" else 1, "dim", default) % len(shape)
        if dim == tok.dim:
            raise Whole(f"{name} along the sequence")
        each = Tokens(tok.dim - 1, tok.inner) if name == "unbind" and dim < tok.dim else tok
        return tuple(each for _ in out)

    def cat(self, node: fx.Node, name: str):
        items = node.args[0]
        shape_out = shape_of(node)
        if shape_out is None:
            raise Whole("shapes not recorded")
        dim = argument(node, 1, "dim", 0) % len(shape_out)
        toks = {self.tok(a) for a in items if self.tok(a) is not None}
        if len(toks) != 1:
            raise Whole("parts split differently")
        tok = next(iter(toks))
        if name != "stack" and dim == tok.dim:
            raise Whole(f"{name} along the sequence")
        out = Tokens(tok.dim + (1 if name == "stack" and dim <= tok.dim else 0), tok.inner)
        for a in items:
            if isinstance(a, fx.Node) and self.tok(a) is None:
                self.take(node, a, tok)
        return out

    def pointwise(self, node: fx.Node):
        shape_out = shape_of(node)
        if shape_out is None:
            raise Whole("shapes not recorded")
        n = len(shape_out)
        outs = {}
        for a in node.all_input_nodes:
            tok, shape = self.tok(a), shape_of(a)
            if tok is not None:
                if shape is None:
                    raise Whole("shapes not recorded")
                outs[a] = Tokens(aligned(tok.dim, len(shape), n), tok.inner)
        if not outs:
            raise Whole("no split operand")
        # operands split along different dimensions (attention scores split by the queries'
        # rows plus a bias split by the keys): the largest keeps its split, the others are
        # gathered whole and cut like it below
        out = outs[max(outs, key=lambda a: math.prod(shape_of(a)))]
        for a, tok in outs.items():
            if tok != out:
                self.gather(node, a)
        for a in node.all_input_nodes:
            shape = shape_of(a)
            if self.tok(a) is not None or shape is None:
                continue
            j = out.dim - (n - len(shape))
            if j >= 0 and shape[j] == shape_out[out.dim] and shape[j] > 1:
                self.take(node, a, Tokens(j, out.inner))
            elif j >= 0 and shape[j] not in (1,):
                raise Whole("an operand as long as neither the sequence nor 1")
        return out

    def norm(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, shape = self.tok(x), shape_of(x)
        normalized = argument(node, 1, "normalized_shape", None)
        k = len(normalized) if isinstance(normalized, (list, tuple)) else 1
        if tok is None or shape is None or tok.dim >= len(shape) - k or \
                any(self.tok(a) for a in node.all_input_nodes if a is not x):
            raise Whole("normalised over the sequence")
        return (tok, tok, tok) if name == "native_layer_norm" else tok

    def along(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, shape = self.tok(x), shape_of(x)
        position, default = ALONG[name]
        dim = argument(node, position + 1, "dim", default)
        if tok is None or shape is None or dim is None or dim % len(shape) == tok.dim or len(node.all_input_nodes) > 1:
            raise Whole(f"{name} along the sequence, or of several operands")
        out = _first_shape(node)
        if out is None or len(out) != len(shape) or out[tok.dim] != shape[tok.dim]:
            raise Whole(f"{name} that changes the dimensions")
        return _like_outputs(node, tok)

    def reduction(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, shape = self.tok(x), shape_of(x)
        if tok is None or shape is None:
            raise Whole("a reduction of a split operand that is not the first")
        dims = norm_dims(argument(node, 1, "dim", None), len(shape))
        keep = bool(argument(node, 2, "keepdim", False))
        if dims is not None and _first_shape(node) != tuple(1 if i in dims else s for i, s in enumerate(shape)
                                                            if keep or i not in dims):
            raise Whole(f"{name} whose dimensions were not read")   # e.g. torch.norm(x, 2, 1): p before dim
        if dims is not None and tok.dim not in dims:
            return _like_outputs(node, Tokens(tok.dim - (0 if keep else sum(d < tok.dim for d in dims)), tok.inner))
        kind = REDUCTIONS[name]
        if kind == "other" or name.startswith("nan") or len(node.all_input_nodes) > 1:
            raise Whole(f"{name} over the sequence")
        total = self._after(node, context_sum, (node, self.group))
        self.report["sums"] += 1
        if kind == "mean":   # every rank holds as many of the elements: the mean of the ranks' means
            self._after(total, operator.truediv, (total, float(self.c)))
        return None


def _first_shape(node: fx.Node):
    """The recorded shape of ``node``'s (first) output, or None."""
    spec = node.meta.get(SPEC)
    spec = spec[0] if isinstance(spec, tuple) and spec else spec
    return tuple(spec.shape) if spec is not None and hasattr(spec, "shape") else None


def _like_outputs(node: fx.Node, tok: Tokens):
    """``tok`` for each output of ``node`` (``max(x, dim)``'s values and indices, ``sort``'s)."""
    spec = node.meta.get(SPEC)
    return tuple(tok for _ in spec) if isinstance(spec, tuple) else tok


def reduction_of(node: fx.Node):
    """A loss node's ``reduction`` argument, by keyword or position (its default "mean")."""
    if "reduction" in node.kwargs:
        return node.kwargs["reduction"]
    names = argument_names(node.target) if is_aten_op(node.target) else list(inspect.signature(node.target).parameters)
    i = names.index("reduction") if "reduction" in names else len(node.args)
    return node.args[i] if i < len(node.args) else "mean"
