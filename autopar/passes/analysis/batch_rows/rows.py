"""What the batch-rows walk carries and what it finds: :class:`Rows`, where a value holds
the rows of the batch, and :class:`Coupling`, a node where rows meet (the kinds and their
remedies: :mod:`autopar.passes.analysis.batch_rows`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch.fx as fx

from autopar.ir import BATCH_COUPLINGS

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
