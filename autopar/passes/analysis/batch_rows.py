"""Where the rows of a batch meet: the analysis that decides whether splitting the batch is exact.

Data parallelism, ZeRO, pipeline microbatches, gradient accumulation, D&SP's branches on
other rows and the 3D grid's row splits over ``z`` all give each rank (or each pass) a
part of the batch. That is exact only when every row's result depends on that row
alone, apart from the reductions autopar already makes the whole batch's: the loss's
reduction over the batch (averaged or summed over the parts), batch norm's statistics
(synchronised over the data ranks) and the routers' load-balancing statistics.

:func:`find_batch_couplings_pass` carries the batch through the graph: the inputs whose
first dimension is the batch (those the runtime splits, :func:`autopar.runtime.executable.local_batch`)
hold the rows in dimension 0, and every op moves, keeps or consumes those dimensions by
its own rule (a view regroups them, a matmul contracts or keeps them, a reduction over
them consumes them). A node where rows meet is a :class:`Coupling`:

==================  ======================================================  ==================
kind                what meets                                              exact remedy
==================  ======================================================  ==================
``pairwise``        a product of two batch operands, one row per row of     ``gather``
                    each (``q @ d.T``: a contrastive or retrieval score)
``batch_mean``      a mean over the batch that is not the loss's            ``all_reduce``
                    (``h - h.mean(0)``)
``batch_sum``       a sum over the batch that is not the loss's             ``all_reduce``
``masked_mean``     the loss as a ratio of two sums over the batch          ``all_reduce``
                    (``(per_token * mask).sum() / mask.sum()``)
``reduce``          another reduction over the batch (``var``, ``max``,     none
                    a norm over rows)
``scan``            an op along the batch (softmax, cumsum, sort, top-k)    none
``index``           an index, slice or split across the batch (``x[0]``,    none
                    ``x[perm]``, ``chunk`` along it)
``concat``          batch tensors concatenated along the batch              none
``outer``           batch operands broadcast against each other             none
                    (``a[:, None] - b[None, :]``)
``positional``      a tensor of row positions (``arange(batch)``) used as   none
                    a number against the rows
``contract``        a product that sums over the batch (``x.T @ y``)        none
``attention``       attention whose sequence is the batch                   none
``unknown``         an op with no rule that does not keep the batch         none
                    dimension where it was
==================  ======================================================  ==================

The exact remedies (:mod:`autopar.strategies.data.rewrite`, ``sync_batch_couplings``):
``gather`` all-gathers both operands over the data ranks (gradient: reduce-scatter of
the sum), so each rank computes its rows of the product against every row of the batch
and its columns against every row (``q_r @ D.T`` and ``d_r @ Q.T``, as open_clip's
``gather_with_grad`` and SigLIP do), and a target made of row positions
(``arange(batch)``) is offset by the rank's first row; ``all_reduce`` makes a batch
statistic the mean over the data ranks of each rank's (forward and backward, equal
shares; for a masked mean both the numerator and the denominator, whose ratio is then
the whole batch's). Those remedies
need the parts of the batch to be on different ranks at once: a split into microbatches
(a pipeline, gradient accumulation) or D&SP's branches cannot use them, and neither can
a coupling without a remedy; the planner then does not weigh those splits and refuses
them when forced, naming the node (:func:`split_conflict`).

Ops with no rule are assumed to keep rows apart when their output keeps the batch
dimensions where their input had them (a warning names them); otherwise they are a
coupling of kind ``unknown``. The result is ``gm.meta[BATCH_COUPLINGS]``, a list of
:class:`Coupling` in graph order, and ``gm.meta[LOSS_TERMS]``: the reductions over the
batch the loss is a linear combination of, each a ``"mean"`` or a ``"sum"`` (the data pass
weighs a sum's share by the number of parts when the loss also holds a mean, so that
averaging the parts' losses gives the single device's); the graph is unchanged.
"""
from __future__ import annotations

import logging
import math
import operator
import string
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar._torch_compat import argument_names, is_aten_op
from autopar.passes.analysis import ops
from autopar.passes.analysis.naming import module_paths, user_path
from autopar.ir import BATCH_COUPLINGS, LOSS_TERMS, SPEC, TensorSpec, regions

log = logging.getLogger("autopar.analysis.batch_rows")

aten = torch.ops.aten
EXACT = {"pairwise": "gather", "batch_mean": "all_reduce", "batch_sum": "all_reduce", "masked_mean": "all_reduce"}


@dataclass(frozen=True)
class Rows:
    """Where a value holds the batch: ``dims``, the dimensions whose index is (or starts
    with, folded) the row of the batch; ``pos``, dimensions whose *values* are row
    positions (``arange(batch)``)."""

    dims: frozenset = frozenset()
    pos: frozenset = frozenset()
    inner: frozenset = frozenset()   # (dim, elements per row inside it): the batch folded inside another dimension
    perm: bool = False               # the rows (or positions) in an order of the rank's own (a sort)
    inverse: bool = False            # positions that undo such an order

    @staticmethod
    def of(dims=(), pos=(), inner=(), perm=False, inverse=False) -> "Rows | None":
        dims, pos = frozenset(dims), frozenset(pos)
        inner = frozenset((d, f) for d, f in inner if d in dims)
        return Rows(dims, pos, inner, perm, inverse) if dims or pos else None

    def moved(self, where: dict) -> "Rows | None":
        """These rows with dimension ``d`` now at ``where[d]`` (dimensions not in it dropped)."""
        return Rows.of({where[d] for d in self.dims if d in where}, {where[d] for d in self.pos if d in where},
                       {(where[d], f) for d, f in self.inner if d in where}, self.perm, self.inverse)

    def shifted(self, by: int) -> "Rows | None":
        return self.moved({d: d + by for d in self.dims | self.pos})

    def without(self, dims) -> "Rows | None":
        """These rows with ``dims`` reduced away (kept as size 1: no shift)."""
        dims = set(dims)
        return Rows.of(self.dims - dims, self.pos - dims, self.inner, self.perm, self.inverse)

    def factor(self, dim: int, size: int, batch: int) -> int | None:
        """Elements per row of the batch inside dimension ``dim`` of ``size`` (None: unknown)."""
        for d, f in self.inner:
            if d == dim:
                return f
        return size // batch if batch and size % batch == 0 else None


@dataclass
class Coupling:
    """A node where rows of the batch meet (see the module docstring for the kinds)."""

    node: str
    op: str
    kind: str
    module: str
    why: str
    remedy: str | None = None
    nbytes: float = 0.0   # what the remedy moves per step (the gathered operands, the statistic)
    details: dict = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return self.remedy is not None

    def describe(self) -> str:
        where = f" (module {self.module})" if self.module else ""
        return f"{self.node}{where}: {self.why}"

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> "Coupling":
        return Coupling(**d)


def couplings(gm: fx.GraphModule) -> list[Coupling]:
    return list(gm.meta.get(BATCH_COUPLINGS, []))


# ---------------------------------------------------------------- op tables (both spellings)

_IDENTITY = {"clone", "contiguous", "detach", "alias", "lift_fresh_copy", "_to_copy", "to", "type_as", "float",
             "half", "bfloat16", "double", "int", "long", "bool", "type", "dropout", "native_dropout", "feature_dropout",
             "alpha_dropout", "_assert_tensor_metadata", "requires_grad_", "cpu", "cuda", "zeros_like", "ones_like",
             "empty_like", "full_like", "rand_like", "randn_like", "fill", "fill_", "copy", "copy_", "clone",
             "dropout1d", "dropout2d", "dropout3d", "replicated_dropout", "batch_statistic", "positive", "cumsum_"}
_OPERATOR = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
             operator.floordiv: "floor_divide", operator.mod: "remainder", operator.pow: "pow", operator.neg: "neg",
             operator.eq: "eq", operator.ne: "ne", operator.lt: "lt", operator.le: "le", operator.gt: "gt",
             operator.ge: "ge", operator.and_: "bitwise_and", operator.or_: "bitwise_or", operator.xor: "bitwise_xor",
             operator.invert: "bitwise_not", operator.abs: "abs", operator.iadd: "add", operator.imul: "mul",
             operator.isub: "sub", operator.itruediv: "div"}
_EXTRA_POINTWISE = {"floor_divide", "where", "masked_fill", "clamp", "clip", "gelu", "silu", "relu", "relu6",
                    "hardswish", "hardsigmoid", "mish", "softplus", "elu", "selu", "celu", "leaky_relu", "prelu",
                    "glu_pointwise", "logit", "nan_to_num", "clamp_min", "clamp_max", "lerp", "addcmul", "addcdiv",
                    "maximum", "minimum", "fmax", "fmin", "threshold", "hardtanh", "tanh", "sigmoid", "erf", "exp",
                    "log", "sqrt", "rsqrt", "square", "abs", "neg", "reciprocal", "sign", "logical_not",
                    "logical_and", "logical_or", "isnan", "isinf", "isfinite", "sin", "cos", "pow", "add", "sub",
                    "mul", "div", "true_divide", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_not", "masked_fill_",
                    "add_", "mul_", "sub_", "div_", "clamp_", "__and__", "__or__", "__xor__",
                    "__invert__", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "logical_xor",
                    "log_sigmoid", "logsigmoid", "softsign", "tanhshrink", "hardshrink", "softshrink"}
_REDUCTIONS = {"sum": "sum", "nansum": "sum", "mean": "mean", "nanmean": "mean", "amax": "other", "amin": "other",
               "max": "other", "min": "other", "prod": "other", "std": "other", "var": "other",
               "std_mean": "other", "var_mean": "other", "norm": "other", "linalg_vector_norm": "other",
               "vector_norm": "other", "logsumexp": "other", "argmax": "other", "argmin": "other", "all": "other",
               "any": "other", "count_nonzero": "other", "median": "other", "nanmedian": "other", "mode": "other",
               "aminmax": "other"}
