"""Op classification shared by the analysis and rewrite passes.

The two tracers spell the same computation differently: ``symbolic_trace`` keeps
``call_module`` nodes for ``nn.Linear``, ``F.linear`` calls and ``x.view(...)`` methods,
while ``torch.export`` produces ``aten.addmm``/``aten.linear``/``aten.view`` with literal
shapes. Everything here answers "what is this node" independently of the spelling, so
passes are written once.

Example::

    >>> match_linear(node)          # for `%addmm = aten.addmm(%bias, %view, %weight)`
    LinearMatch(node=addmm, input=view, weight='model.h.0.mlp.c_fc.weight',
                bias='model.h.0.mlp.c_fc.bias', weight_layout='in_out', in_features=64, out_features=256)
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar._torch_compat import aten_name, is_aten_op
from autopar.ir import tensor_spec

aten = torch.ops.aten


def _targets(*names: str) -> set:
    out = set()
    for name in names:
        packet = getattr(aten, name, None)
        if packet is None:
            continue
        out.add(packet)
        for overload in packet.overloads():
            out.add(getattr(packet, overload))
    return out


LINEAR_FUNCTIONS = {F.linear} | _targets("linear")
CONCAT_FUNCTIONS = {torch.cat, torch.concat, torch.concatenate} | _targets("cat", "concat")
SLICE_FUNCTIONS = {torch.narrow} | _targets("slice", "narrow")
ADDMM_FUNCTIONS = _targets("addmm")
MATMUL_FUNCTIONS = {torch.matmul, operator.matmul, torch.mm, torch.bmm} | _targets("mm", "matmul", "bmm")
SDPA_FUNCTIONS = {F.scaled_dot_product_attention} | _targets(
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention")
SOFTMAX_FUNCTIONS = {F.softmax, torch.softmax} | _targets("softmax", "_softmax")
EMBEDDING_FUNCTIONS = {F.embedding} | _targets("embedding")
CROSS_ENTROPY_FUNCTIONS = {F.cross_entropy} | _targets("cross_entropy_loss")
DROPOUT_FUNCTIONS = {F.dropout, torch.dropout} | _targets("dropout", "native_dropout")
TRANSPOSE_FUNCTIONS = {torch.t, torch.transpose} | _targets("t", "transpose", "permute", "numpy_T")

VIEW_METHODS = {"view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "contiguous",
                "transpose", "permute", "split", "chunk", "unbind", "expand", "t"}
VIEW_FUNCTIONS = {torch.reshape, torch.flatten, torch.squeeze, torch.unsqueeze, torch.split,
                  torch.chunk, torch.unbind, torch.transpose, torch.permute, operator.getitem,
                  torch.view_as_complex, torch.view_as_real} | _targets(
    "view", "_unsafe_view", "reshape", "flatten", "squeeze", "unsqueeze", "clone", "contiguous",
    "transpose", "permute", "split", "split_with_sizes", "chunk", "unbind", "expand", "alias", "t",
    "_to_copy", "to", "lift_fresh_copy", "detach", "unflatten",
    # a complex view of pairs in the last dimension and back (a rotary embedding in complex
    # numbers): every dimension but the last keeps each element where it was
    "view_as_complex", "view_as_real")
# ``x[i]`` along one dimension: drops the others, so it is not view-like, but it is how
# ``torch.export`` takes Q, K and V out of ``nn.MultiheadAttention``'s packed projection
SELECT_FUNCTIONS = {torch.select} | _targets("select")

POINTWISE_MODULES = (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Dropout, nn.Identity,
                     nn.LeakyReLU, nn.ELU, nn.Mish, nn.Softplus)
POINTWISE_FUNCTIONS = {F.relu, F.gelu, F.silu, torch.tanh, torch.sigmoid, F.dropout, torch.relu,
                       F.leaky_relu, F.elu, F.mish, torch.mul, torch.add, operator.mul, operator.add,
                       operator.truediv, operator.sub, torch.pow, operator.pow, torch.exp, torch.erf,
                       torch.sqrt, torch.rsqrt, operator.neg} | _targets(
    "relu", "gelu", "silu", "tanh", "sigmoid", "mul", "add", "sub", "div", "pow", "dropout",
    "native_dropout", "exp", "erf", "sqrt", "rsqrt", "neg", "leaky_relu", "elu", "mish", "softplus",
    "where", "masked_fill", "clamp", "_to_copy", "to", "type_as", "abs", "log", "reciprocal")
POINTWISE_METHODS = {"relu", "gelu", "tanh", "sigmoid", "mul", "add", "sub", "div", "pow", "exp",
                     "float", "half", "bfloat16", "to", "type_as", "masked_fill", "clamp", "neg",
                     "sqrt", "rsqrt", "softmax"}


def is_call(node: fx.Node, targets: set) -> bool:
    return node.op == "call_function" and node.target in targets


def module_of(gm: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    """The module a ``call_module`` node calls (None for other nodes, or where its path
    names none). Read down the registered children (``_modules``), as
    ``nn.Module.get_submodule`` finds them without its attribute lookups (the planner
    asks for tens of thousands of them); anything else is left to ``get_submodule``."""
    if node.op != "call_module":
        return None
    mod = gm
    for atom in str(node.target).split("."):
        child = mod._modules.get(atom)
        if child is None:
            break
        mod = child
    else:
        return mod
    try:
        return gm.get_submodule(node.target)
    except AttributeError:
        return None


def parameter_name(node: fx.Node) -> tuple[str, bool] | None:
    """``(qualified parameter name, transposed)`` when ``node`` is a parameter, possibly
    through one transpose (``W.t()``, ``aten.t(W)``, ``permute(W, [1, 0])``)."""
    if node.op == "get_attr":
        return str(node.target), False
    if node.op in ("call_function", "call_method") and node.args and isinstance(node.args[0], fx.Node):
        inner = node.args[0]
        is_transpose = (node.op == "call_method" and node.target in ("t", "transpose", "permute")) or \
            (node.op == "call_function" and node.target in TRANSPOSE_FUNCTIONS)
        if is_transpose and inner.op == "get_attr":
            spec = tensor_spec(inner)
            if spec is not None and len(spec.shape) == 2:
                return str(inner.target), True
    return None


@dataclass(frozen=True)
class LinearMatch:
    """A matrix product of an activation with a parameter, whatever its spelling.

    ``weight_layout`` is ``"out_in"`` for ``nn.Linear``-style weights ([out, in]) and
    ``"in_out"`` for ``x @ W`` / ``addmm`` / Hugging Face ``Conv1D`` weights ([in, out]).
    A grouped matmul of mixture-of-experts layers (one weight per expert, each row of
    the input multiplied by its expert's: :func:`match_grouped_mm`) has a 3-D weight,
    ``"experts_out_in"`` ([experts, out, in], used transposed) or ``"experts_in_out"``
    ([experts, in, out]); ``experts`` is then the number of experts.
    """

    node: fx.Node
    input: fx.Node
    weight: str
    bias: str | None
    weight_layout: str
    in_features: int
    out_features: int
    spelling: str
    experts: int | None = None

    @property
    def out_dim_of_weight(self) -> int:
        return {"out_in": 0, "in_out": 1, "experts_out_in": 1, "experts_in_out": 2}[self.weight_layout]

    @property
    def in_dim_of_weight(self) -> int:
        return {"out_in": 1, "in_out": 0, "experts_out_in": 2, "experts_in_out": 1}[self.weight_layout]


def match_linear(node: fx.Node, gm: fx.GraphModule | None = None) -> LinearMatch | None:
    """Recognise ``node`` as a linear layer, or return None."""
    if node.op == "call_module" and gm is not None:
        mod = module_of(gm, node)
        if isinstance(mod, nn.Linear) and isinstance(node.args[0], fx.Node):
            return LinearMatch(node, node.args[0], f"{node.target}.weight",
                               f"{node.target}.bias" if mod.bias is not None else None,
                               "out_in", mod.in_features, mod.out_features, "nn.Linear")
        return None
    if node.op != "call_function":
        return None
    args = node.args
    if is_grouped_mm(node):
        return match_grouped_mm(node)
    if node.target in LINEAR_FUNCTIONS and len(args) >= 2:
        x, w = args[0], args[1]
        b = args[2] if len(args) > 2 else node.kwargs.get("bias")
        p = parameter_name(w) if isinstance(w, fx.Node) else None
        if p is None or p[1] or not isinstance(x, fx.Node):
            return None
        bias = parameter_name(b) if isinstance(b, fx.Node) else None
        if b is not None and bias is None:
            return None
        out_f, in_f = tensor_spec(w).shape
        return LinearMatch(node, x, p[0], bias[0] if bias else None, "out_in", in_f, out_f,
                           "F.linear" if node.target is F.linear else "aten.linear")
    if node.target in ADDMM_FUNCTIONS and len(args) >= 3 and not node.kwargs.get("beta", 1) != 1:
        b, x, w = args[0], args[1], args[2]
        p = parameter_name(w) if isinstance(w, fx.Node) else None
        bias = parameter_name(b) if isinstance(b, fx.Node) else None
        if p is None or bias is None or bias[1] or not isinstance(x, fx.Node):
            return None
        return _from_matmul(node, x, w, p, bias[0], "aten.addmm")
    if node.target in MATMUL_FUNCTIONS and len(args) >= 2:
        x, w = args[0], args[1]
        if not isinstance(x, fx.Node) or not isinstance(w, fx.Node) or parameter_name(x):
            return None
        p = parameter_name(w)
        if p is None:
            return None
        return _from_matmul(node, x, w, p, None, "matmul")
    return None


def _from_matmul(node, x, w, p, bias, spelling) -> LinearMatch | None:
    spec = tensor_spec(w)
    if spec is not None and len(spec.shape) == 3 and not p[1]:
        # a batched product of ``[experts, rows, in]`` with one 3-D parameter ``[experts,
        # in, out]`` (``bmm``, or ``matmul`` of two 3-D values): each expert's rows times
        # its own weight, as a grouped matmul with equal groups (Llama 4's experts)
        used = tensor_spec(x)
        if used is None or len(used.shape) != 3 or used.shape[0] != spec.shape[0] or used.shape[2] != spec.shape[1]:
            return None
        experts, rows, cols = spec.shape
        return LinearMatch(node, x, p[0], bias, "experts_in_out", rows, cols, "bmm", experts)
    if spec is None or len(spec.shape) != 2:
        return None
    rows, cols = spec.shape  # the shape of the operand as used: [in, out]
    layout = "out_in" if p[1] else "in_out"
    return LinearMatch(node, x, p[0], bias, layout, rows, cols, spelling)


# grouped matmuls: ``out[rows of group g] = input[rows of group g] @ weight[g]``, the
# groups given by cumulative row offsets (mixture-of-experts layers with the experts'
# weights in one 3-D tensor, as Hugging Face's Mixtral). Under torch.export transformers
# calls its own custom op (a loop over experts hidden from the tracer), eagerly torch's.
GROUPED_MM_FUNCTIONS = {f for f in (getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None)) if f}
GROUPED_MM_SCHEMAS = {"aten::_grouped_mm", "transformers::grouped_mm_fallback"}
_TRANSPOSE_TWO_DIMS = {torch.transpose} | _targets("transpose")


def is_grouped_mm(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    schema = getattr(node.target, "_schema", None)
    return node.target in GROUPED_MM_FUNCTIONS or getattr(schema, "name", None) in GROUPED_MM_SCHEMAS


def match_grouped_mm(node: fx.Node) -> LinearMatch | None:
    """A grouped matmul ``grouped_mm(x [rows, in], W [experts, in, out], offs)`` of an
    activation with a 3-D parameter, or with one transposed in its last two dimensions
    (``W.transpose(-2, -1)`` of ``[experts, out, in]``), as a :class:`LinearMatch`."""
    x, w = (node.args + (None, None))[:2]
    if not isinstance(x, fx.Node) or not isinstance(w, fx.Node) or any(
            isinstance(a, fx.Node) and a.op == "get_attr" for a in node.args[2:]):
        return None
    layout, param = "experts_in_out", w
    if w.op != "get_attr":
        is_transpose = (w.op == "call_method" and w.target == "transpose") or \
            (w.op == "call_function" and w.target in _TRANSPOSE_TWO_DIMS)
        inner = w.args[0] if w.args else None
        if not (is_transpose and isinstance(inner, fx.Node) and inner.op == "get_attr"):
            return None
        spec = tensor_spec(inner)
        if spec is None or len(spec.shape) != 3 or {d % 3 for d in w.args[1:3]} != {1, 2}:
            return None
        layout, param = "experts_out_in", inner
    spec, used = tensor_spec(param), tensor_spec(w)
    if spec is None or used is None or len(used.shape) != 3:
        return None
    experts, in_f, out_f = used.shape  # the operand as used: [experts, in, out]
    return LinearMatch(node, x, str(param.target), None, layout, in_f, out_f, "grouped_mm", experts)


def is_sdpa(node: fx.Node) -> bool:
    return is_call(node, SDPA_FUNCTIONS)


def is_softmax(node: fx.Node) -> bool:
    return is_call(node, SOFTMAX_FUNCTIONS) or (node.op == "call_method" and node.target == "softmax")


def is_activation_matmul(node: fx.Node) -> bool:
    """A matmul of two activations (attention scores or context), not a linear layer."""
    if node.op == "call_function" and node.target in MATMUL_FUNCTIONS:
        return all(isinstance(a, fx.Node) and parameter_name(a) is None for a in node.args[:2])
    return node.op == "call_method" and node.target in ("matmul", "bmm")


def is_view_like(node: fx.Node) -> bool:
    """Shape-only ops that keep each element's identity (what the head dimension flows through)."""
    if node.op == "call_method":
        return node.target in VIEW_METHODS
    return node.op == "call_function" and node.target in VIEW_FUNCTIONS


def is_select(node: fx.Node) -> bool:
    """``x.select(dim, i)`` / ``aten.select.int``: one index along one dimension."""
    return (node.op == "call_method" and node.target == "select") or is_call(node, SELECT_FUNCTIONS)


def is_pointwise(node: fx.Node, gm: fx.GraphModule | None = None) -> bool:
    if node.op == "call_module" and gm is not None:
        return isinstance(module_of(gm, node), POINTWISE_MODULES)
    if node.op == "call_method":
        return node.target in POINTWISE_METHODS
    return node.op == "call_function" and node.target in POINTWISE_FUNCTIONS


def is_embedding(node: fx.Node, gm: fx.GraphModule | None = None) -> tuple[fx.Node, str] | None:
    """``(ids node, weight name)`` when ``node`` is an embedding lookup."""
    if node.op == "call_module" and gm is not None:
        mod = module_of(gm, node)
        if isinstance(mod, nn.Embedding) and isinstance(node.args[0], fx.Node):
            return node.args[0], f"{node.target}.weight"
        return None
    if node.op == "call_function" and node.target in EMBEDDING_FUNCTIONS:
        if node.target is F.embedding:
            ids, w = node.args[0], node.args[1]
        else:
            w, ids = node.args[0], node.args[1]
        p = parameter_name(w) if isinstance(w, fx.Node) else None
        if p and not p[1] and isinstance(ids, fx.Node):
            return ids, p[0]
    return None


def is_cross_entropy(node: fx.Node, gm: fx.GraphModule | None = None) -> bool:
    if node.op == "call_module" and gm is not None:
        return isinstance(module_of(gm, node), nn.CrossEntropyLoss)
    return node.op == "call_function" and node.target in CROSS_ENTROPY_FUNCTIONS


def is_dropout(node: fx.Node, gm: fx.GraphModule | None = None) -> bool:
    if node.op == "call_module" and gm is not None:
        return isinstance(module_of(gm, node), nn.Dropout)
    return node.op == "call_function" and node.target in DROPOUT_FUNCTIONS


def call_name(node: fx.Node) -> str:
    """The op's bare name whatever the spelling (``aten.topk.default``, ``torch.topk``,
    ``x.topk``: ``"topk"``); ``""`` for modules, placeholders and attributes."""
    if node.op == "call_method":
        return str(node.target)
    if is_aten_op(node.target):
        return getattr(getattr(node.target, "overloadpacket", None), "__name__", "")
    return getattr(node.target, "__name__", "") if node.op == "call_function" else ""


def op_name(node: fx.Node) -> str:
    """A short, spelling-independent name for messages: ``aten.addmm``, ``F.linear``, ``Linear``."""
    if node.op == "call_module":
        return f"module {node.target}"
    if node.op == "call_method":
        return f".{node.target}()"
    target = node.target
    name = getattr(target, "__name__", str(target))
    if is_aten_op(target):
        name = aten_name(target)
    return name


RESHAPE_FUNCTIONS = {torch.reshape} | _targets("view", "_unsafe_view", "reshape")


def reshape_target(node: fx.Node) -> list | None:
    """The target shape of a ``view``/``reshape`` node as a list (entries are ints or
    nodes), or None when ``node`` is not one. Handles ``x.view(a, b)``, ``x.view((a, b))``
    and ``aten.view(x, [a, b])``."""
    if node.op == "call_method" and node.target in ("view", "reshape"):
        shape = node.args[1:]
    elif node.op == "call_function" and node.target in RESHAPE_FUNCTIONS:
        shape = node.args[1:]
    else:
        return None
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = shape[0]
    return list(shape)


# batch norm's arguments by spelling: (input, weight, bias, running_mean, running_var,
# training, momentum, eps) as positions in the call, with the defaults
_BN_ATEN = _targets("batch_norm")
_BN_ORDER = {"aten": (0, 1, 2, 3, 4, 5, 6, 7), "functional": (0, 3, 4, 1, 2, 5, 6, 7)}
_BN_NAMES = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")
_BN_DEFAULTS = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}


def batch_norm_arguments(node: fx.Node) -> dict | None:
    """The arguments of a batch norm that normalises over the batch (training mode, or
    no running statistics), by name, or None when ``node`` is not one. Module calls give
    ``module`` (the ``nn.BatchNorm*d``) and its attributes' names instead of nodes."""
    if node.op == "call_module":
        module = node.graph.owning_module.get_submodule(node.target)
        if not isinstance(module, nn.modules.batchnorm._BatchNorm):
            return None
        if not (module.training or module.running_mean is None):
            return None
        return {"module": module, "input": node.args[0] if node.args else node.kwargs["input"]}
    if node.op != "call_function" or not (node.target is F.batch_norm or node.target in _BN_ATEN):
        return None
    order = _BN_ORDER["functional" if node.target is F.batch_norm else "aten"]
    values = dict(_BN_DEFAULTS)
    for name, position in zip(_BN_NAMES, order):
        if position < len(node.args):
            values[name] = node.args[position]
    values.update({k: v for k, v in node.kwargs.items() if k in _BN_NAMES})
    if not (values["training"] or values.get("running_mean") is None):
        return None
    return values
