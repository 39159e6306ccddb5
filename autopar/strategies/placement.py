"""Building a rank's :class:`~autopar.runtime.layout.ParamLayout` from the plan: every family
that touches parameters places them, in turn, on a :class:`LayoutBuilder`.

The base placement (every family's cut, from ``planned_shards``: Megatron's
:class:`~autopar.strategies.shared.tensor_rewrite.ParamShard`, the 3D and cube
:class:`~autopar.strategies.shared.grid3d.runtime.Grid3DShard`) averages every gradient over
the data ranks, as DDP does. Then each family of the registry refines it where the plan
uses it (:meth:`~autopar.strategies.family.Family.place`):

* AxoNN 3D and Bian's cube (:func:`autopar.strategies.shared.grid3d.layout.place`): weight
  shards summed over the data ranks, the rest averaged over the replica group;
* D&SP (:func:`autopar.strategies.dsp.layout.place`): a branch's parameters live on the
  sub-grid that runs it;
* PTD-P (:func:`autopar.strategies.pipeline.layout.place`): a parameter is held by the
  pipeline positions whose stages read it.

Last, under ZeRO (:func:`autopar.strategies.data.zero.place`), the parameters every
family left averaged over the data ranks are cut into row shards over them.
"""
from __future__ import annotations

import dataclasses

import torch.nn as nn

from autopar.grid import MeshAxis
from autopar.trace.capture import layout_name
from autopar.runtime.layout import Bucket, ParamLayout, Placement, Seat
from autopar.strategies.data.zero import place as zero_place
from autopar.strategies.family import RankBuild
from autopar.strategies.registry import FAMILIES



