"""The random ops of a rank program, drawn from autopar's streams (:mod:`autopar.runtime.rng`).

:mod:`autopar.passes.random_draws` replaces each random op of a program by the function
here of its kind, called as the op was (its arguments and keywords as the tracer wrote
them, whatever the spelling: ``torch.rand(2, 3)``, ``aten.rand.default([2, 3])``,
``x.uniform_(-1, 1)``, ``F.dropout(x, 0.1, True)``, ``nn.Dropout``'s call), plus the
site's keywords: ``_form`` (the op's bare name, which says how its arguments read),
``_site`` (its index among the plan's random sites) and ``_at`` (the layout of its value,
:data:`autopar.runtime.rng.Layout`). Each reads the shape, dtype and parameters the op
would, and draws with :mod:`autopar.runtime.rng`; an in-place form fills its tensor.
"""
from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F

from autopar.runtime import rng


def _bind(args: tuple, kwargs: dict, names: tuple, defaults: dict) -> dict:
    """The call's arguments by name: positional ``args`` in the order of ``names``, then
    ``kwargs`` (``input`` and ``self`` are one), then ``defaults``."""
    out = dict(defaults)
    out.update(zip(names, args))
    for key, value in kwargs.items():
        out["input" if key == "self" else key] = value
    return out


def _size(args: tuple, kwargs: dict) -> tuple:
    """``torch.rand(2, 3)``, ``torch.rand((2, 3))``, ``aten.rand([2, 3])``, ``size=``."""
    if "size" in kwargs:
        return tuple(int(s) for s in kwargs["size"])
    if len(args) == 1 and isinstance(args[0], (list, tuple, torch.Size)):
        return tuple(int(s) for s in args[0])
    return tuple(int(s) for s in args)


def _where(kwargs: dict, like: torch.Tensor | None = None) -> tuple:
    dtype = kwargs.get("dtype") or (like.dtype if like is not None else None)
    device = kwargs.get("device") or (like.device if like is not None else None)
    return dtype, device


def _fill(target: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        target.copy_(value)
    return target


def uniform(*args, _form: str, _site: int, _at: tuple, **kwargs):
    """``rand``, ``rand_like``, ``uniform`` (ATen's functional), ``uniform_``."""
    if _form == "rand":
        dtype, device = _where(kwargs)
        return rng.uniform(_size(args, {k: v for k, v in kwargs.items() if k == "size"}), _site, _at, dtype=dtype,
                           device=device)
    if _form == "rand_like":
        a = _bind(args, kwargs, ("input",), {})
        dtype, device = _where(kwargs, a["input"])
        return rng.uniform(a["input"].shape, _site, _at, dtype=dtype, device=device)
    a = _bind(args, kwargs, ("input", "from", "to"), {"from": 0.0, "to": 1.0})
    x = a["input"]
    value = rng.uniform(x.shape, _site, _at, low=float(a["from"]), high=float(a["to"]), dtype=x.dtype,
                        device=x.device)
    return _fill(x, value) if _form == "uniform_" else value


def normal(*args, _form: str, _site: int, _at: tuple, **kwargs):
    """``randn``, ``randn_like``, ``normal`` (every overload), ``normal_``, ``normal_functional``."""
    if _form == "randn":
        dtype, device = _where(kwargs)
        return rng.normal(_size(args, {k: v for k, v in kwargs.items() if k == "size"}), _site, _at, dtype=dtype,
                          device=device)
    if _form == "randn_like":
        a = _bind(args, kwargs, ("input",), {})
        dtype, device = _where(kwargs, a["input"])
        return rng.normal(a["input"].shape, _site, _at, dtype=dtype, device=device)
    if _form in ("normal_", "normal_functional"):
        a = _bind(args, kwargs, ("input", "mean", "std"), {"mean": 0.0, "std": 1.0})
        x = a["input"]
        value = rng.normal(x.shape, _site, _at, float(a["mean"]), float(a["std"]), dtype=x.dtype, device=x.device)
        return _fill(x, value) if _form == "normal_" else value
    a = _bind(args, kwargs, ("mean", "std", "size"), {"mean": 0.0, "std": 1.0})
    mean, std = a["mean"], a["std"]
    tensors = [t for t in (mean, std) if isinstance(t, torch.Tensor)]
    if tensors:
        shape = torch.broadcast_shapes(*(t.shape for t in tensors))
        dtype, device = tensors[0].dtype, tensors[0].device
    else:
        shape = _size((), {"size": a["size"]})
        dtype, device = _where(kwargs)
    return rng.normal(shape, _site, _at, mean, std, dtype=dtype, device=device)


def randint(*args, _form: str, _site: int, _at: tuple, **kwargs):
    """``randint`` (``high, size`` or ``low, high, size``), ``randint_like``, ``random_``."""
    if _form == "randint":
        ints = [a for a in args if not isinstance(a, (list, tuple, torch.Size))]
        size = next((a for a in args if isinstance(a, (list, tuple, torch.Size))), kwargs.get("size"))
        low, high = (0, ints[0]) if len(ints) == 1 else ints[:2]
        low, high = kwargs.get("low", low), kwargs.get("high", high)
        dtype, device = _where(kwargs)
        return rng.randint(int(low), int(high), tuple(int(s) for s in size), _site, _at, dtype=dtype or torch.int64,
                           device=device)
    x, rest = args[0] if args else kwargs.get("input", kwargs.get("self")), [a for a in args[1:]]
    if _form == "random_":
        bounds = rest or [kwargs[k] for k in ("from", "to") if k in kwargs]
        low, high = (0, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1]) if bounds else \
            (0, 2 ** (torch.finfo(x.dtype).nmant + 1) if x.is_floating_point() else torch.iinfo(x.dtype).max)
        return _fill(x, rng.randint(int(low), int(high), x.shape, _site, _at, dtype=x.dtype, device=x.device))
    low, high = (0, rest[0]) if len(rest) == 1 else rest[:2] if rest else (kwargs.get("low", 0), kwargs["high"])
    dtype, device = _where(kwargs, x)
    return rng.randint(int(low), int(high), x.shape, _site, _at, dtype=dtype, device=device)


