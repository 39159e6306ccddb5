"""Fusion pass: the pointwise chains and row-wise reductions of a rank's graph become
generated Triton kernels (megatron §4.2, §5.8: fused bias+GeLU, bias+dropout+add and
scale+mask+softmax gained 11-19% throughput).

It runs last, on each rank's rewritten graph, so collectives and matmuls are already in
place and bound every chain. Steps:

1. **Classify** every node: a fusible op (``_recognise``: pointwise arithmetic and
   activations, casts, views with literal shapes, masked_fill, softmax over the last
   dimension, layer norm over the last dimension, autopar's rank-aware dropout) or not.
   Matmuls, collectives, plain ``F.dropout`` (not rank-aware) and everything else are
   boundaries.
2. **Split biases** off linears whose output only feeds fusible ops, so the bias add
   moves into the kernel (Megatron's ``skip_bias_add``): ``addmm(b, x, w)`` becomes
   ``mm(x, w) + b``.
3. **Grow chains** in graph order: a fusible node joins the chains of its fusible
   producers when it has as many elements and the merged chain can still be placed:
   every input of the chain (and every dropout site's seed) is computed before the
   first node outside the chain that reads one of its values. That one test keeps
   the graph acyclic (a path chain → outside → chain would break it) and respects every
   other consumer: any value read outside the chain is an output of the kernel.
4. **Generate** each chain with at least two real ops (``autopar.kernels``), or log why
   it stays unfused: an unsupported dtype, broadcast, exponent or row length.
5. **Rewrite**: each dropout site keeps a ``dropout_seed`` node where it stood (so seeds
   are drawn in the unfused order and masks are equal), one ``fused_kernel`` call
   replaces the chain, and ``getitem`` nodes hand its outputs to their readers.

What was fused and what was not, with reasons, is in ``gm.meta[FUSION]``.
"""
from __future__ import annotations

import logging
import math
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar._torch_compat import is_aten_op
from autopar.ir import FUSION, SPEC, TensorSpec, tensor_spec
from autopar.kernels import codegen
from autopar.kernels.chain import DTYPE_NAMES, Chain, Input, Op, Output, pattern_name
from autopar.runtime import rng

log = logging.getLogger("autopar.fusion")

@dataclass
class FusionReport:
    kernels: list = field(default_factory=list)      # distinct FusedKernel objects, in graph order
    uses: list = field(default_factory=list)         # (kernel name, the fx node names it replaces)
    skipped: list = field(default_factory=list)      # (fx node names, reason)
    biases_split: int = 0

    def skip(self, nodes: list[fx.Node], reason) -> None:
        """Record (and log) that ``nodes`` stay unfused, and why."""
        names = [n.name for n in nodes]
        log.info("fusion: %s stay unfused: %s", ", ".join(names), reason)
        self.skipped.append((names, str(reason)))

    def summary(self) -> str:
        lines = [f"fusion: {len(self.uses)} chain(s) run by {len(self.kernels)} generated kernel(s); "
                 f"{self.biases_split} bias add(s) moved into them"]
        for name, nodes in self.uses:
            lines.append(f"  {name}: {', '.join(nodes)}")
        for names, reason in self.skipped:
            lines.append(f"  unfused {', '.join(names)}: {reason}")
        return "\n".join(lines)


# ------------------------------------------------------------------ recognising ops

@dataclass
class _Rec:
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


def _scalar_node(a) -> bool:
    """A Python number the graph computes (``1.0 / math.sqrt(k.size(-1))`` under symbolic tracing)."""
    return isinstance(a, fx.Node) and a.op in ("call_function", "call_method") and a.meta.get(SPEC) is None \
        and a.target in _SCALAR_FUNCTIONS


_SCALAR_FUNCTIONS = {operator.truediv, operator.mul, operator.add, operator.sub, operator.floordiv, operator.pow,
                     operator.getitem, math.sqrt, operator.neg, "size"}


