"""Data-parallel gradient averaging: bucketed and overlapped with backward, or all at once.

:class:`GradientBuckets` does what DDP's reducer does: parameters are grouped into
buckets of about ``bucket_bytes`` in *reverse* forward order (the order in which backward
produces their gradients); a ``post_accumulate_grad`` hook marks a parameter ready, and
a bucket whose parameters are all ready is all-reduced asynchronously while backward goes
on. Each gradient is held once: the hook moves a new gradient into its parameter's slot
of the bucket's flat buffer and points ``param.grad`` at that slot, where later
accumulations add to it (DDP's ``gradient_as_bucket_view``), so a rank holds its
parameters and one copy of their gradients, as without data parallelism.
:meth:`GradientBuckets.finish` waits and averages the buffers in place::

    buckets = GradientBuckets(list(model.parameters()), "data")
    loss.backward()          # buckets are all-reduced as their gradients appear
    buckets.finish()         # every rank now holds the averaged gradients
    optimizer.step()

Buckets are launched strictly in bucket order, so every rank issues the same sequence
of collectives even when its gradients become ready in another order. A parameter that
got no gradient this step counts as a zero gradient (and afterwards holds the average
of the other ranks'), so ranks that used different parameters do not hang; its bucket,
and the buckets after it, are only launched by ``finish()``.

Gradient accumulation: the hook fires once per ``backward()``. Set
``buckets.enabled = False`` for every microbatch but the last, then ``enabled = True``
for the last one and call ``finish()`` once after it.

:func:`sync_gradients` is the reference: one flat all-reduce per dtype, no overlap.
"""
from __future__ import annotations

import logging
from typing import Iterable, Sequence

import torch
import torch.distributed as dist

from autopar._torch_compat import reduce_scatter_flat
from autopar.runtime.groups import get_group, size_of

log = logging.getLogger("autopar.runtime")


class _Bucket:
    """Parameters whose gradients travel in one flat all-reduce."""

    def __init__(self, index: int, params: list[torch.nn.Parameter], extra_slots: int = 0):
        self.index = index
        self.params = params
        total = sum(p.numel() for p in params)
        # extra slots after the gradients carry a few scalars (the step's loss) for free
        self.buffer = torch.empty(total + extra_slots, dtype=params[0].dtype, device=params[0].device)
        self.extra = self.buffer[total:]
        # each parameter's slice of the buffer, shaped as the parameter: made once, so a
        # step neither slices nor reshapes per parameter
        self.views = _param_views(self.buffer, params)
        self.ready: set[int] = set()
        self.work = None

    def flatten(self) -> None:
        """Copy into the buffer the gradients that are not already its views (a parameter
        with none counts as zero and is given its view)."""
        into, values = [], []
        for p, view in zip(self.params, self.views):
            g = p.grad
            if g is view:
                continue
            if g is None:
                view.zero_()
                p.grad = view
            else:
                into.append(view)
                values.append(g)
        if into:   # one foreach copy instead of a copy_ per parameter
            torch._foreach_copy_(into, values)

    def unflatten_into_grads(self) -> None:
        """Point every ``param.grad`` at its view of the (averaged) buffer."""
        for p, view in zip(self.params, self.views):
            if p.grad is not view:
                p.grad = view


