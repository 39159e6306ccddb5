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
* a matmul of the rank's rows with a value split along its other side (the scores
  ``q @ k^T`` and the output ``probs @ v`` of attention written out, :mod:`.written`)
  gathers that operand: the all-gather form, each rank its rows of every key;
* a sum or mean over the split dimension (a loss) adds the ranks' parts
  (:func:`~.collectives.context_sum`);
* anything else (an op with no rule here, a slice or a cumulative sum along the
  sequence, a shift of the labels)
  runs on the whole sequence: its split operands are gathered first
  (:func:`~.collectives.gather_tokens`), which is exact and costs the gather (a warning
  names each op kind the first time).

The rules read the global shapes the capture recorded (``node.meta[SPEC]``).
"""
from __future__ import annotations

import logging
import operator

import torch
import torch.fx as fx
import torch.nn as nn

from autopar._torch_compat import is_aten_op
from autopar.ir import SPEC, TensorSpec
from autopar.passes.analysis.batch_rows.op_tables import (ALONG, FACTORIES, IDENTITY, LOSSES, MATMUL, REDUCTIONS,
                                                          SDPA, TRANSPOSES, VIEWS, bare_name, is_pointwise_name,
                                                          shape_of)
from autopar.strategies.context.collectives import gather_tokens, take_tokens
from autopar.strategies.context.meeting import Meetings
from autopar.strategies.context.rules import Rules, Whole
from autopar.strategies.context.shapes import Tokens

log = logging.getLogger("autopar.strategies.context")

SHAPE_PRESERVING = {"copy_to_tensor_region", "reduce_from_tensor_region", "replicated_dropout"}
DROPOUTS = {"dropout", "native_dropout", "feature_dropout", "alpha_dropout", "dropout1d", "dropout2d", "dropout3d"}
SIZES = {"size", "sym_size"}
EMBEDDINGS = {"embedding", "vocab_parallel_embedding"}


class Walk(Rules, Meetings):
    """The walk over ``gm`` for a sequence of ``seq`` tokens split over ``group``
    (``degree`` ranks); ``batch``: the rows of the rank's graph."""

    def __init__(self, gm: fx.GraphModule, *, seq: int, degree: int, group: str, balanced: bool, mode: str,
                 batch: int):
        self.gm, self.graph = gm, gm.graph
        self.seq, self.c, self.group, self.balanced, self.mode, self.batch = seq, degree, group, balanced, mode, batch
        self.state: dict[fx.Node, object] = {}
        self.gathered: dict[fx.Node, fx.Node] = {}
        self.taken: dict[tuple, fx.Node] = {}
        self.original: dict[fx.Node, tuple] = {}   # a view's arguments before its sizes were made the rank's
        self.report = {"ring_attention": 0, "gathers": [], "cuts": 0, "sums": 0, "why": {}}
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
        self.report["why"][node.name] = why or name
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
                state = self.visit(node)
                if type(state) is tuple and any(not _reads_item(user) for user in node.users):
                    raise Whole("several outputs read together")
                self.state[node] = state
            except Whole as e:
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
        if _reads_item(node) and type(self.state.get(node.args[0])) is tuple:   # not a Tokens (a NamedTuple)
            items, i = self.state[node.args[0]], _item(node)
            return items[i] if isinstance(i, int) and -len(items) <= i < len(items) else None
        if name in SIZES or (name == "getattr" and len(node.args) > 1 and node.args[1] == "shape"):
            return self.size(node, name)
        if name in EMBEDDINGS:
            return self.embedding(node, name)
        if not any(self.tok(a) is not None for a in node.all_input_nodes):
            return None
        return self.rule(node, name)

    def rule(self, node: fx.Node, name: str):
        """The rule of an op that reads a split value."""
        if name in DROPOUTS:
            return self.dropout(node)
        if name in FACTORIES and (name.startswith("new_") or name in ("zeros", "ones", "full", "empty", "arange")):
            return None   # a new tensor of the (global) sizes given: whole, whatever it was made like
        if name.endswith("_") and name != "requires_grad_" and (
                self.tok(node.args[0]) is None or (name in IDENTITY and name not in ("fill_", "copy_"))):
            raise Whole(f"in-place {name} on a value held whole, or along the sequence")
        if name in IDENTITY or name in SHAPE_PRESERVING:
            return self.tok(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else self.pointwise(node)
        if name in TRANSPOSES or name in ("transpose", "swapaxes", "swapdims", "permute"):
            return self.permute(node, name)
        if name in VIEWS or name in ("squeeze", "unsqueeze", "expand", "broadcast_to"):
            return self.regroup(node, name)
        if name in ("slice", "select", "narrow", "index_select"):
            return self.select(node, name)
        if name == "index":
            return self.index(node)
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
        raise Whole("no context-parallel rule for this op")

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
        last = [n for n in self.graph.nodes if n.op == "placeholder"][-1]   # export puts attributes first
        with self.graph.inserting_after(last):
            cut = self.graph.call_function(take_tokens, (node, d, 1, self.seq, self.group, self.balanced))
        cut.meta[SPEC] = spec
        node.replace_all_uses_with(cut, delete_user_cb=lambda user: user is not cut)
        self.state[cut] = Tokens(d)
        self.report["cuts"] += 1
        return None

    def embedding(self, node: fx.Node, name: str):
        ids_at = 1 if (name == "embedding" and node.op == "call_function" and is_aten_op(node.target)) else 0
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
            raise Whole("an embedding table split over the sequence")
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
        raise Whole(f"module {type(module).__name__}")

    def size(self, node: fx.Node, name: str):
        """A size query of a split value: the captured (global) size, as a constant; the
        whole shape (``x.size()``, ``x.shape``) as the captured shape."""
        x = node.args[0]
        tok = self.tok(x)
        if tok is None:
            return None
        shape = shape_of(x)
        if shape is None:
            raise Whole("the size of a value whose shape was not recorded")
        dim = node.args[1] if len(node.args) > 1 and name in SIZES else node.kwargs.get("dim")
        if isinstance(dim, int):
            if dim % len(shape) == tok.dim:
                self._global_int(node, shape[tok.dim])
            return None
        whole = torch.Size(shape)
        for user in list(node.users):   # ``B, T, C = x.size()``: each item a constant the views can read
            if _reads_item(user) and isinstance(user.args[1], (int, slice)):
                self._global_int(user, whole[user.args[1]])
        self._global_int(node, whole)
        return None

    # ------------------------------------------------------------------ outputs
    def output(self, node: fx.Node) -> None:
        for value in node.all_input_nodes:
            if self.tok(value) is not None:
                self.gather(node, value)


def _reads_item(node: fx.Node) -> bool:
    """Whether ``node`` reads one output of a multi-output op (``getitem``, or a named
    tuple's ``.values`` / ``.indices``)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    return node.target is getattr and len(node.args) > 1 and node.args[1] in ("values", "indices")


def _item(node: fx.Node):
    """Which output :func:`_reads_item`'s ``node`` reads."""
    if node.target is getattr:
        return 0 if node.args[1] == "values" else 1
    return node.args[1]