# ops along one dimension: (position of dim among the arguments after the tensor, default)
_ALONG = {"softmax": (0, None), "_softmax": (0, None), "log_softmax": (0, None), "_log_softmax": (0, None),
          "cumsum": (0, None), "cumprod": (0, None), "cummax": (0, None), "cummin": (0, None),
          "logcumsumexp": (0, None), "sort": (0, -1), "argsort": (0, -1), "topk": (1, -1), "kthvalue": (1, -1),
          "diff": (1, -1), "glu": (0, -1), "normalize": (1, 1), "cosine_similarity": (1, 1), "flip": (0, None),
          "roll": (1, None), "fliplr": (0, 1), "flipud": (0, 0), "softmin": (0, None), "gumbel_softmax": (2, -1),
          "msort": (0, 0)}
_LOSSES = {"cross_entropy_loss", "cross_entropy", "nll_loss", "nll_loss_nd", "nll_loss2d", "mse_loss", "l1_loss",
           "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div",
           "soft_margin_loss", "poisson_nll_loss", "hinge_embedding_loss", "margin_ranking_loss",
           "multilabel_soft_margin_loss", "gaussian_nll_loss"}
_LOSSES |= {"multilabel_margin_loss", "multi_margin_loss", "cosine_embedding_loss", "triplet_margin_loss",
            "triplet_margin_with_distance_loss", "l1_loss", "mse_loss"}
_CLASS_LOSSES = {"cross_entropy_loss", "cross_entropy", "nll_loss", "nll_loss_nd", "nll_loss2d"}
_LEADING_BATCH = {"convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                  "conv_transpose3d", "_convolution", "max_pool1d", "max_pool2d", "max_pool3d",
                  "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d", "avg_pool3d",
                  "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d",
                  "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "upsample_nearest1d",
                  "upsample_nearest2d", "upsample_nearest3d", "upsample_bilinear2d", "upsample_bicubic2d",
                  "upsample_linear1d", "upsample_trilinear3d", "interpolate", "pad", "constant_pad_nd",
                  "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d", "pixel_shuffle",
                  "pixel_unshuffle", "group_norm", "native_group_norm", "instance_norm", "im2col", "col2im",
                  "unfold", "fold", "grid_sampler", "grid_sample", "channel_shuffle", "batch_norm",
                  "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                  "_native_batch_norm_legit_functional", "sync_batch_norm", "embedding_bag"}
_SDPA = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_cudnn_attention", "flex_attention"}
_FACTORIES = {"arange", "zeros", "ones", "full", "empty", "eye", "linspace", "logspace", "randn", "rand", "randint",
              "randperm", "scalar_tensor", "tensor", "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor",
              "empty_strided", "_tensor_constant", "full_like_scalar", "normal"}
_NO_VALUE = {"size", "dim", "numel", "sym_size", "sym_numel", "sym_stride", "sym_storage_offset", "len",
             "_assert_async", "_assert_scalar", "sym_constrain_range_for_size", "sym_constrain_range",
             "_local_scalar_dense", "item", "getattr", "stride", "is_floating_point", "get_device",
             "_set_grad_enabled", "manual_seed", "device", "isinstance", "_functional_assert_async"}
_VIEWS = {"view", "reshape", "_unsafe_view", "view_as", "reshape_as", "flatten", "unflatten", "_reshape_alias"}
_TRANSPOSES = {"t", "numpy_T", "mT", "T", "adjoint", "H", "mH"}
_MATMUL = {"matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "linear", "einsum", "bilinear", "_grouped_mm"}
_LINEAR_MODULES = (nn.Linear,)
_POINTWISE_MODULES = ops.POINTWISE_MODULES + (nn.Hardswish, nn.Hardsigmoid, nn.ReLU6, nn.SELU, nn.CELU,
                                             nn.PReLU, nn.Softsign, nn.Tanhshrink, nn.Threshold, nn.Hardtanh,
                                             nn.LogSigmoid, nn.AlphaDropout, nn.Dropout1d, nn.Dropout2d,
                                             nn.Dropout3d, nn.FeatureAlphaDropout)


def _aten_pointwise(name: str) -> bool:
    packet = getattr(aten, name, None)
    if packet is None or not hasattr(packet, "overloads"):
        return False
    return any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())


_POINTWISE_CACHE: dict[str, bool] = {}


def is_pointwise_name(name: str) -> bool:
    if name not in _POINTWISE_CACHE:
        _POINTWISE_CACHE[name] = name in _EXTRA_POINTWISE or _aten_pointwise(name.rstrip("_"))
    return _POINTWISE_CACHE[name]


def bare_name(node: fx.Node) -> str:
    """The op's name whatever the spelling; operators by their aten names."""
    if node.op == "call_function" and node.target in _OPERATOR:
        return _OPERATOR[node.target]
    if node.op == "call_function" and node.target is getattr:
        return str(node.args[1]) if len(node.args) > 1 and node.args[1] in _TRANSPOSES else "getattr"
    return ops.call_name(node)


def _arg(node: fx.Node, index: int, name: str, default=None):
    """Argument ``name`` of ``node``: by keyword, else at ``index`` (counted with the tensor
    first); for an ATen overload the schema's position wins."""
    if name in node.kwargs:
        return node.kwargs[name]
    if is_aten_op(node.target):
        names = argument_names(node.target)
        if name in names:
            i = names.index(name)
            return node.args[i] if i < len(node.args) else default
        return default
    return node.args[index] if index < len(node.args) else default


def _shape(value) -> tuple | None:
    spec = value.meta.get(SPEC) if isinstance(value, fx.Node) else None
    return tuple(spec.shape) if isinstance(spec, TensorSpec) else None


def _norm_dims(dims, ndim: int) -> list[int] | None:
    """Dimension arguments as non-negative ints; None for "every dimension"."""
    if dims is None:
        return None
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) for d in dims):
        return None
    if len(dims) == 0:
        return None
    return sorted({d % ndim if ndim else 0 for d in dims})


