"""The random ops of a graph: what each draws, in graph order (``gm.meta[RANDOM_SITES]``).

An op is random when it draws from a generator: ATen tags such ops
``nondeterministic_seeded`` (``rand``, ``randn``, ``randint``, ``bernoulli``, ``normal``,
``multinomial``, ``randperm``, ``dropout``, ``native_dropout``, the in-place
``uniform_``/``normal_``/``exponential_``...), and the tracers spell them as ATen
overloads, ``torch`` functions, ``Tensor`` methods or ``nn`` modules (``Dropout`` and its
kin); ``scaled_dot_product_attention`` with a ``dropout_p`` and ``F.gumbel_softmax`` draw
inside. Each random op found is a *site*: its kind (:data:`KINDS`, or ``"unsupported"``
for a random op autopar cannot draw for, which a compile refuses), the shape of its value
and its captured name, stamped on the node (``node.meta[RANDOM_SITE]``) so the rewrites
that replace it keep it. :mod:`autopar.passes.random_draws` rewrites every site into the
plan-independent draws of :mod:`autopar.runtime.rng`.

A dropout in eval mode (``training=False``, a module not training) or with ``p = 0``,
and an attention with ``dropout_p = 0``, draw nothing and are no site.
"""
from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn

from autopar._torch_compat import argument_names, is_aten_op
from autopar.ir import RANDOM_SITE, RANDOM_SITES, SPEC, TensorSpec
from autopar.passes.analysis import ops

aten = torch.ops.aten

KINDS = ("dropout", "native_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "uniform",
         "normal", "randint", "bernoulli", "exponential", "multinomial", "randperm", "sdpa", "gumbel_softmax")

# the bare name of a function, method or ATen packet -> its kind
_BY_NAME = {
    "dropout": "dropout", "native_dropout": "native_dropout", "feature_dropout": "feature_dropout",
    "dropout1d": "feature_dropout", "dropout2d": "feature_dropout", "dropout3d": "feature_dropout",
    "alpha_dropout": "alpha_dropout", "feature_alpha_dropout": "feature_alpha_dropout",
    "rand": "uniform", "rand_like": "uniform", "uniform": "uniform", "uniform_": "uniform",
    "randn": "normal", "randn_like": "normal", "normal": "normal", "normal_": "normal",
    "normal_functional": "normal",
    "randint": "randint", "randint_like": "randint", "random_": "randint",
    "bernoulli": "bernoulli", "bernoulli_": "bernoulli",
    "exponential": "exponential", "exponential_": "exponential",
    "multinomial": "multinomial", "randperm": "randperm",
    "gumbel_softmax": "gumbel_softmax",
}
_DROPOUT_MODULES = ((nn.Dropout1d, "feature_dropout"), (nn.Dropout2d, "feature_dropout"),
                    (nn.Dropout3d, "feature_dropout"), (nn.AlphaDropout, "alpha_dropout"),
                    (nn.FeatureAlphaDropout, "feature_alpha_dropout"), (nn.Dropout, "dropout"))


def _seeded(name: str) -> bool:
    """Whether ATen tags an op of this name as drawing from a generator."""
    packet = getattr(aten, name.rstrip("_") if not hasattr(aten, name) else name, None)
    if packet is None or not hasattr(packet, "overloads"):
        return False
    return any(torch.Tag.nondeterministic_seeded in getattr(packet, o).tags for o in packet.overloads())


def _arg(node: fx.Node, index: int, name: str, default=None):
    if name in node.kwargs:
        return node.kwargs[name]
    if is_aten_op(node.target):
        names = argument_names(node.target)
        if name in names:
            i = names.index(name)
            return node.args[i] if i < len(node.args) else default
        return default
    return node.args[index] if index < len(node.args) else default


def random_kind(node: fx.Node, gm: fx.GraphModule) -> str | None:
    """What random op ``node`` is (one of :data:`KINDS`; ``"unsupported"`` for one autopar
    cannot draw for), or None when it draws nothing."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        for cls, kind in _DROPOUT_MODULES:
            if isinstance(module, cls):
                return kind if module.training and module.p > 0 else None
        if isinstance(module, nn.RReLU):
            return "unsupported" if module.training else None
        if isinstance(module, nn.RNNBase):
            return "unsupported" if module.training and module.dropout > 0 else None
        return None
    if node.op not in ("call_function", "call_method"):
        return None
    if node.op == "call_function" and node.target in ops.SDPA_FUNCTIONS:
        if ops.call_name(node) != "scaled_dot_product_attention":
            return "unsupported" if _seeded(ops.call_name(node)) and _arg(node, 3, "dropout_p", 0.0) else None
        return "sdpa" if _arg(node, 4, "dropout_p", 0.0) else None
    name = ops.call_name(node)
    kind = _BY_NAME.get(name)
    if kind in ("dropout", "native_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"):
        p = _arg(node, 1, "p", 0.5)
        training = _arg(node, 2, "train", _arg(node, 2, "training", True))
        return kind if training is not False and p != 0 else None
    if kind is not None:
        return kind
    if name in ("rrelu", "rrelu_", "rrelu_with_noise"):
        training = _arg(node, 3, "training", False)
        return "unsupported" if training else None
    if name and _seeded(name):
        return "unsupported"
    return None


def shape_of(node: fx.Node) -> tuple | None:
    spec = node.meta.get(SPEC)
    if isinstance(spec, (tuple, list)):
        spec = spec[0] if spec else None
    return tuple(spec.shape) if isinstance(spec, TensorSpec) else None


def find_random_sites_pass(gm: fx.GraphModule) -> fx.GraphModule:
    """Write :data:`~autopar.ir.RANDOM_SITES` on ``gm`` and stamp each site's node."""
    sites = []
    for node in gm.graph.nodes:
        kind = random_kind(node, gm)
        if kind is None:
            continue
        node.meta[RANDOM_SITE] = node.name
        sites.append({"node": node.name, "kind": kind, "op": ops.op_name(node),
                      "shape": list(shape_of(node) or ()), "rows": []})
    gm.meta[RANDOM_SITES] = sites
    return gm


def sites(gm: fx.GraphModule) -> list[dict]:
    return list(gm.meta.get(RANDOM_SITES, []))
