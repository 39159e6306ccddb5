"""What the fusion pass can fuse: which fx nodes a generated kernel can compute, and how
they group into chains.

:func:`recognise` classifies one node: a :class:`Rec` (its kind, its tensor and constant
arguments, and attributes such as a view's target shape or a dropout's probability) for
pointwise arithmetic and activations, casts, views with literal shapes, masked_fill,
softmax, layer norm and RMS norm over the last dimension, means and sums over the last
dimension that keep it (a row value: Llama's RMS norm written out, ``x.pow(2).mean(-1,
keepdim=True)``) and autopar's dropout (its mask over global indices), in
their symbolic-trace, method, module and ATen spellings; None for everything else
(matmuls, collectives, plain ``F.dropout``), which bounds a chain.

:class:`Chains` then grows chains in graph order: a fusible node joins the chains of its
fusible producers when it has as many elements (or one per row of the other: a row
reduction and what reads it) and the merged chain can still be placed
(every input, and every dropout's seed, computed before the first outside reader of one
of its values), which keeps the graph acyclic and makes every value read outside the
chain an output of the kernel. :func:`drop_leading_views` and :func:`worth` leave out
what costs nothing alone. Turning a chain into kernel IR is :mod:`.chain_builder`'s; the
pass that rewrites the graph is :mod:`.rewrite`.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar._torch_compat import is_aten_op
from autopar.ir import SPEC, TensorSpec, tensor_spec
from autopar.passes.fusion.codegen import MAX_ROW
from autopar.runtime import draws


@dataclass
class Rec:
    """A fusible node: ``kind`` and its tensor/constant ``args`` (fx nodes or numbers)."""
    kind: str
    args: list
    attrs: dict = field(default_factory=dict)


_FUNCTIONS = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
              operator.neg: "neg", operator.pow: "pow", torch.add: "add", torch.sub: "sub", torch.mul: "mul",
              torch.div: "div", torch.neg: "neg", torch.pow: "pow", torch.exp: "exp", torch.tanh: "tanh",
              torch.erf: "erf", torch.sigmoid: "sigmoid", torch.relu: "relu", F.relu: "relu", F.gelu: "gelu",
              F.silu: "silu", torch.sqrt: "sqrt", torch.rsqrt: "rsqrt", F.softmax: "softmax",
              torch.softmax: "softmax", F.layer_norm: "layer_norm", torch.reshape: "view",
              torch.masked_fill: "masked_fill", torch.where: "where", F.tanh: "tanh", F.sigmoid: "sigmoid",
              torch.mean: "mean", torch.sum: "sum", F.rms_norm: "rms_norm", torch.rms_norm: "rms_norm"}
_ATEN = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "neg": "neg", "pow": "pow", "exp": "exp",
         "tanh": "tanh", "erf": "erf", "sigmoid": "sigmoid", "relu": "relu", "gelu": "gelu", "silu": "silu",
         "sqrt": "sqrt", "rsqrt": "rsqrt", "_softmax": "softmax", "softmax": "softmax", "layer_norm": "layer_norm",
         "view": "view", "_unsafe_view": "view", "reshape": "view", "clone": "view", "contiguous": "view",
         "alias": "view", "masked_fill": "masked_fill", "where": "where", "rsub": "rsub", "_to_copy": "cast",
         "to": "cast", "mean": "mean", "sum": "sum", "rms_norm": "rms_norm"}
_METHODS = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "neg": "neg", "pow": "pow", "exp": "exp",
            "tanh": "tanh", "sigmoid": "sigmoid", "relu": "relu", "sqrt": "sqrt", "rsqrt": "rsqrt",
            "softmax": "softmax", "view": "view", "reshape": "view", "contiguous": "view",
            "masked_fill": "masked_fill", "float": "cast", "half": "cast", "bfloat16": "cast", "to": "cast",
            "mean": "mean", "sum": "sum"}
_MODULES = ((nn.GELU, "gelu"), (nn.ReLU, "relu"), (nn.SiLU, "silu"), (nn.Tanh, "tanh"), (nn.Sigmoid, "sigmoid"),
            (nn.Identity, "view"), (nn.LayerNorm, "layer_norm"), (nn.RMSNorm, "rms_norm"))
_ARITY = {"add": 2, "sub": 2, "mul": 2, "div": 2, "where": 3, "masked_fill": 3, "pow": 2}


def _kind(node: fx.Node, gm: fx.GraphModule) -> str | None:
    if node.op == "call_function" and node.target in (torch.cat, torch.ops.aten.cat.default):
        return "cat"
    if node.op == "call_function":
        if node.target is draws.dropout and node.kwargs.get("_form") == "dropout":
            return "dropout"
        if is_aten_op(node.target):
            packet = getattr(node.target, "overloadpacket", None)
            return _ATEN.get(getattr(packet, "__name__", ""))
        return _FUNCTIONS.get(node.target)
    if node.op == "call_method":
        return _METHODS.get(node.target)
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        return next((k for cls, k in _MODULES if type(module) is cls), None)
    return None


def _tensor_arg(a) -> bool:
    return isinstance(a, fx.Node) and isinstance(a.meta.get(SPEC), TensorSpec)


def _number(a) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool)


def scalar_node(a) -> bool:
    """A Python number the graph computes (``1.0 / math.sqrt(k.size(-1))`` under symbolic tracing)."""
    return isinstance(a, fx.Node) and a.op in ("call_function", "call_method") and a.meta.get(SPEC) is None \
        and a.target in _SCALAR_FUNCTIONS


_SCALAR_FUNCTIONS = {operator.truediv, operator.mul, operator.add, operator.sub, operator.floordiv, operator.pow,
                     operator.getitem, math.sqrt, operator.neg, "size"}


def recognise(node: fx.Node, gm: fx.GraphModule) -> Rec | None:
    """What ``node`` computes, when a generated kernel can compute it; else None."""
    kind = _kind(node, gm)
    spec = node.meta.get(SPEC)
    if kind is None or not isinstance(spec, TensorSpec):
        return None
    args, kwargs = list(node.args), dict(node.kwargs)   # a method's args[0] is self
    if kind in ("add", "sub", "mul", "div", "rsub", "pow", "where", "masked_fill"):
        return _arithmetic(kind, args, kwargs)
    if kind == "gelu":
        approximate = kwargs.get("approximate", "none")
        if node.op == "call_module":
            approximate = gm.get_submodule(node.target).approximate
            args = [args[0]]
        return Rec("gelu_tanh" if approximate == "tanh" else "gelu", [args[0]])
    if kind in ("neg", "exp", "tanh", "erf", "sigmoid", "relu", "silu", "sqrt", "rsqrt"):
        if kwargs.get("inplace") or len(args) < 1 or not _tensor_arg(args[0]):
            return None
        return Rec(kind, [args[0]])
    if kind == "view":
        return _view(node, args)
    if kind == "cast":
        return _cast(node, args, kwargs, spec)
    if kind == "softmax":
        return _softmax(args, kwargs, spec)
    if kind == "layer_norm":
        return _layer_norm(node, gm, args, kwargs, spec)
    if kind == "rms_norm":
        return _rms_norm(node, gm, args, kwargs, spec)
    if kind in ("mean", "sum"):
        return _row_reduction(kind, args, kwargs, spec)
    if kind == "cat":
        return _rotate_half(args, kwargs, spec, gm)
    if kind == "dropout":
        return _dropout(node, args)
    return None


def recognise_all(gm: fx.GraphModule) -> dict[fx.Node, Rec]:
    """Every fusible node of ``gm`` with what it computes (the nodes a ``rotate_half``
    absorbs are not fusible on their own: its kernel makes them dead)."""
    recs = {n: r for n in gm.graph.nodes if (r := recognise(n, gm)) is not None}
    for rec in list(recs.values()):
        for absorbed in rec.attrs.get("absorbs", ()):
            recs.pop(absorbed, None)
    return recs


def _arithmetic(kind: str, args: list, kwargs: dict) -> Rec | None:
    """``+ - * /``, ``rsub`` (as a sub), ``pow`` by a constant, ``where`` and ``masked_fill``."""
    if kind in ("add", "sub"):
        alpha = kwargs.pop("alpha", 1)
        if alpha != 1 or kwargs or len(args) != 2:
            return None
    if kind == "div" and (kwargs.get("rounding_mode") is not None or len(args) != 2):
        return None
    if kind == "rsub":
        if len(args) != 2 or kwargs.get("alpha", 1) != 1:
            return None
        kind, args = "sub", [args[1], args[0]]
    if len(args) != _ARITY[kind]:
        return None
    if kind == "pow":
        if not _tensor_arg(args[0]) or not _number(args[1]):
            return None
        return Rec("pow", [args[0]], {"exponent": float(args[1])})
    if not all(_tensor_arg(a) or _number(a) or scalar_node(a) for a in args):
        return None
    if kind == "masked_fill" and not (_tensor_arg(args[0]) and _tensor_arg(args[1]) and _number(args[2])):
        return None
    if kind == "where" and not (_tensor_arg(args[0]) and tensor_spec(args[0]).dtype == torch.bool):
        return None
    if not any(_tensor_arg(a) for a in args):
        return None
    return Rec(kind, args)


def _view(node: fx.Node, args: list) -> Rec | None:
    """A view with literal sizes (``target``), or a copy or identity (``target`` None)."""
    if not _tensor_arg(args[0]):
        return None
    if node.op == "call_module" or node.target in (torch.ops.aten.clone.default, torch.ops.aten.alias.default):
        return Rec("view", [args[0]], {"target": None})
    if node.op == "call_method" and node.target == "contiguous" or \
            getattr(node.target, "overloadpacket", None) is torch.ops.aten.contiguous:
        return Rec("view", [args[0]], {"target": None})
    shape = args[1:]
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = list(shape[0])
    if not shape or not all(isinstance(d, int) for d in shape):
        return None   # symbolic sizes: the kernel could not reshape its output without them
    return Rec("view", [args[0]], {"target": tuple(shape)})


_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _cast(node: fx.Node, args: list, kwargs: dict, spec: TensorSpec) -> Rec | None:
    """A cast between floating dtypes (not ``.to(device)``, not a memory format change)."""
    if node.op == "call_method" and node.target == "to" and (
            set(kwargs) - {"dtype"} or not all(isinstance(a, torch.dtype) or _dtype_of(a) for a in args[1:])):
        return None   # .to(device) and friends are not casts
    if not _tensor_arg(args[0]) or tensor_spec(args[0]).dtype not in _FLOATS or spec.dtype not in _FLOATS:
        return None
    if "memory_format" in kwargs:
        return None
    return Rec("cast", [args[0]], {"dtype": spec.dtype})


def _dtype_of(a) -> bool:
    """Whether ``a`` is a tensor's dtype read in the graph (``x.to(h.dtype)`` under
    symbolic tracing, as Llama's RMS norm casts back to its input's dtype)."""
    return isinstance(a, fx.Node) and a.op == "call_function" and a.target is getattr and a.args[1:] == ("dtype",)


def _softmax(args: list, kwargs: dict, spec: TensorSpec) -> Rec | None:
    """Softmax over the last dimension, in the input's dtype."""
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    ndim = len(spec.shape)
    if not _tensor_arg(args[0]) or dim not in (-1, ndim - 1) or (len(args) > 2 and args[2] is True):
        return None
    if kwargs.get("dtype") not in (None, tensor_spec(args[0]).dtype):
        return None
    return Rec("softmax", [args[0]])


