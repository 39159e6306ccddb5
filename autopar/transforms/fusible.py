"""What the fusion pass can fuse: which fx nodes a generated kernel can compute, and how
they group into chains.

:func:`recognise` classifies one node: a :class:`Rec` (its kind, its tensor and constant
arguments, and attributes such as a view's target shape or a dropout's probability) for
pointwise arithmetic and activations, casts, views with literal shapes, masked_fill,
softmax and layer norm over the last dimension and autopar's rank-aware dropout, in
their symbolic-trace, method, module and ATen spellings; None for everything else
(matmuls, collectives, plain ``F.dropout``), which bounds a chain.

:class:`Chains` then grows chains in graph order: a fusible node joins the chains of its
fusible producers when it has as many elements and the merged chain can still be placed
(every input, and every dropout's seed, computed before the first outside reader of one
of its values), which keeps the graph acyclic and makes every value read outside the
chain an output of the kernel. :func:`drop_leading_views` and :func:`worth` leave out
what costs nothing alone. Turning a chain into kernel IR is :mod:`.chain_builder`'s; the
pass that rewrites the graph is :mod:`.fusion`.
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
from autopar.runtime import rng


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
              torch.masked_fill: "masked_fill", torch.where: "where", F.tanh: "tanh", F.sigmoid: "sigmoid"}
_ATEN = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "neg": "neg", "pow": "pow", "exp": "exp",
         "tanh": "tanh", "erf": "erf", "sigmoid": "sigmoid", "relu": "relu", "gelu": "gelu", "silu": "silu",
         "sqrt": "sqrt", "rsqrt": "rsqrt", "_softmax": "softmax", "softmax": "softmax", "layer_norm": "layer_norm",
         "view": "view", "_unsafe_view": "view", "reshape": "view", "clone": "view", "contiguous": "view",
         "alias": "view", "masked_fill": "masked_fill", "where": "where", "rsub": "rsub", "_to_copy": "cast",
         "to": "cast"}
_METHODS = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "neg": "neg", "pow": "pow", "exp": "exp",
            "tanh": "tanh", "sigmoid": "sigmoid", "relu": "relu", "sqrt": "sqrt", "rsqrt": "rsqrt",
            "softmax": "softmax", "view": "view", "reshape": "view", "contiguous": "view",
            "masked_fill": "masked_fill", "float": "cast", "half": "cast", "bfloat16": "cast", "to": "cast"}
_MODULES = ((nn.GELU, "gelu"), (nn.ReLU, "relu"), (nn.SiLU, "silu"), (nn.Tanh, "tanh"), (nn.Sigmoid, "sigmoid"),
            (nn.Identity, "view"), (nn.LayerNorm, "layer_norm"))
_DROPOUTS = {rng.replicated_dropout: "replicated", rng.sharded_dropout: "sharded"}
_ARITY = {"add": 2, "sub": 2, "mul": 2, "div": 2, "where": 3, "masked_fill": 3, "pow": 2}


def _kind(node: fx.Node, gm: fx.GraphModule) -> str | None:
    if node.op == "call_function":
        if node.target in _DROPOUTS:
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
    if kind == "dropout":
        return _dropout(node, args)
    return None


def recognise_all(gm: fx.GraphModule) -> dict[fx.Node, Rec]:
    """Every fusible node of ``gm`` with what it computes."""
    return {n: r for n in gm.graph.nodes if (r := recognise(n, gm)) is not None}


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
            set(kwargs) - {"dtype"} or not all(isinstance(a, torch.dtype) for a in args[1:])):
        return None   # .to(device) and friends are not casts
    if not _tensor_arg(args[0]) or tensor_spec(args[0]).dtype not in _FLOATS or spec.dtype not in _FLOATS:
        return None
    if "memory_format" in kwargs:
        return None
    return Rec("cast", [args[0]], {"dtype": spec.dtype})


def _softmax(args: list, kwargs: dict, spec: TensorSpec) -> Rec | None:
    """Softmax over the last dimension, in the input's dtype."""
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    ndim = len(spec.shape)
    if not _tensor_arg(args[0]) or dim not in (-1, ndim - 1) or (len(args) > 2 and args[2] is True):
        return None
    if kwargs.get("dtype") not in (None, tensor_spec(args[0]).dtype):
        return None
    return Rec("softmax", [args[0]])


def _layer_norm(node, gm, args, kwargs, spec) -> Rec | None:
    """Layer norm over the last dimension; a module's weight and bias by parameter name."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        shape, eps = tuple(module.normalized_shape), module.eps
        weight = f"{node.target}.weight" if module.weight is not None else None
        bias = f"{node.target}.bias" if module.bias is not None else None
    else:
        shape = tuple(args[1])
        weight = args[2] if len(args) > 2 else kwargs.get("weight")
        bias = args[3] if len(args) > 3 else kwargs.get("bias")
        eps = args[4] if len(args) > 4 else kwargs.get("eps", 1e-5)
    if len(shape) != 1 or shape[0] != spec.shape[-1] or not _tensor_arg(args[0]):
        return None
    for p in (weight, bias):
        if p is not None and not isinstance(p, (str, fx.Node)):
            return None
    return Rec("layer_norm", [args[0], weight, bias], {"eps": float(eps)})


def _dropout(node: fx.Node, args: list) -> Rec | None:
    """autopar's rank-aware dropout; a view when it drops nothing (eval, or p = 0)."""
    x, p, training = args[0], args[1], args[2]
    if not (_tensor_arg(x) and _number(p) and isinstance(training, bool)):
        return None
    if not training or p == 0:
        return Rec("view", [x], {"target": None})
    if not 0 < p < 1:
        return None
    return Rec("dropout", [x], {"p": float(p), "stream": _DROPOUTS[node.target], "group": args[3]})


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

    def grow(self) -> list[list[fx.Node]]:
        """The chains, each in graph order, in the order they were started."""
        next_id = 0
        for node in self.gm.graph.nodes:
            rec = self.recs.get(node)
            if rec is None:
                continue
            numel = _numel(node)
            producers = []
            for a in _inputs_of(node, rec):
                cid = self.chain_of.get(a)
                if cid is not None and cid not in producers and _numel(a) == numel:
                    producers.append(cid)
            joined = None
            for candidate in ([producers] if len(producers) > 1 else []) + [[c] for c in producers]:
                nodes = {n for c in candidate for n in self.members[c]} | {node}
                if self.placeable(nodes):
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
    return bool(real) and (len(real) >= min_ops or any(recs[n].kind in ("softmax", "layer_norm") for n in real))


__all__ = ["Chains", "Rec", "drop_leading_views", "recognise", "recognise_all", "scalar_node", "worth"]