def _regroup(src: tuple, dst: tuple, r: "Rows", batch: int) -> "Rows | None":
    """``r`` (rows of a value of shape ``src``) on a view of it of shape ``dst``. Each batch
    dimension holds ``batch`` rows of ``factor`` elements, with more outside them when the
    batch is folded inside another dimension (``[T, B] -> [T·B]``); the view keeps that span
    of the flat elements, whichever output dimension holds it. A span that ends up across
    several output dimensions marks them all (and they meet rows if read apart)."""
    dims, inner, pos = set(), set(), set()

    def place(k: int, factor: int | None, out_dims: set, out_inner: set | None):
        stride_src = math.prod(src[k + 1:])
        lo, hi = stride_src * (factor if factor else 1), stride_src * src[k]
        if factor:
            hi = lo * batch if lo * batch <= stride_src * src[k] else hi
        # the flat span [lo, hi) of one batch index step .. the whole batch, in dst's strides
        for m in range(len(dst)):
            stride = math.prod(dst[m + 1:])
            top = stride * dst[m]
            if dst[m] == 1:
                continue
            if stride <= lo and hi <= top and lo % stride == 0 and factor:
                out_dims.add(m)
                if out_inner is not None:
                    f = lo // stride
                    if f * batch != dst[m]:
                        out_inner.add((m, f))
                return
        for m in range(len(dst)):   # across several dimensions: every one it covers
            stride = math.prod(dst[m + 1:])
            if dst[m] != 1 and stride < hi and stride * dst[m] > lo:
                out_dims.add(m)
                if out_inner is not None:
                    out_inner.add((m, -1))

    for k in r.dims:
        place(k, r.factor(k, src[k], batch), dims, inner)
    for k in r.pos:
        place(k, src[k] // batch if batch and src[k] % batch == 0 else None, pos, None)
    return Rows.of(dims, pos, inner, r.perm, r.inverse)


# ---------------------------------------------------------------- the walk


class _Walk:
    def __init__(self, gm: fx.GraphModule, batch: int):
        self.gm, self.batch = gm, batch
        self.state: dict[fx.Node, Any] = {}
        self.found: list[Coupling] = []
        self.unknown: list[str] = []
        self.reductions: list[tuple[fx.Node, str]] = []   # reductions over the batch: (node, sum|mean|other)
        self.loss_terms: list[tuple[str, str]] = []       # of those, the loss's: (node name, sum|mean)
        self.pairwise: list[fx.Node] = []
        self.counts: list[fx.Node] = []   # counts of rows per value (histc, bincount)
        self.statistics: set[str] = set()

    # ------------------------------------------------------------ helpers
    def rows(self, value) -> Rows | None:
        if isinstance(value, fx.Node):
            s = self.state.get(value)
            return s if isinstance(s, Rows) else None
        return None

    def module(self, node: fx.Node) -> str:
        paths = module_paths(node)
        return user_path(self.gm, paths[-1]) if paths else ""

    def couple(self, node: fx.Node, kind: str, why: str, **details) -> None:
        if any(c.node == node.name for c in self.found):
            return
        self.found.append(Coupling(node.name, ops.op_name(node), kind, self.module(node), why,
                                   EXACT.get(kind) if kind not in ("pairwise", "masked_mean") else None,
                                   details=details))

    def tensor_args(self, node: fx.Node) -> list[fx.Node]:
        return [a for a in node.all_input_nodes if self.rows(a) is not None]

    # ------------------------------------------------------------ rules
    def run(self) -> None:
        for node in self.gm.graph.nodes:
            try:
                self.state[node] = self.visit(node)
            except Exception as e:  # a rule that cannot read its node: said, and taken as a meeting of rows
                if any(self.rows(a) is not None for a in node.all_input_nodes):
                    self.couple(node, "unknown", f"its rule could not read it ({type(e).__name__}: {e})")
                self.state[node] = self._fallback_rows(node)

    def visit(self, node: fx.Node):
        if node.op == "placeholder":
            shape = _shape(node)
            return Rows.of({0}) if shape and shape[0] == self.batch else None
        if node.op in ("get_attr", "output"):
            return None
        inputs = self.tensor_args(node)
        tuple_in = [a for a in node.all_input_nodes if isinstance(self.state.get(a), tuple)]
        name = bare_name(node)
        if name == "getattr" and node.args and isinstance(self.state.get(node.args[0]), tuple) \
                and node.args[1] in ("values", "indices"):   # a named tuple's field (sort, topk, max)
            return self.state[node.args[0]][0 if node.args[1] == "values" else 1]
        if name in ("getitem",) and node.args and isinstance(self.state.get(node.args[0]), tuple):
            items = self.state[node.args[0]]
            i = node.args[1]
            return items[i] if isinstance(i, int) and -len(items) <= i < len(items) else None
        if name in _FACTORIES:
            return self.factory(node, name)
        if not inputs and not tuple_in:
            return None
        if node.op == "call_module":
            return self.module_rule(node, inputs)
        if name in _NO_VALUE:
            return None
        if name in _IDENTITY:
            return self._like(node, node.args[0] if node.args and isinstance(node.args[0], fx.Node) else inputs[0])
        if name in _TRANSPOSES:
            return self.permute(node, None, transpose=(-2, -1))
        if name in ("transpose", "swapaxes", "swapdims"):
            return self.permute(node, None, transpose=(node.args[1], node.args[2]))
        if name == "permute":
            order = node.args[1:] if len(node.args) > 2 else node.args[1]
            return self.permute(node, list(order))
        if name == "movedim" or name == "moveaxis":
            return self.movedim(node)
        if name in _VIEWS or name in ("squeeze", "unsqueeze", "expand", "expand_as", "broadcast_to", "repeat",
                                      "tile", "atleast_2d", "atleast_3d"):
            return self.regroup(node, name)
        if name in ("select", "narrow", "slice", "index_select", "select_scatter", "slice_scatter"):
            return self.select(node, name)
        if name in ("split", "split_with_sizes", "chunk", "unbind", "tensor_split", "unsafe_split"):
            return self.split(node, name)
        if name in ("cat", "concat", "concatenate", "stack", "hstack", "vstack"):
            return self.cat(node, name)
        if name == "getitem":
            return self.getitem(node)
        if name == "index":
            return self.index(node)
        if name.rstrip("_") in ("gather", "take_along_dim", "scatter", "scatter_add", "scatter_reduce", "index_add",
                                "index_copy", "index_fill", "index_put", "index_reduce", "masked_scatter") \
                or name == "index_put_":
            return self.gather(node, name)
        if name == "embedding":
            ids = node.args[1] if is_aten_op(node.target) else node.args[0]
            r = self.rows(ids)
            if r is not None and r.pos and not r.dims and bare_positions(ids):
                self.couple(node, "positional", "a table is read at the rows' positions (arange over the batch), "
                                                "which differ on each rank")
            return Rows.of(r.dims, (), r.inner, r.perm) if r else None
        if name in _MATMUL or (node.op == "call_function" and node.target in ops.LINEAR_FUNCTIONS):
            return self.matmul(node, name)
        if name in _SDPA:
            return self.attention(node)
        if name in ("tril", "triu", "diagonal", "diag", "diag_embed"):
            r = self.rows(node.args[0])
            shape = _shape(node.args[0])
            if r is not None and shape and (r.dims | r.pos) & {len(shape) - 1, len(shape) - 2} and \
                    node.args[0] not in self.pairwise_values:
                self.couple(node, "positional", f"{name} reads the batch's rows by their positions")
            elif r is not None and node.args[0] in self.pairwise_values:
                self.couple(node, "positional", f"{name} reads a pairwise score by its rows' positions")
            return self._fallback_rows(node)
        if name in ("broadcast_tensors",):
            spec = node.meta.get(SPEC)
            first = spec[0] if isinstance(spec, (tuple, list)) and spec else None
            out = self.pointwise(node, name, shape=tuple(first.shape) if isinstance(first, TensorSpec) else None)
            return tuple(out for _ in (node.args[0] if node.args else ()))
        if name in ("one_hot",):
            r = self.rows(node.args[0])
            return r
        if name in ("cosine_similarity", "pairwise_distance", "dist", "cdist", "inner", "tensordot", "kron",
                    "outer", "ger"):
            return self.binary_rows(node, name)
        if name == "repeat_interleave" and node.args and isinstance(node.args[0], fx.Node):
            return self.repeat_rows(node)
        if name in ("histc", "bincount"):
            r = self.rows(node.args[0])
            if r is not None and r.dims:
                self.counts.append(node)
            return None
        if name in ("grouped_mm_fallback", "_grouped_mm", "grouped_mm"):
            r = self.rows(node.args[0])
            return Rows.of(r.dims, (), r.inner, r.perm) if r else None
        if name in _LOSSES:
            return self.loss(node, name)
        if name in ("min", "max") and len([a for a in node.args[1:2] if isinstance(a, fx.Node)]) == 1:
            return self.pointwise(node, name)   # the elementwise minimum / maximum of two tensors
        if name in _REDUCTIONS:
            return self.reduction(node, name)
        if name in _ALONG:
            return self.along(node, name)
        if name in ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "local_response_norm"):
            return self.layer_norm(node)
        if name in _LEADING_BATCH:
            return self.leading(node, inputs[0] if not isinstance(node.args[0], fx.Node) else node.args[0])
        if is_pointwise_name(name):
            return self.pointwise(node, name)
        return self.unknown_op(node, name, inputs)

    def _fallback_rows(self, node: fx.Node):
        for a in node.all_input_nodes:
            r = self.rows(a)
            if r is not None and _shape(a) == _shape(node):
                return Rows.of(r.dims, (), r.inner, r.perm)
        return None

    def _like(self, node: fx.Node, src) -> Any:
        s = self.state.get(src) if isinstance(src, fx.Node) else None
        if isinstance(s, tuple):
            return s
        shape_in, shape_out = _shape(src), _shape(node)
        if s is None or shape_in is None or shape_out is None or len(shape_in) == len(shape_out):
            return s if not isinstance(node.meta.get(SPEC), tuple) else (s, s)
        return self._fallback_rows(node)

    def factory(self, node: fx.Node, name: str):
        shape = _shape(node)
        if name == "arange" and shape is not None and len(shape) == 1 and shape[0] == self.batch and self.batch > 1:
            return Rows.of(pos={0})
        if name == "eye" and shape is not None and shape[:1] == (self.batch,) and self.batch > 1:
            return Rows.of(pos={0, 1})
        return None

    def module_rule(self, node: fx.Node, inputs: list[fx.Node]):
        module = self.gm.get_submodule(node.target)
        x = node.args[0] if node.args else None
        r = self.rows(x)
        if isinstance(module, _LINEAR_MODULES):
            return self._contract_last(node, r, _shape(x))
        if isinstance(module, _POINTWISE_MODULES) or isinstance(module, (nn.Identity, nn.Flatten, nn.Unflatten)):
            if isinstance(module, (nn.Flatten, nn.Unflatten)):
                return self.regroup(node, "flatten")
            return r
        if isinstance(module, nn.Embedding):
            return Rows.of(r.dims, (), r.inner, r.perm) if r else None
        if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            k = len(module.normalized_shape)
            return self._normalize_last(node, r, _shape(x), k)
        if isinstance(module, (nn.Softmax, nn.LogSoftmax)):
            return self._along_dim(node, r, _shape(x), module.dim if module.dim is not None else -1, "softmax")
        if isinstance(module, (nn.modules.conv._ConvNd, nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd,
                               nn.modules.pooling._AdaptiveAvgPoolNd, nn.modules.pooling._AdaptiveMaxPoolNd,
                               nn.GroupNorm, nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm,
                               nn.Upsample, nn.PixelShuffle, nn.ZeroPad2d, nn.ConstantPad2d, nn.ReflectionPad2d)):
            return self.leading(node, x)
        if isinstance(module, nn.MultiheadAttention):
            axis = 0 if module.batch_first else 1
            rs = [self.rows(a) for a in node.args[:3]]
            dims = set().union(*(x.dims for x in rs if x))
            if dims and dims != {axis}:
                self.couple(node, "attention", "attention runs over the batch dimension (its sequence is the batch)")
            out = Rows.of({axis}) if dims else None
            return (out, Rows.of({0}) if dims else None)
        if isinstance(module, nn.modules.loss._Loss) and not isinstance(module, nn.CTCLoss):
            return self.loss(node, "cross_entropy" if isinstance(module, (nn.CrossEntropyLoss, nn.NLLLoss))
                             else "mse_loss", reduction=module.reduction)
        return self.unknown_op(node, f"module {type(module).__name__}", inputs)

    # ---- views
    def permute(self, node: fx.Node, order, transpose=None):
        x = node.args[0]
        r, shape = self.rows(x), _shape(x)
        if r is None or shape is None:
            return None
        n = len(shape)
        if transpose is not None:
            if n < 2 and transpose == (-2, -1):
                return r
            a, b = (d % n for d in transpose)
            order = list(range(n))
            order[a], order[b] = order[b], order[a]
        order = [d % n for d in order]
        return r.moved({old: new for new, old in enumerate(order)})

    def movedim(self, node: fx.Node):
        x = node.args[0]
        r, shape = self.rows(x), _shape(x)
        if r is None or shape is None:
            return None
        n = len(shape)
        src = node.args[1] if isinstance(node.args[1], (list, tuple)) else [node.args[1]]
        dst = node.args[2] if isinstance(node.args[2], (list, tuple)) else [node.args[2]]
        src, dst = [d % n for d in src], [d % n for d in dst]
        rest = [d for d in range(n) if d not in src]
        order: list = [None] * n
        for s, d in zip(src, dst):
            order[d] = s
        it = iter(rest)
        order = [o if o is not None else next(it) for o in order]
        return r.moved({old: new for new, old in enumerate(order)})

    def regroup(self, node: fx.Node, name: str):
        x = node.args[0] if node.args else None
        r, src, dst = self.rows(x), _shape(x), _shape(node)
        if r is None:
            return None
        if src is None or dst is None:
            return self._fallback_rows(node)
        if name in ("expand", "expand_as", "broadcast_to"):
            return r.shifted(len(dst) - len(src))
        if name in ("repeat", "tile"):
            shift = len(dst) - len(src)
            for d in r.dims | r.pos:
                if dst[d + shift] != src[d]:
                    self.couple(node, "index", f"{name} repeats the batch's rows along dimension {d}")
            return r.shifted(shift)
        return _regroup(src, dst, r, self.batch)

    def repeat_rows(self, node: fx.Node):
        """``repeat_interleave``: each element repeated in place, so every row's copies stay
        together and in the batch's order (flattened first when no dimension is given)."""
        x = node.args[0]
        r, src, dst = self.rows(x), _shape(x), _shape(node)
        if r is None or src is None or dst is None:
            return None
        dim = _arg(node, 2, "dim", None)
        if dim is None:
            return _regroup(src, (math.prod(src),), r, self.batch)   # flattened, then each element repeated
        return r

    def select(self, node: fx.Node, name: str):
        x = node.args[0]
        r, shape = self.rows(x), _shape(x)
        if r is None or shape is None:
            index = node.args[2] if name == "index_select" and len(node.args) > 2 else None
            ri = self.rows(index)
            if name == "index_select" and ri is not None:
                dim = node.args[1] % len(shape) if shape else 0
                return Rows.of({dim} if ri.dims else set())
            return None
        n = len(shape)
        dim = _arg(node, 1, "dim", 0)
        dim = dim % n if isinstance(dim, int) else 0
        if dim in r.dims:
            full = False
            if name == "slice":
                start, end, step = (_arg(node, 2, "start", 0), _arg(node, 3, "end", None), _arg(node, 4, "step", 1))
                full = (start in (0, None)) and (end is None or (isinstance(end, int) and end >= shape[dim])) \
                    and step in (1, None)
            elif name == "narrow":
                full = node.args[2] == 0 and node.args[3] == shape[dim]
            elif name == "index_select":
                ri = self.rows(node.args[2])
                full = ri is not None and 0 in ri.pos
            if not full:
                self.couple(node, "index", f"{name} takes some rows of the batch (dimension {dim}): each rank "
                                           f"would take them from its own share")
            if name == "select":
                return r.moved({d: d - (d > dim) for d in range(n) if d != dim})
            return r
        if name == "select":
            return r.moved({d: d - (d > dim) for d in range(n) if d != dim})
        return r

    def split(self, node: fx.Node, name: str):
        x = node.args[0]
        r, shape, out = self.rows(x), _shape(x), node.meta.get(SPEC)
        count = len(out) if isinstance(out, (tuple, list)) else 1
        if r is None or shape is None:
            return tuple([None] * count)
        dim = _arg(node, 2 if name != "unbind" else 1, "dim", 0)
        dim = dim % len(shape) if isinstance(dim, int) else 0
        if dim in r.dims and count > 1:
            self.couple(node, "index", f"{name} cuts the batch (dimension {dim}) into parts, which each rank "
                                       f"would cut from its own share")
        if name == "unbind":
            item = r.moved({d: d - (d > dim) for d in range(len(shape)) if d != dim})
            return tuple([item] * count)
        return tuple([r] * count)

    def cat(self, node: fx.Node, name: str):
        tensors = node.args[0] if node.args else node.kwargs.get("tensors", ())
        tensors = [t for t in tensors if isinstance(t, fx.Node)]
        out_shape = _shape(node)
        if out_shape is None:
            return None
        n = len(out_shape)
        dim = _arg(node, 1, "dim", 0)
        dim = dim % (n if name not in ("stack",) else n) if isinstance(dim, int) else 0
        dims, pos = set(), set()
        for t in tensors:
            r = self.rows(t)
            if r is None:
                continue
            if name in ("stack",):
                dims |= {d + (d >= dim) for d in r.dims}
                pos |= {d + (d >= dim) for d in r.pos}
            else:
                if dim in r.dims and len(tensors) > 1:
                    self.couple(node, "concat", f"{name} joins tensors along the batch (dimension {dim}): each "
                                                f"rank would join its own shares, in another order than the "
                                                f"single device")
                dims |= r.dims
                pos |= r.pos
        return Rows.of(dims, pos)

    def getitem(self, node: fx.Node):
        x, index = node.args[0], node.args[1]
        r, shape = self.rows(x), _shape(x)
        out = _shape(node)
        if r is None or shape is None:
            return None
        index = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, fx.Node) for i in index) or any(isinstance(i, (list, torch.Tensor)) for i in index):
            # advanced indexing: rows kept only when the batch dim is not indexed
            return self._advanced(node, x, list(index), shape)
        d_in = d_out = 0
        mapping, ell = {}, False
        rest = [i for i in index if i is not None and i is not Ellipsis]
        for i in index:
            if i is Ellipsis:
                skip = len(shape) - len(rest)
                for _ in range(skip):
                    mapping[d_in] = d_out
                    d_in += 1
                    d_out += 1
                ell = True
                continue
            if i is None:
                d_out += 1
                continue
            if isinstance(i, int):
                if d_in in r.dims:
                    self.couple(node, "index", f"x[...] takes row {i} of the batch (dimension {d_in})")
                d_in += 1
                continue
            if isinstance(i, slice):
                if d_in in r.dims and not (i.start in (None, 0) and i.stop in (None,) and i.step in (None, 1)):
                    if not (isinstance(i.stop, int) and i.stop >= shape[d_in] and i.start in (None, 0)):
                        self.couple(node, "index", f"x[...] takes a slice of the batch's rows (dimension {d_in})")
                mapping[d_in] = d_out
                d_in += 1
                d_out += 1
                continue
            return self._fallback_rows(node)
        while d_in < len(shape):
            mapping[d_in] = d_out
            d_in += 1
            d_out += 1
        del ell, out
        return r.moved(mapping)

    def index(self, node: fx.Node):
        x, indices = node.args[0], list(node.args[1])
        shape = _shape(x)
        if shape is None:
            return None
        return self._advanced(node, x, indices, shape)

    def _advanced(self, node: fx.Node, x, indices: list, shape: tuple):
        """``x[indices]`` with index tensors (``aten.index``): rows meet unless the batch
        dimension is indexed by its own positions with every index tensor's batch rows
        aligned (``x[arange(B), y]``, a pick per row), or not indexed at all."""
        r = self.rows(x) or Rows()
        if not r.dims and not r.pos and not any(self.rows(i) is not None and self.rows(i).dims
                                                for i in indices if isinstance(i, fx.Node)):
            # a batch-free tensor (a mask expanded to the batch size) read at row positions:
            # every row reads the same values, unless it is a table held per position
            if _held_table(x):
                self.couple(node, "positional", "a parameter or buffer is read at the rows' positions "
                                                "(arange over the batch), which differ on each rank")
            return None
        out = _shape(node)
        indexed = [d for d, i in enumerate(indices) if i is not None and not (isinstance(i, slice)
                                                                              and i == slice(None))]
        tensors = [i for i in indices if isinstance(i, fx.Node)]
        idx_rows = [self.rows(i) for i in tensors]
        b_rank = max((len(_shape(i) or ()) for i in tensors), default=0)
        hit = [d for d in indexed if d in r.dims]   # the batch's rows indexed (positions indexed: positions)
        # index tensors' batch dims, right-aligned to their broadcast; their positions count
        # as rows only where they index the batch (elsewhere they are plain indexes of another
        # dimension, perhaps one as long as the batch)
        aligned_dims, aligned_pos = set(), set()
        for d, i in enumerate(indices):
            ri = self.rows(i) if isinstance(i, fx.Node) else None
            if ri is None:
                continue
            shift = b_rank - len(_shape(i) or ())
            aligned_dims |= {e + shift for e in ri.dims}
            if d in hit or not r.dims:
                aligned_pos |= {e + shift for e in ri.pos}
        perm = r.perm
        if hit:
            by = [self.rows(indices[d]) if isinstance(indices[d], fx.Node) else None for d in hit]
            picks = all(b is not None and b.pos and bare_positions(indices[d]) for b, d in zip(by, hit))
            reorder = all(b is not None and b.pos and b.perm for b in by)
            if reorder:   # rows gathered in the rank's own order, or that order undone
                perm = not (r.perm and all(b.inverse for b in by))
            elif not picks or (aligned_dims and aligned_dims != aligned_pos):
                self.couple(node, "index", f"an index reads rows of the batch (dimension {hit[0]}) at positions "
                                           f"it computes: each rank would read its own share")
        first = indexed[0] if indexed else 0
        adjacent = indexed == list(range(first, first + len(indexed)))
        start = first if adjacent else 0
        # a pick of the batch's rows by their positions gives rows; positions read at positions, positions
        batch_part = {start + d for d in aligned_dims | (aligned_pos if hit else set())}
        mapping = {}
        if out is not None:
            after = [d for d in range(len(shape)) if d not in indexed]
            for d in after:
                mapping[d] = d if d < start else d - len(indexed) + b_rank
        dims = {mapping[d] for d in r.dims if d in mapping} | batch_part
        pos = {mapping[d] for d in r.pos if d in mapping} | ({start + d for d in aligned_pos} if not hit else set())
        if hit and perm is not None and any((self.rows(i) or Rows()).perm for i in tensors):
            return Rows.of(dims, (), perm=perm)
        return Rows.of(dims, pos, perm=r.perm)

    def gather(self, node: fx.Node, name: str):
        x = node.args[0]
        shape = _shape(x)
        r = self.rows(x)
        dim = _arg(node, 1, "dim", 0)
        if shape is None:
            return None
        n = max(len(shape), 1)
        dim = dim % n if isinstance(dim, int) else 0
        others = [self.rows(a) for a in node.all_input_nodes if a is not x]
        if name in ("index_put", "index_put_"):
            idx = node.args[1] if len(node.args) > 1 else []
            by = [self.rows(i) for i in idx if isinstance(i, fx.Node)]
            if by and all(b is not None and b.perm and b.pos for b in by):
                # out[perm] = arange(n): the positions that undo the rank's own order
                return Rows.of((), {0}, perm=True, inverse=True)
            hit = r is not None and any(i is not None for d, i in enumerate(idx) if d in r.dims)
            if hit:
                self.couple(node, "index", "an index_put writes rows of the batch at positions it computes")
            return r
        base = name.rstrip("_")
        if r is not None and dim in r.dims:
            self.couple(node, "index", f"{name} reads or writes the batch (dimension {dim}) at positions it computes")
        if base in ("scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_reduce",
                    "index_fill", "masked_scatter"):
            # values of the batch's rows written into slots that are not rows (a count per
            # expert: scatter_add of ones at the experts' ids): a reduction over the batch
            if any(o is not None and o.dims for o in others) and (r is None or dim not in r.dims):
                self.reductions.append((node, "sum" if base in ("scatter_add", "index_add") else "other"))
            return r
        dims = set(r.dims) if r else set()
        for o in others:
            if o is not None:
                dims |= o.dims
        return Rows.of(dims)

    # ---- compute
    def _contract_last(self, node: fx.Node, r: Rows | None, shape) -> Rows | None:
        if r is None or shape is None:
            return None
        if len(shape) - 1 in r.dims:
            self.couple(node, "contract", "a linear layer sums over the batch dimension")
            return Rows.of(r.dims - {len(shape) - 1}, r.pos, r.inner, r.perm)
        return r

    def matmul(self, node: fx.Node, name: str):
        if node.op == "call_function" and node.target in ops.LINEAR_FUNCTIONS or name == "linear":
            x, w = node.args[0], node.args[1]
            if self.rows(w) is not None:
                self.couple(node, "contract", "a linear layer's weight is computed from the batch")
            return self._contract_last(node, self.rows(x), _shape(x))
        if name == "addmm":
            a, b = node.args[1], node.args[2]
        elif name in ("baddbmm", "addbmm"):
            a, b = node.args[1], node.args[2]
        elif name == "einsum":
            return self.einsum(node)
        elif name == "bilinear":
            return self.unknown_op(node, name, self.tensor_args(node))
        else:
            a, b = node.args[0], node.args[1]
        sa, sb, so = _shape(a), _shape(b), _shape(node)
        ra, rb = self.rows(a) or Rows(), self.rows(b) or Rows()
        if sa is None or sb is None or so is None:
            return self._fallback_rows(node)
        na, nb, no = len(sa), len(sb), len(so)
        # a: [..., n, k] (1-D: [k]); b: [..., k, m] (1-D: [k]); out: [..., n, m]
        contracted_a = na - 1
        contracted_b = nb - 2 if nb >= 2 else 0
        if contracted_a in ra.dims | ra.pos or contracted_b in rb.dims | rb.pos:
            self.couple(node, "contract", "a matrix product sums over the batch dimension")
            return self._fallback_rows(node)
        out_a, out_b = {}, {}
        if na >= 2:
            out_a[na - 2] = no - 2 if nb >= 2 else no - 1
            for d in range(na - 2):
                out_a[d] = d + (no - na) if nb >= 2 else d
        if nb >= 2:
            out_b[nb - 1] = no - 1
            for d in range(nb - 2):
                out_b[d] = d + (no - nb)
        da = {out_a[d] for d in ra.dims if d in out_a}
        db = {out_b[d] for d in rb.dims if d in out_b}
        layout = {(out_a[d], f) for d, f in ra.inner if d in out_a} | {(out_b[d], f) for d, f in rb.inner if d in out_b}
        if da and db and da != db:
            if na == 2 and nb == 2 and da == {0} and db == {1} and name in ("matmul", "mm"):
                self.pairwise.append(node)
                return Rows.of(da | db)
            self.couple(node, "outer", "a matrix product pairs rows of the batch with rows of the batch")
        pa, pb = {out_a[d] for d in ra.pos if d in out_a}, {out_b[d] for d in rb.pos if d in out_b}
        if (pa & db) or (pb & da):
            self.couple(node, "positional", "row positions are multiplied with the batch's rows")
        return Rows.of(da | db, () if da or db else pa | pb, layout, ra.perm or rb.perm)

    def einsum(self, node: fx.Node):
        equation, operands = node.args[0], node.args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = operands[0]
        equation = equation.replace(" ", "")
        if "->" not in equation or "." in equation:
            return self.unknown_op(node, "einsum", self.tensor_args(node))
        lhs, out = equation.split("->")
        terms = lhs.split(",")
        letters: dict[str, set] = {}
        for term, operand in zip(terms, operands):
            r = self.rows(operand)
            if r is None:
                continue
            for d in r.dims:
                letters.setdefault(term[d], set()).add(operand)
        for letter in letters:
            if letter not in out:
                self.couple(node, "contract", f"einsum sums over the batch (index {letter!r})")
        dims = {out.index(letter) for letter in letters if letter in out}
        if len(dims) > 1:
            self.couple(node, "outer", "einsum pairs rows of the batch with rows of the batch")
        return Rows.of(dims)

    def attention(self, node: fx.Node):
        q, k, v = node.args[:3]
        sq = _shape(q)
        if sq is None:
            return None
        n = len(sq)
        for t in (q, k, v):
            r = self.rows(t)
            if r is not None and r.dims & {n - 1, n - 2}:
                self.couple(node, "attention", "attention runs over the batch dimension (its sequence is the batch)")
        rq = self.rows(q) or Rows()
        dims = set(rq.dims)
        for t in (k, v):
            rt = self.rows(t)
            if rt is not None:
                dims |= rt.dims
        out = Rows.of(dims - {n - 1, n - 2})
        spec = node.meta.get(SPEC)
        if isinstance(spec, (tuple, list)):
            return tuple(out for _ in spec)
        return out

    def loss(self, node: fx.Node, name: str, reduction=None):
        x = node.args[0]
        if reduction is None:
            reduction = _arg(node, 3 if name in ("nll_loss", "nll_loss_nd", "nll_loss2d") else 4, "reduction", None)
            if reduction is None:
                reduction = "mean" if not is_aten_op(node.target) else 1
        reduction = {0: "none", 1: "mean", 2: "sum"}.get(reduction, reduction)
        if reduction == "batchmean":   # kl_div: the sum over the rows' elements over the rows: a mean per row
            reduction = "mean"
        r = self.rows(x) or Rows()
        shape = _shape(x)
        operands = [self.rows(a) for a in node.all_input_nodes if self.rows(a) is not None and self.rows(a).dims]
        ranks = [len(_shape(a) or ()) for a in node.all_input_nodes if self.rows(a) is not None and self.rows(a).dims]
        if len(operands) > 1 and name not in _CLASS_LOSSES:
            top = max(ranks)
            if len({frozenset(o.shifted(top - k).dims) for o, k in zip(operands, ranks)}) > 1:
                self.couple(node, "outer", f"{name} broadcasts rows of the batch against rows of the batch")
        if name in _CLASS_LOSSES and shape is not None:
            cls = 1 if len(shape) > 1 else 0
            if cls in r.dims and node.args[0] not in self.pairwise_values:
                self.couple(node, "outer", "the classes of a loss are rows of the batch")
        batch_operands = [self.rows(a) for a in node.all_input_nodes if self.rows(a) is not None and self.rows(a).dims]
        if len({b.perm for b in batch_operands}) > 1:
            self.couple(_sorted_at(node), "scan", "a sort along the batch reorders rows that then meet rows in the "
                                                  "batch's order: each rank would sort its own rows only")
        if reduction == "none":
            if name in _CLASS_LOSSES and shape is not None and len(shape) > 1:
                return Rows.of({d - (d > 1) for d in r.dims if d != 1})
            return Rows.of(r.dims)
        if any(self.rows(a) is not None for a in node.all_input_nodes):
            self.reductions.append((node, "mean" if reduction == "mean" else "sum"))
        return None

    @property
    def pairwise_values(self) -> set:
        return getattr(self, "_pairwise_values", set())

    def reduction(self, node: fx.Node, name: str):
        x = node.args[0]
        r, shape = self.rows(x), _shape(x)
        if r is None or shape is None:
            return None
        n = len(shape)
        if name == "norm" and not is_aten_op(node.target):
            dims = _norm_dims(_arg(node, 2, "dim", None), n)
        elif name in ("linalg_vector_norm", "vector_norm"):
            dims = _norm_dims(_arg(node, 2, "dim", None), n)
        else:
            dims = _norm_dims(_arg(node, 1, "dim", None), n)
        if dims is None and is_aten_op(node.target) and "dim" not in argument_names(node.target):
            dims = None
        keep = bool(_arg(node, 2, "keepdim", False)) if name not in ("norm", "linalg_vector_norm") else \
            bool(_arg(node, 3, "keepdim", False))
        reduced = set(range(n)) if dims is None else set(dims)
        hit = reduced & r.dims
        if node.args[0] in self.pairwise_values and reduced == {n - 1}:
            hit = set()   # within each row of a pairwise score (gathered whole): the row's own
        if hit:
            self.reductions.append((node, _REDUCTIONS[name]))
        if keep:
            out = r.without(reduced)
        else:
            out = r.moved({d: d - sum(1 for e in reduced if e < d) for d in range(n) if d not in reduced})
        spec = node.meta.get(SPEC)
        if isinstance(spec, (tuple, list)):
            return tuple(out for _ in spec)
        return out

    def _along_dim(self, node: fx.Node, r: Rows | None, shape, dim, name: str):
        if r is None or shape is None:
            return None
        n = max(len(shape), 1)
        dims = _norm_dims(dim, n)
        if dims is None:
            dims = list(range(n))
        if set(dims) & r.dims:
            if node.args[0] in self.pairwise_values and set(dims) <= {1}:
                pass   # along a pairwise score's columns: each row's own (checked with the scores)
            else:
                self.couple(node, "scan", f"{name} runs along the batch (dimension {dims[0]}): each rank would "
                                          f"see only its own rows")
        spec = node.meta.get(SPEC)
        if isinstance(spec, (tuple, list)):
            return tuple(Rows.of(r.dims, (), r.inner, r.perm) for _ in spec)
        return r

    def along(self, node: fx.Node, name: str):
        x = node.args[0]
        index, default = _ALONG[name]
        dim = _arg(node, index + 1, "dim", default)
        r, shape = self.rows(x), _shape(x)
        if name in ("sort", "argsort") and r is not None and shape:
            dims = _norm_dims(dim, max(len(shape), 1)) or []
            if set(dims) & r.dims and len(dims) == 1:
                # the rows in an order of the rank's own: each row's values stay its own, and
                # the positions (indices) say where each went; the order must be undone later
                values = Rows.of(r.dims, r.pos, r.inner, perm=True)
                indices = Rows.of((), set(dims), perm=True)
                return indices if name == "argsort" else (values, indices)
        if name in ("roll", "flip"):
            dim = _arg(node, 2 if name == "roll" else 1, "dims", None)
            if name == "roll" and dim is None:
                dim = list(range(len(_shape(x) or ())))   # rolled flat: every dimension
        return self._along_dim(node, self.rows(x), _shape(x), dim, name)

    def _normalize_last(self, node: fx.Node, r: Rows | None, shape, k: int):
        if r is None or shape is None:
            return None
        n = len(shape)
        if r.dims & set(range(n - k, n)):
            self.couple(node, "reduce", "a normalisation reduces over the batch dimension")
        spec = node.meta.get(SPEC)
        out = Rows.of(r.dims, (), r.inner, r.perm)
        if isinstance(spec, (tuple, list)):
            return tuple(out for _ in spec)
        return out

    def layer_norm(self, node: fx.Node):
        x = node.args[0]
        shape_arg = _arg(node, 1, "normalized_shape", None)
        k = len(shape_arg) if isinstance(shape_arg, (list, tuple)) else 1
        return self._normalize_last(node, self.rows(x), _shape(x), k)

    def leading(self, node: fx.Node, x):
        r = self.rows(x)
        if r is None:
            spec = node.meta.get(SPEC)
            return tuple(None for _ in spec) if isinstance(spec, (tuple, list)) else None
        if r.dims - {0} or r.pos:
            self.couple(node, "reduce", f"{ops.op_name(node)} works across its first dimension, and the batch is "
                                        f"not there")
        spec = node.meta.get(SPEC)
        out = Rows.of({0})
        if isinstance(spec, (tuple, list)):
            return tuple(out for _ in spec)
        return out

    def binary_rows(self, node: fx.Node, name: str):
        """Ops of two tensors that broadcast them against each other (``cosine_similarity``,
        ``pairwise_distance``) or pair every row of one with every row of the other
        (``cdist``, ``inner``, ``tensordot``, ``outer``): rows meet unless only one operand
        holds the batch, or both hold it in the same broadcast place of a row-wise op."""
        operands = [a for a in node.all_input_nodes if self.rows(a) is not None and self.rows(a).dims]
        if len(operands) > 1:
            if name in ("cosine_similarity", "pairwise_distance"):
                ranks = [len(_shape(a) or ()) for a in operands]
                top = max(ranks)
                if len({frozenset(self.rows(a).shifted(top - k).dims) for a, k in zip(operands, ranks)}) == 1:
                    return self._fallback_rows(node) or Rows.of(self.rows(operands[0]).dims - {top - 1})
            self.couple(node, "outer", f"{name} pairs rows of the batch with rows of the batch")
            return self._fallback_rows(node)
        if name in ("cosine_similarity", "pairwise_distance"):
            x = operands[0] if operands else node.args[0]
            r = self.rows(x)
            dim = _arg(node, 2, "dim", 1) if name == "cosine_similarity" else -1
            if r is not None and _shape(x) and (dim % len(_shape(x))) in r.dims:
                self.couple(node, "reduce", f"{name} reduces over the batch dimension")
            return self._fallback_rows(node) or (r.without({dim % len(_shape(x))}) if r and _shape(x) else None)
        return self.unknown_op(node, name, self.tensor_args(node))

    def pointwise(self, node: fx.Node, name: str, shape: tuple | None = None):
        out = shape or _shape(node)
        if out is None:
            return self._fallback_rows(node)
        n = len(out)
        dims, pos, inner, per_operand = set(), set(), {}, []
        for a in node.all_input_nodes:
            r = self.rows(a)
            if r is None:
                continue
            sa = _shape(a)
            moved = r.shifted(n - len(sa) if sa is not None else 0)
            d, p = set(moved.dims), set(moved.pos)
            per_operand.append((a, d, p))
            dims |= d
            pos |= p
            for dim, f in moved.inner:
                inner.setdefault(dim, set()).add(f)
        if any(len(fs) > 1 or (-1 in fs) for fs in inner.values()) and len(per_operand) > 1 and \
                not all(a in self.pairwise_values for a, d, _ in per_operand if d):
            self.couple(node, "outer", f"{name} meets rows of the batch laid out in another order")
        perm = any(self.rows(a).perm for a, _, _ in per_operand)
        inverse = any(self.rows(a).inverse for a, _, _ in per_operand)
        if len({self.rows(a).perm for a, d, _ in per_operand if d}) > 1:
            self.couple(_sorted_at(node), "scan", "a sort along the batch reorders rows that then meet rows in the "
                                                  "batch's order: each rank would sort its own rows only")
        with_dims = [d for _, d, _ in per_operand if d]
        if len({frozenset(d) for d in with_dims}) > 1:
            if not all(a in self.pairwise_values for a, d, _ in per_operand if d):
                self.couple(node, "outer", f"{name} broadcasts rows of the batch against rows of the batch")
        if pos & dims and not perm:
            self.couple(node, "positional", f"{name} combines the batch's rows with their positions "
                                            f"(arange over the batch), which differ on each rank")
        layout = {(d, min(fs)) for d, fs in inner.items()}
        if perm and dims and pos:
            return Rows.of(dims, (), layout, perm=True)
        # positions combined with data are data (a rotary table applied to keys), not positions
        return Rows.of(dims, () if dims else pos, layout, perm=perm, inverse=inverse)

    def unknown_op(self, node: fx.Node, name: str, inputs: list[fx.Node]):
        batch_inputs = [a for a in inputs if self.rows(a) is not None and self.rows(a).dims]
        if len(batch_inputs) > 1:
            self.couple(node, "unknown", f"{name} has no batch rule in autopar and reads the rows of more than one "
                                         f"batch tensor")
            return self._fallback_rows(node)
        out = self._fallback_rows(node)
        shape = _shape(node)
        first = inputs[0] if inputs else None
        r = self.rows(first)
        if out is None and r is not None and shape is not None and _shape(first) is not None:
            sf = _shape(first)
            if len(sf) == len(shape) and all(sf[d] == shape[d] for d in r.dims if d < len(shape)):
                out = Rows.of(r.dims)
        if out is None and r is not None:
            self.couple(node, "unknown", f"{name} has no batch rule in autopar, and its output does not keep the "
                                         f"batch where its input had it")
        elif r is not None:
            self.unknown.append(f"{node.name} ({name})")
        return out


