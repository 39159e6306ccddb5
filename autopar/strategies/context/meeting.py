"""The context-parallel walk's rules where tokens meet (:mod:`.walk`): attention (the
ring), products over the sequence, and losses (sums over the sequence added over the
context group; a mean over counted targets as the ranks' sums over their counts)."""
from __future__ import annotations

import inspect
import operator

import torch
import torch.fx as fx

from autopar._torch_compat import argument_names
from autopar.ir import SPEC
from autopar.passes.analysis.batch_rows.op_tables import (ALONG, REDUCTIONS, TRANSPOSES, argument, bare_name,
                                                          norm_dims, shape_of)
from autopar.strategies.context.collectives import context_count, context_sum
from autopar.strategies.context.ring import ring_attention
from autopar.strategies.context.shapes import Tokens, aligned, reshaped
from autopar.strategies.context.rules import Whole, _reduction
from autopar.strategies.data.losses import set_sum_reduction



class Meetings:
    """The rules of :class:`.walk.Walk` where the tokens of several ranks meet."""

    # ------------------------------------------------------------------ attention, matmuls, losses
    def attention(self, node: fx.Node, name: str):
        q, k, v = node.args[:3]
        toks = [self.tok(a) for a in (q, k, v)]
        nd = len(shape_of(q) or ())
        if name != "scaled_dot_product_attention" or any(t is None or t != Tokens(nd - 2) for t in toks):
            raise Whole("attention whose queries, keys and values are not all split along their sequence")
        mask = argument(node, 3, "attn_mask", None)
        dropout = argument(node, 4, "dropout_p", 0.0)
        if dropout:
            raise Whole(f"attention dropout {dropout}")
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
            raise Whole(f"{name}")
        a, b = node.args[0], node.args[1]
        sa, sb, so = shape_of(a), shape_of(b), shape_of(node)
        if sa is None or sb is None or so is None or len(sa) < 2 or len(sb) < 2 and name != "linear":
            raise Whole("a matmul of vectors or unrecorded shapes")
        ta, tb = self.tok(a), self.tok(b)
        bias = [x for x in node.all_input_nodes[2:] if self.tok(x) is not None]
        if bias:
            raise Whole("a split bias")
        if name == "linear":
            if tb is not None or ta is None or ta.dim == len(sa) - 1:
                raise Whole("a linear over the sequence")
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
                raise Whole("a product over the sequence split two ways")
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
            raise Whole("a loss of a split value that is not its input")
        if isinstance(target, fx.Node) and self.tok(target) is None:
            tshape = shape_of(target)
            if tshape is None:
                raise Whole("a target whose shape was not recorded")
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
            raise Whole("a class-weighted mean")
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

