"""Counter-based random numbers shared by fused and unfused dropout.

autopar's rank-aware dropout draws its masks from Philox4x32-10 (Salmon et al., SC'11),
the generator of Triton's ``tl.randint``: element ``i`` of a dropout site's tensor gets
the 32-bit word ``philox(key=seed, counter=(i, 0, 0, 0))[0]``. A generated Triton kernel
computes the same word in registers, so a dropout fused into a kernel and the same
dropout run unfused (:func:`keep_mask`, in PyTorch) keep exactly the same elements, on
any device. Because the mask is a pure function of ``(seed, i)`` a fused kernel's
backward recomputes it instead of saving it.

The PyTorch implementation works in int64 arithmetic: a 32×32-bit product is split into
16-bit halves so that no intermediate exceeds 2^63.
"""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57   # Philox4x32 multipliers
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85       # Weyl increments of the key
ROUNDS = 10
THRESHOLD_BITS = 24
"""keep element i iff (word_i >> 8) >= round(p * 2^24): an integer comparison, so the
PyTorch and Triton masks agree bit for bit (no float rounding in between)."""


def _mul_hi_lo(constant: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of ``constant * x`` for 32-bit ``constant`` and ``x`` (int64)."""
    lo16, hi16 = x & 0xFFFF, x >> 16
    low = constant * lo16                  # < 2^48
    mid = constant * hi16                  # < 2^48
    hi = (mid + (low >> 16)) >> 16
    lo = (((mid & 0xFFFF) << 16) + low) & _M32
    return hi, lo


def philox4(seed: int, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton's ``tl.randint4x(seed, offsets)``: the four 32-bit words (each an int64
    tensor of unsigned values) of counter ``(offset mod 2^32, offset div 2^32, 0, 0)`` for
    non-negative int64 ``offsets`` and a 64-bit ``seed``."""
    if int(seed) < 0 or int(seed) >= 2**64:
        raise ValueError(f"philox seed {seed} is not an unsigned 64-bit integer")
    k0, k1 = int(seed) & _M32, (int(seed) >> 32) & _M32
    offsets = offsets.to(torch.int64)
    c0 = offsets & _M32
    c1 = (offsets >> 32) & _M32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    for _ in range(ROUNDS):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0, c1, c2, c3


def randint(seed: int, offsets: torch.Tensor) -> torch.Tensor:
    """Triton's ``tl.randint(seed, offsets)`` as unsigned 32-bit values in an int64 tensor,
    for non-negative ``offsets`` and a 64-bit ``seed``: the first word of :func:`philox4`."""
    return philox4(seed, offsets)[0]


def threshold(p: float) -> int:
    """The integer threshold of dropout probability ``p`` (see :data:`THRESHOLD_BITS`)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    return int(round(p * 2**THRESHOLD_BITS))


def keep_mask(seed: int, shape, p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """The elements a dropout of probability ``p`` keeps: a bool tensor of ``shape``,
    element i (row-major) kept iff ``(randint(seed, i) >> 8) >= threshold(p)``."""
    numel = 1
    for s in shape:
        numel *= int(s)
    words = randint(seed, torch.arange(numel, device=device, dtype=torch.int64))
    return ((words >> (32 - THRESHOLD_BITS)) >= threshold(p)).reshape(tuple(shape))


__all__ = ["philox4", "randint", "keep_mask", "threshold", "ROUNDS", "THRESHOLD_BITS"]