# ---------------------------------------------------------------- after the walk: what the reductions are

_LINEAR_SCALAR = {"add", "sub", "neg", "mul", "div", "true_divide", "to", "_to_copy", "type_as", "float", "half",
                  "bfloat16", "double", "clone", "detach", "alias", "contiguous", "squeeze", "view", "reshape",
                  "unsqueeze", "global_mean", "positive", "add_", "sub_", "mul_", "div_"}


def _loss_path(walk: _Walk, start: fx.Node) -> tuple[bool, list[fx.Node]]:
    """Whether ``start``'s value reaches the graph's outputs only through linear scalar ops
    (a loss's reduction, scaled, summed with other losses) and the divisions on the way
    whose divisor depends on the batch (a ratio of two reductions)."""
    ratios: list[fx.Node] = []
    seen, stack = set(), [start]
    while stack:
        n = stack.pop()
        for user in n.users:
            if user in seen:
                continue
            seen.add(user)
            if user.op == "output":
                continue
            name = bare_name(user)
            if name not in _LINEAR_SCALAR or (walk.rows(user) is not None and walk.rows(user).dims):
                return False, ratios   # combined with the rows again: used inside the model
            if name in ("mul", "div", "true_divide"):
                others = [a for a in user.all_input_nodes if a is not n]
                if name in ("div", "true_divide") and user.args and user.args[0] is not n:
                    if _depends_on_batch(walk, n):
                        ratios.append(user)
                    else:
                        return False, ratios
                elif name == "mul" and any(_depends_on_batch(walk, a) for a in others):
                    return False, ratios   # a product of two batch reductions is not a sum of the parts'
                elif any(_depends_on_batch(walk, a) and not _is_reduction_of_batch(walk, a) for a in others):
                    return False, ratios
                elif name in ("div", "true_divide") and any(_depends_on_batch(walk, a) for a in others):
                    ratios.append(user)
            stack.append(user)
    return True, ratios


