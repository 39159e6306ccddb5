"""Where D&SP puts its parameters (SUPER §IV, docs/dsp_design.md).

A branch's parameters are current on the sub-grid that runs it (their home in the
``segment`` group, which holds one rank of every sub-grid): summed over that sub-grid
and divided by the number of batch chunks; other sub-grids take part in no collective
of them. Under D&SP-cSub the common layers run on sub-grid 0 only: their home is
sub-grid 0 and the other sub-grids do not reduce them. The norm of both is summed over
the segment (only the home's copy counts).

In a mixed plan (:func:`place_over_tensor`) each rank of the tensor group is a sub-grid:
a branch's parameters live on the tensor rank that runs it, on every row of its data
replica, so their gradients are averaged over the data ranks like any replicated
parameter's, and only that rank's copy counts in the norm over the tensor group. With
``g < t`` sub-grids of the tensor group they live on their sub-grid (home in
``tensor_seg``), each of its ranks holding its Megatron shard (norm over the shard's
group and ``tensor_seg``). In a pipeline stage the pipeline adds its own home
(:mod:`autopar.strategies.pipeline.layout`).
"""
from __future__ import annotations

from autopar.grid import MeshAxis
from autopar.runtime.layout import Bucket


def place(builder) -> None:
    plan = builder.plan
    mine = builder.seat.coords[MeshAxis.SEGMENT]
    in_branches = _branches(builder, MeshAxis.SEGMENT, Bucket(MeshAxis.SUBGRID, divisor=plan.batch_parts(), order=1))
    if plan.csub:
        if mine != 0:
            builder.loss_bucket = None  # sub-grid 0 reduces the loss and sends it
        for name in builder.names():
            placement = builder.placement(name)
            if placement.names not in in_branches:
                builder.update(name, home=((MeshAxis.SEGMENT, 0),), norm_groups=(MeshAxis.SEGMENT,),
                               bucket=placement.bucket if mine == 0 else None)


def place_over_tensor(builder) -> None:
    """The branches of a mixed plan's D&SP regions on the ranks of the tensor group, or
    on its sub-grids (the ``tensor_seg`` member; each rank of the sub-grid holds its
    Megatron shard of a split region's parameters)."""
    _branches(builder, MeshAxis.TENSOR_SEG if builder.plan.tensor_subgrids else MeshAxis.TENSOR, None)


def _branches(builder, group: str, bucket: Bucket | None) -> set:
    """Each branch's parameters at home on the member of ``group`` whose sub-grid runs
    the branch, reduced there in ``bucket`` (None: the bucket they have) and in no
    bucket elsewhere; their norm summed over ``group`` (and the groups of their cut).
    Returns their names."""
    mine = builder.seat.coords[group]
    placed = set()
    for details in builder.plan.region_details("dsp").values():
        for index, names in enumerate(details["branch_params"]):
            home = details["assignment"][index]
            for wrapper_name in names:
                name = builder.named(wrapper_name)
                placement = builder.placement(name)
                placed.add(placement.names)
                # a split region's cut keeps its groups (a Megatron shard over the sub-grid)
                norm = tuple(dict.fromkeys(placement.norm_groups + (group,)))
                builder.update(name, home=((group, home),), norm_groups=norm,
                               bucket=(bucket or placement.bucket) if home == mine else None)
    return placed
