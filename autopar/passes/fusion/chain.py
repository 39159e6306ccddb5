"""The fusion IR: one chain of pointwise and row-wise operations, independent of fx.

A :class:`Chain` is what the fusion pass (:mod:`autopar.passes.fusion.rewrite`) reads out of a
rank's graph and what :mod:`autopar.passes.fusion.codegen` writes a Triton kernel for. Every
value of a chain is a view of one contiguous iteration space of ``numel`` elements; a
chain with a row reduction (softmax, layer norm) also has a row length ``n_cols`` (the
last dimension of every value) and is computed a tile of rows at a time.

Operations are primitives with a forward and a reverse rule (see ``codegen.OPS``).
Composite operations are expanded when the chain is built, so their backward follows
from the primitives' rules:

* ``softmax(x)`` → ``e = exp(x - rowmax(x)); e / rowsum(e)`` (``rowmax`` is a constant
  for differentiation: softmax is shift-invariant, so this is exact);
* ``layer_norm(x, w, b, eps)`` → ``d = x - rowmean(x); d * rsqrt(rowmean(d*d) + eps) * w + b``;
* ``gelu`` (exact, erf) and ``gelu_tanh`` (the tanh approximation) stay primitives with
  their closed-form derivatives (megatron §5.8 fuses bias+GeLU the same way).

Inputs are *full* (the shape of the value that reads them, read contiguously),
*trailing* (broadcast over leading dimensions: their shape, without leading ones, is
the trailing dimensions of the reader's shape; read at ``index % numel``; a bias, a
causal mask), *broadcast* (broadcast over any dimensions of the reader's shape, as
rotary embeddings' ``cos`` ``[B, 1, T, D]`` against the queries' ``[B, H, T, D]``: read at
the index its strides give, 0 on the broadcast dimensions, from sizes passed at run
time), *scalar* (a Python number the graph computes, e.g. ``1 / sqrt(head size)``) or
*seed* (a dropout site's Philox seed, an integer).

``rotate_half(x)`` (Llama's rotary embedding: ``cat(-x[..., h:], x[..., :h])`` over the
row, ``h = n_cols / 2``) reads a full input at the rotated column of the same row; its
backward needs the gradient of its output at the rotated columns, which the backward
kernel gets by computing its reverse sweep a second time at those columns.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "bool": torch.bool}
"""The dtypes generated kernels take, by the names the IR uses."""
DTYPE_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}


@dataclass(frozen=True)
class Input:
    name: str            # in0, in1, ... (seeds: seed0, ...)
    kind: str            # "full" | "trailing" | "broadcast" | "scalar" (a Python number computed in the
                         # graph) | "seed"
    dtype: str           # torch dtype name without "torch."; "int64" for seeds
    shape: tuple = ()    # as captured (unsharded), for reading; kernels take sizes at run time
    reader: tuple = ()   # broadcast: the shape rule of the values that read it (see Output)
    ndim: int = 0        # broadcast: how many dimensions those values have

    @property
    def differentiable(self) -> bool:
        return self.kind in TENSOR_KINDS and self.dtype in FLOAT_DTYPES


TENSOR_KINDS = ("full", "trailing", "broadcast")


@dataclass(frozen=True)
class Op:
    """``out = op(*args)``; an arg is a value name (an input's or an op's) or a constant."""
    out: str
    op: str
    args: tuple
    dtype: str = "float32"   # dtype of the value in the unfused graph (a cast rounds to it)
    source: str = ""         # the fx node it came from (not written into the source: identical
                             # blocks then share one kernel)
    what: str = ""           # what that node computes (gelu, softmax, ...), for reading


@dataclass(frozen=True)
class Output:
    """A value the rest of the graph reads. ``shape_rule`` gives its shape at run time
    (rank graphs keep the captured, unsharded shapes in their metadata, so shapes are
    taken from the tensors): ``("input", k)``, the shape of tensor input k, or
    ``("view", (d0, d1, ...))``, a literal reshape target (-1 resolved from the size)."""
    value: str
    dtype: str
    shape_rule: tuple


@dataclass
class Chain:
    """A fusible chain: inputs, primitive ops in order, outputs, and its iteration space."""
    inputs: list[Input]
    ops: list[Op]
    outputs: list[Output]
    numel: int                         # elements as captured (unsharded): checks and costs only
    n_cols: int | None = None          # row length as captured, when the chain has a row reduction
    pattern: str = "pointwise"         # a short name from its ops, e.g. bias_gelu, mask_softmax
    sources: list[str] = field(default_factory=list)   # the fx nodes it replaces, in order

    @property
    def rows(self) -> bool:
        return self.n_cols is not None

    @property
    def seeds(self) -> list[Input]:
        return [i for i in self.inputs if i.kind == "seed"]

    @property
    def tensors(self) -> list[Input]:
        return [i for i in self.inputs if i.kind in TENSOR_KINDS]

    @property
    def scalars(self) -> list[Input]:
        return [i for i in self.inputs if i.kind == "scalar"]


def pattern_name(ops: list[Op], inputs: list[Input]) -> str:
    """A readable name for a chain from what it does (megatron §4.2 names its kernels
    the same way): bias_gelu, scale_mask_softmax, dropout_add_layer_norm, ..."""
    trailing = {i.name for i in inputs if i.kind == "trailing" and i.dtype in FLOAT_DTYPES}
    numbers = {i.name for i in inputs if i.kind == "scalar"}
    broadcast = {i.name for i in inputs if i.kind == "broadcast" and i.dtype in FLOAT_DTYPES}
    words: list[str] = []
    composite = set()   # fx nodes expanded into several ops (softmax, layer norm, dropout): named once
    producer = {o.out: o for o in ops}
    rows = set()        # values with one element per row: named by the reduction that made them
    for o in ops:
        if o.source in composite:
            continue
        tag = None
        if o.op in ("rowmean", "rowsum") or (o.op != "mul" and any(a in rows for a in o.args)):
            rows.add(o.out)
        if o.what in ("softmax", "layer_norm", "rms_norm", "dropout"):
            tag = o.what
            composite.add(o.source)
        elif o.op == "rowmean" and _square(producer.get(o.args[0])):
            tag = "rms_norm"   # mean(x²) over the row: an RMS norm written out (Llama's)
        elif o.op in ("rowmean", "rowsum"):
            tag = o.op[3:]
        elif o.out in rows:
            tag = None
        elif o.op == "rotate_half":
            tag = "rotary"   # x * cos + rotate_half(x) * sin: rotary embeddings
        elif o.op == "add" and words and words[-1] == "rotary":
            continue
        elif o.op == "mul" and words and words[-1] == "silu" and all(
                isinstance(a, str) and a not in numbers and a not in trailing for a in o.args):
            words[-1] = "swiglu"   # silu(gate) * up: Llama's SwiGLU
            continue
        elif o.op == "add" and any(a in trailing for a in o.args):
            tag = "bias"
        elif o.op == "add" and any(a in broadcast for a in o.args):
            tag = "mask"   # an additive mask broadcast over heads and queries ([B, 1, 1, T])
        elif o.op == "add" and all(isinstance(a, str) and a not in numbers for a in o.args):
            tag = "add"
        elif o.op in ("mul", "div") and any(not isinstance(a, str) or a in numbers for a in o.args):
            tag = "scale"
        elif o.op == "where":
            tag = "mask"
        elif o.op in ("gelu", "gelu_tanh", "relu", "silu", "tanh", "sigmoid", "exp"):
            tag = "gelu" if o.op.startswith("gelu") else o.op
        if tag and (not words or words[-1] != tag):
            words.append(tag)
    return "_".join(words[:6]) or (ops[0].op if ops else "chain")


def _square(op: "Op | None") -> bool:
    """Whether ``op`` squares its input (``x ** 2`` or ``x * x``)."""
    return op is not None and ((op.op == "pow" and float(op.args[1]) == 2.0) or
                               (op.op == "mul" and op.args[0] == op.args[1]))
