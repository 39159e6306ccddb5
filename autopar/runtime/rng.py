"""Random draws that do not depend on the plan: every random op of a program draws from a
counter-based stream keyed by the seed, the call, the op and each element's *global*
index.

A model's random ops (dropout anywhere, ``scaled_dot_product_attention``'s ``dropout_p``,
``rand``, ``randn``, ``randint``, ``bernoulli``, ``normal``, ``multinomial``,
``randperm``, their ``_like`` and in-place forms) are rewritten by
:mod:`autopar.passes.random_draws` into the draws of this module. Element ``i`` of a
random op's value over the *whole batch* (its index in the value the single device
computes, row-major) gets the Philox4x32-10 words (Salmon et al., SC'11; the generator of
Triton's ``tl.randint4x``) of counter ``(i mod 2^32, i div 2^32, 0, 0)`` under the key
``mix(seed, call, site)``:

* ``seed``: ``compile(seed=...)``, the same on every rank;
* ``call``: the number of the call (``pm.step``, ``pm(...)``) since compile, counted on
  every rank alike (restored by ``autopar.resume``);
* ``site``: the op's index among the random ops of the plan's capture, in graph order.

A rank computes its part of a value only: the element's global index comes from its
local index and, per dimension, where the rank's part sits in the whole (a
:data:`Layout`): the dimension's whole, the rows of the batch this program run holds
(``("rows", f)``, ``f`` elements per row; the runner says which rows, :func:`rows`), or
a contiguous part split over a group (``("split", group)``: Megatron's heads, sequence
parallelism's tokens). So a run gives the same draws under every plan and world size,
one rank under autopar included, and no two rows of the batch share draws; recomputation
draws the same again (same call, site and rows: :meth:`RandomStates.get_state` holds them).
The draws are autopar's, not torch's generator's: equal to autopar on one device, not to
the plain model.

From the words: a uniform in [0, 1) takes the top 24 bits of the first word (float32,
half, bfloat16: computed in float32) or 53 bits of the first two (float64); a normal is
Box-Muller of two uniforms (words 0-1 and 2-3); dropout keeps element ``i`` iff
``(word0 >> 8) >= round(p * 2^24)`` (:func:`autopar.runtime.philox.keep_mask`, the test a
generated Triton kernel makes in registers, :mod:`autopar.passes.fusion`).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.fx

from autopar.runtime import philox
from autopar.runtime._swap import SwapGlobal
from autopar.runtime.groups import group_rank, group_size

_MASK64 = 2**64 - 1

Layout = tuple
"""Per dimension of a random op's local value: ``None`` (the whole dimension), ``("rows", f)``
(the rows of the batch this program run holds, ``f`` elements per row, rows outermost), or
``("split", group)`` (a contiguous part, the rank's place in ``group``)."""


def _mix(*values: int) -> int:
    """Combine integers into a 63-bit seed with SplitMix64, so nearby inputs give unrelated seeds."""
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ (value & _MASK64)) & _MASK64
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state >> 1


class RandomStates:
    """A rank's random draws: the seed, the number of the current call, and the rows of
    the batch the program running holds (``(first row, rows, rows of the whole batch)``)."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self.calls = 0
        self.rows: tuple[int, int, int] | None = None

    def next_call(self) -> None:
        """A new call (``pm.step``, ``pm(...)``): its draws are new."""
        self.calls += 1

    def site_seed(self, site: int) -> int:
        """The Philox key of random site ``site`` in this call, in [2^62, 2^63): one
        integer width for every key, so a Triton kernel taking it is compiled once."""
        return _mix(self.seed, self.calls, site) | (1 << 62)

    def get_state(self) -> dict:
        """What the draws depend on besides the seed: the call and the rows (a recomputation
        restores them, :mod:`autopar.passes.recompute`; a checkpoint saves them)."""
        return {"calls": self.calls, "rows": self.rows}

    def set_state(self, state: dict) -> None:
        """Restore a snapshot taken with :meth:`get_state`."""
        self.calls = int(state.get("calls", 0))
        self.rows = state.get("rows", self.rows)


_STATES: Optional[RandomStates] = None


def seed_everything(seed: int) -> RandomStates:
    """Seed torch's default generator with ``seed`` (identical on every rank, so full
    weights are initialised identically before sharding) and start autopar's draws."""
    global _STATES
    torch.manual_seed(seed)
    _STATES = RandomStates(seed)
    return _STATES