def _recognise(node: fx.Node, gm: fx.GraphModule) -> _Rec | None:
    """What ``node`` computes, when a generated kernel can compute it; else None."""
    kind = _kind(node, gm)
    spec = node.meta.get(SPEC)
    if kind is None or not isinstance(spec, TensorSpec):
        return None
    args, kwargs = list(node.args), dict(node.kwargs)   # a method's args[0] is self
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
    if kind in _ARITY and len(args) != _ARITY[kind]:
        return None
    if kind == "pow":
        if len(args) != 2 or not _tensor_arg(args[0]) or not _number(args[1]):
            return None
        return _Rec("pow", [args[0]], {"exponent": float(args[1])})
    if kind in ("add", "sub", "mul", "div", "where", "masked_fill"):
        if not all(_tensor_arg(a) or _number(a) or _scalar_node(a) for a in args):
            return None
        if kind == "masked_fill" and not (_tensor_arg(args[0]) and _tensor_arg(args[1]) and _number(args[2])):
            return None
        if kind == "where" and not (_tensor_arg(args[0]) and tensor_spec(args[0]).dtype == torch.bool):
            return None
        if not any(_tensor_arg(a) for a in args):
            return None
        return _Rec(kind, args)
    if kind == "gelu":
        approximate = kwargs.get("approximate", "none")
        if node.op == "call_module":
            approximate = gm.get_submodule(node.target).approximate
            args = [args[0]]
        return _Rec("gelu_tanh" if approximate == "tanh" else "gelu", [args[0]])
    if kind in ("neg", "exp", "tanh", "erf", "sigmoid", "relu", "silu", "sqrt", "rsqrt"):
        if kwargs.get("inplace") or len(args) < 1 or not _tensor_arg(args[0]):
            return None
        return _Rec(kind, [args[0]])
    if kind == "view":
        if not _tensor_arg(args[0]):
            return None
        if node.op == "call_module" or node.target in (torch.ops.aten.clone.default, torch.ops.aten.alias.default):
            return _Rec("view", [args[0]], {"target": None})
        if node.op == "call_method" and node.target == "contiguous" or \
                getattr(node.target, "overloadpacket", None) is torch.ops.aten.contiguous:
            return _Rec("view", [args[0]], {"target": None})
        shape = args[1:]
        if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
            shape = list(shape[0])
        if not shape or not all(isinstance(d, int) for d in shape):
            return None   # symbolic sizes: the kernel could not reshape its output without them
        return _Rec("view", [args[0]], {"target": tuple(shape)})
    if kind == "cast":
        if node.op == "call_method" and node.target == "to" and (
                set(kwargs) - {"dtype"} or not all(isinstance(a, torch.dtype) for a in args[1:])):
            return None   # .to(device) and friends are not casts
        if not _tensor_arg(args[0]) or tensor_spec(args[0]).dtype not in _FLOATS or spec.dtype not in _FLOATS:
            return None
        if "memory_format" in kwargs:
            return None
        return _Rec("cast", [args[0]], {"dtype": spec.dtype})
    if kind == "softmax":
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        ndim = len(spec.shape)
        if not _tensor_arg(args[0]) or dim not in (-1, ndim - 1) or (len(args) > 2 and args[2] is True):
            return None
        if kwargs.get("dtype") not in (None, tensor_spec(args[0]).dtype):
            return None
        return _Rec("softmax", [args[0]])
    if kind == "layer_norm":
        return _layer_norm(node, gm, args, kwargs, spec)
    if kind == "dropout":
        x, p, training = args[0], args[1], args[2]
        if not (_tensor_arg(x) and _number(p) and isinstance(training, bool)):
            return None
        if not training or p == 0:
            return _Rec("view", [x], {"target": None})
        if not 0 < p < 1:
            return None
        return _Rec("dropout", [x], {"p": float(p), "stream": _DROPOUTS[node.target], "group": args[3]})
    return None


_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _layer_norm(node, gm, args, kwargs, spec) -> _Rec | None:
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
    return _Rec("layer_norm", [args[0], weight, bias], {"eps": float(eps)})


# ------------------------------------------------------------------ bias split

def _give_parameter_spec(gm: fx.GraphModule, node: fx.Node) -> None:
    """Write SPEC on a ``get_attr`` of a parameter that has none (added by a rewrite pass)."""
    if node.op != "get_attr" or node.meta.get(SPEC) is not None:
        return
    try:
        value = gm.get_parameter(node.target)
    except AttributeError:
        return
    node.meta[SPEC] = TensorSpec(tuple(value.shape), value.dtype)