def _param_views(buffer: torch.Tensor, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """The consecutive slices of ``buffer`` that hold ``params``' gradients, each viewed
    in its parameter's shape."""
    views, offset = [], 0
    for p in params:
        views.append(buffer[offset:offset + p.numel()].view(p.shape))
        offset += p.numel()
    return views


class _ShardedBucket(_Bucket):
    """A bucket of ZeRO's (:mod:`autopar.strategies.data.zero`): its parameters' gradients
    end in their row shards' (``shards``: per parameter, ``(shard parameter, RowShard)``).
    ZeRO-1 and ZeRO-2 alike reduce-scatter a buffer laid out rank by rank (every
    parameter's padded block of rank 0, then of rank 1, ...), allocated at launch and
    freed at finish: a rank updates only its rows, so it needs only their sum, and the
    reduce-scatter moves half an all-reduce's bytes (AxoNN eqs 2-3; the distributed
    optimizer of Megatron-LM does the same). The stages differ in what is held between
    microbatches (:mod:`autopar.strategies.data.zero`). The full gradients are dropped
    once read (``param.grad = None``)."""

    def __init__(self, index: int, params: list[torch.nn.Parameter], shards: list):
        self.index, self.params, self.shards = index, params, shards
        self.ready: set[int] = set()
        self.work = None
        self.buffer = self.out = None
        self.extra = self.views = None

    def flatten(self) -> None:
        blocks = [cut.padded_blocks((p.grad if p.grad is not None else torch.zeros_like(p)).detach())
                  for p, (_, cut) in zip(self.params, self.shards)]
        self.buffer = torch.cat([per_param[k] for k in range(self.shards[0][1].size) for per_param in blocks])
        self.out = self.buffer.new_empty(self.buffer.numel() // self.shards[0][1].size)
        for p in self.params:
            p.grad = None

    def launch(self, group):
        return reduce_scatter_flat(self.out, self.buffer, group=group, async_op=True)

    def unflatten_into_grads(self, divisor: int) -> None:
        offset = 0
        for p, (shard, cut) in zip(self.params, self.shards):
            start, stop = cut.span
            size = cut.chunk * p[0].numel() if p.dim() else 0
            piece = self.out[offset:offset + size].view(cut.chunk, *p.shape[1:])[:stop - start]
            offset += size
            piece = piece / divisor
            if shard.grad is None:
                shard.grad = piece.clone()
            else:
                shard.grad.add_(piece)
        self.buffer = self.out = None


class GradientBuckets:
    """Average gradients over the group ``group_name``, bucketed and overlapped with backward.

    ``params`` are given in forward order; those that do not require grad are skipped.
    The group is looked up here, at construction (after ``set_groups``). Over a group of
    size 1 nothing is registered and :meth:`finish` does nothing.
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        group_name: str,
        bucket_bytes: int = 25 * 2**20,
        *,
        first_bucket_bytes: int | None = None,
        divisor: int | None = None,
        hooks: bool = True,
        zero: int = 0,
        shards: dict | None = None,
        armed: bool = False,
    ):
        if first_bucket_bytes is None:
            first_bucket_bytes = min(2**20, bucket_bytes)
        self.group_name = group_name
        self.group = get_group(group_name)
        self.world_size = size_of(self.group)
        # the sum over the group is divided by this: the group size (an average) unless a
        # strategy says otherwise (D&SP branch parameters: the number of data ranks)
        self.divisor = divisor if divisor is not None else self.world_size
        self.enabled = True
        self.buckets: list[_Bucket] = []
        self._bucket_of: dict[int, _Bucket] = {}
        self._view_of: dict[int, torch.Tensor] = {}   # each parameter's gradient slot in its bucket
        self._next_to_launch = 0
        self._handles = []
        self._lone: torch.Tensor | None = None  # a carried value when there are no buckets
        # ZeRO (strategies/data/zero.py): the stage, and each parameter's (shard, RowShard)
        self.zero, self._shards = zero, shards or {}
        # armed: a hook counts a parameter only once arm() named it (before the backward
        # that gives its gradient its last microbatch: a pipeline stage's last), so the
        # buckets launch during the last backwards instead of after the schedule
        self._armed: set[int] | None = set() if armed else None
        self.launched_in_backward = 0  # buckets launched by the hooks (overlapping backward) since construction
        # Deduplicated (a tied weight listed twice would otherwise be hooked twice).
        params = list({id(p): p for p in params if p.requires_grad}.values())
        self._params = params
        if self.world_size == 1:
            return
        current: list[torch.nn.Parameter] = []
        current_bytes = 0
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            # the first bucket is small (as in DDP) so communication starts early in backward
            limit = first_bucket_bytes if not self.buckets else bucket_bytes
            starts_new = current and (
                current_bytes + nbytes > limit
                or p.dtype != current[0].dtype
                or p.device != current[0].device
            )
            if starts_new:
                self._add_bucket(current)
                current, current_bytes = [], 0
            current.append(p)
            current_bytes += nbytes
        if current:
            self._add_bucket(current, extra_slots=1)  # the last bucket launched carries the loss
        # hooks=False: gradients written outside autograd (3D weight shards whose
        # reduce-scatter is deferred to the end of backward): every bucket waits for finish()
        for p in params if hooks else ():
            self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))
        log.debug(
            "GradientBuckets over %r: %d params in %d buckets",
            group_name, len(params), len(self.buckets),
        )

    def _add_bucket(self, params: list[torch.nn.Parameter], extra_slots: int = 0) -> None:
        if self.zero:
            bucket = _ShardedBucket(len(self.buckets), params, [self._shards[id(p)] for p in params])
        else:
            bucket = _Bucket(len(self.buckets), params, extra_slots)
        self.buckets.append(bucket)
        for p in params:
            self._bucket_of[id(p)] = bucket
        if not self.zero:
            self._view_of.update((id(p), view) for p, view in zip(params, bucket.views))

    def arm(self, params) -> None:
        """Count ``params`` when their gradients are next ready (their last backward)."""
        if self._armed is not None:
            self._armed.update(id(p) for p in params if id(p) in self._bucket_of)

    def _on_grad_ready(self, param: torch.nn.Parameter) -> None:
        # a Python call per parameter per step (DDP's reducer hooks in C++): kept to the
        # checks, and the launch loop entered only when this bucket is full and next in
        # line (a full bucket behind a waiting one is launched by the loop that launches
        # the waiting one, so nothing else can start here)
        key = id(param)
        view = self._view_of.get(key)
        if view is not None and param.grad is not view:
            # the gradient moves into its bucket slot as soon as it exists, and later
            # accumulations add to it there: a parameter's gradient is held once, not
            # once as ``param.grad`` and again in the bucket (DDP's gradient_as_bucket_view)
            view.copy_(param.grad)
            param.grad = view
        if not self.enabled:
            return
        if self._armed is not None and key not in self._armed:
            return
        bucket = self._bucket_of[key]
        ready = bucket.ready
        if key in ready:
            raise RuntimeError(
                f"a parameter of shape {tuple(param.shape)} received a second gradient in "
                "one step while GradientBuckets was enabled; with gradient accumulation set "
                "buckets.enabled = False for all microbatches but the last, and call "
                "finish() after each step"
            )
        ready.add(key)
        if len(ready) == len(bucket.params) and bucket.index == self._next_to_launch:
            self._launch_ready_buckets()

    def _launch_ready_buckets(self) -> None:
        # In bucket order only: every rank must issue the same sequence of collectives.
        while self._next_to_launch < len(self.buckets):
            bucket = self.buckets[self._next_to_launch]
            if len(bucket.ready) < len(bucket.params):
                return
            self._launch(bucket)
            self.launched_in_backward += 1

    def _launch(self, bucket: _Bucket) -> None:
        bucket.flatten()
        if isinstance(bucket, _ShardedBucket):
            bucket.work = bucket.launch(self.group)
        else:
            bucket.work = dist.all_reduce(bucket.buffer, group=self.group, async_op=True)
        self._next_to_launch += 1

    @property
    def launched_buckets(self) -> int:
        """How many buckets of this step are already in flight."""
        return self._next_to_launch

    def carry(self, value: torch.Tensor) -> None:
        """Send the scalar ``value`` with this step's last bucket (no collective of its own);
        :meth:`finish` returns its average over the group. Call before backward."""
        if self.world_size == 1:
            return
        if self.zero:
            raise RuntimeError("a ZeRO bucket carries no value: the layout's loss bucket is a plain one")
        if self.buckets:
            self.buckets[-1].extra.copy_(value.detach().reshape(1))
        else:  # nothing to train: the value travels alone
            self._lone = value.detach().reshape(1).clone()
            dist.all_reduce(self._lone, group=self.group)

    def finish(self) -> torch.Tensor | None:
        """Launch the buckets still waiting, wait for all, average into ``param.grad``, reset.

        Returns the group average of the value given to :meth:`carry` (None on a group of 1)."""
        if self.world_size == 1:
            if self.divisor != 1:
                for p in self._params:
                    if p.grad is not None:
                        p.grad.div_(self.divisor)
            return None
        while self._next_to_launch < len(self.buckets):
            self._launch(self.buckets[self._next_to_launch])
        for bucket in self.buckets:
            bucket.work.wait()
            if isinstance(bucket, _ShardedBucket):
                bucket.unflatten_into_grads(self.divisor)
            else:
                bucket.buffer.div_(self.divisor)
                bucket.unflatten_into_grads()
            bucket.work = None
            bucket.ready.clear()
        self._next_to_launch = 0
        if self._armed is not None:
            self._armed.clear()
        if self.zero:
            return None
        if not self.buckets:
            return None if self._lone is None else self._lone / self.world_size
        return self.buckets[-1].extra * (self.divisor / self.world_size)

    def remove_hooks(self) -> None:
        """Unregister the gradient hooks (the object is unusable for overlap afterwards)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def sync_gradients(params: Iterable[torch.nn.Parameter], group_name: str) -> None:
    """Average ``param.grad`` over the group ``group_name`` with one flat all-reduce per dtype.

    A missing gradient counts as zero and is replaced by the average. No overlap: this is
    the reference that :class:`GradientBuckets` must equal.
    """
    group = get_group(group_name)
    world_size = size_of(group)
    if world_size == 1:
        return
    by_kind: dict[tuple, list[torch.nn.Parameter]] = {}
    for p in {id(p): p for p in params}.values():
        if p.requires_grad:
            by_kind.setdefault((p.dtype, p.device), []).append(p)
    for same_kind in by_kind.values():
        bucket = _Bucket(0, same_kind)
        bucket.flatten()
        dist.all_reduce(bucket.buffer, group=group)
        bucket.buffer.div_(world_size)
        bucket.unflatten_into_grads()