class use_random_states(SwapGlobal):
    """Install ``states`` as the draws' state for the duration of the block (each
    ParallelModule owns its own; this lets several live in one process)."""

    __slots__ = ()

    def __init__(self, states: RandomStates):
        super().__init__(globals(), "_STATES", states)


class rows(SwapGlobal):
    """The block runs a program on rows ``first .. first + count - 1`` of a batch of
    ``total`` rows (of ``states``, else the installed state): the ``("rows", f)``
    dimensions of its draws sit there."""

    __slots__ = ()

    def __init__(self, first: int, count: int, total: int, states: RandomStates | None = None):
        super().__init__((states or get_random_states()).__dict__, "rows", (int(first), int(count), int(total)))


def get_random_states() -> RandomStates:
    """The draws' state installed by :func:`use_random_states` (or :func:`seed_everything`);
    without one, a state seeded from ``torch.initial_seed()``."""
    global _STATES
    if _STATES is None:
        _STATES = RandomStates(torch.initial_seed())
    return _STATES


# ------------------------------------------------------------------ where a rank's part sits
def placement(shape: Sequence[int], layout: Layout, states: RandomStates | None = None
              ) -> list[tuple[int, int, int]]:
    """Per dimension of a local value of ``shape``: ``(local size, offset of the rank's
    part in the whole, whole size)``, from ``layout`` (:data:`Layout`)."""
    states = states or get_random_states()
    out = []
    layout = tuple(layout) + (None,) * (len(shape) - len(layout))
    for d, (n, how) in enumerate(zip(shape, layout)):
        n = int(n)
        if how is None:
            out.append((n, 0, n))
        elif how[0] == "rows":
            f = int(how[1])
            # outside a program run that says which rows it holds (a capture running the
            # program once for its shapes): the rows of the whole batch
            first, count, total = states.rows if states.rows is not None else (0, n // f, n // f)
            if n != count * f:
                raise RuntimeError(f"a random draw's dimension {d} holds {n} elements, not the {count} rows of this "
                                   f"program run times {f}; this is a bug")
            out.append((n, first * f, total * f))
        elif how[0] == "split":
            g, size = group_rank(how[1]), group_size(how[1])
            out.append((n, g * n, n * size))
        else:
            raise ValueError(f"random draw: unknown layout {how!r} of dimension {d}")
    return out


def global_index(shape: Sequence[int], layout: Layout, device=None, states: RandomStates | None = None
                 ) -> torch.Tensor:
    """Each element's index in the whole value (int64, of ``shape``): the counter of its draws."""
    dims = placement(shape, layout, states)
    index = torch.zeros((), dtype=torch.int64, device=device)
    stride = 1
    for d in range(len(dims) - 1, -1, -1):
        n, offset, whole = dims[d]
        view = [1] * len(dims)
        view[d] = n
        coord = (torch.arange(n, dtype=torch.int64, device=device) + offset).view(view)
        index = index + coord * stride
        stride *= whole
    return index.expand(tuple(int(n) for n in shape)) if len(dims) else index


def dropout_index(site: int, layout: Layout, like: torch.Tensor, view: Sequence[int] | None = None
                  ) -> tuple[int, ...]:
    """What a generated kernel draws a dropout site's mask with, for a value shaped like
    ``like`` (or the ``view`` of it, a ``-1`` taken from its size): the site's key, then
    per dimension (local size, offset of the rank's part, stride in the whole): the kernel
    computes :func:`global_index` of each element from its local offset
    (:mod:`autopar.passes.fusion.codegen`)."""
    states = get_random_states()
    shape = tuple(like.shape)
    if view is not None:
        known = math.prod(int(d) for d in view if int(d) != -1)
        shape = tuple(like.numel() // known if int(d) == -1 else int(d) for d in view)
    dims = placement(shape, layout, states)
    strides, stride = [], 1
    for _, _, whole in reversed(dims):
        strides.append(stride)
        stride *= whole
    strides.reverse()
    out = [states.site_seed(site)]
    for (n, offset, _), s in zip(dims, strides):
        out += [n, offset, s]
    return tuple(out)


def _words(site: int, shape, layout, device) -> tuple[torch.Tensor, ...]:
    states = get_random_states()
    return philox.philox4(states.site_seed(site), global_index(shape, layout, device, states))


_TWO_24, _TWO_53 = 2.0**-24, 2.0**-53


def _uniform_from(words: tuple, dtype: torch.dtype, second: bool = False) -> torch.Tensor:
    """Uniforms in [0, 1) from the words (the first two; ``second``: the last two)."""
    a, b = (words[2], words[3]) if second else (words[0], words[1])
    if dtype == torch.float64:
        return ((a >> 5) * 2.0**26 + (b >> 6)).to(torch.float64) * _TWO_53
    return (a >> 8).to(torch.float32) * _TWO_24


def _float(dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None and dtype.is_floating_point else torch.get_default_dtype()


# ------------------------------------------------------------------ the draws
def uniform(shape, site: int, layout: Layout, low=0.0, high=1.0, dtype=None, device=None) -> torch.Tensor:
    """``torch.rand`` (``low + (high - low) * U[0, 1)``), drawn as the module docstring says."""
    dtype = _float(dtype)
    u = _uniform_from(_words(site, shape, layout, device), dtype)
    return (u * (high - low) + low).to(dtype) if (low, high) != (0.0, 1.0) else u.to(dtype)


def normal(shape, site: int, layout: Layout, mean=0.0, std=1.0, dtype=None, device=None) -> torch.Tensor:
    """``torch.randn`` scaled: ``mean + std * N(0, 1)`` by Box-Muller of two uniforms."""
    dtype = _float(dtype)
    words = _words(site, shape, layout, device)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    u1, u2 = _uniform_from(words, work), _uniform_from(words, work, second=True)
    z = torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos((2.0 * math.pi) * u2)
    if not (isinstance(mean, (int, float)) and isinstance(std, (int, float)) and (mean, std) == (0.0, 1.0)):
        z = z * std + mean
    return z.to(dtype)


def randint(low: int, high: int, shape, site: int, layout: Layout, dtype=None, device=None) -> torch.Tensor:
    """``torch.randint(low, high, shape)``: ``low + (64-bit word mod (high - low))``."""
    if high <= low:
        raise ValueError(f"randint: high ({high}) must exceed low ({low})")
    words = _words(site, shape, layout, device)
    word = (words[1] << 31) ^ words[0]   # 63 bits, non-negative in int64
    return (word % int(high - low) + int(low)).to(dtype or torch.int64)


def bernoulli(p, shape, site: int, layout: Layout, dtype=None, device=None) -> torch.Tensor:
    """``torch.bernoulli``: 1 where a uniform falls below ``p`` (a tensor broadcast to
    ``shape``, or a number)."""
    work = torch.float64 if (isinstance(p, torch.Tensor) and p.dtype == torch.float64) or dtype == torch.float64 \
        else torch.float32
    u = _uniform_from(_words(site, shape, layout, device), work)
    p = p.to(work) if isinstance(p, torch.Tensor) else p
    return (u < p).to(dtype or (p.dtype if isinstance(p, torch.Tensor) else torch.get_default_dtype()))


def exponential(shape, site: int, layout: Layout, lambd: float = 1.0, dtype=None, device=None) -> torch.Tensor:
    """``Tensor.exponential_(lambd)``: ``-log(1 - U) / lambd``."""
    dtype = _float(dtype)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    u = _uniform_from(_words(site, shape, layout, device), work)
    return (-torch.log1p(-u) / lambd).to(dtype)


def keep_mask(shape, p: float, site: int, layout: Layout, device=None) -> torch.Tensor:
    """The elements a dropout of probability ``p`` keeps (the rule of
    :func:`autopar.runtime.philox.keep_mask`, over global indices)."""
    words = _words(site, shape, layout, device)
    return (words[0] >> (32 - philox.THRESHOLD_BITS)) >= philox.threshold(p)


def dropout(x: torch.Tensor, p: float, training: bool, site: int, layout: Layout) -> torch.Tensor:
    """``F.dropout(x, p, training)`` with the mask of :func:`keep_mask`."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    keep = keep_mask(x.shape, p, site, layout, x.device)
    return torch.where(keep, x * (1.0 / (1.0 - p)), torch.zeros((), dtype=x.dtype, device=x.device))


def native_dropout(x: torch.Tensor, p: float, training, site: int, layout: Layout):
    """``aten.native_dropout``: ``(output, mask)``."""
    if not training or p == 0.0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    keep = keep_mask(x.shape, p, site, layout, x.device) if p < 1.0 else torch.zeros_like(x, dtype=torch.bool)
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    return x * keep * scale, keep


def feature_dropout(x: torch.Tensor, p: float, training: bool, site: int, layout: Layout,
                    alpha: bool = False) -> torch.Tensor:
    """``dropout1d/2d/3d`` (``feature_dropout``), and with ``alpha`` ``feature_alpha_dropout``:
    one draw per channel (the first two dimensions; one for an input without a batch)."""
    if not training or p == 0.0:
        return x
    channels = 2 if x.dim() > 2 else 1
    shape = tuple(x.shape[:channels]) + (1,) * (x.dim() - channels)
    keep = keep_mask(shape[:channels], p, site, tuple(layout)[:channels], x.device).reshape(shape) \
        if p < 1.0 else torch.zeros(shape, dtype=torch.bool, device=x.device)
    return _alpha(x, keep, p) if alpha else x * keep * (0.0 if p == 1.0 else 1.0 / (1.0 - p))


def alpha_dropout(x: torch.Tensor, p: float, training: bool, site: int, layout: Layout) -> torch.Tensor:
    """``F.alpha_dropout``: dropped elements set to SELU's negative saturation, then the
    affine correction that keeps mean and variance (Klambauer et al. 2017)."""
    if not training or p == 0.0:
        return x
    keep = keep_mask(x.shape, p, site, layout, x.device) if p < 1.0 else torch.zeros_like(x, dtype=torch.bool)
    return _alpha(x, keep, p)


def _alpha(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    if p == 1.0:
        return x * 0.0
    alpha_prime = -1.7580993408473766   # -scale * alpha of SELU
    a = ((1 - p) * (1 + p * alpha_prime ** 2)) ** -0.5
    b = -a * alpha_prime * p
    return (x * keep + alpha_prime * (~keep)) * a + b


def multinomial(probs: torch.Tensor, samples: int, replacement: bool, site: int, layout: Layout) -> torch.Tensor:
    """``torch.multinomial``: with replacement the inverse of each row's cumulative
    distribution at a uniform per (row, sample); without, the ``samples`` largest of
    ``log p + Gumbel`` per row (the Gumbel-top-k draw). Rows are the leading dimensions."""
    rows_shape = tuple(probs.shape[:-1])
    work = torch.float64 if probs.dtype == torch.float64 else torch.float32
    p = probs.to(work)
    if replacement:
        words = _words(site, rows_shape + (int(samples),), tuple(layout)[:-1] + (None,), probs.device)
        u = _uniform_from(words, work)
        cdf = torch.cumsum(p, -1)
        cdf = cdf / cdf[..., -1:]
        return torch.searchsorted(cdf.contiguous(), (u * (1 - 2 ** -20)).contiguous(), right=True) \
            .clamp_(max=p.shape[-1] - 1)
    words = _words(site, tuple(probs.shape), tuple(layout)[:-1] + (None,), probs.device)
    u = _uniform_from(words, work)
    gumbel = -torch.log(-torch.log1p(-u).clamp_max(-1e-30))
    scores = torch.where(p > 0, torch.log(p) + gumbel, torch.full_like(p, -math.inf))
    return torch.topk(scores, int(samples), dim=-1).indices


def randperm(n: int, site: int, dtype=None, device=None) -> torch.Tensor:
    """``torch.randperm(n)``: the order of ``n`` uniforms (the whole permutation on every rank)."""
    words = _words(site, (int(n),), (None,), device)
    keys = (words[1] << 31) ^ words[0]
    return torch.argsort(keys).to(dtype or torch.int64)


def sdpa_dropout(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                 scale=None, enable_gqa: bool = False, *, site: int, layout: Layout, training: bool = True):
    """``scaled_dot_product_attention`` with its dropout drawn here: the attention's
    probabilities ``[..., L, S]`` computed in full, dropout applied with the global
    indices of ``layout`` (the query's leading dimensions, then the whole ``L`` and ``S``)."""
    L, S = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        causal = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    probs = torch.softmax(scores, dim=-1)
    if training and dropout_p > 0.0:
        lead = tuple(layout)[:query.dim() - 2]
        probs = dropout(probs, dropout_p, True, site, lead + (None, None))
    return torch.matmul(probs, value)


GRAPH_FUNCTIONS = ("uniform", "normal", "randint", "bernoulli", "exponential", "dropout", "native_dropout",
                   "feature_dropout", "alpha_dropout", "multinomial", "randperm", "sdpa_dropout", "keep_mask",
                   "dropout_index")
for _name in GRAPH_FUNCTIONS:
    torch.fx.wrap(_name)


__all__ = ["RandomStates", "Layout", "seed_everything", "use_random_states", "rows", "get_random_states",
           "placement", "global_index", "uniform", "normal", "randint", "bernoulli", "exponential", "keep_mask",
           "dropout", "native_dropout", "feature_dropout", "alpha_dropout", "multinomial", "randperm",
           "sdpa_dropout", "dropout_index", "GRAPH_FUNCTIONS"]