def bernoulli(*args, _form: str, _site: int, _at: tuple, **kwargs):
    """``bernoulli(probabilities)``, ``bernoulli(x, p)``, ``bernoulli_(p)``."""
    a = _bind(args, kwargs, ("input", "p"), {"p": None})
    x, p = a["input"], a["p"]
    if p is None:
        p = x
    value = rng.bernoulli(p, x.shape, _site, _at, dtype=x.dtype, device=x.device)
    return _fill(x, value) if _form == "bernoulli_" else value


def exponential(*args, _form: str, _site: int, _at: tuple, **kwargs):
    """``exponential_(lambd)`` and ATen's functional ``exponential``."""
    a = _bind(args, kwargs, ("input", "lambd"), {"lambd": 1.0})
    x = a["input"]
    value = rng.exponential(x.shape, _site, _at, float(a["lambd"]), dtype=x.dtype, device=x.device)
    return _fill(x, value) if _form == "exponential_" else value


def multinomial(*args, _form: str, _site: int, _at: tuple, **kwargs):
    a = _bind(args, kwargs, ("input", "num_samples", "replacement"), {"replacement": False})
    return rng.multinomial(a["input"], int(a["num_samples"]), bool(a["replacement"]), _site, _at)


def randperm(*args, _form: str, _site: int, _at: tuple, **kwargs):
    a = _bind(args, kwargs, ("n",), {})
    dtype, device = _where(kwargs)
    return rng.randperm(int(a["n"]), _site, dtype=dtype, device=device)


def _dropout_arguments(args: tuple, kwargs: dict) -> tuple:
    a = _bind(args, kwargs, ("input", "p", "training"), {"p": 0.5, "training": True})
    training = a.get("train", a["training"])
    return a["input"], float(a["p"]), bool(training)


def dropout(*args, _form: str, _site: int, _at: tuple, **kwargs):
    """``F.dropout``, ``torch.dropout``, ``aten.dropout``, ``nn.Dropout`` (its ``p`` and
    mode as arguments), ``native_dropout`` (``(output, mask)``) and the feature and alpha
    dropouts."""
    x, p, training = _dropout_arguments(args, kwargs)
    if _form == "native_dropout":
        return rng.native_dropout(x, p, training, _site, _at)
    if _form in ("feature_dropout", "dropout1d", "dropout2d", "dropout3d"):
        return rng.feature_dropout(x, p, training, _site, _at)
    if _form == "feature_alpha_dropout":
        return rng.feature_dropout(x, p, training, _site, _at, alpha=True)
    if _form == "alpha_dropout":
        return rng.alpha_dropout(x, p, training, _site, _at)
    return rng.dropout(x, p, training, _site, _at)


def sdpa(*args, _form: str, _site: int, _at: tuple, _training: bool = True, **kwargs):
    """``scaled_dot_product_attention`` with ``dropout_p``: :func:`rng.sdpa_dropout`."""
    a = _bind(args, kwargs, ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale"),
              {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None})
    return rng.sdpa_dropout(a["query"], a["key"], a["value"], a["attn_mask"], float(a["dropout_p"]),
                            bool(a["is_causal"]), a["scale"], bool(a.get("enable_gqa", False)), site=_site,
                            layout=_at, training=_training)


def gumbel_softmax(*args, _form: str, _site: int, _at: tuple, **kwargs):
    """``F.gumbel_softmax``: the Gumbel noise ``-log(Exp(1))`` drawn here, the rest as torch
    computes it (a straight-through one-hot with ``hard``)."""
    a = _bind(args, kwargs, ("logits", "tau", "hard", "eps", "dim"), {"tau": 1.0, "hard": False, "dim": -1})
    logits = a.get("input", a["logits"])
    gumbels = -rng.exponential(logits.shape, _site, _at, dtype=logits.dtype, device=logits.device).log()
    y = F.softmax((logits + gumbels) / a["tau"], dim=a["dim"])
    if not a["hard"]:
        return y
    index = y.max(a["dim"], keepdim=True)[1]
    hard = torch.zeros_like(logits, memory_format=torch.legacy_contiguous_format).scatter_(a["dim"], index, 1.0)
    return hard - y.detach() + y


KIND_FUNCTIONS = {"uniform": uniform, "normal": normal, "randint": randint, "bernoulli": bernoulli,
                  "exponential": exponential, "multinomial": multinomial, "randperm": randperm, "dropout": dropout,
                  "native_dropout": dropout, "feature_dropout": dropout, "alpha_dropout": dropout,
                  "feature_alpha_dropout": dropout, "sdpa": sdpa, "gumbel_softmax": gumbel_softmax}
"""Each kind of :mod:`autopar.passes.analysis.random_sites` to the function drawing it."""

for _fn in set(KIND_FUNCTIONS.values()):
    torch.fx.wrap(_fn.__name__)

__all__ = ["KIND_FUNCTIONS"] + sorted({fn.__name__ for fn in KIND_FUNCTIONS.values()})
