"""Per-node work from shapes: FLOPs, bytes moved, and whether a node is a kernel at all.

Both graph spellings a capture produces are understood: ``torch.fx.symbolic_trace``
graphs (``call_module`` ``nn.Linear`` / ``nn.Conv2d`` / ``nn.LayerNorm``..., ``torch.matmul``,
``F.scaled_dot_product_attention``, ``x.view(...)`` methods) and ``torch.export`` graphs
(``aten.linear``, ``aten.addmm``, ``aten.mm``, ``aten.convolution``, ``aten.view``...).
Shapes come from ``node.meta[autopar.ir.SPEC]``, written by capture.

Conventions (forward only; :mod:`autopar.cost.model` applies the backward factors):

* matmul ``A[m×k] @ X[k×n]``: 2mkn FLOPs (Megatron PTD-P appendix), i.e. 2·numel(out)·k;
* attention ``softmax(QKᵀ)V``: 2·b·h·s_q·s_k·d + 2·b·h·s_q·s_k·d_v (= 4bh·s_q·s_k·d);
* convolution: 2·numel(out)·C_in/groups·∏kernel (transposed: 2·numel(in)·C_out/groups·∏kernel);
* any other kernel is memory-bound: FLOPs = numel of its output, bytes = inputs + outputs;
* views, ``getitem`` of a tuple, placeholders, parameters and size queries are no kernel;
  a view (``is_view``) still costs the host a Python call and an autograd node per pass.

Example (``nn.Linear(4, 8)`` on a ``[2, 4]`` input)::

    >>> node_work(linear_node, gm)
    NodeWork(flops=128, bytes_moved=256, is_matmul=True, is_kernel=True)

:func:`count_work_pass` (the first analysis pass) writes each node's work into
``node.meta[autopar.ir.WORK]``; the planner and the fork/join and repeated-block passes
read it from there.

Composite leaf modules (``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``) and
unusual contractions (``einsum``) are counted by running them on meta tensors under
``torch.utils.flop_counter.FlopCounterMode``.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from autopar._torch_compat import schema_of
from autopar.ir import SPEC, WORK, TensorSpec
from autopar.passes.analysis.ops import is_grouped_mm

log = logging.getLogger("autopar.analysis.flops")
aten = torch.ops.aten


@dataclass(frozen=True)
class NodeWork:
    """Forward work of one graph node."""

    flops: int          # forward FLOPs
    bytes_moved: int    # bytes read + written (inputs + outputs); 0 for views
    is_matmul: bool     # compute-bound: timed by cost.matmul_time
    is_kernel: bool     # launches a kernel (False for views, getitem, placeholders, get_attr, size queries)
    # a view (reshape, transpose, flatten...): no kernel, but a Python call and an autograd
    # node, so a pass costs the host's per-op overhead (cost.node_time)
    is_view: bool = False
    # elements evaluated through a transcendental function in forward (exp, tanh, erf,
    # sigmoid: activations, softmax, a loss's log-softmax, attention's softmax): on a CPU
    # these kernels are bound by the function's arithmetic, not by the bytes they move
    # (a GELU forward and backward takes 3.3x an add of the same shape on the 2-core
    # machine); priced by ``Hardware.special_element_s`` (0 on GPUs)
    special: int = 0


NO_WORK = NodeWork(0, 0, False, False)
VIEW_WORK = NodeWork(0, 0, False, False, True)


def _aten(*names: str) -> set:
    """Every overload of the named aten ops (those that exist in this torch)."""
    found = set()
    for name in names:
        packet = getattr(aten, name, None)
        if packet is not None:
            found.update(getattr(packet, o) for o in packet.overloads())
    return found


# matmul-like target -> index of the argument whose last dimension is the contracted k
_MATMUL_K_ARG: dict = {torch.matmul: 0, operator.matmul: 0, torch.mm: 0, torch.bmm: 0, F.linear: 0,
                       torch.addmm: 1, torch.baddbmm: 1}
_MATMUL_K_ARG.update({op: 0 for op in _aten("mm", "bmm", "matmul", "linear")})
_MATMUL_K_ARG.update({op: 1 for op in _aten("addmm", "baddbmm")})
_MATMUL_METHODS = {"matmul": 0, "mm": 0, "bmm": 0, "__matmul__": 0}

_SDPA = {F.scaled_dot_product_attention} | _aten(
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention")
_CONV = {F.conv1d, F.conv2d, F.conv3d} | _aten("conv1d", "conv2d", "conv3d")
_CONV_TRANSPOSE = {F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d} | _aten(
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_CONVOLUTION = _aten("convolution", "_convolution")  # args[6] says whether transposed
_EMBEDDING = {F.embedding} | _aten("embedding")

_VIEW_FUNCTIONS = {torch.reshape, torch.flatten, torch.squeeze, torch.unsqueeze, torch.split,
                   torch.chunk, torch.unbind, torch.transpose, torch.permute, torch.t, torch.narrow,
                   torch.select, torch.movedim, torch.swapaxes, torch.tensor_split, torch.broadcast_to,
                   torch.detach}
_VIEW_METHODS = {"view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze",
                 "unsqueeze", "transpose", "permute", "split", "chunk", "unbind", "expand", "expand_as",
                 "t", "narrow", "select", "movedim", "swapaxes", "detach", "size", "dim"}
_CAST_METHODS = {"to", "float", "half", "bfloat16", "double", "type_as", "type"}
_COPY = {"contiguous"} | _aten("contiguous")  # aliases by schema, but copies after a transpose
_COMPOSITE_FUNCTIONS = {torch.einsum, torch.tensordot, F.bilinear, F.multi_head_attention_forward,
                        torch.addbmm, torch.mv, torch.dot, torch.outer} | _aten("einsum", "addbmm")
_VIEW_MODULES = (nn.Identity, nn.Flatten, nn.Unflatten)


def _specs(value) -> list[TensorSpec]:
    """The tensor specs of a node (or nested args) as a flat list."""
    if isinstance(value, fx.Node):
        value = value.meta.get(SPEC)
    if isinstance(value, TensorSpec):
        return [value]
    if isinstance(value, (tuple, list)):
        return [s for v in value for s in _specs(v)]
    return []


def _spec(value) -> TensorSpec | None:
    found = _specs(value) if isinstance(value, fx.Node) else []
    return found[0] if found else None


def _input_bytes(node: fx.Node) -> int:
    return sum(s.nbytes for n in node.all_input_nodes for s in _specs(n))


def _kernel(node: fx.Node, out: list[TensorSpec], flops: int, is_matmul: bool, extra_bytes: int = 0) -> NodeWork:
    moved = _input_bytes(node) + sum(s.nbytes for s in out) + extra_bytes
    return NodeWork(int(flops), int(moved), is_matmul, True)


def _pointwise(node: fx.Node, out: list[TensorSpec], extra_bytes: int = 0) -> NodeWork:
    return _kernel(node, out, out[0].numel, False, extra_bytes)


def _gather(indices, out: list[TensorSpec]) -> NodeWork:
    """An embedding lookup: reads the indices and the looked-up rows (as many bytes as the
    output, not the whole table) and writes the output; no arithmetic."""
    return NodeWork(0, _spec(indices).nbytes + 2 * out[0].nbytes, False, True)


def _matmul_flops(out: TensorSpec, k_operand) -> int:
    k_spec = _spec(k_operand)
    return 2 * out.numel * (k_spec.shape[-1] if k_spec is not None and k_spec.shape else 1)


def _sdpa_flops(q, k, v, causal: bool = False) -> int:
    """2·s_q·s_k·(d + d_v) per (batch, head): QKᵀ and PV. ``causal``: only the pairs a
    query attends (key j ≤ query i, aligned at the top left as torch's ``is_causal``):
    a flash kernel skips the blocks above the diagonal (Dao, FlashAttention-2 §3.1.1),
    so about half the work at s_q = s_k."""
    q, k, v = _spec(q), _spec(k), _spec(v)
    s_q, d = q.shape[-2], q.shape[-1]
    s_k, d_v = k.shape[-2], v.shape[-1]
    batch_heads = q.numel // max(1, s_q * d)
    pairs = s_q * s_k
    if causal:  # Σ_{i<s_q} min(i + 1, s_k)
        full = min(s_q, s_k)
        pairs = full * (full + 1) // 2 + max(0, s_q - s_k) * s_k
    return 2 * batch_heads * pairs * (d + d_v)


def _is_causal(node: fx.Node) -> bool:
    """The ``is_causal`` argument of an attention node (by name in its schema; position 5
    of ``F.scaled_dot_product_attention``)."""
    if "is_causal" in node.kwargs:
        return bool(node.kwargs["is_causal"])
    schema = schema_of(node.target)
    names = [a.name for a in schema.arguments] if schema is not None else \
        ["query", "key", "value", "attn_mask", "dropout_p", "is_causal"]
    if "is_causal" in names and names.index("is_causal") < len(node.args):
        return bool(node.args[names.index("is_causal")])
    return False


def _conv_flops(out: TensorSpec, inp, weight_shape, transposed: bool) -> int:
    per_position = math.prod(weight_shape[1:])  # C_in/groups·∏kernel (or C_out/groups·∏kernel)
    if transposed:
        return 2 * _spec(inp).numel * per_position
    return 2 * out.numel * per_position


def _meta(value):
    """Meta-device stand-ins for a node's value, for counting on shapes alone."""
    spec = value.meta.get(SPEC)
    if isinstance(spec, TensorSpec):
        return torch.empty(spec.shape, dtype=spec.dtype, device="meta")
    if isinstance(spec, tuple):
        return tuple(None if s is None else torch.empty(s.shape, dtype=s.dtype, device="meta") for s in spec)
    raise ValueError(f"no tensor spec on {value.format_node()}")


def _counted_flops(node: fx.Node, call) -> int:
    """FLOPs that ``FlopCounterMode`` counts for ``call(*args, **kwargs)`` on meta tensors; 0 if
    it cannot run on shapes alone (e.g. an argument is a size computed at run time)."""
    try:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), _meta)
        with FlopCounterMode(display=False) as counter:
            call(*args, **kwargs)
        return int(counter.get_total_flops())
    except Exception as e:  # noqa: BLE001 - an estimate; the node still counts as a kernel
        log.debug("could not count FLOPs of %s on meta tensors: %s", node.format_node(), e)
        return 0


