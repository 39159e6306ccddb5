"""Where AxoNN's 3D layers (and Bian's cube) put their parameters' gradients.

The rows of a 3D grid are split over z and data (axonn §III): a weight shard ``Ŵ`` is
summed over z by the layer's own reduce-scatter (the cube's diagonal vectors over the
cube), so the data ranks only add theirs and divide by every batch chunk; every other
parameter (biases, norms, replicated layers) is averaged over the ``replica`` group, the
ranks of one (x, y) that split the batch. In a mixed plan the grid is the tensor group
as ``Gx × Gy × Gz``: the loss is its data replica's, so the weight shards only average
over data (the layer summed their rows over z already), and with ``Gz = 1`` nothing else
changes bucket; with ``Gz > 1`` a 3D region's bias blocks saw only their z block of the
rows, so they are summed over z and averaged over data (the ``replica`` group, divisor
Gdata). Inside pipeline stages (``Gz = 1`` only) not even the weights change (the
pipeline's bucket averages over data after the last microbatch, as z = 1 needs).
"""
from __future__ import annotations

from autopar.grid import MeshAxis
from autopar.runtime.layout import Bucket


def place(builder, deferred_reduce_scatter: bool) -> None:
    """``deferred_reduce_scatter`` (AxoNN §IV-B): ``Ŵ.grad`` is written after backward by
    the 3D runtime, so its bucket has no hooks and waits for ``finish``."""
    plan = builder.plan
    if plan.pipeline:  # the pipeline places every gradient (strategies/pipeline/layout.py)
        return
    weights = Bucket(MeshAxis.DATA, divisor=plan.batch_parts(),
                     hooks=not (deferred_reduce_scatter and plan.region_grid.z > 1), order=0)
    # in a mixed plan the loss and the rows outside the 3D regions are the data replica's
    others = None if plan.mixed else Bucket(MeshAxis.REPLICA)
    z_rows = (Bucket(MeshAxis.REPLICA, divisor=plan.degree(MeshAxis.DATA))
              if plan.mixed and plan.region_grid.z > 1 else None)
    if not plan.mixed:
        builder.loss_bucket = Bucket(MeshAxis.REPLICA)
    for name in builder.names():
        cut = builder.placement(name).cut
        if cut is not None and getattr(cut, "grid_weight", False):
            builder.update(name, bucket=weights)
        elif z_rows is not None and cut is not None and getattr(cut, "vector", False):
            builder.update(name, bucket=z_rows)
        elif others is not None:
            builder.update(name, bucket=others)
