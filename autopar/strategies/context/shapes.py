"""Where a value's sequence factor goes through an op that regroups dimensions.

A value split over the context group holds ``outer × seq × inner`` elements in one
dimension (:mod:`.collectives`); these helpers follow that factor through reshapes,
transposes and broadcasts, from the global shapes the capture recorded.
"""
from __future__ import annotations

import math
from typing import NamedTuple


class Tokens(NamedTuple):
    """A value whose dimension ``dim`` holds this rank's tokens (``outer × seq/c × inner``)."""

    dim: int
    inner: int = 1


def suffix(shape, j: int) -> int:
    """The product of ``shape[j:]``."""
    return math.prod(shape[j:])


def reshaped(tok: Tokens, shape_in, shape_out, seq: int) -> Tokens | None:
    """Where the sequence factor of ``tok`` (in ``shape_in``) lies in ``shape_out`` (same
    elements): the output dimension whose extent holds the whole factor, or None when
    the reshape cuts through it."""
    low = tok.inner * suffix(shape_in, tok.dim + 1)   # elements per step of the sequence
    high = low * seq
    for j in range(len(shape_out)):
        inside, outside = suffix(shape_out, j + 1), suffix(shape_out, j)
        if inside <= low and high <= outside and low % inside == 0 and outside % high == 0:
            if shape_out[j] % seq:
                return None
            return Tokens(j, low // inside)
    return None


def aligned(dim: int, ndim_in: int, ndim_out: int) -> int:
    """A dimension of an operand broadcast against an output of ``ndim_out`` dimensions."""
    return dim + (ndim_out - ndim_in)