def _divided_by_rows(walk: _Walk, node: fx.Node) -> bool:
    """Whether the sum ``node`` reaches the loss divided by the batch's row count: a size
    read off a batch tensor's batch dimension (``x.shape[0]``, ``x.size(0)``, ``len(x)``),
    or, where the capture baked it, the constant batch size."""
    for _ in range(8):
        users = [u for u in node.users if u.op != "output"]
        if len(users) != 1:
            return False
        user = users[0]
        name = bare_name(user)
        if name in ("div", "true_divide", "div_") and user.args and user.args[0] is node and len(user.args) > 1:
            d = user.args[1]
            if isinstance(d, (int, float)) and not isinstance(d, bool):
                return d == walk.batch
            if isinstance(d, fx.Node):
                return _reads_rows(walk, d)
            return False
        if name not in ("to", "_to_copy", "float", "mul", "clone", "detach", "alias"):
            return False
        node = user
    return False


def _reads_rows(walk: _Walk, d: fx.Node) -> bool:
    """Whether ``d`` is the row count of a batch tensor: its size along a batch dimension."""
    for _ in range(4):
        name = bare_name(d)
        if name in ("float", "to", "_to_copy", "int", "long", "scalar_tensor", "tensor") and d.args and \
                isinstance(d.args[0], fx.Node):
            d = d.args[0]
            continue
        if name in ("size", "sym_size") and d.args:
            r = walk.rows(d.args[0])
            dim = d.args[1] if len(d.args) > 1 else None
            return r is not None and isinstance(dim, int) and dim % max(len(_shape(d.args[0]) or (1,)), 1) in r.dims
        if name == "len" and d.args:
            r = walk.rows(d.args[0])
            return r is not None and 0 in r.dims
        if name == "getitem" and d.args and isinstance(d.args[0], fx.Node) and bare_name(d.args[0]) == "getattr":
            src = d.args[0].args[0]
            r = walk.rows(src)
            return r is not None and isinstance(d.args[1], int) and d.args[1] in r.dims
        return False
    return False


