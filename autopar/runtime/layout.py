"""The parameter layout: for every parameter of the model, how it is cut and where it lives.

A :class:`ParamLayout` is made once per rank by the families of the plan
(:func:`autopar.strategies.placement.build_layout`: each family that touches
parameters places them) and read by everything that handles parameters:
:class:`autopar.engine.module.ParallelModule` (installing this rank's shards, the gradient
buckets, ``grad_norm``, ``full_state_dict``/``load_full_state_dict``,
``full_gradients``) and :mod:`autopar.engine.checkpoint`. Nothing else needs to know
which family split a parameter.

For each parameter (by every name it has in the original model; tied parameters share
one :class:`Placement`) it says:

* ``cut``: how the full tensor is cut for this rank (a Megatron
  :class:`~autopar.strategies.shared.tensor_rewrite.ParamShard`, a 3D
  :class:`~autopar.strategies.shared.grid3d.runtime.Grid3DShard`, or None: whole). A cut
  knows how to take this rank's part of a full tensor (``local``), how to gather the
  full tensor back (``gather``, a collective over the groups it is split over) and the
  groups its norm is summed over (``norm_groups``);
* ``held``: whether this rank holds a part at all (a pipeline rank holds only its
  stages' parameters);
* ``home``: ``((group, index), ...)``, the rank whose copy is the one gathered
  (broadcast from there, over each group in turn) and counted in the norm: a D&SP
  branch's parameters on the sub-grid (or tensor rank) that runs the branch, whose
  copies elsewhere are stale; a pipeline parameter on the first position that reads
  it, whose copies on the other positions are kept equal (``copies_current`` names
  the groups over which the copies are current); both, for a D&SP branch in a
  pipeline stage;
* ``bucket``: the :class:`Bucket` its gradient is reduced in (None: not reduced here);
* ``norm_groups``: the groups its gradient's norm is summed over;
* ``tied``: the group its gradient is summed over after the step (a weight several
  pipeline stages read, as Megatron's embedding group);
* ``zero``: under ZeRO (:mod:`autopar.strategies.data.zero`), the rows of the cut part
  this data rank holds (a ``RowShard``): what the rank's module tree, the optimizer and
  the checkpoints see; ``local_part`` and ``gather`` apply it after ``cut``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol

import torch
import torch.distributed as dist

from autopar.runtime.groups import get_group, size_of


class Cut(Protocol):
    """How a full parameter is cut for one rank (the families' shard classes)."""

    def local(self, full: torch.Tensor, seat: "Seat") -> torch.Tensor:
        """This rank's part of ``full``."""

    def gather(self, local: torch.Tensor, seat: "Seat", full_shape: tuple[int, ...]) -> torch.Tensor:
        """The full tensor from every rank's part (a collective over its groups)."""

    def norm_groups(self) -> tuple[str, ...]:
        """The groups over which the parameter is split (its norm is summed over them)."""


@dataclass(frozen=True)
class Seat:
    """Where this rank sits in the plan: its coordinate and the size of each named
    dimension of the rank grid, and the plan's 3D grid (None without one)."""

    coords: dict[str, int]
    sizes: dict[str, int]
    grid: Any = None

    def size(self, name: str) -> int:
        return self.sizes.get(name, 1)


@dataclass(frozen=True)
class Bucket:
    """Gradients reduced together over ``group`` (a
    :class:`~autopar.runtime.grad_sync.GradientBuckets`): summed and divided by
    ``divisor`` (None: the group's size, an average); ``hooks``: launched as backward
    produces them (False: all at ``finish``, after gradients written outside autograd or
    accumulated over microbatches). Buckets finish in increasing ``order``; the layout's
    ``loss_bucket`` finishes last and reduces the step's loss in its last slot."""

    group: str
    divisor: int | None = None
    hooks: bool = True
    order: int = 2
    zero: int = 0  # ZeRO's stage: the gradients go to the parameters' row shards (strategies/data/zero.py)
    armed: bool = False  # hooks count only parameters armed for their last backward (a pipeline's stages)
    count_group: str | None = None  # the loss's bucket: the group whose ranks hold different targets (None: group)


@dataclass(frozen=True)
class Placement:
    """How one parameter is cut and where it lives on this rank (module docstring)."""

    names: tuple[str, ...]
    full_shape: tuple[int, ...]
    cut: Any = None
    held: bool = True
    home: tuple[tuple[str, int], ...] = ()
    copies_current: tuple[str, ...] = ()
    bucket: Bucket | None = None
    norm_groups: tuple[str, ...] = ()
    tied: str | None = None
    zero: Any = None  # ZeRO's row shard of the cut part over the data group (strategies/data/zero.py)


@dataclass
class ParamLayout:
    """Every parameter's :class:`Placement` on this rank (by each of its names), and the
    rank's :class:`Seat`. Built by the families; read by the module and checkpoints."""

    seat: Seat
    placements: dict[str, Placement] = field(default_factory=dict)
    loss_bucket: Bucket | None = None  # the bucket the step's loss travels in (None: the runner reduces it)
    # a buffer the forward changes in place on some ranks only (a pipeline stage's running
    # mean): layout name -> its home ((group, index), ...), where the current value is
    buffer_homes: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)

    # ------------------------------------------------------------------ queries
    def get(self, name: str) -> Placement | None:
        return self.placements.get(name)

    def unique(self) -> list[Placement]:
        """Each parameter's placement once (tied names share one), in model order."""
        seen: dict[tuple[str, ...], Placement] = {}
        for p in self.placements.values():
            seen.setdefault(p.names, p)
        return list(seen.values())

    def holds(self, name: str) -> bool:
        """Whether this rank holds any part of the tensor ``name`` (a buffer, or a
        parameter not held only by other pipeline stages)."""
        placement = self.placements.get(name)
        return placement is None or placement.held

    def buffer_current(self, name: str) -> bool:
        """Whether this rank's copy of buffer ``name`` is current (every rank's, unless
        the buffer has a home: :attr:`buffer_homes`)."""
        return all(self.seat.coords.get(group, 0) == index for group, index in self.buffer_homes.get(name, ()))

    def at_home(self, placement: Placement) -> bool:
        """Whether this rank holds the copy that is gathered and counted (it is at the
        parameter's home, or the parameter has none)."""
        return placement.held and all(self.seat.coords.get(group, 0) == index for group, index in placement.home)

    def current(self, placement: Placement) -> bool:
        """Whether this rank's copy is current (stepped by the optimizer, saved): it is at
        home in every group over which the copies are not kept equal."""
        return placement.held and all(self.seat.coords.get(group, 0) == index for group, index in placement.home
                                      if group not in placement.copies_current)

    def norm_keys(self) -> list[tuple[str, ...]]:
        """Every parameter's norm groups, the same sorted list on every rank."""
        return sorted({p.norm_groups for p in self.unique()})

    def __str__(self) -> str:
        lines = []
        for p in self.unique():
            home = ", ".join(f"{g} {i}" for g, i in p.home)
            where = "not held" if not p.held else ("home" if self.at_home(p) else
                                                   f"{'current' if self.current(p) else 'stale'} copy of {home}")
            bucket = f"bucket {p.bucket.group}" if p.bucket else "no bucket"
            cut = ("whole" if p.cut is None else f"cut {p.cut}") + (f", {p.zero}" if p.zero is not None else "")
            lines.append(f"{p.names[0]}: {list(p.full_shape)} {cut}; {where}; {bucket}; "
                         f"norm over {p.norm_groups or '-'}" + (f"; tied over {p.tied}" if p.tied else ""))
        return "\n".join(lines)

    # ------------------------------------------------------------------ cutting and gathering
    def local_part(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of the full tensor ``full`` of parameter ``name`` (the whole
        tensor when it is not cut)."""
        placement = self.placements.get(name)
        if placement is None:
            return full
        part = full if placement.cut is None else placement.cut.local(full, self.seat)
        return part if placement.zero is None else placement.zero.local(part)

    def gather(self, name: str, local: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
        """The full value of parameter ``name`` (or of a tensor laid out as it: a
        gradient, an optimizer state) from this rank's ``local`` part (None: none here;
        ``like`` is the local parameter). A collective over the parameter's cut groups
        and its home group: every rank calls it for every name in the same order."""
        placement = self.placements.get(name)
        if placement is None:  # a buffer: whole on every rank, current at its home if it has one
            if local is None:
                return None
            value = local.detach().clone()
            for group_name, index in self.buffer_homes.get(name, ()):
                group = get_group(group_name)
                if group is not None and size_of(group) > 1:
                    dist.broadcast(value, group=group, group_src=index)
            return value
        homes = [(get_group(g), g, i) for g, i in placement.home]
        homes = [(group, g, i) for group, g, i in homes if group is not None and size_of(group) > 1]
        if local is None and not homes:
            return None
        value = None
        # the home's copy, then broadcast over each home group in turn: after the k-th,
        # every rank at home in the groups after k holds it
        at = [all(self.seat.coords.get(g, 0) == i for _, g, i in homes[k:]) for k in range(len(homes) + 1)]
        if self.at_home(placement):
            value = (local if local is not None else torch.zeros_like(like)).detach()
            if placement.zero is not None:  # the data ranks' row shards, then the cut's parts
                value = placement.zero.gather(value, self.cut_shape(placement))
            value = placement.cut.gather(value, self.seat, placement.full_shape) if placement.cut else value.clone()
        for k, (group, _, index) in enumerate(homes):
            if not at[k + 1]:
                continue
            if value is None:  # received: on the parameter's device, in its dtype now
                value = torch.empty(placement.full_shape, dtype=like.dtype, device=like.device)
            else:
                value = value.to(like.dtype).contiguous()
            dist.broadcast(value, group=group, group_src=index)
        return value


    def cut_shape(self, placement: Placement) -> tuple[int, ...]:
        """The shape of this rank's cut part of a parameter (before ZeRO's row shard)."""
        return cut_shape(placement, self.seat)


def zero_unit(name: str) -> str:
    """The unit a ZeRO-3 parameter is all-gathered and reduce-scattered with
    (:mod:`autopar.strategies.data.zero_runtime`): its layer, the name up to its first
    index (``layers.3`` of ``layers.3.attention.wq.weight``, as torchtitan's FSDP2 wraps
    each layer), or its module outside any stack (``norm`` of ``norm.weight``)."""
    parts = name.split(".")
    for k, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[:k + 1])
    return ".".join(parts[:-1])


def cut_shape(placement: Placement, seat: Seat) -> tuple[int, ...]:
    """The shape of the part of ``placement``'s parameter that ``seat``'s cut keeps (the
    full shape when it is whole), worked out on the meta device."""
    if placement.cut is None:
        return placement.full_shape
    return tuple(placement.cut.local(torch.empty(placement.full_shape, device="meta"), seat).shape)


def group_buckets(layout: ParamLayout, params: Iterable[tuple[str, torch.nn.Parameter]]
                  ) -> list[tuple[Bucket, list[torch.nn.Parameter]]]:
    """The parameters (``(name, parameter)`` in model order) of each bucket (the loss's
    too, even when empty), by the buckets' ``order``: what :class:`~autopar.runtime.grad_sync.GradientBuckets` is made from."""
    by_bucket: dict[Bucket, list] = {} if layout.loss_bucket is None else {layout.loss_bucket: []}
    seen = set()
    for name, p in params:
        placement = layout.get(name)
        if id(p) in seen or placement is None or not placement.held or placement.bucket is None:
            continue
        seen.add(id(p))
        by_bucket.setdefault(placement.bucket, []).append(p)
    return sorted(by_bucket.items(), key=lambda item: item[0].order)
