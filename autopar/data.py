"""Feeding each rank only its share of the data (``compile(..., batch="local")``).

    pm = autopar.compile(model, mesh, example_inputs=(global_ids,), ..., batch="local")
    loader = torch.utils.data.DataLoader(dataset, batch_size=global_batch // pm.data_parallel_size,
                                         sampler=autopar.data.sampler(pm, dataset, seed=0), drop_last=True)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for ids, labels in loader:
            pm.step(ids, target=labels)

A plan splits the global batch's rows into ``pm.data_parallel_size`` shares; this rank
trains on share ``pm.data_parallel_rank``, which its tensor, context and pipeline ranks
share. :func:`sampler` is torch's ``DistributedSampler`` over the shares, not the ranks:
the ranks of one share read the same rows, and no row is read by two shares in an epoch.
:func:`shard` does the same for an iterable (every ``size``-th item). Each share's batch
is then ``global_batch / data_parallel_size`` rows, in the order the global form would
have split them when the global batch is the shares' rows stacked in share order (as
``local_rows`` takes them).
"""
from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator

from autopar._torch_compat import tree_flatten, tree_unflatten
from autopar.engine.executable import batch_of, local_batch


def sampler(pm, dataset, *, shuffle: bool = True, seed: int = 0, drop_last: bool = True):
    """``torch.utils.data.DistributedSampler`` of ``dataset`` for ``pm``'s share
    (``num_replicas=pm.data_parallel_size``, ``rank=pm.data_parallel_rank``); call its
    ``set_epoch(epoch)`` at each epoch, as with any ``DistributedSampler``."""
    from torch.utils.data import DistributedSampler
    return DistributedSampler(dataset, num_replicas=pm.data_parallel_size, rank=pm.data_parallel_rank,
                              shuffle=shuffle, seed=seed, drop_last=drop_last)


def shard(pm, iterable: Iterable[Any]) -> Iterator[Any]:
    """The items of ``iterable`` that ``pm``'s share reads: every
    ``data_parallel_size``-th from the ``data_parallel_rank``-th (a stream read by
    every rank, each keeping its own)."""
    return itertools.islice(iterable, pm.data_parallel_rank, None, pm.data_parallel_size)


def local_rows(pm, batch: Any) -> Any:
    """This rank's share of a global batch: a tensor, or a tuple / list / dict of them,
    cut as ``batch="global"`` cuts a call (:func:`autopar.engine.executable.local_batch`:
    the tensors whose first dimension is the batch, the first tensor's, into
    ``data_parallel_size`` equal chunks; the others whole). What ``batch="local"``
    expects where a script holds the global batch anyway (tests, a small run)."""
    size, index = pm.data_parallel_size, pm.data_parallel_rank
    leaves, spec = tree_flatten(batch)
    rows = batch_of(tuple(leaves))
    if rows is None:
        return batch
    if rows % size:
        raise ValueError(f"local_rows: a batch of {rows} rows does not split into {size} equal shares")
    cut, _ = local_batch(size, index, tuple(leaves), None)
    return tree_unflatten(list(cut), spec)