def _is_reduction_of_batch(walk: _Walk, node: fx.Node) -> bool:
    return any(n is node for n, _ in walk.reductions)


def _depends_on_batch(walk: _Walk, node: fx.Node) -> bool:
    memo = walk.__dict__.setdefault("_depends", {})
    if node in memo:
        return memo[node]
    stack, seen, found = [node], set(), False
    while stack and not found:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if walk.state.get(n) is not None or _is_reduction_of_batch(walk, n):
            found = True
            break
        if bare_name(n) in _NO_VALUE or (bare_name(n) == "getitem" and n.args and bare_name(n.args[0]) == "getattr"):
            continue   # a size read off a tensor carries none of its values
        stack.extend(n.all_input_nodes)
    memo[node] = found
    return found


def _classify_reductions(walk: _Walk) -> None:
    """A reduction over the batch is the loss's (the data pass reduces it over the parts), a
    masked mean's numerator or denominator, or a batch statistic used inside the model."""
    handled: set = set()
    for node, kind in walk.reductions:
        if node in handled:
            continue
        is_loss, ratios = _loss_path(walk, node)
        if is_loss and not ratios:
            if kind == "other":
                walk.couple(node, "reduce", f"the loss reduces over the batch with {ops.op_name(node)}, which is "
                                            f"not a mean or a sum of its parts'")
            else:   # a sum over the rows divided by their number is a mean
                walk.loss_terms.append((node.name, "mean" if kind == "sum" and _divided_by_rows(walk, node) else kind))
            continue
        if is_loss and ratios:
            ratio = ratios[0]
            num, den = ratio.args[0], ratio.args[1]
            parts = {n: k for n, k in walk.reductions}
            base_num, base_den = _base_reduction(num, parts), _base_reduction(den, parts)
            if base_num is None or base_den is None:
                walk.couple(ratio, "reduce", "the loss divides by a value computed from the batch that autopar "
                                             "cannot read as a sum or mean over it")
                continue
            handled |= {base_num[0], base_den[0]}
            same = base_num[1] == base_den[1]
            walk.found.append(Coupling(
                ratio.name, ops.op_name(ratio), "masked_mean", walk.module(ratio),
                f"the loss is a ratio of two {base_num[1]}s over the batch (a masked mean): each part's ratio would "
                f"weigh its rows by its own denominator" + ("" if same else f" (a {base_num[1]} over a "
                                                            f"{base_den[1]}, which autopar does not rescale)"),
                remedy="all_reduce" if same else None, nbytes=16.0, details={"numerator": base_num[0].name, "denominator": base_den[0].name,
                                      "numerator_kind": base_num[1], "denominator_kind": base_den[1]}))
            continue
        if kind in ("mean", "sum"):
            spec = node.meta.get(SPEC)
            nbytes = spec.numel * spec.dtype.itemsize if isinstance(spec, TensorSpec) else 8
            walk.found.append(Coupling(node.name, ops.op_name(node), f"batch_{kind}", walk.module(node),
                                       f"a {kind} over the batch is used inside the model: each rank would use its "
                                       f"own rows' {kind}", remedy="all_reduce", nbytes=float(nbytes)))
        else:
            walk.couple(node, "reduce", f"{ops.op_name(node)} reduces over the batch inside the model: each rank "
                                        f"would reduce its own rows only")


