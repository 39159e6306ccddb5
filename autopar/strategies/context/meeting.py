"""The context-parallel walk's rules where tokens meet (:mod:`.walk`): attention (the
ring), products over the sequence, and losses (sums over the sequence added over the
context group; a mean over counted targets as the ranks' sums over their counts)."""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx

from autopar.ir import SPEC
from autopar.passes.analysis.batch_rows.op_tables import argument, bare_name, shape_of
from autopar.strategies.context.collectives import context_count, context_sum
from autopar.strategies.context.ring import ring_attention
from autopar.strategies.context.shapes import Tokens, aligned
from autopar.strategies.context.rules import Whole, reduction_of
from autopar.strategies.shared.losses import set_sum_reduction

REPEATS = {"unsqueeze", "expand", "transpose", "permute", "contiguous", "clone", "broadcast_to", "t"}
CLASS_LOSSES = {"cross_entropy", "cross_entropy_loss", "nll_loss", "nll_loss_nd", "vocab_parallel_cross_entropy"}
ELEMENTWISE_LOSSES = {"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                      "binary_cross_entropy_with_logits", "soft_margin_loss", "poisson_nll_loss"}


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
        if shape_of(k)[-1] != shape_of(v)[-1]:
            raise Whole("values of another width than the keys")
        if not all(shape_of(a)[-2] == self.seq for a in (q, k, v)):
            raise Whole("attention over another length than the sequence")
        if isinstance(mask, fx.Node) and learned(self.gm, mask):
            raise Whole("a mask computed from parameters (its gradient)")
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
        if name == "addmm":   # bias + a @ b (GPT-2's Conv1D): the rows of a split, a bias over the columns
            bias, a, b = node.args[:3]
            ta = self.tok(a)
            if ta is None or ta.dim != 0 or self.tok(b) is not None or self.tok(bias) is not None or \
                    len(shape_of(bias) or (0, 0)) != 1:
                raise Whole("addmm with other operands split")
            return ta
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
            self.gather_unrepeated(node, b)
            tb = None
        if a_contracted:
            self.gather(node, a)
            ta = None
        out_a = None if ta is None else (len(so) - 2 if ta.dim == len(sa) - 2 else aligned(ta.dim, len(sa), len(so)))
        out_b = None if tb is None else (len(so) - 1 if tb.dim == len(sb) - 1 else aligned(tb.dim, len(sb), len(so)))
        if out_a is not None and out_b is not None and out_a != out_b:
            self.gather_unrepeated(node, b)       # scores of every key: the keys gathered
            out_b, tb = None, None
        out = Tokens(out_a, ta.inner) if out_a is not None else Tokens(out_b, tb.inner) if out_b is not None else None
        if out is not None and out.dim < len(so) - 2:   # a batch dimension: a whole operand broadcast along it is cut
            for operand, shape, t in ((a, sa, ta), (b, sb, tb)):
                j = out.dim - (len(so) - len(shape))
                if t is None and 0 <= j < len(shape) - 2 and shape[j] == so[out.dim] and shape[j] > 1:
                    self.take(node, operand, Tokens(j, out.inner))
        return out

    def gather_unrepeated(self, user: fx.Node, value: fx.Node) -> None:
        """``value`` (split) gathered whole for ``user``; where it is a chain of views,
        transposes and expands of a smaller split value used nowhere else (keys or values
        repeated for grouped-query attention: ``unsqueeze``, ``expand``, ``reshape``), that
        value is gathered instead and the chain runs on the whole sequence (its sizes the
        global ones again): the all-gather moves the key/value heads, not their repeats."""
        chain, source = [], value
        while (source in self.original or bare_name(source) in REPEATS) and len(source.users) == 1 and source.args and isinstance(source.args[0], fx.Node) \
                and len(source.all_input_nodes) == 1 and self.tok(source.args[0]) is not None:
            chain.append(source)
            source = source.args[0]
        if not chain or math.prod(shape_of(source) or (0,)) >= math.prod(shape_of(value) or (0,)):
            self.gather(user, value)
            return
        first = chain[-1]
        self.gather(first, source)
        for node in reversed(chain):
            if node in self.original:
                args, kwargs = self.original[node]
                node.args, node.kwargs = (node.args[0], *args[1:]), kwargs
            self.state[node] = None

    def loss(self, node: fx.Node, name: str):
        """A loss of split predictions: its targets cut alike; ``"none"`` stays split, a sum
        adds the ranks' sums, a mean over counted class targets is the ranks' sums over
        their counts, an elementwise mean the mean of the ranks' (equal) shares. Other
        losses (a batch mean, weights, reductions over features) run on the whole sequence."""
        x, target = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("target")
        tok, shape = self.tok(x), shape_of(x)
        if tok is None or shape is None or node.op != "call_function" or not isinstance(target, fx.Node):
            raise Whole("a loss of a split value that is not its input")
        if any(a is not x and a is not target for a in node.all_input_nodes):
            raise Whole("a loss with weights or other tensor operands")
        tshape, tspec = shape_of(target), target.meta.get(SPEC)
        classes = name in CLASS_LOSSES
        if tshape is None or not (classes or name in ELEMENTWISE_LOSSES):
            raise Whole(f"{name}")
        indices = classes and not tspec.dtype.is_floating_point
        if classes and len(shape) >= 2 and tok.dim == 1:
            raise Whole("the class dimension is split")
        out_dim = tok.dim - 1 if classes and tok.dim >= 2 else tok.dim      # the class dimension reduced
        at = out_dim if indices else tok.dim - (len(shape) - len(tshape))   # the target's split dimension
        if self.tok(target) is None:
            if at < 0 or tshape[at] not in (1, shape[tok.dim]):
                raise Whole("a target that does not line up with the predictions")
            if tshape[at] > 1:
                self.take(node, target, Tokens(at, tok.inner))
        elif self.tok(target) != Tokens(at, tok.inner):
            raise Whole("a target split otherwise")
        reduction = reduction_of(node)
        if reduction in ("none", 0):
            return Tokens(out_dim, tok.inner)
        if reduction in ("sum", 2):
            self._after(node, context_sum, (node, self.group))
            self.report["sums"] += 1
            return None
        if indices:
            return self._counted_mean(node, name)
        total = self._after(node, context_sum, (node, self.group))   # an elementwise mean: equal shares
        self._after(total, operator.truediv, (total, float(self.c)))
        self.report["sums"] += 1
        return None

    def _counted_mean(self, node: fx.Node, name: str):
        """A mean over the targets a class loss does not ignore: the ranks' sums over the
        ranks' counts."""
        if name != "vocab_parallel_cross_entropy" and argument(node, 2, "weight", None) is not None:
            raise Whole("a class-weighted mean")
        target = node.args[1] if len(node.args) > 1 else node.kwargs["target"]
        ignore = argument(node, 4, "ignore_index", -100)
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


def learned(gm: fx.GraphModule, value: fx.Node, steps: int = 5000) -> bool:
    """Whether ``value`` is computed from a parameter of ``gm`` (a learned attention bias,
    whose gradient the ring does not return); past ``steps`` ancestors, assumed so."""
    stack, seen = [value], set()
    while stack and len(seen) < steps:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "get_attr" and _is_parameter(gm, str(n.target)):
            return True
        if n.op == "call_module" and any(p.requires_grad for p in gm.get_submodule(str(n.target)).parameters()):
            return True
        if _metadata(n):   # x.device, x.size(): no values of x flow on
            continue
        stack.extend(n.all_input_nodes)
    return bool(stack)


def _metadata(node: fx.Node) -> bool:
    """Whether ``node`` reads only a tensor's metadata (device, dtype, sizes)."""
    name = bare_name(node)
    if name == "getattr":
        return len(node.args) > 1 and node.args[1] in ("device", "dtype", "shape", "ndim", "is_cuda", "layout")
    return name in ("size", "sym_size", "dim", "numel", "sym_numel", "get_device", "stride")


def _is_parameter(gm: fx.GraphModule, target: str) -> bool:
    """Whether the attribute path ``target`` names a parameter of ``gm``."""
    try:
        gm.get_parameter(target)
    except AttributeError:
        return False
    return True
