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

from autopar.layout import Bucket
from autopar.runtime.groups import tied_group_name


def place(builder, holders: dict[str, set[int]]) -> None:
    """``holders``: the pipeline positions holding each parameter, by the wrapper's names."""
    position = builder.seat.coords["pipeline"]
    positions_of = {builder.placement(builder.named(name)).names: set(positions) for name, positions in holders.items()}
    accumulated = Bucket("data", hooks=False)
    builder.loss_bucket = None  # the last stage reduces the loss and broadcasts it
    for name in builder.names():
        placement = builder.placement(name)
        positions = positions_of.get(placement.names, {0})
        held = position in positions
        builder.update(name, held=held, home=("pipeline", min(positions)), copies_current=True, bucket=accumulated if held else None,
                       norm_groups=placement.norm_groups + ("pipeline",),
                       tied=tied_group_name(positions) if held and len(positions) > 1 else None)