def _base_reduction(node: fx.Node, parts: dict) -> tuple[fx.Node, str] | None:
    for _ in range(8):
        if node in parts and parts[node] in ("sum", "mean"):
            return node, parts[node]
        if node.op != "call_function" and node.op != "call_method":
            return None
        if bare_name(node) not in ("to", "_to_copy", "float", "type_as", "clone", "double", "clamp", "clamp_min",
                                   "detach", "alias"):
            return None
        node = node.args[0]
    return None


# ---------------------------------------------------------------- pairwise scores: what reads them

_PAIRWISE_CHAIN = {"mul", "div", "add", "sub", "neg", "to", "_to_copy", "float", "type_as", "clone", "contiguous",
                   "exp", "true_divide", "masked_fill"}


def _check_pairwise(walk: _Walk, node: fx.Node) -> None:
    """A pairwise score ``a @ b.T`` (both operands' rows the batch's) is exact on split
    rows when every reader takes a row of it whole: pointwise ops with batch-free
    operands, transposes, and at the end a softmax, log-softmax, cross-entropy (targets
    the rows' positions or batch targets), a reduction over its last dimension or the
    graph's output."""
    a, b = node.args[0], node.args[1]
    b_path, src = [], b
    while True:   # b = casts/transposes of a batch-major tensor
        r = walk.rows(src)
        if r is not None and r.dims == {0}:
            break
        if src.op not in ("call_function", "call_method") or not src.args or not isinstance(src.args[0], fx.Node):
            src = None
            break
        b_path.append(src.name)
        src = src.args[0]
    problems, offsets, transposes, chain = [], [], [], [node.name]
    if src is None:
        problems.append(f"its right operand {b.name} is not a transpose of batch-major rows")
    frontier = [(node, False)]
    seen = set()
    while frontier:
        value, flipped = frontier.pop()
        for user in value.users:
            if (user, flipped) in seen:
                continue
            seen.add((user, flipped))
            name = bare_name(user)
            if user.op == "output":
                continue
            if name in _TRANSPOSES or (name in ("transpose", "swapaxes") and len(user.args) >= 3
                                       and {user.args[1] % 2, user.args[2] % 2} == {0, 1}) or \
                    (name == "permute" and list(user.args[1] if len(user.args) == 2 else user.args[1:]) == [1, 0]):
                transposes.append(user.name)
                chain.append(user.name)
                frontier.append((user, not flipped))
            elif name in _PAIRWISE_CHAIN or is_pointwise_name(name):
                others = [o for o in user.all_input_nodes if o is not value]
                if any(walk.rows(o) is not None and walk.rows(o).dims for o in others):
                    problems.append(f"{user.name} ({name}) combines the scores with other batch values")
                    continue
                chain.append(user.name)
                frontier.append((user, flipped))
            elif name in ("softmax", "_softmax", "log_softmax", "_log_softmax"):
                dim = _arg(user, 1, "dim", -1)
                if dim not in (-1, 1):
                    problems.append(f"{user.name} ({name}) runs along the rows, not within one")
            elif name in _CLASS_LOSSES or (user.op == "call_module" and isinstance(
                    walk.gm.get_submodule(user.target), (nn.CrossEntropyLoss, nn.NLLLoss))):
                if user.args[0] is not value:
                    problems.append(f"{user.name} ({name}) takes the scores as its target")
                    continue
                target = user.args[1] if len(user.args) > 1 else user.kwargs.get("target")
                rt = walk.rows(target)
                if rt is not None and rt.pos == {0} and not rt.dims and bare_positions(target):
                    offsets.append(target.name)
                elif not (rt is not None and rt.dims == {0} and not rt.pos and _is_input_rows(target)):
                    problems.append(f"{user.name} ({name}) reads targets autopar cannot place over the gathered "
                                    f"rows ({target.name if isinstance(target, fx.Node) else target!r})")
            elif name in _REDUCTIONS and name in ("sum", "mean", "amax", "max", "logsumexp", "argmax", "amin", "min",
                                                  "argmin"):
                shape = _shape(value)
                dims = _norm_dims(_arg(user, 1, "dim", None), len(shape) if shape else 2)
                if dims != [1]:
                    problems.append(f"{user.name} ({name}) reduces the scores over the batch's rows")
            else:
                problems.append(f"{user.name} ({name}) reads the scores in a way autopar cannot split by rows")
    sa, sb = a.meta.get(SPEC), (src.meta.get(SPEC) if src is not None else None)
    nbytes = sum(s.numel * s.dtype.itemsize for s in (sa, sb) if isinstance(s, TensorSpec))
    details = {"rows": a.name, "columns": src.name if src is not None else None, "columns_path": b_path[::-1],
               "chain": chain, "transposes": transposes, "offset_targets": sorted(set(offsets))}
    why = "a product pairs every row of the batch with every row (a contrastive or retrieval score)"
    walk.found.append(Coupling(node.name, ops.op_name(node), "pairwise", walk.module(node),
                               f"{why}; {problems[0]}" if problems else why, remedy=None if problems else "gather",
                               nbytes=float(nbytes), details=details))


