"""The context-parallel walk: every value of a rank's graph as this rank's tokens or whole.

A value is either split over the context group (:class:`~.shapes.Tokens`: one
dimension holds this rank's tokens) or held whole by every rank (None). The walk goes
node by node in graph order, and each op's rule says what its output is and what its
inputs need, rewriting the graph as it goes:

* an op that keeps tokens apart (pointwise ops, norms over the features, linears,
  views and transposes that keep the sequence factor in one dimension, reductions and
  softmaxes over other dimensions) runs on this rank's tokens; an operand held whole
  that lines up with the split dimension is cut to the rank's tokens first
  (:func:`~.collectives.take_tokens`: rotary tables, position embeddings, masks, labels);
  a literal size of the split dimension (``view(4, 16, -1, 8)``) becomes the rank's;
* an embedding of token ids held whole looks up the rank's ids only;
* attention (``scaled_dot_product_attention``) over split queries, keys and values
  becomes :func:`~.ring.ring_attention`;
* a sum or mean over the split dimension (a loss) adds the ranks' parts
  (:func:`~.collectives.context_sum`);
* anything else (an op with no rule here, a slice or a cumulative sum along the
  sequence, a shift of the labels, an eager attention's scores against every key)
  runs on the whole sequence: its split operands are gathered first
  (:func:`~.collectives.gather_tokens`), which is exact and costs the gather (a warning
  names each op kind the first time).

The rules read the global shapes the capture recorded (``node.meta[SPEC]``).
"""
from __future__ import annotations

import inspect
import logging
import operator

import torch
import torch.fx as fx
import torch.nn as nn

from autopar._torch_compat import argument_names
from autopar.ir import SPEC, TensorSpec
from autopar.passes.analysis.batch_rows.op_tables import (ALONG, FACTORIES, IDENTITY, LOSSES, MATMUL, REDUCTIONS,
                                                          SDPA, TRANSPOSES, VIEWS, argument, bare_name,
                                                          is_pointwise_name, norm_dims, shape_of)
from autopar.strategies.data.losses import set_sum_reduction
from autopar.strategies.context.collectives import context_count, context_sum, gather_tokens, take_tokens
from autopar.strategies.context.ring import ring_attention
from autopar.strategies.context.shapes import Tokens, aligned, reshaped

log = logging.getLogger("autopar.strategies.context")

SHAPE_PRESERVING = {"copy_to_tensor_region", "reduce_from_tensor_region", "replicated_dropout"}
DROPOUTS = {"dropout", "native_dropout", "feature_dropout", "alpha_dropout", "dropout1d", "dropout2d", "dropout3d"}
SIZES = {"size", "sym_size"}
EMBEDDINGS = {"embedding", "vocab_parallel_embedding"}


