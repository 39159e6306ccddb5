"""Where PTD-P puts its parameters (megatron §2.2).

A rank at pipeline position ``r`` holds only the parameters its stages read (a
parameter no stage reads: position 0). Gradients accumulate over the microbatches and
are averaged over the data ranks once, after the last backward (a bucket without
hooks). A weight several positions read (GPT-2's tied embedding and head) is current on
the first of them (its home in the ``pipeline`` group) and its gradient is summed over
the ranks of those positions (the ``tied:<positions>`` group, as Megatron's embedding
group). Every norm is also summed over the pipeline.
"""
from __future__ import annotations

import torch.fx as fx

from autopar.grid import MeshAxis
from autopar.runtime.layout import Bucket
from autopar.planning.schedules import rank_of
from autopar.runtime.groups import tied_group_name
from autopar.planning.strategy import PlanError
from autopar.strategies.pipeline.stages import buffer_stages, parameter_stages, partition
from autopar.trace.capture import layout_name


def parameter_holders(plan, gm: fx.GraphModule) -> dict[str, set[int]]:
    """The pipeline positions that hold each parameter the stages read, by the graph's
    names, from the plan's cut of ``gm`` (the global graph). By parameter object: a
    weight tied under two names (embedding and head modules) is held by the positions
    that read either. A buffer the forward changes in place is held (current) by the one
    position whose stage changes and reads it; one read on another position is refused."""
    pp = plan.pipeline
    p = pp["stages"]
    part = partition(gm, p * pp["chunks"], pp["assignment"])
    by_object: dict[int, set[int]] = {}
    read = parameter_stages(gm, part)
    for name, stages in read.items():
        by_object.setdefault(id(gm.get_parameter(name)), set()).update(rank_of(pp["schedule"], p, s) for s in stages)
    holders = {name: by_object[id(gm.get_parameter(name))] for name in read}
    for name, (writes, reads) in buffer_stages(gm, part).items():
        positions = {rank_of(pp["schedule"], p, s) for s in writes | reads}
        if len(positions) > 1:
            raise PlanError(f"pipeline: buffer {layout_name(name)} is changed in place in forward (a running "
                            f"statistic) by stage(s) {sorted(writes)} and read by stage(s) {sorted(reads - writes)}: "
                            f"another stage would read its stale copy; autopar keeps such a buffer current on one "
                            f"stage only. Use a plan without a pipeline")
        holders[name] = positions
    return holders


def place(builder, holders: dict[str, set[int]]) -> None:
    """``holders``: the pipeline positions holding each parameter, by the wrapper's names."""
    position = builder.seat.coords[MeshAxis.PIPELINE]
    buffers = {name for name, _ in builder.root.named_buffers()}
    for name, positions in holders.items():   # a buffer changed in forward: current on its stage's position
        if name in buffers:
            builder.buffer_homes[layout_name(name)] = ((MeshAxis.PIPELINE, min(positions)),)
    positions_of = {builder.placement(builder.named(name)).names: set(positions) for name, positions in holders.items()
                    if name not in buffers}
    # reduced once the stage's last microbatch has given a parameter its gradient: the
    # runner arms a stage's parameters before that backward (the hooks then launch the
    # buckets while the last backwards run)
    accumulated = Bucket(MeshAxis.DATA, armed=True)
    builder.loss_bucket = None  # the last stage reduces the loss and broadcasts it
    for name in builder.names():
        placement = builder.placement(name)
        positions = positions_of.get(placement.names, {0})
        held = position in positions
        # a D&SP branch's parameters (a mixed stage) keep their home rank of the tensor
        # group, and no bucket off it
        reduced = placement.bucket is not None
        builder.update(name, held=held, home=placement.home + ((MeshAxis.PIPELINE, min(positions)),),
                       copies_current=(MeshAxis.PIPELINE,), bucket=accumulated if held and reduced else None,
                       norm_groups=placement.norm_groups + (MeshAxis.PIPELINE,),
                       tied=tied_group_name(positions) if held and len(positions) > 1 else None)