def _literal_shape(shape) -> tuple:
    """A normalized shape written as integers (an int or a list of them); ``()`` for one
    the graph computes (``x.shape[-1:]`` under symbolic tracing), which no kernel is made for."""
    if isinstance(shape, int) and not isinstance(shape, bool):
        return (shape,)
    if isinstance(shape, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        return tuple(shape)
    return ()


def _layer_norm(node, gm, args, kwargs, spec) -> Rec | None:
    """Layer norm over the last dimension; a module's weight and bias by parameter name."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        shape, eps = tuple(module.normalized_shape), module.eps
        weight = f"{node.target}.weight" if module.weight is not None else None
        bias = f"{node.target}.bias" if module.bias is not None else None
    else:
        shape = _literal_shape(args[1] if len(args) > 1 else kwargs.get("normalized_shape"))
        weight = args[2] if len(args) > 2 else kwargs.get("weight")
        bias = args[3] if len(args) > 3 else kwargs.get("bias")
        eps = args[4] if len(args) > 4 else kwargs.get("eps", 1e-5)
    if len(shape) != 1 or shape[0] != spec.shape[-1] or not _tensor_arg(args[0]):
        return None
    for p in (weight, bias):
        if p is not None and not isinstance(p, (str, fx.Node)):
            return None
    return Rec("layer_norm", [args[0], weight, bias], {"eps": float(eps)})


def _rms_norm(node, gm, args, kwargs, spec) -> Rec | None:
    """RMS norm over the last dimension (``F.rms_norm``, ``nn.RMSNorm``); eps None is the
    dtype's machine epsilon, as torch has it."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        shape, eps = tuple(module.normalized_shape), module.eps
        weight = f"{node.target}.weight" if module.weight is not None else None
    else:
        shape = _literal_shape(args[1] if len(args) > 1 else kwargs.get("normalized_shape"))
        weight = args[2] if len(args) > 2 else kwargs.get("weight")
        eps = args[3] if len(args) > 3 else kwargs.get("eps")
    if len(shape) != 1 or shape[0] != spec.shape[-1] or not _tensor_arg(args[0]):
        return None
    if weight is not None and not isinstance(weight, (str, fx.Node)):
        return None
    if eps is None:
        eps = torch.finfo(spec.dtype).eps
    if not _number(eps):
        return None
    return Rec("rms_norm", [args[0], weight], {"eps": float(eps)})


def _row_reduction(kind: str, args: list, kwargs: dict, spec: TensorSpec) -> Rec | None:
    """A mean or sum over the last dimension that keeps it (``x.pow(2).mean(-1,
    keepdim=True)``, Llama's RMS norm written out): a row value of the chain."""
    if not args or not _tensor_arg(args[0]):
        return None
    x = tensor_spec(args[0])
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if isinstance(dim, (list, tuple)):
        dim = dim[0] if len(dim) == 1 else None
    if dim not in (-1, len(x.shape) - 1) or keepdim is not True or kwargs.get("dtype") is not None:
        return None
    if not x.shape or tuple(spec.shape) != tuple(x.shape[:-1]) + (1,):
        return None
    return Rec("row" + kind, [args[0]])


def _rotate_half(args: list, kwargs: dict, spec: TensorSpec, gm: fx.GraphModule) -> Rec | None:
    """``cat((-x[..., h:], x[..., :h]), dim=-1)`` with ``h`` half the last dimension:
    rotary embeddings' ``rotate_half`` (Llama, Mistral, Qwen2, ...), in its ATen
    (``slice``) and symbolic-trace (``x[..., :h]``) spellings. Its slices and negation
    are absorbed (``attrs["absorbs"]``): the kernel loads ``x`` at the rotated column."""
    pieces = args[0] if args else kwargs.get("tensors")
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if not isinstance(pieces, (list, tuple)) or len(pieces) != 2 or dim not in (-1, len(spec.shape) - 1):
        return None
    negated, first = pieces
    if not (isinstance(negated, fx.Node) and isinstance(first, fx.Node)) or len(negated.users) != 1 \
            or _kind(negated, gm) != "neg" or len(negated.args) != 1:
        return None
    second = negated.args[0]
    x2, x1 = _half_of(second, "second"), _half_of(first, "first")
    if x2 is None or x2 is not x1 or len(second.users) != 1 or len(first.users) != 1 \
            or tensor_spec(x1).shape != spec.shape:
        return None
    return Rec("rotate_half", [x1], {"absorbs": [negated, second, first]})


_END = 2**63 - 1


def _half_of(node, which: str) -> fx.Node | None:
    """``x`` when ``node`` is the ``which`` half of ``x``'s last dimension, else None."""
    if not isinstance(node, fx.Node) or not isinstance(node.meta.get(SPEC), TensorSpec) or not node.args:
        return None
    x = node.args[0]
    if not _tensor_arg(x) or not tensor_spec(x).shape:
        return None
    n = tensor_spec(x).shape[-1]
    if n % 2 or tensor_spec(node).shape != tensor_spec(x).shape[:-1] + (n // 2,):
        return None
    if node.target is torch.ops.aten.slice.Tensor:
        d, start, end = (list(node.args[1:4]) + [None, None, None])[:3]
        step = node.args[4] if len(node.args) > 4 else 1
        if d not in (-1, len(tensor_spec(x).shape) - 1) or step != 1:
            return None
        bounds = (start in (0, None), end == n // 2) if which == "first" else (start == n // 2, end in (n, _END, None))
        return x if all(bounds) else None
    if node.target is operator.getitem and isinstance(node.args[1], tuple) and len(node.args[1]) == 2 \
            and node.args[1][0] is Ellipsis and isinstance(node.args[1][1], slice):
        cut = node.args[1][1]   # x[..., :h] or x[..., h:], h possibly computed in the graph
        if cut.step not in (None, 1):
            return None
        if which == "first" and cut.start in (None, 0) and cut.stop is not None:
            return x
        if which == "second" and cut.stop is None and cut.start is not None:
            return x
    return None


def row_shaped(node: fx.Node, of: fx.Node) -> bool:
    """Whether ``node`` holds one value per row of ``of`` (its shape with the last dimension 1)."""
    a, b = tensor_spec(node).shape, tensor_spec(of).shape
    return bool(a) and len(a) == len(b) and a[-1] == 1 and tuple(a[:-1]) == tuple(b[:-1]) and b[-1] != 1


def _dropout(node: fx.Node, args: list) -> Rec | None:
    """autopar's dropout (:func:`autopar.runtime.draws.dropout`, its mask drawn over the
    value's global indices); a view when it drops nothing (eval, or p = 0)."""
    kwargs = node.kwargs
    x = args[0] if args else kwargs.get("input")
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    training = args[2] if len(args) > 2 else kwargs.get("training", kwargs.get("train", True))
    if not (_tensor_arg(x) and _number(p) and isinstance(training, bool)):
        return None
    if not training or p == 0:
        return Rec("view", [x], {"target": None})
    if not 0 < p < 1:
        return None
    return Rec("dropout", [x], {"p": float(p), "site": kwargs["_site"], "at": kwargs["_at"]})


# ------------------------------------------------------------------ growing chains

def _numel(node: fx.Node) -> int:
    return tensor_spec(node).numel


def _inputs_of(node: fx.Node, rec: Rec) -> list[fx.Node]:
    return [a for a in rec.args if isinstance(a, fx.Node)]


class Chains:
    """Grows chains of fusible nodes in graph order (see the module docstring)."""

    def __init__(self, gm: fx.GraphModule, recs: dict[fx.Node, Rec]):
        self.gm, self.recs = gm, recs
        self.pos = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.chain_of: dict[fx.Node, int] = {}
        self.members: dict[int, list[fx.Node]] = {}
        self.row_values: set[fx.Node] = set()   # a row reduction, and what computes on row values only

    def placeable(self, nodes: set[fx.Node]) -> bool:
        """Whether every input of ``nodes`` (and every dropout's seed) comes before the
        first node outside them that reads one of their values."""
        last_input, first_reader = -1, len(self.pos)
        for n in nodes:
            for a in _inputs_of(n, self.recs[n]):  # tensors and scalar nodes
                if a not in nodes:
                    last_input = max(last_input, self.pos[a])
            if self.recs[n].kind == "dropout":
                last_input = max(last_input, self.pos[n])   # its seed is drawn where it stood
            for u in n.users:
                if u not in nodes:
                    first_reader = min(first_reader, self.pos[u])
        return last_input < first_reader

    def rotations_load_inputs(self, nodes: set[fx.Node]) -> bool:
        """Whether every ``rotate_half`` among ``nodes`` rotates a value from outside them
        (its kernel loads its input at the rotated column: a value the chain computes is
        not in memory)."""
        return all(self.recs[n].kind != "rotate_half" or self.recs[n].args[0] not in nodes for n in nodes)

    def grow(self) -> list[list[fx.Node]]:
        """The chains, each in graph order, in the order they were started."""
        next_id = 0
        for node in self.gm.graph.nodes:
            rec = self.recs.get(node)
            if rec is None:
                continue
            numel = _numel(node)
            tensors = [a for a in _inputs_of(node, rec) if isinstance(a.meta.get(SPEC), TensorSpec)]
            if rec.kind in ("rowmean", "rowsum") or (tensors and all(a in self.row_values for a in tensors)):
                self.row_values.add(node)
            producers = []
            # a row reduction joins its producer's chain only when every reader of its value is
            # fusible (a row value cannot be a kernel's output) and its rows fit a row kernel
            alone = rec.kind == "rotate_half" or (rec.kind in ("rowmean", "rowsum") and (
                any(u not in self.recs for u in node.users) or tensor_spec(tensors[0]).shape[-1] > MAX_ROW))
            for a in (() if alone else tensors):   # rotate_half loads an input, never a chain's value
                cid = self.chain_of.get(a)
                # as many elements, or a row reduction of a chain's value, or a value of the
                # chain's shape reading a row value (rows of one length: checked when built)
                if cid is not None and cid not in producers and (
                        (_numel(a) == numel and (a in self.row_values) == (node in self.row_values))
                        or (node in self.row_values and rec.kind in ("rowmean", "rowsum") and row_shaped(node, a))
                        or (a in self.row_values and row_shaped(a, node))):
                    producers.append(cid)
            joined = None
            for candidate in ([producers] if len(producers) > 1 else []) + [[c] for c in producers]:
                nodes = {n for c in candidate for n in self.members[c]} | {node}
                if self.placeable(nodes) and self.rotations_load_inputs(nodes):
                    joined = candidate
                    break
            if joined is None:
                self.members[next_id] = [node]
                self.chain_of[node] = next_id
                next_id += 1
                continue
            keep = joined[0]
            for other in joined[1:]:
                for n in self.members.pop(other):
                    self.chain_of[n] = keep
                    self.members[keep].append(n)
            self.members[keep].append(node)
            self.chain_of[node] = keep
        return [sorted(ns, key=self.pos.__getitem__) for _, ns in sorted(self.members.items())]


def drop_leading_views(recs: dict) -> dict:
    """Views and no-op dropouts alone are free: a chain must start from a real op."""
    for node in [n for n, r in recs.items() if r.kind == "view"]:
        if not any(isinstance(a, fx.Node) and a in recs for a in recs[node].args):
            del recs[node]
    return recs


def worth(nodes: list[fx.Node], recs: dict, min_ops: int) -> bool:
    """Whether a chain is worth a kernel: ``min_ops`` real ops, or a row-wise one."""
    real = [n for n in nodes if recs[n].kind != "view"]
    return bool(real) and (len(real) >= min_ops or any(recs[n].kind in ROW_KINDS for n in real))


ROW_KINDS = ("softmax", "layer_norm", "rms_norm", "rowmean", "rowsum")
"""Recognised kinds that reduce over rows: a chain with one is computed a tile of rows at a time."""


__all__ = ["Chains", "ROW_KINDS", "Rec", "drop_leading_views", "recognise", "recognise_all", "row_shaped",
           "scalar_node", "worth"]