def seat_of(plan, rank: int) -> Seat:
    """Rank ``rank``'s coordinates in the plan's rank grid: its mesh coordinates, and
    ``segment``, its sub-grid under D&SP (its index in the segment group); in a mixed
    plan with 3D regions also its ``x``, ``y``, ``z`` in the tensor group's grid."""
    coords = dict(plan.rank_coordinates(rank))
    coords[MeshAxis.SEGMENT] = plan.subgrid_coordinates(rank)[0]
    sizes = {dim: plan.degree(dim) for dim in plan.mesh}
    sizes[MeshAxis.SEGMENT] = plan.subgrids
    grid = plan.region_grid
    if plan.mixed and grid is not None:  # the 3D regions' coordinates in the tensor group
        coords.update({axis: i for axis, i in plan.region_coordinates(rank).items() if axis != MeshAxis.DATA})
        sizes.update({MeshAxis.X: grid.x, MeshAxis.Y: grid.y, MeshAxis.Z: grid.z})
    if plan.experts > 1:  # expert parallelism: the expert group and the place in it
        coords[MeshAxis.EXPERT_REPLICA], coords[MeshAxis.EXPERTS] = plan.expert_coordinates(rank)
        sizes.update({MeshAxis.EXPERT_REPLICA: plan.degree(MeshAxis.DATA) // plan.experts,
                      MeshAxis.EXPERTS: plan.experts})
    if plan.degree(MeshAxis.CONTEXT) > 1:  # the ranks that average the gradients: data × context, in that order
        coords[MeshAxis.DATA_CONTEXT] = coords[MeshAxis.DATA] * plan.degree(MeshAxis.CONTEXT) + coords[MeshAxis.CONTEXT]
        sizes[MeshAxis.DATA_CONTEXT] = plan.degree(MeshAxis.DATA) * plan.degree(MeshAxis.CONTEXT)
    g = plan.tensor_subgrids
    if g:  # D&SP's sub-grids of the tensor group: which one, and the place in it
        coords[MeshAxis.TENSOR_SEG], coords[MeshAxis.TENSOR_SUB] = plan.tensor_subgrid_coordinates(rank)
        sizes.update({MeshAxis.TENSOR_SEG: g, MeshAxis.TENSOR_SUB: plan.degree(MeshAxis.TENSOR) // g})
    return Seat(coords, sizes, grid)


class LayoutBuilder:
    """The placements being built: one per parameter object of ``root`` (the captured
    wrapper's module tree, full-sized), under all of its names."""

    def __init__(self, plan, rank: int, root: nn.Module, shards: dict):
        self.plan, self.rank, self.root = plan, rank, root
        self.seat = seat_of(plan, rank)
        names: dict[int, list[str]] = {}
        wrapper_names: dict[int, list[str]] = {}
        params: dict[int, nn.Parameter] = {}
        for name, p in root.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(layout_name(name))
            wrapper_names.setdefault(id(p), []).append(name)
            params[id(p)] = p
        self._by_id: dict[int, Placement] = {}
        for key, p in params.items():
            cut = _one_cut(wrapper_names[key], shards)
            self._by_id[key] = Placement(tuple(names[key]), tuple(p.shape), cut=cut, bucket=Bucket(MeshAxis.DATA),
                                         norm_groups=cut.norm_groups() if cut is not None else ())
        self._id_of = {name: key for key, ns in names.items() for name in ns}
        unknown = sorted(set(shards) - {n for ns in wrapper_names.values() for n in ns})
        if unknown:
            raise RuntimeError(f"the plan splits {unknown[:3]}, which the model has no parameter of; this is a bug")
        self.loss_bucket: Bucket | None = Bucket(MeshAxis.DATA)  # the step's loss travels in it
        self.buffer_homes: dict[str, tuple] = {}   # ParamLayout.buffer_homes, by layout name

    def names(self) -> list[str]:
        """Each parameter's first name, in model order."""
        return [p.names[0] for p in self._by_id.values()]

    def placement(self, name: str) -> Placement:
        """The placement of parameter ``name`` (any of its names in the layout)."""
        return self._by_id[self._id_of[name]]

    def update(self, name: str, **changes) -> None:
        """Change fields of the placement of parameter ``name`` (any of its layout names)."""
        key = self._id_of[name]
        self._by_id[key] = dataclasses.replace(self._by_id[key], **changes)

    def named(self, wrapper_name: str) -> str:
        """The layout's name of the parameter the captured graphs call ``wrapper_name``."""
        return self._by_id[id(self.root.get_parameter(wrapper_name))].names[0]

    @staticmethod
    def module_name(wrapper_path: str) -> str:
        """The layout's name of the module the captured wrapper calls ``wrapper_path``
        (its parameters' names begin with it)."""
        return layout_name(wrapper_path)

    def build(self) -> ParamLayout:
        return ParamLayout(self.seat, {name: p for p in self._by_id.values() for name in p.names}, self.loss_bucket,
                           dict(self.buffer_homes))


def _one_cut(names: list[str], shards: dict):
    """The cut of a parameter from the shards by the wrapper's names; tied names must agree."""
    cuts = {shards[n] for n in names if n in shards}
    if len(cuts) > 1:
        raise RuntimeError(f"parameter {names[0]} is split two different ways ({sorted(map(str, cuts))})")
    return next(iter(cuts), None)


def build_layout(plan, rank: int, root: nn.Module, shards: dict, *, holders: dict | None = None,
                 deferred_reduce_scatter: bool = False) -> ParamLayout:
    """Rank ``rank``'s parameter layout under ``plan``. ``root``: the wrapper around a
    full-sized copy of the model; ``shards``: each split parameter's cut (by the
    wrapper's names); ``holders``: under a pipeline, the positions that hold each
    parameter; ``deferred_reduce_scatter``: the 3D layers write their weight gradients
    after backward (AxoNN §IV-B), so those buckets wait for ``finish``. Every family
    of the registry places what is its own (:meth:`~autopar.strategies.family.Family.place`)."""
    builder = LayoutBuilder(plan, rank, root, shards)
    build = RankBuild(rank, holders=holders, deferred_reduce_scatter=deferred_reduce_scatter)
    for family in FAMILIES:
        family.place(builder, build)
    if getattr(plan, "zero", 0):  # ZeRO shards what the families average over the data ranks: last
        zero_place(builder, plan.zero, plan.replica_group)
    return builder.build()
