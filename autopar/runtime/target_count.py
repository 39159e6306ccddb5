"""The count of a batch's counted targets, for losses that average over them.

A cross-entropy (or NLL) loss with ``reduction="mean"`` averages over the targets it does
not ignore (``ignore_index``, -100: padding, unmasked tokens). When the batch is split
over data ranks or microbatches, each piece counts its own targets; the mean of the
pieces' means is the single-device mean only when every piece counts as many. The
data-parallel rewrite (:func:`autopar.strategies.shared.losses.global_mean_losses`) turns
such a loss into ``global_mean(loss summed over this piece's targets)``, and the
runtime (``ParallelModule``) makes the count of the **whole** batch current around the
program: the graph's count program (``gm.meta[TARGET_COUNT]``) evaluated on each of the
rank's pieces, summed over the data ranks. Summed over the pieces, the rewritten losses
are then exactly the single-device mean::

    sum_r  sum(loss over the targets of rank r) / N  =  mean over all N counted targets

Gradients follow: every rank back-propagates ``1/N`` of its summed loss.
"""
from __future__ import annotations

import torch

from autopar.ir import TARGET_COUNT  # noqa: F401 - the key this module's counting graphs are kept under

_current: list = []  # torch.Tensor | PendingCount | None


class PendingCount:
    """The whole batch's count while the all-reduce summing it over the data ranks is in
    flight (``work``, from ``dist.all_reduce(value, async_op=True)``): :func:`global_mean`
    waits for it where the program divides by it, at the end of the forward, so the
    collective overlaps the forward instead of blocking before it. A blocking all-reduce
    before the forward is a second rendezvous of the ranks each step (the buckets' being
    the first), the cost the step's loss once had before it moved into the last gradient
    bucket (docs/benchmarks.md, section 2)."""

    __slots__ = ("value", "work")

    def __init__(self, value: torch.Tensor, work):
        self.value, self.work = value, work

    def wait(self) -> torch.Tensor:
        """The summed count (waiting for the all-reduce the first time)."""
        if self.work is not None:
            self.work.wait()
            self.work = None
        return self.value


class use_target_count:
    """Make ``count`` (a 0-d tensor: the whole batch's counted targets, or a
    :class:`PendingCount` of it) the one :func:`global_mean` divides by inside the block."""

    __slots__ = ("count",)

    def __init__(self, count: torch.Tensor | PendingCount | None):
        self.count = count

    def __enter__(self):
        _current.append(self.count)
        return self

    def __exit__(self, *exc):
        _current.pop()


def global_mean(loss_sum: torch.Tensor) -> torch.Tensor:
    """``loss_sum / N``: a loss summed over this rank's share of the targets, divided by
    the count ``N`` of counted targets in the whole batch (the current
    :class:`use_target_count`). Backward: ``1/N`` times the incoming gradient. Summed over
    the ranks (and microbatches) that share the batch it is the single-device mean."""
    count = _current[-1] if _current else None
    if type(count) is PendingCount:
        count = count.wait()
    if count is None:
        raise RuntimeError("global_mean: no target count is current. The ParallelModule that runs this program sets "
                           "it (pm(...) or pm.step(...)); a rank program run by hand needs "
                           "autopar.runtime.target_count.use_target_count(count of the whole batch)")
    wide = loss_sum if loss_sum.dtype == torch.float64 else loss_sum.float()  # half precision divides in fp32
    return (wide / count.to(wide.dtype)).to(loss_sum.dtype)


__all__ = ["TARGET_COUNT", "PendingCount", "global_mean", "use_target_count"]