_REFORMS = {"to", "_to_copy", "long", "int", "unsqueeze", "expand", "view", "reshape", "contiguous", "clone",
            "detach", "alias", "lift_fresh_copy", "flatten"}
"""Ops that change how a tensor is held (dtype, view, broadcast), not its values."""


def _behind(node, through: set = _REFORMS, steps: int = 8):
    """The first node before ``node`` (``node`` itself included) that is not one of the ops
    ``through`` applied to its first argument; None past ``steps`` or at a non-node."""
    for _ in range(steps):
        if not isinstance(node, fx.Node):
            return None
        if node.op not in ("call_function", "call_method") or bare_name(node) not in through:
            return node
        node = node.args[0] if node.args else None
    return None


def bare_positions(node) -> bool:
    """Whether ``node`` is ``arange`` over the batch itself (cast, viewed, broadcast), not
    positions transformed (flipped, rolled, shifted, compared)."""
    source = _behind(node)
    return source is not None and bare_name(source) == "arange"


def _held_table(node: fx.Node) -> bool:
    """Whether ``node`` is (a view of) a parameter or buffer, not a value broadcast to a size."""
    for _ in range(8):
        if node.op == "get_attr":
            return True
        if node.op not in ("call_function", "call_method") or not node.args or not isinstance(node.args[0], fx.Node):
            return False
        if bare_name(node) in ("expand", "expand_as", "broadcast_to", "new_ones", "new_zeros", "new_full"):
            return False
        node = node.args[0]
    return False


def _is_input_rows(node: fx.Node) -> bool:
    """Targets read from a batch input (casts and views of it): the runtime splits them with
    the rows, so they already hold the whole batch's positions."""
    source = _behind(node)
    return source is not None and source.op == "placeholder"


def batch_size(gm: fx.GraphModule) -> int | None:
    """The batch: the first dimension of the graph's first tensor input (as the runtime
    splits it, :func:`autopar.runtime.executable.batch_of`)."""
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            shape = _shape(node)
            if shape:
                return shape[0]
    return None


def find_batch_couplings_pass(gm: fx.GraphModule) -> fx.GraphModule:
    """Write :data:`~autopar.ir.BATCH_COUPLINGS` (a list of :class:`Coupling`) on ``gm``."""
    batch = batch_size(gm)
    gm.meta[BATCH_COUPLINGS] = []
    gm.meta[LOSS_TERMS] = []
    if not batch or batch < 2:
        return gm
    walk = _Walk(gm, batch)
    walk._pairwise_values = set()
    # a first walk finds the pairwise scores; the second knows them (their columns are rows too)
    walk.run()
    if walk.pairwise:
        values = _pairwise_closure(walk)
        walk = _Walk(gm, batch)
        walk._pairwise_values = values
        walk.run()
    try:
        _after_walk(walk, gm)
    except Exception as e:  # noqa: BLE001 - a pattern it cannot read: refused, never a crash
        output = next(n for n in gm.graph.nodes if n.op == "output")
        walk.couple(output, "unknown", f"autopar could not read where rows of the batch meet "
                                       f"({type(e).__name__}: {e})")
    dispatch = {n for r in regions(gm, "experts") for n in r.nodes}
    walk.found = [c for c in walk.found if c.node not in dispatch]
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    walk.found.sort(key=lambda c: order.get(c.node, 0))
    gm.meta[BATCH_COUPLINGS] = walk.found
    gm.meta[LOSS_TERMS] = walk.loss_terms
    if walk.unknown:
        log.warning("batch rows: %d op(s) have no batch rule; autopar takes them to keep the rows of the batch "
                    "apart (their output keeps the batch dimension): %s", len(walk.unknown),
                    ", ".join(walk.unknown[:8]) + (" ..." if len(walk.unknown) > 8 else ""))
    return gm


def _after_walk(walk: _Walk, gm: fx.GraphModule) -> None:
    for node in walk.pairwise:
        _check_pairwise(walk, node)
    _exempt_router_statistics(walk)
    for node in walk.counts:
        if node.name not in walk.statistics and not _offsets_only(node):
            walk.couple(node, "reduce", f"{ops.op_name(node)} counts rows of the batch, and the count is used "
                                        f"beyond a grouped matmul's offsets: each rank would count its own rows")
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    for value in (output.all_input_nodes if output is not None else ()):
        r = walk.rows(value)
        if r is not None and r.perm:
            walk.couple(_sorted_at(value), "scan", "a sort along the batch puts rows in an order that reaches the "
                                                   "output: each rank would sort its own rows only")
    _classify_reductions(walk)
    # a scalar output that sums over other dimensions than the batch (a stack of losses, a
    # statistic's entries) is not summed over the parts: its terms are weighed instead
    named = {name for name, _ in walk.loss_terms}
    output = next((n for n in walk.gm.graph.nodes if n.op == "output"), None)
    for value in (output.all_input_nodes if output is not None else ()):
        spec = value.meta.get(SPEC)
        if isinstance(spec, TensorSpec) and not spec.shape and value.name not in named and \
                bare_name(value) in ("sum", "nansum") and _depends_on_batch(walk, value):
            walk.loss_terms.append((value.name, "mean"))
    # A routed MoE layer's dispatch (autopar.passes.analysis.experts: its tokens sorted by expert,
    # gathered, counted, run through their experts and put back in place) permutes the
    # layer's own rows; with dropless routing each row's output depends on that row alone,
    # so its sort, indexes and counts are not rows of the batch meeting (filtered above).


def _sorted_at(node: fx.Node) -> fx.Node:
    """The sort along the batch whose order ``node`` carries (``node`` itself if none is found)."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if bare_name(n) in ("sort", "argsort"):
            return n
        stack.extend(n.all_input_nodes)
    return node


def _exempt_router_statistics(walk: _Walk) -> None:
    """The routers' load-balancing statistics are the data pass's own (its
    ``sync_router_statistics`` makes each the mean over the data ranks): not couplings."""
    from autopar.passes.analysis.experts import router_statistics
    walk.statistics = set(router_statistics(walk.gm))
    walk.reductions = [(n, k) for n, k in walk.reductions if n.name not in walk.statistics]


def _offsets_only(node: fx.Node) -> bool:
    """Whether a count of rows per value (a histogram of expert ids) only makes a grouped
    matmul's group offsets (through cumsum and casts): organising the rank's own rows."""
    stack, seen, used = [node], set(), False
    while stack:
        n = stack.pop()
        for user in n.users:
            if user in seen:
                continue
            seen.add(user)
            name = bare_name(user)
            if name in ("grouped_mm_fallback", "_grouped_mm", "grouped_mm") and user.args and user.args[0] is not n:
                used = True
            elif name in ("cumsum", "to", "_to_copy", "int", "long", "contiguous", "clone", "detach"):
                stack.append(user)
            else:
                return False
    return used


def _pairwise_closure(walk: _Walk) -> set:
    """The pairwise scores and what pointwise ops and transposes make of them."""
    values = set(walk.pairwise)
    stack = list(walk.pairwise)
    while stack:
        n = stack.pop()
        for user in n.users:
            name = bare_name(user)
            if user in values:
                continue
            if name in _TRANSPOSES or name in ("transpose", "swapaxes", "permute") or name in _PAIRWISE_CHAIN \
                    or (is_pointwise_name(name) and user.op != "output"):
                values.add(user)
                stack.append(user)
    return values


# ---------------------------------------------------------------- what the planner asks


def split_conflict(found: list[Coupling], *, data: int = 1, rows_z: int = 1, microbatches: int = 1,
                   branches: bool = False, pipeline: bool = False) -> str | None:
    """Why a configuration that splits the batch this way would not equal the single
    device (None: it would). ``data``: ranks splitting the batch that the data pass
    joins (the exact remedies run there); ``rows_z``: the 3D grid's row split;
    ``microbatches``: passes over parts of the batch (a pipeline's or accumulation);
    ``branches``: D&SP's branches on other rows; ``pipeline``: the stages of a pipeline
    with data ranks (only the last stage runs the data pass)."""
    if not found:
        return None
    splits = []
    if microbatches > 1:
        splits.append(f"{microbatches} microbatches")
    if branches:
        splits.append("D&SP's branches on other rows")
    if rows_z > 1:
        splits.append(f"the 3D grid's rows over z = {rows_z}")
    if pipeline and data > 1:
        splits.append(f"a pipeline's stages over {data} data ranks")
    first_refused = next((c for c in found if not c.exact), None)
    if first_refused is not None and (data > 1 or splits):
        how = ", ".join(splits + ([f"{data} data ranks"] if data > 1 else []))
        return (f"rows of the batch meet at {first_refused.describe()}; splitting the batch over {how} would not "
                f"equal the single device. Plans that keep the batch whole (tensor, 3D over x and y, a pipeline "
                f"with one microbatch) are still possible")
    if splits:
        c = found[0]
        return (f"rows of the batch meet at {c.describe()}; autopar makes that exact across data ranks "
                f"({c.remedy}), not across {', '.join(splits)}. Use data (and tensor) parallelism, or a plan "
                f"that keeps the batch whole")
    return None


REMEDIES = {"gather": "each data rank scores its rows against every row: the operands all-gathered, their "
                      "gradients reduce-scattered, row-position targets offset",
            "all_reduce": "the statistic is the mean over the data ranks of each rank's (all-reduce forward and "
                          "backward)"}


def remedy_text(c: Coupling) -> str:
    """What a plan that splits the batch over data ranks does at ``c``."""
    if not c.exact:
        return "no exact split: plans that split the batch are refused"
    return REMEDIES[c.remedy]


def describe_all(found: list[Coupling]) -> list[str]:
    return [f"{c.kind}: {c.describe()} -> {remedy_text(c)}" for c in found]


__all__ = ["BATCH_COUPLINGS", "Coupling", "Rows", "bare_positions", "batch_size", "couplings", "describe_all",
           "find_batch_couplings_pass", "split_conflict"]