class Walk:
    """The walk over ``gm`` for a sequence of ``seq`` tokens split over ``group``
    (``degree`` ranks); ``batch``: the rows of the rank's graph."""

    def __init__(self, gm: fx.GraphModule, *, seq: int, degree: int, group: str, balanced: bool, mode: str,
                 batch: int):
        self.gm, self.graph = gm, gm.graph
        self.seq, self.c, self.group, self.balanced, self.mode, self.batch = seq, degree, group, balanced, mode, batch
        self.state: dict[fx.Node, object] = {}
        self.gathered: dict[fx.Node, fx.Node] = {}
        self.taken: dict[tuple, fx.Node] = {}
        self.report = {"ring_attention": 0, "gathers": [], "cuts": 0, "sums": 0}
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ helpers
    def tok(self, value) -> Tokens | None:
        s = self.state.get(value) if isinstance(value, fx.Node) else None
        return s if isinstance(s, Tokens) else None

    def _new(self, before: fx.Node, fn, args, spec_of=None, kwargs=None) -> fx.Node:
        with self.graph.inserting_before(before):
            new = self.graph.call_function(fn, args, kwargs or {})
        if spec_of is not None and SPEC in spec_of.meta:
            new.meta[SPEC] = spec_of.meta[SPEC]
        return new

    def _after(self, node: fx.Node, fn, args) -> fx.Node:
        with self.graph.inserting_after(node):
            new = self.graph.call_function(fn, args)
        new.meta[SPEC] = node.meta.get(SPEC)
        node.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
        return new

    def take(self, user: fx.Node, value: fx.Node, tok: Tokens) -> fx.Node:
        """``value`` (held whole) cut to this rank's tokens in ``tok.dim``, for ``user``."""
        key = (value, tok)
        if key not in self.taken:
            self.taken[key] = self._new(user, take_tokens, (value, tok.dim, tok.inner, self.seq, self.group,
                                                            self.balanced), spec_of=value)
            self.state[self.taken[key]] = tok
            self.report["cuts"] += 1
        user.replace_input_with(value, self.taken[key])
        return self.taken[key]

    def gather(self, user: fx.Node, value: fx.Node) -> fx.Node:
        """``value`` (split) gathered whole, for ``user``."""
        tok = self.tok(value)
        if value not in self.gathered:
            self.gathered[value] = self._new(user, gather_tokens, (value, tok.dim, tok.inner, self.seq, self.group,
                                                                   self.balanced), spec_of=value)
        user.replace_input_with(value, self.gathered[value])
        return self.gathered[value]

    def whole(self, node: fx.Node, why: str = "") -> None:
        """Run ``node`` on the whole sequence: gather its split operands (the fallback)."""
        split = [a for a in node.all_input_nodes if self.tok(a) is not None]
        if not split:
            return None
        for a in split:
            self.gather(node, a)
        name = bare_name(node) or str(node.target)
        self.report["gathers"].append(node.name)
        if name not in self._warned:
            self._warned.add(name)
            log.warning("context parallelism: %s (%s) runs on the whole sequence: its split operands are gathered "
                        "first%s", node.name, name, f" ({why})" if why else "")
        return None

    def _global_int(self, node: fx.Node, value: int) -> None:
        """Replace the size query ``node`` by its global value in every user's arguments."""
        def swap(a):
            if a is node:
                return value
            if isinstance(a, (list, tuple)):
                return type(a)(swap(x) for x in a)
            if isinstance(a, dict):
                return {k: swap(x) for k, x in a.items()}
            return a
        for user in list(node.users):
            user.args, user.kwargs = swap(user.args), swap(user.kwargs)

    # ------------------------------------------------------------------ the walk
    def run(self) -> dict:
        for node in list(self.graph.nodes):
            if node.op == "output":
                self.output(node)
                continue
            try:
                self.state[node] = self.visit(node)
            except _Whole as e:
                self.state[node] = self.whole(node, str(e))
        return self.report

    def visit(self, node: fx.Node):
        if node.op == "placeholder":
            return self.placeholder(node)
        if node.op == "get_attr":
            return None
        name = bare_name(node)
        if node.op == "call_module":
            return self.module(node)
        if name == "getitem" and isinstance(self.state.get(node.args[0]), tuple):
            items, i = self.state[node.args[0]], node.args[1]
            return items[i] if isinstance(i, int) and -len(items) <= i < len(items) else None
        if name in SIZES or (name == "getattr" and len(node.args) > 1 and node.args[1] == "shape"):
            return self.size(node, name)
        if name == "getitem" and isinstance(self.state.get(node.args[0]), _SizeOf):
            return self.size_item(node)
        if name in EMBEDDINGS:
            return self.embedding(node, name)
        if not any(self.tok(a) is not None for a in node.all_input_nodes):
            return None
        return self.rule(node, name)

    def rule(self, node: fx.Node, name: str):
        """The rule of an op that reads a split value."""
        if name in DROPOUTS:
            return self.dropout(node)
        if name in FACTORIES:   # a new tensor of the sizes given: whole, whatever it was made like
            return None
        if name in IDENTITY or name in SHAPE_PRESERVING:
            return self.tok(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else self.pointwise(node)
        if name in TRANSPOSES or name in ("transpose", "swapaxes", "swapdims", "permute"):
            return self.permute(node, name)
        if name in VIEWS or name in ("squeeze", "unsqueeze", "expand"):
            return self.regroup(node, name)
        if name in ("slice", "select", "narrow", "index_select"):
            return self.select(node, name)
        if name in ("split", "split_with_sizes", "chunk", "unbind", "tensor_split"):
            return self.split(node, name)
        if name in ("cat", "concat", "concatenate", "stack"):
            return self.cat(node, name)
        if name in SDPA:
            return self.attention(node, name)
        if name in MATMUL:
            return self.matmul(node, name)
        if name in LOSSES or name == "vocab_parallel_cross_entropy":
            return self.loss(node, name)
        if name in REDUCTIONS:
            return self.reduction(node, name)
        if name in ALONG:
            return self.along(node, name)
        if name in ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"):
            return self.norm(node, name)
        if name in ("gather_from_tensor_region", "scatter_to_tensor_region"):
            return self.keep_unless(node, node.args[1])
        if is_pointwise_name(name):
            return self.pointwise(node)
        raise _Whole("no context-parallel rule for this op")

    # ------------------------------------------------------------------ sources
    def token_dim(self, shape) -> int | None:
        """The dimension of a whole input of ``shape`` that holds the sequence: one of size
        ``seq`` after the batch (``[batch, seq, ...]``), else the first (``[seq, batch, ...]``)."""
        dims = [d for d, s in enumerate(shape) if s == self.seq]
        if not dims:
            return None
        later = [d for d in dims if d > 0]
        if shape[0] == self.batch and later:
            return later[0]
        return dims[0]

    def placeholder(self, node: fx.Node):
        spec = node.meta.get(SPEC)
        if not isinstance(spec, TensorSpec) or not spec.dtype.is_floating_point or len(spec.shape) < 2:
            return None
        d = self.token_dim(spec.shape)
        if d is None:
            return None
        first = next(n for n in self.graph.nodes if n.op != "placeholder")
        with self.graph.inserting_before(first):
            cut = self.graph.call_function(take_tokens, (node, d, 1, self.seq, self.group, self.balanced))
        cut.meta[SPEC] = spec
        node.replace_all_uses_with(cut, delete_user_cb=lambda user: user is not cut)
        self.state[cut] = Tokens(d)
        self.report["cuts"] += 1
        return None

    def embedding(self, node: fx.Node, name: str):
        ids_at = 1 if (name == "embedding" and node.op == "call_function" and _is_aten(node)) else 0
        ids = node.args[ids_at] if len(node.args) > ids_at else node.kwargs.get("input")
        if not isinstance(ids, fx.Node):
            return None
        tok = self.tok(ids)
        if tok is None:
            shape = shape_of(ids)
            d = self.token_dim(shape) if shape else None
            if d is None:
                return None
            tok = Tokens(d)
            self.take(node, ids, tok)
        if any(self.tok(a) is not None for a in node.all_input_nodes if a is not node.args[ids_at]):
            raise _Whole("an embedding table split over the sequence")
        return tok

    def module(self, node: fx.Node):
        module = self.gm.get_submodule(node.target)
        if isinstance(module, nn.Embedding):
            ids = node.args[0]
            tok = self.tok(ids)
            if tok is None:
                d = self.token_dim(shape_of(ids) or ())
                if d is None:
                    return None
                tok = Tokens(d)
                self.take(node, ids, tok)
            return tok
        if not any(self.tok(a) is not None for a in node.all_input_nodes):
            return None
        x = node.args[0] if node.args else None
        tok = self.tok(x)
        if tok is not None and len(node.all_input_nodes) == 1:
            shape = shape_of(x)
            if isinstance(module, nn.Linear) and tok.dim < len(shape) - 1:
                return tok
            if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and tok.dim < len(shape) - len(module.normalized_shape):
                return tok
            if isinstance(module, (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Identity)):
                return tok
            if isinstance(module, nn.Dropout) and (module.p == 0 or not module.training):
                return tok
        raise _Whole(f"module {type(module).__name__}")

    def size(self, node: fx.Node, name: str):
        x = node.args[0]
        tok = self.tok(x)
        if tok is None:
            return None
        shape = shape_of(x)
        dim = node.args[1] if len(node.args) > 1 and name in SIZES else node.kwargs.get("dim")
        if isinstance(dim, int):
            if dim % len(shape) == tok.dim:
                self._global_int(node, shape[tok.dim])
            return None
        return _SizeOf(tok.dim, shape[tok.dim])

    def size_item(self, node: fx.Node):
        s = self.state[node.args[0]]
        i = node.args[1]
        if isinstance(i, int) and i == s.dim:
            self._global_int(node, s.size)
        return None

    # ------------------------------------------------------------------ rules
    def dropout(self, node: fx.Node):
        p = argument(node, 1, "p", 0.5)
        train = argument(node, 2, "train", True)
        if p == 0 or train is False:
            out = self.tok(node.args[0])
            return (out, out) if bare_name(node) == "native_dropout" else out
        raise _Whole(f"dropout with p={p}: its masks are drawn for the whole sequence")

    def keep_unless(self, node: fx.Node, dim):
        tok = self.tok(node.args[0])
        shape = shape_of(node.args[0])
        if tok is None or shape is None or not isinstance(dim, int) or dim % len(shape) == tok.dim:
            raise _Whole("along the sequence")
        return tok

    def permute(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, n = self.tok(x), len(shape_of(x) or ())
        if tok is None or not n:
            raise _Whole("an operand that is not the first")
        if name in TRANSPOSES or name in ("transpose", "swapaxes", "swapdims"):
            a, b = (n - 2, n - 1) if name in TRANSPOSES else (node.args[1] % n, node.args[2] % n)
            d = b if tok.dim == a else a if tok.dim == b else tok.dim
            return Tokens(d, tok.inner)
        order = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else node.args[1:]
        order = [o % n for o in order]
        return Tokens(order.index(tok.dim), tok.inner)

    def regroup(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, shape_in, shape_out = self.tok(x), shape_of(x), shape_of(node)
        if tok is None or shape_in is None or shape_out is None:
            raise _Whole("a view whose shapes were not recorded")
        if name in ("expand",):
            out = Tokens(aligned(tok.dim, len(shape_in), len(shape_out)), tok.inner)
        elif name in ("view_as", "reshape_as"):
            out = reshaped(tok, shape_in, shape_out, self.seq)
            if out is None or self.tok(node.args[1]) != out:
                raise _Whole("a view as a value not split the same way")
            return out
        else:
            out = reshaped(tok, shape_in, shape_out, self.seq)
        if out is None:
            raise _Whole("a view that cuts through the sequence")
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
        raise _Whole(f"a view whose size {size!r} of the split dimension is not a literal")

    def select(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, shape = self.tok(x), shape_of(x)
        if tok is None or shape is None or any(self.tok(a) for a in node.all_input_nodes if a is not x):
            raise _Whole("an index that is split")
        dim = argument(node, 1, "dim", 0) % len(shape)
        if dim != tok.dim:
            return Tokens(tok.dim - 1, tok.inner) if name == "select" and dim < tok.dim else tok
        if name == "slice":
            start, end, step = argument(node, 2, "start", None), argument(node, 3, "end", None), argument(node, 4, "step", 1)
            if (start in (None, 0)) and (end is None or end >= shape[dim]) and step in (None, 1):
                return tok
        raise _Whole(f"{name} along the sequence")

    def split(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, shape, out = self.tok(x), shape_of(x), node.meta.get(SPEC)
        if tok is None or shape is None or not isinstance(out, tuple):
            raise _Whole("a split whose shapes were not recorded")
        default = 0
        dim = argument(node, 2 if name != "unbind" else 1, "dim", default) % len(shape)
        if dim == tok.dim:
            raise _Whole(f"{name} along the sequence")
        each = Tokens(tok.dim - 1, tok.inner) if name == "unbind" and dim < tok.dim else tok
        return tuple(each for _ in out)

    def cat(self, node: fx.Node, name: str):
        items = node.args[0]
        shape_out = shape_of(node)
        if shape_out is None:
            raise _Whole("shapes not recorded")
        dim = argument(node, 1, "dim", 0) % len(shape_out)
        toks = {self.tok(a) for a in items if self.tok(a) is not None}
        if len(toks) != 1:
            raise _Whole("parts split differently")
        tok = next(iter(toks))
        if name != "stack" and dim == tok.dim:
            raise _Whole(f"{name} along the sequence")
        out = Tokens(tok.dim + (1 if name == "stack" and dim <= tok.dim else 0), tok.inner)
        for a in items:
            if isinstance(a, fx.Node) and self.tok(a) is None:
                self.take(node, a, tok)
        return out

    def pointwise(self, node: fx.Node):
        shape_out = shape_of(node)
        if shape_out is None:
            raise _Whole("shapes not recorded")
        n = len(shape_out)
        outs = set()
        for a in node.all_input_nodes:
            tok, shape = self.tok(a), shape_of(a)
            if tok is not None:
                if shape is None:
                    raise _Whole("shapes not recorded")
                outs.add(Tokens(aligned(tok.dim, len(shape), n), tok.inner))
        if len(outs) != 1:
            raise _Whole("operands split along different dimensions")
        out = next(iter(outs))
        for a in node.all_input_nodes:
            shape = shape_of(a)
            if self.tok(a) is not None or shape is None:
                continue
            j = out.dim - (n - len(shape))
            if j >= 0 and shape[j] == shape_out[out.dim] and shape[j] > 1:
                self.take(node, a, Tokens(j, out.inner))
            elif j >= 0 and shape[j] not in (1,):
                raise _Whole("an operand as long as neither the sequence nor 1")
        return out

    def norm(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, shape = self.tok(x), shape_of(x)
        normalized = argument(node, 1, "normalized_shape", None)
        k = len(normalized) if isinstance(normalized, (list, tuple)) else 1
        if tok is None or shape is None or tok.dim >= len(shape) - k or \
                any(self.tok(a) for a in node.all_input_nodes if a is not x):
            raise _Whole("normalised over the sequence")
        return (tok, tok, tok) if name == "native_layer_norm" else tok

    def along(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, shape = self.tok(x), shape_of(x)
        position, default = ALONG[name]
        dim = argument(node, position + 1, "dim", default)
        if tok is None or shape is None or dim is None or dim % len(shape) == tok.dim:
            raise _Whole(f"{name} along the sequence")
        return tok

    def reduction(self, node: fx.Node, name: str):
        x = node.args[0]
        tok, shape = self.tok(x), shape_of(x)
        if tok is None or shape is None:
            raise _Whole("a reduction of a split operand that is not the first")
        dims = norm_dims(argument(node, 1, "dim", None), len(shape))
        keep = bool(argument(node, 2, "keepdim", False))
        if dims is not None and tok.dim not in dims:
            return Tokens(tok.dim - (0 if keep else sum(d < tok.dim for d in dims)), tok.inner)
        kind = REDUCTIONS[name]
        if kind == "other" or len(node.all_input_nodes) > 1:
            raise _Whole(f"{name} over the sequence")
        total = self._after(node, context_sum, (node, self.group))
        self.report["sums"] += 1
        if kind == "mean":   # every rank holds as many of the elements: the mean of the ranks' means
            self._after(total, operator.truediv, (total, float(self.c)))
        return None

    # ------------------------------------------------------------------ attention, matmuls, losses
    def attention(self, node: fx.Node, name: str):
        q, k, v = node.args[:3]
        toks = [self.tok(a) for a in (q, k, v)]
        nd = len(shape_of(q) or ())
        if name != "scaled_dot_product_attention" or any(t is None or t != Tokens(nd - 2) for t in toks):
            raise _Whole("attention whose queries, keys and values are not all split along their sequence")
        mask = argument(node, 3, "attn_mask", None)
        dropout = argument(node, 4, "dropout_p", 0.0)
        if dropout:
            raise _Whole(f"attention dropout {dropout}")
        if isinstance(mask, fx.Node) and self.tok(mask) is not None:
            self.gather(node, mask)
            mask = self.gathered[mask]
        kwargs = {"is_causal": bool(argument(node, 5, "is_causal", False)), "scale": argument(node, 6, "scale", None),
                  "seq": self.seq, "group": self.group, "balanced": self.balanced, "mode": self.mode}
        new = self._new(node, ring_attention, (q, k, v, mask), spec_of=node, kwargs=kwargs)
        node.replace_all_uses_with(new)
        self.graph.erase_node(node)
        self.state[new] = Tokens(nd - 2)
        self.report["ring_attention"] += 1
        return Tokens(nd - 2)

    def matmul(self, node: fx.Node, name: str):
        if name not in ("matmul", "mm", "bmm", "linear"):
            raise _Whole(f"{name}")
        a, b = node.args[0], node.args[1]
        sa, sb, so = shape_of(a), shape_of(b), shape_of(node)
        if sa is None or sb is None or so is None or len(sa) < 2 or len(sb) < 2 and name != "linear":
            raise _Whole("a matmul of vectors or unrecorded shapes")
        ta, tb = self.tok(a), self.tok(b)
        bias = [x for x in node.all_input_nodes[2:] if self.tok(x) is not None]
        if bias:
            raise _Whole("a split bias")
        if name == "linear":
            if tb is not None or ta is None or ta.dim == len(sa) - 1:
                raise _Whole("a linear over the sequence")
            return ta
        a_contracted = ta is not None and ta.dim == len(sa) - 1
        b_contracted = tb is not None and tb.dim == len(sb) - 2
        if a_contracted and (b_contracted or tb is None) or b_contracted and ta is None:
            inner = (ta or tb).inner
            if tb is None:
                self.take(node, b, Tokens(len(sb) - 2, inner))
            elif ta is None:
                self.take(node, a, Tokens(len(sa) - 1, inner))
            elif ta.inner != tb.inner:
                raise _Whole("a product over the sequence split two ways")
            self._after(node, context_sum, (node, self.group))
            self.report["sums"] += 1
            return None
        if b_contracted:   # attention weights of every key times the split values: the values gathered
            self.gather(node, b)
            tb = None
        if a_contracted:
            self.gather(node, a)
            ta = None
        out_a = None if ta is None else (len(so) - 2 if ta.dim == len(sa) - 2 else aligned(ta.dim, len(sa), len(so)))
        out_b = None if tb is None else (len(so) - 1 if tb.dim == len(sb) - 1 else aligned(tb.dim, len(sb), len(so)))
        if out_a is not None and out_b is not None and out_a != out_b:
            self.gather(node, b)       # scores of every key: the keys gathered
            out_b = None
        if out_a is not None:
            return Tokens(out_a, ta.inner)
        if out_b is not None:
            return Tokens(out_b, tb.inner)
        return None

    def loss(self, node: fx.Node, name: str):
        x, target = node.args[0], node.args[1] if len(node.args) > 1 else None
        tok = self.tok(x)
        shape = shape_of(x)
        if tok is None or shape is None or node.op != "call_function":
            raise _Whole("a loss of a split value that is not its input")
        if isinstance(target, fx.Node) and self.tok(target) is None:
            tshape = shape_of(target)
            if tshape is None:
                raise _Whole("a target whose shape was not recorded")
            self.take(node, target, Tokens(tok.dim if len(tshape) == len(shape) else min(tok.dim, len(tshape) - 1),
                                           tok.inner))
        reduction = node.args[5] if name == "vocab_parallel_cross_entropy" and len(node.args) > 5 else \
            _reduction(node)
        if reduction in ("none", 0):
            return tok
        if reduction in ("sum", 2):
            self._after(node, context_sum, (node, self.group))
            self.report["sums"] += 1
            return None
        if name in ("cross_entropy", "cross_entropy_loss", "nll_loss", "nll_loss_nd", "vocab_parallel_cross_entropy"):
            return self._counted_mean(node, name)
        total = self._after(node, context_sum, (node, self.group))   # an elementwise mean: equal shares
        self._after(total, operator.truediv, (total, float(self.c)))
        self.report["sums"] += 1
        return None

    def _counted_mean(self, node: fx.Node, name: str):
        """A mean over the targets a class loss does not ignore: the ranks' sums over the
        ranks' counts."""
        if argument(node, 2, "weight", None) is not None:
            raise _Whole("a class-weighted mean")
        target = node.args[1]
        ignore = node.args[4] if name == "vocab_parallel_cross_entropy" else argument(node, 4, "ignore_index", -100)
        if name == "vocab_parallel_cross_entropy":
            node.args = (*node.args[:5], "sum", *node.args[6:])
            summed = node
        else:
            summed = set_sum_reduction(node, self.gm)
        with self.graph.inserting_after(summed):
            kept = self.graph.call_function(torch.ne, (target, ignore))
        with self.graph.inserting_after(kept):
            count = self.graph.call_function(torch.sum, (kept,))
        with self.graph.inserting_after(count):
            count_all = self.graph.call_function(context_count, (count, self.group))
        with self.graph.inserting_after(count_all):
            total = self.graph.call_function(context_sum, (summed, self.group))
        with self.graph.inserting_after(total):
            mean = self.graph.call_function(operator.truediv, (total, count_all))
        for n in (total, mean):
            n.meta[SPEC] = summed.meta.get(SPEC)
        summed.replace_all_uses_with(mean, delete_user_cb=lambda user: user not in (total, kept, count))
        self.report["sums"] += 1
        return None

    # ------------------------------------------------------------------ outputs
    def output(self, node: fx.Node) -> None:
        for value in node.all_input_nodes:
            if self.tok(value) is not None:
                self.gather(node, value)


class _Whole(Exception):
    """The op runs on the whole sequence (its split operands gathered); the reason."""


class _SizeOf:
    """A ``size()`` of a split value: which dimension is split and its global size."""

    def __init__(self, dim: int, size: int):
        self.dim, self.size = dim, size


def _reduction(node: fx.Node):
    """A loss node's ``reduction`` argument, by keyword or position (its default "mean")."""
    if "reduction" in node.kwargs:
        return node.kwargs["reduction"]
    names = argument_names(node.target) if _is_aten(node) else list(inspect.signature(node.target).parameters)
    i = names.index("reduction") if "reduction" in names else len(node.args)
    return node.args[i] if i < len(node.args) else "mean"


def _is_aten(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload)


__all__ = ["Walk", "FACTORIES"]