def _linear_parts(node: fx.Node, gm: fx.GraphModule):
    """(matmul target, x, w, bias) of an ``addmm(b, x, w)``, ``linear(x, w, b)`` or
    ``nn.Linear`` node (its parameters as new ``get_attr`` nodes)."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        if type(module) is not nn.Linear or module.bias is None or len(node.args) != 1 or node.kwargs:
            return None
        with gm.graph.inserting_before(node):
            w = gm.graph.get_attr(f"{node.target}.weight")
            b = gm.graph.get_attr(f"{node.target}.bias")
        return F.linear, node.args[0], w, b
    if node.op != "call_function" or node.kwargs or len(node.args) != 3:
        return None
    if node.target is torch.ops.aten.addmm.default:
        bias, x, w = node.args
        return torch.ops.aten.mm.default, x, w, bias
    if node.target in (F.linear, torch.ops.aten.linear.default):
        x, w, bias = node.args
        return node.target, x, w, bias
    return None


def split_biases(gm: fx.GraphModule, fusible) -> int:
    """``linear(x, w, b)`` whose only reader (directly, or through one view whose readers
    all are) is fusible becomes ``linear(x, w) + b``, so the bias add joins the chain
    (Megatron's ``skip_bias_add``). Returns how many were split."""
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if node.op not in ("call_module", "call_function") or len(node.users) != 1:
            continue
        reader = next(iter(node.users))
        rec = _recognise(reader, gm)
        if rec is None:
            continue
        if rec.kind == "view":
            # the bias [N] broadcasts against the view only if the view keeps the last dimension
            keeps_rows = tensor_spec(reader).shape[-1:] == tensor_spec(node).shape[-1:] if \
                isinstance(node.meta.get(SPEC), TensorSpec) else False
            if not rec.attrs.get("target") or not keeps_rows or not reader.users or \
                    not all(fusible(u) for u in reader.users):
                continue
        elif not fusible(reader):
            continue
        parts = _linear_parts(node, gm)
        if parts is None or not isinstance(parts[3], fx.Node):
            continue
        target, x, w, bias = parts
        with graph.inserting_before(node):
            mm = graph.call_function(target, (x, w))
        mm.meta.update(node.meta)
        node.replace_all_uses_with(mm)
        graph.erase_node(node)
        anchor = reader if rec.kind == "view" else mm
        with graph.inserting_after(anchor):
            add = graph.call_function(torch.ops.aten.add.Tensor, (anchor, bias))
        add.meta[SPEC] = anchor.meta.get(SPEC)
        _give_parameter_spec(gm, bias)
        anchor.replace_all_uses_with(add, delete_user_cb=lambda user: user is not add)
        count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count


# ------------------------------------------------------------------ growing chains

def _numel(node: fx.Node) -> int:
    return tensor_spec(node).numel


def _inputs_of(node: fx.Node, rec: _Rec) -> list[fx.Node]:
    return [a for a in rec.args if isinstance(a, fx.Node)]


class _Chains:
    def __init__(self, gm: fx.GraphModule, recs: dict[fx.Node, _Rec]):
        self.gm, self.recs = gm, recs
        self.pos = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.chain_of: dict[fx.Node, int] = {}
        self.members: dict[int, list[fx.Node]] = {}

    def placeable(self, nodes: set[fx.Node]) -> bool:
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


# ------------------------------------------------------------------ building the IR



def _trailing(shape: tuple, reader: tuple) -> bool:
    stripped = list(shape)
    while stripped and stripped[0] == 1:
        stripped.pop(0)
    return len(stripped) <= len(reader) and tuple(reader[len(reader) - len(stripped):]) == tuple(stripped)


class _Builder:
    """Turns a list of fx nodes into a :class:`Chain` (raises codegen.Unsupported)."""

    def __init__(self, gm: fx.GraphModule, nodes: list[fx.Node], recs: dict[fx.Node, _Rec]):
        self.gm, self.nodes, self.recs = gm, nodes, recs
        self.inside = set(nodes)
        self.ops: list[Op] = []
        self.inputs: list[Input] = []
        self.input_nodes: list = []        # fx.Node or parameter name (str), per tensor input
        self.value: dict[fx.Node, str] = {}
        self.shape_rule: dict[str, tuple] = {}
        self.dropouts: list[tuple[fx.Node, str, str]] = []   # (node, stream, group)
        self.scalars: list[Input] = []
        self.scalar_nodes: list[fx.Node] = []
        self.n_cols: int | None = None

    def fresh(self) -> str:
        return f"v{len(self.ops)}"

    def emit(self, kind: str, args: tuple, node: fx.Node, dtype: str = "float32", rule: tuple | None = None) -> str:
        out = self.fresh()
        self.ops.append(Op(out, kind, tuple(args), dtype, node.name, self.recs[node].kind))
        if rule is None:
            rule = next((r for a in args if isinstance(a, str) and (r := self.shape_rule.get(a))), None)
        if rule:
            self.shape_rule[out] = rule
        return out

    def tensor_input(self, source, reader: fx.Node) -> str:
        """The input name of external value ``source`` (an fx node or a parameter name) read by ``reader``."""
        if isinstance(source, str):
            shape, dtype = tuple(self.gm.get_parameter(source).shape), self.gm.get_parameter(source).dtype
        else:
            spec = tensor_spec(source)
            shape, dtype = spec.shape, spec.dtype
        if dtype not in DTYPE_NAMES:
            raise codegen.Unsupported(f"{reader.name} reads {getattr(source, 'name', source)} of dtype {dtype}; "
                                      f"generated kernels take float32, float16, bfloat16 and bool")
        reader_shape = tensor_spec(reader).shape
        if shape == reader_shape:
            kind = "full"
        elif _trailing(shape, reader_shape):
            kind = "trailing"
        else:
            raise codegen.Unsupported(f"{reader.name} broadcasts {getattr(source, 'name', source)} of shape "
                                      f"{list(shape)} against {list(reader_shape)}; generated kernels take inputs "
                                      f"of the full shape or broadcast over leading dimensions only")
        for k, known in enumerate(self.input_nodes):
            if known == source:   # the same node (fx compares nodes by identity) or parameter name
                if self.inputs[k].kind != kind:
                    raise codegen.Unsupported(f"{getattr(source, 'name', source)} is read both whole and broadcast")
                return self.inputs[k].name
        name = f"in{len(self.input_nodes)}"
        self.inputs.append(Input(name, kind, DTYPE_NAMES[dtype], tuple(shape)))
        self.input_nodes.append(source)
        if kind == "full":
            self.shape_rule[name] = ("input", len(self.input_nodes) - 1)
        return name

    def scalar_input(self, node: fx.Node) -> str:
        if node in self.scalar_nodes:
            return self.scalars[self.scalar_nodes.index(node)].name
        self.scalar_nodes.append(node)
        self.scalars.append(Input(f"s{len(self.scalars)}", "scalar", "float32"))
        return self.scalars[-1].name

    def arg(self, a, reader: fx.Node):
        if a is None:
            return None
        if isinstance(a, fx.Node) and a not in self.inside and _scalar_node(a):
            return self.scalar_input(a)
        if isinstance(a, fx.Node):
            return self.value[a] if a in self.inside else self.tensor_input(a, reader)
        if isinstance(a, str):
            return self.tensor_input(a, reader)
        return float(a) if not isinstance(a, bool) else a

    def build(self) -> tuple[Chain, list]:
        for node in self.nodes:
            self.value[node] = self.node(node, self.recs[node])
        outputs = []
        for node in self.nodes:
            if any(u not in self.inside for u in node.users):
                value = self.value[node]
                rule = self.shape_rule.get(value)
                if rule is None:
                    raise codegen.Unsupported(f"{node.name} has no full-shaped input to take its shape from")
                outputs.append((node, Output(value, DTYPE_NAMES[tensor_spec(node).dtype], rule)))
        if not any(i.kind == "full" for i in self.inputs):
            raise codegen.Unsupported("no input of the full shape (the chain only broadcasts)")
        seeds = [Input(f"seed{k}", "seed", "int64") for k in range(len(self.dropouts))]
        chain = Chain(self.inputs + self.scalars + seeds, self.ops, [o for _, o in outputs], _numel(self.nodes[0]), self.n_cols,
                      pattern_name(self.ops, self.inputs + self.scalars), [n.name for n in self.nodes])
        codegen.check(chain)
        return chain, [n for n, _ in outputs]

    def node(self, node: fx.Node, rec: _Rec) -> str:
        spec = tensor_spec(node)
        dtype = DTYPE_NAMES.get(spec.dtype)
        if dtype is None or dtype == "bool":
            raise codegen.Unsupported(f"{node.name} computes {spec.dtype}; generated kernels compute float32, "
                                      f"float16 and bfloat16")
        args = [self.arg(a, node) for a in rec.args]
        k = rec.kind
        if k == "view":
            rule = ("view", rec.attrs["target"]) if rec.attrs.get("target") is not None else None
            return self.emit("view", args, node, dtype, rule)
        if k == "pow":
            return self.emit("pow", (args[0], rec.attrs["exponent"]), node, dtype)
        if k == "cast":
            return self.emit("cast", args, node, DTYPE_NAMES[rec.attrs["dtype"]])
        if k == "masked_fill":
            return self.emit("where", (args[1], float(args[2]), args[0]), node, dtype,
                             self.shape_rule.get(args[0]) if isinstance(args[0], str) else None)
        if k == "where":
            return self.emit("where", args, node, dtype)
        if k == "dropout":
            seed = f"seed{len(self.dropouts)}"
            self.dropouts.append((node, rec.attrs["stream"], rec.attrs["group"]))
            p = rec.attrs["p"]
            mask = self.emit("dropout_mask", (seed, p), node, "bool", ())
            scaled = self.emit("mul", (args[0], 1.0 / (1.0 - p)), node, dtype)
            return self.emit("where", (mask, scaled, 0.0), node, dtype, self.shape_rule.get(args[0]))
        if k in ("softmax", "layer_norm"):
            self.row(node, spec)
        if k == "softmax":
            x = args[0]
            m = self.emit("rowmax", (x,), node, dtype, ())
            e = self.emit("exp", (self.emit("sub", (x, m), node, dtype),), node, dtype)
            return self.emit("div", (e, self.emit("rowsum", (e,), node, dtype, ())), node, dtype)
        if k == "layer_norm":
            x, w, b = args
            d = self.emit("sub", (x, self.emit("rowmean", (x,), node, dtype, ())), node, dtype)
            var = self.emit("rowmean", (self.emit("mul", (d, d), node, dtype),), node, dtype, ())
            rstd = self.emit("rsqrt", (self.emit("add", (var, rec.attrs["eps"]), node, dtype, ()),), node, dtype, ())
            y = self.emit("mul", (d, rstd), node, dtype)
            if w is not None:
                y = self.emit("mul", (y, w), node, dtype)
            if b is not None:
                y = self.emit("add", (y, b), node, dtype)
            return y
        return self.emit(k, args, node, dtype)

    def row(self, node: fx.Node, spec: TensorSpec) -> None:
        n = spec.shape[-1]
        if self.n_cols not in (None, n):
            raise codegen.Unsupported(f"{node.name} reduces rows of {n}, another op of the chain rows of {self.n_cols}")
        self.n_cols = n


def _in_dependency_order(chains: list[list[fx.Node]]) -> tuple[list, list]:
    """``chains`` ordered so that a chain comes after every chain it reads from (each
    kernel's call is placed after its inputs, which may be another kernel's outputs), and
    the chains on a cycle of direct reads, which cannot be fused together."""
    owner = {n: k for k, nodes in enumerate(chains) for n in nodes}
    reads = {k: {owner[a] for n in nodes for a in n.all_input_nodes if a in owner and owner[a] != k}
             for k, nodes in enumerate(chains)}
    done: list[int] = []
    placed: set[int] = set()
    pending = list(range(len(chains)))
    while pending:
        ready = [k for k in pending if reads[k] <= placed]
        if not ready:
            break
        for k in ready:
            done.append(k)
            placed.add(k)
        pending = [k for k in pending if k not in placed]
    # what remains is on a cycle, or reads from one: those read from are left unfused too,
    # so the remaining chains are retried against them as plain nodes next time round
    return [chains[k] for k in done], [chains[k] for k in pending]


def _rows_consistent(chain: Chain, nodes: list[fx.Node]) -> None:
    if chain.rows:
        for n in nodes:
            if tensor_spec(n).shape[-1] != chain.n_cols:
                raise codegen.Unsupported(f"{n.name} has rows of {tensor_spec(n).shape[-1]}, the chain's reductions "
                                          f"rows of {chain.n_cols}")


# ------------------------------------------------------------------ the pass

def fusible_chains(gm: fx.GraphModule, min_ops: int = 2) -> list[list[fx.Node]]:
    """The chains the pass would fuse in ``gm`` (before checking what codegen supports):
    what the cost model prices as one kernel each. Reads the graph, changes nothing."""
    recs = {n: r for n in gm.graph.nodes if (r := _recognise(n, gm)) is not None}
    return [nodes for nodes in _Chains(gm, _drop_leading_views(recs)).grow() if _worth(nodes, recs, min_ops)]


def _drop_leading_views(recs: dict) -> dict:
    """Views and no-op dropouts alone are free: a chain must start from a real op."""
    for node in [n for n, r in recs.items() if r.kind == "view"]:
        if not any(isinstance(a, fx.Node) and a in recs for a in recs[node].args):
            del recs[node]
    return recs


def _worth(nodes: list[fx.Node], recs: dict, min_ops: int) -> bool:
    real = [n for n in nodes if recs[n].kind != "view"]
    return bool(real) and (len(real) >= min_ops or any(recs[n].kind in ("softmax", "layer_norm") for n in real))


def fusion_pass(gm: fx.GraphModule, *, min_ops: int = 2) -> fx.GraphModule:
    """Replace the fusible chains of ``gm`` by generated kernels (see the module docstring)."""
    from autopar.kernels.runtime import fused_kernel, register

    report = FusionReport()
    for node in gm.graph.nodes:   # parameters read by rewrite passes (a row-parallel bias) carry no spec
        _give_parameter_spec(gm, node)

    def recognise_all():
        return {n: r for n in gm.graph.nodes if (r := _recognise(n, gm)) is not None}

    recs = recognise_all()
    report.biases_split = split_biases(gm, lambda n: n in recs or _recognise(n, gm) is not None)
    recs = _drop_leading_views(recognise_all())
    graph = gm.graph
    replaced: dict[fx.Node, fx.Node] = {}   # an earlier kernel's output node -> its getitem
    chains = [nodes for nodes in _Chains(gm, recs).grow() if _worth(nodes, recs, min_ops)]
    ordered, cyclic = _in_dependency_order(chains)
    for nodes in cyclic:
        report.skip(nodes, "reads and is read by another fused chain (the two kernels would wait on each other)")
    for nodes in ordered:
        while nodes and recs[nodes[-1]].kind == "view":  # a trailing view is left to the graph
            nodes.pop()
        try:
            builder = _Builder(gm, nodes, recs)
            chain, out_nodes = builder.build()
            _rows_consistent(chain, nodes)
        except codegen.Unsupported as e:
            report.skip(nodes, e)
            continue
        late = _late_input(gm, nodes, builder, replaced)
        if late is not None:
            report.skip(nodes, f"its input {late} (another kernel's output) is computed after a reader of the "
                               f"chain's values")
            continue
        kernel = register(chain)
        if kernel not in report.kernels:
            report.kernels.append(kernel)
        report.uses.append((kernel.name, [n.name for n in nodes]))
        _replace(gm, nodes, builder, out_nodes, kernel.name, fused_kernel, replaced)
    graph.lint()
    gm.recompile()
    gm.meta[FUSION] = report
    return gm


def _late_input(gm: fx.GraphModule, nodes: list[fx.Node], builder: _Builder, replaced: dict) -> str | None:
    """The input that would come after a reader of the chain once earlier chains were
    replaced (an input from another kernel is ready only where that kernel's call went),
    or None when the chain can be placed (checked on the graph as it is now)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    inside = set(nodes)
    first_reader = min((order[u] for n in nodes for u in n.users if u not in inside), default=len(order))
    for source in builder.input_nodes + builder.scalar_nodes:
        if isinstance(source, fx.Node) and order[replaced.get(source, source)] >= first_reader:
            return replaced.get(source, source).name
    return None


def _replace(gm: fx.GraphModule, nodes: list[fx.Node], builder: _Builder, out_nodes: list[fx.Node], name: str,
             fused_kernel, replaced: dict) -> None:
    """Put one ``fused_kernel`` call in place of ``nodes``: after its last input (every
    reader of its outputs comes later: :meth:`_Chains.placeable`)."""
    graph = gm.graph
    seeds = []
    for node, stream, group in builder.dropouts:
        with graph.inserting_before(node):
            seeds.append(graph.call_function(rng.dropout_seed, (stream, group)))
    args = []
    for source in builder.input_nodes:
        if isinstance(source, str):   # a LayerNorm module's parameter
            with graph.inserting_before(nodes[0]):
                source = graph.get_attr(source)
        args.append(replaced.get(source, source))
    order = {n: i for i, n in enumerate(graph.nodes)}
    scalars = list(builder.scalar_nodes)
    last = max(args + scalars + seeds, key=order.__getitem__)
    with graph.inserting_after(last):
        call = graph.call_function(fused_kernel, (name, *args, *scalars, *seeds))
    getters = []
    with graph.inserting_after(call):
        for k in reversed(range(len(out_nodes))):   # inserting_after reverses successive inserts
            getters.insert(0, graph.call_function(operator.getitem, (call, k)))
    for node, getter in zip(out_nodes, getters):
        getter.meta[SPEC] = node.meta.get(SPEC)
        node.replace_all_uses_with(getter)
        replaced[node] = getter
    for node in reversed(nodes):
        graph.erase_node(node)
