"""The ops the batch-rows walk knows, by kind, in both spellings (``torch``/``Tensor``
methods and ATen), and the readers of a node's name, arguments and shape every rule uses."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn as nn

from autopar._torch_compat import argument_names, is_aten_op
from autopar.passes.analysis import ops
from autopar.ir import SPEC, TensorSpec

aten = torch.ops.aten


IDENTITY = {"clone", "contiguous", "detach", "alias", "lift_fresh_copy", "_to_copy", "to", "type_as", "float",
            "half", "bfloat16", "double", "int", "long", "bool", "type", "dropout", "native_dropout", "feature_dropout",
            "alpha_dropout", "_assert_tensor_metadata", "requires_grad_", "cpu", "cuda", "zeros_like", "ones_like",
            "empty_like", "full_like", "rand_like", "randn_like", "fill", "fill_", "copy", "copy_", "clone",
            "dropout1d", "dropout2d", "dropout3d", "replicated_dropout", "batch_statistic", "positive", "cumsum_"}
OPERATOR = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
            operator.floordiv: "floor_divide", operator.mod: "remainder", operator.pow: "pow", operator.neg: "neg",
            operator.eq: "eq", operator.ne: "ne", operator.lt: "lt", operator.le: "le", operator.gt: "gt",
            operator.ge: "ge", operator.and_: "bitwise_and", operator.or_: "bitwise_or", operator.xor: "bitwise_xor",
            operator.invert: "bitwise_not", operator.abs: "abs", operator.iadd: "add", operator.imul: "mul",
            operator.isub: "sub", operator.itruediv: "div"}
EXTRA_POINTWISE = {"floor_divide", "where", "masked_fill", "clamp", "clip", "gelu", "silu", "relu", "relu6",
                   "hardswish", "hardsigmoid", "mish", "softplus", "elu", "selu", "celu", "leaky_relu", "prelu",
                   "glu_pointwise", "logit", "nan_to_num", "clamp_min", "clamp_max", "lerp", "addcmul", "addcdiv",
                   "maximum", "minimum", "fmax", "fmin", "threshold", "hardtanh", "tanh", "sigmoid", "erf", "exp",
                   "log", "sqrt", "rsqrt", "square", "abs", "neg", "reciprocal", "sign", "logical_not",
                   "logical_and", "logical_or", "isnan", "isinf", "isfinite", "sin", "cos", "pow", "add", "sub",
                   "mul", "div", "true_divide", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_not", "masked_fill_",
                   "add_", "mul_", "sub_", "div_", "clamp_", "__and__", "__or__", "__xor__",
                   "__invert__", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "logical_xor",
                   "log_sigmoid", "logsigmoid", "softsign", "tanhshrink", "hardshrink", "softshrink"}
REDUCTIONS = {"sum": "sum", "nansum": "sum", "mean": "mean", "nanmean": "mean", "amax": "other", "amin": "other",
              "max": "other", "min": "other", "prod": "other", "std": "other", "var": "other",
              "std_mean": "other", "var_mean": "other", "norm": "other", "linalg_vector_norm": "other",
              "vector_norm": "other", "logsumexp": "other", "argmax": "other", "argmin": "other", "all": "other",
              "any": "other", "count_nonzero": "other", "median": "other", "nanmedian": "other", "mode": "other",
              "aminmax": "other"}
# ops along one dimension: (position of dim among the arguments after the tensor, default)
ALONG = {"softmax": (0, None), "_softmax": (0, None), "log_softmax": (0, None), "_log_softmax": (0, None),
         "cumsum": (0, None), "cumprod": (0, None), "cummax": (0, None), "cummin": (0, None),
         "logcumsumexp": (0, None), "sort": (0, -1), "argsort": (0, -1), "topk": (1, -1), "kthvalue": (1, -1),
         "diff": (1, -1), "glu": (0, -1), "normalize": (1, 1), "cosine_similarity": (1, 1), "flip": (0, None),
         "roll": (1, None), "fliplr": (0, 1), "flipud": (0, 0), "softmin": (0, None), "gumbel_softmax": (2, -1),
         "msort": (0, 0)}
LOSSES = {"cross_entropy_loss", "cross_entropy", "nll_loss", "nll_loss_nd", "nll_loss2d", "mse_loss", "l1_loss",
          "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div",
          "soft_margin_loss", "poisson_nll_loss", "hinge_embedding_loss", "margin_ranking_loss",
          "multilabel_soft_margin_loss", "gaussian_nll_loss"}
LOSSES |= {"multilabel_margin_loss", "multi_margin_loss", "cosine_embedding_loss", "triplet_margin_loss",
           "triplet_margin_with_distance_loss", "l1_loss", "mse_loss"}
CLASS_LOSSES = {"cross_entropy_loss", "cross_entropy", "nll_loss", "nll_loss_nd", "nll_loss2d"}
LEADING_BATCH = {"convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
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
SDPA = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention", "flex_attention"}
FACTORIES = {"arange", "zeros", "ones", "full", "empty", "eye", "linspace", "logspace", "randn", "rand", "randint",
             "randperm", "scalar_tensor", "tensor", "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor",
             "empty_strided", "_tensor_constant", "full_like_scalar", "normal"}
NO_VALUE = {"size", "dim", "numel", "sym_size", "sym_numel", "sym_stride", "sym_storage_offset", "len",
            "_assert_async", "_assert_scalar", "sym_constrain_range_for_size", "sym_constrain_range",
            "_local_scalar_dense", "item", "getattr", "stride", "is_floating_point", "get_device",
            "_set_grad_enabled", "manual_seed", "device", "isinstance", "_functional_assert_async"}
VIEWS = {"view", "reshape", "_unsafe_view", "view_as", "reshape_as", "flatten", "unflatten", "_reshape_alias"}
TRANSPOSES = {"t", "numpy_T", "mT", "T", "adjoint", "H", "mH"}
MATMUL = {"matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "linear", "einsum", "bilinear", "_grouped_mm"}
LINEAR_MODULES = (nn.Linear,)
POINTWISE_MODULES = ops.POINTWISE_MODULES + (nn.Hardswish, nn.Hardsigmoid, nn.ReLU6, nn.SELU, nn.CELU,
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
        _POINTWISE_CACHE[name] = name in EXTRA_POINTWISE or _aten_pointwise(name.rstrip("_"))
    return _POINTWISE_CACHE[name]


def bare_name(node: fx.Node) -> str:
    """The op's name whatever the spelling; operators by their aten names."""
    if node.op == "call_function" and node.target in OPERATOR:
        return OPERATOR[node.target]
    if node.op == "call_function" and node.target is getattr:
        return str(node.args[1]) if len(node.args) > 1 and node.args[1] in TRANSPOSES else "getattr"
    return ops.call_name(node)


def argument(node: fx.Node, index: int, name: str, default=None):
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


def shape_of(value) -> tuple | None:
    spec = value.meta.get(SPEC) if isinstance(value, fx.Node) else None
    return tuple(spec.shape) if isinstance(spec, TensorSpec) else None


def norm_dims(dims, ndim: int) -> list[int] | None:
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