def _composite(node: fx.Node, out: list[TensorSpec], call, extra_bytes: int = 0) -> NodeWork:
    counted = _counted_flops(node, call)
    if counted:
        return _kernel(node, out, counted, True, extra_bytes)
    return _pointwise(node, out, extra_bytes)


def _is_view_op(target) -> bool:
    """An aten op whose every return aliases an input without writing it (``Tensor(a)``)."""
    schema = schema_of(target)
    if schema is None or not schema.returns:
        return False
    return all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def _casts(node: fx.Node, out: list[TensorSpec]) -> bool:
    first = _spec(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
    return first is not None and first.dtype != out[0].dtype


def _getitem_work(node: fx.Node, out: list[TensorSpec]) -> NodeWork:
    """``x[...]``: basic indexing is a view; indexing with a tensor is a gather kernel."""
    source, index = node.args[0], node.args[1]
    if not isinstance(source.meta.get(SPEC), TensorSpec):
        return NO_WORK  # picking one output of a multi-output node
    index_nodes: list[fx.Node] = []
    fx.node.map_arg(index, index_nodes.append)
    return _pointwise(node, out) if any(_spec(n) is not None for n in index_nodes) else NO_WORK


def _function_work(node: fx.Node, out: list[TensorSpec]) -> NodeWork:
    target, args = node.target, node.args
    if target in _MATMUL_K_ARG:
        return _kernel(node, out, _matmul_flops(out[0], args[_MATMUL_K_ARG[target]]), True)
    if is_grouped_mm(node):  # each row times its group's [k, n] matrix: 2·numel(out)·k
        return _kernel(node, out, _matmul_flops(out[0], args[0]), True)
    if target in _SDPA:
        q, k, v = (args + tuple(node.kwargs.get(n) for n in ("query", "key", "value")))[:3]
        return _kernel(node, out, _sdpa_flops(q, k, v, _is_causal(node)), True)
    if target in _CONV or target in _CONV_TRANSPOSE or target in _CONVOLUTION:
        transposed = target in _CONV_TRANSPOSE or (target in _CONVOLUTION and bool(args[6]))
        return _kernel(node, out, _conv_flops(out[0], args[0], _spec(args[1]).shape, transposed), True)
    if target in _EMBEDDING:  # F.embedding(indices, weight); aten.embedding(weight, indices)
        indices = args[0] if target is F.embedding else args[1]
        return _gather(indices, out)
    if target is operator.getitem:
        return _getitem_work(node, out)
    if target in _COPY:
        return _pointwise(node, out)
    if target in _VIEW_FUNCTIONS or _is_view_op(target):
        return _pointwise(node, out) if _casts(node, out) else VIEW_WORK
    if target in _COMPOSITE_FUNCTIONS or getattr(target, "overloadpacket", None) in flop_registry:
        return _composite(node, out, target)
    return _pointwise(node, out)


def _method_work(node: fx.Node, out: list[TensorSpec]) -> NodeWork:
    name = node.target
    if name in _MATMUL_METHODS:
        return _kernel(node, out, _matmul_flops(out[0], node.args[0]), True)
    if name in _CAST_METHODS:
        return _pointwise(node, out) if _casts(node, out) else NO_WORK
    if name in _VIEW_METHODS:
        return VIEW_WORK
    if name == "contiguous" or name == "clone":
        return _pointwise(node, out)
    return _pointwise(node, out)


def _module_work(node: fx.Node, module: nn.Module, out: list[TensorSpec]) -> NodeWork:
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    state_bytes = sum(t.numel() * t.element_size() for t in state.values())
    if isinstance(module, nn.Identity):
        return NO_WORK
    if isinstance(module, _VIEW_MODULES):
        return VIEW_WORK
    if isinstance(module, nn.Linear):
        return _kernel(node, out, 2 * out[0].numel * module.in_features, True, state_bytes)
    if isinstance(module, nn.modules.conv._ConvNd):
        flops = _conv_flops(out[0], node.args[0], tuple(module.weight.shape), module.transposed)
        return _kernel(node, out, flops, True, state_bytes)
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return _gather(node.args[0], out)
    if any(True for _ in module.children()) or isinstance(module, nn.MultiheadAttention):
        meta_state = {k: torch.empty_like(v, device="meta") for k, v in state.items()}
        return _composite(node, out, lambda *a, **kw: torch.func.functional_call(module, meta_state, a, kw),
                          state_bytes)
    return _pointwise(node, out, state_bytes)


def node_work(node: fx.Node, gm: fx.GraphModule) -> NodeWork:
    """The forward work of ``node`` (a node of ``gm``) from the shapes capture recorded,
    kept in ``node.meta[WORK]`` for its current spec (counted once per node)."""
    spec = node.meta.get(SPEC)
    cached = node.meta.get(WORK)
    if cached is not None and cached[0] is spec:
        return cached[1]
    work = _count(node, gm)
    node.meta[WORK] = (spec, work)
    return work


def node_flops(gm: fx.GraphModule, node: fx.Node) -> int:
    """Forward FLOPs of ``node`` when it is a matmul-like op (linear, matmul, convolution,
    attention core), else 0 (:func:`node_work` does the counting): what the fork/join and
    repeated-block passes record and the pipeline balances its stages by."""
    work = node_work(node, gm)
    return work.flops if work.is_matmul else 0


def _count(node: fx.Node, gm: fx.GraphModule) -> NodeWork:
    if node.op not in ("call_function", "call_method", "call_module"):
        return NO_WORK
    out = _specs(node)
    if not out:
        return NO_WORK  # size queries, Python arithmetic on sizes
    try:
        if node.op == "call_module":
            module = gm.get_submodule(node.target)
            work = _module_work(node, module, out)
            special = _special_elements(node, module, out)
        elif node.op == "call_method":
            work, special = _method_work(node, out), _special_elements(node, node.target, out)
        else:
            work, special = _function_work(node, out), _special_elements(node, node.target, out)
        return dataclasses.replace(work, special=special) if special and work.is_kernel else work
    except (AttributeError, IndexError, TypeError) as e:
        raise ValueError(f"cannot count the work of {node.format_node()} from its shapes "
                         f"({type(e).__name__}: {e}); is node.meta[{SPEC!r}] set on it and its inputs?") from e


_SPECIAL_NAMES = frozenset({"exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "sigmoid", "erf", "erfc",
                            "erfinv", "sin", "cos", "tan", "atan", "gelu", "silu", "mish", "softplus", "elu", "selu",
                            "celu", "logsigmoid", "softmax", "log_softmax", "_softmax", "_log_softmax",
                            "cross_entropy", "cross_entropy_loss", "logsumexp", "special_erf", "special_expit"})
"""Operations (functions, methods, ATen ops by name) that evaluate a transcendental
function per element."""
_OVER_INPUT = frozenset({"softmax", "log_softmax", "_softmax", "_log_softmax", "cross_entropy", "cross_entropy_loss",
                         "logsumexp"})
"""Of them, those whose count is their input's elements (a reduction's output is smaller)."""
_SPECIAL_MODULES = {nn.GELU: "gelu", nn.SiLU: "silu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.Softmax: "softmax",
                    nn.LogSoftmax: "log_softmax", nn.Mish: "mish", nn.Softplus: "softplus", nn.ELU: "elu",
                    nn.SELU: "selu", nn.CELU: "celu", nn.LogSigmoid: "logsigmoid",
                    nn.CrossEntropyLoss: "cross_entropy"}


def _special_elements(node: fx.Node, target, out: list[TensorSpec]) -> int:
    """Elements ``node`` evaluates through a transcendental function in forward
    (:attr:`NodeWork.special`): an activation's or exponential's output, a softmax's or
    cross-entropy's input, attention's scores (b·h·s_q·s_k, each through the softmax's exp)."""
    if isinstance(target, nn.Module):
        name = next((n for cls, n in _SPECIAL_MODULES.items() if isinstance(target, cls)), "")
    elif isinstance(target, str):
        name = target
    elif target in _SDPA:
        q, k = (node.args + tuple(node.kwargs.get(n) for n in ("query", "key")))[:2]
        q, k = _spec(q), _spec(k)
        if q is None or k is None or len(q.shape) < 2:
            return 0
        return int(math.prod(q.shape[:-1]) * k.shape[-2])
    else:
        packet = getattr(target, "overloadpacket", None)
        name = getattr(packet if packet is not None else target, "__name__", "")
    if name not in _SPECIAL_NAMES:
        return 0
    if name in _OVER_INPUT:
        first = _spec(node.args[0]) if node.args else None
        return int(first.numel) if first is not None else 0
    return int(out[0].numel)


def graph_work(gm: fx.GraphModule) -> dict[str, NodeWork]:
    """:func:`node_work` of every node of ``gm``, by node name, in graph order."""
    return {node.name: node_work(node, gm) for node in gm.graph.nodes}


def count_work_pass(gm: fx.GraphModule) -> fx.GraphModule:
    """The analysis pass that writes ``node.meta[WORK]`` on every node whose work its
    shapes tell (a node they do not is left without: whoever needs it counts it again
    and reports why it cannot). The graph is unchanged."""
    for node in gm.graph.nodes:
        try:
            node_work(node, gm)
        except ValueError:
            continue
    return gm


__all__ = ["NodeWork", "NO_WORK", "VIEW_WORK", "node_work", "graph_work", "count_work_pass"]
