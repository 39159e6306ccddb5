"""Autograd-aware collectives that rewritten graphs call, named after their math.

Every public function here is a plain module-level function of tensors, ints and a
group *name* (see :mod:`autopar.runtime.groups`), so a rewrite pass inserts it as a
``call_function`` node and the rank's generated code reads like the paper::

    copy_to_tensor_region = autopar_runtime_collectives_copy_to_tensor_region(x, 'tensor')
    matmul = torch.matmul(copy_to_tensor_region, a_column_shard)
    ...
    reduce_from_tensor_region = autopar_runtime_collectives_reduce_from_tensor_region(matmul_1, 'tensor')

Each one is backed by a ``torch.autograd.Function`` whose docstring states what it does
in forward and in backward. The tensor-parallel pair f / g is Megatron's (Narayanan et
al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", §2.3 and Figure 5: "f is the identity operator in the forward pass and
all-reduce in the backward pass, while g is the reverse").

Over a group of size 1 (``None`` in the registry) every collective is the identity or
the plain single-device operation. The group is looked up when the forward runs and
kept for the backward. Gathers assume every rank holds a chunk of the same shape.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.fx
from torch.autograd.function import once_differentiable
from torch.distributed import ProcessGroup

from autopar._torch_compat import all_gather_flat, reduce_scatter_flat
from autopar.runtime.groups import get_group, rank_in, size_of


def _all_reduce(tensor: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """All-reduce a fresh contiguous copy of ``tensor`` (gloo needs contiguous buffers)."""
    out = tensor.clone(memory_format=torch.contiguous_format)
    if size_of(group) > 1:
        dist.all_reduce(out, op=op, group=group)
    return out


def _all_gather_cat(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along ``dim`` in rank order."""
    tensor = tensor.contiguous()
    chunks = [torch.empty_like(tensor) for _ in range(size_of(group))]
    dist.all_gather(chunks, tensor, group=group)
    return torch.cat(chunks, dim=dim)


def _own_chunk(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    """This rank's chunk of ``tensor`` along ``dim`` (equal chunks, rank order)."""
    size = size_of(group)
    if tensor.shape[dim] % size:
        raise ValueError(
            f"cannot split dim {dim} of size {tensor.shape[dim]} into {size} equal chunks"
        )
    length = tensor.shape[dim] // size
    return tensor.narrow(dim, rank_in(group) * length, length).contiguous()


class _CopyToRegion(torch.autograd.Function):
    """Megatron's f: identity in forward, all-reduce (sum) in backward (Megatron-LM §2.3, Fig. 5)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Optional[ProcessGroup]) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromRegion(torch.autograd.Function):
    """Megatron's g: all-reduce (sum) in forward, identity in backward (Megatron-LM §2.3, Fig. 5)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Optional[ProcessGroup]) -> torch.Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _GatherFromRegion(torch.autograd.Function):
    """All-gather along ``dim`` in forward, take this rank's chunk of the gradient in backward.

    The output is replicated, so every rank holds the same full gradient and its own
    chunk is exact (Megatron-LM's gather_from_tensor_model_parallel_region, §2.3).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, group: Optional[ProcessGroup]) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _all_gather_cat(x, dim, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _own_chunk(grad, ctx.dim, ctx.group), None, None


class _ScatterToRegion(torch.autograd.Function):
    """Take this rank's chunk along ``dim`` in forward (no communication), all-gather the gradient in backward.

    The conjugate of :class:`_GatherFromRegion` (Megatron-LM §2.3; the same split and
    re-gather is the scatter/gather optimisation of §4.1).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, group: Optional[ProcessGroup]) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _own_chunk(x, dim, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_gather_cat(grad, ctx.dim, ctx.group), None, None


def copy_to_tensor_region(x: torch.Tensor, group: str) -> torch.Tensor:
    """Megatron f: identity forward, all-reduce (sum) of the gradient over ``group`` backward."""
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return x
    return _CopyToRegion.apply(x, process_group)


def reduce_from_tensor_region(x: torch.Tensor, group: str) -> torch.Tensor:
    """Megatron g: all-reduce (sum) over ``group`` forward, identity backward."""
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return x
    return _ReduceFromRegion.apply(x, process_group)


def gather_from_tensor_region(x: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    """All-gather ``x`` along ``dim`` in rank order forward; this rank's gradient chunk backward."""
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return x
    return _GatherFromRegion.apply(x, dim % x.dim(), process_group)


def scatter_to_tensor_region(x: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    """This rank's equal chunk of ``x`` along ``dim`` forward; all-gather of the gradient backward."""
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return x
    return _ScatterToRegion.apply(x, dim % x.dim(), process_group)


def all_gather_batch(x: torch.Tensor, group: str) -> torch.Tensor:
    """Concatenate the data-parallel ranks' batch shards along dim 0 (full outputs on every rank)."""
    return gather_from_tensor_region(x, 0, group)


class _AverageOverGroup(torch.autograd.Function):
    """Mean over the data-parallel group in forward (all-reduce, divide by G); identity in
    backward.

    For a rank program's loss when the loss is a mean over an evenly split batch: the
    mean of the ranks' means is the global mean. Backward follows the data-parallel
    convention: each replica back-propagates its own loss and the gradient buckets
    average the replicas' gradients, which is where the 1/G of this mean is applied
    (averaging also keeps gradients accumulated over earlier steps, which are identical
    on every replica, unchanged).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Optional[ProcessGroup]) -> torch.Tensor:
        return _all_reduce(x, group) / size_of(group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _SumOverGroup(torch.autograd.Function):
    """Sum over the data-parallel group in forward (all-reduce); gradient × G in backward.

    For a loss that sums over the batch: the global loss is the sum of the ranks' sums.
    Its gradient is the sum of the replicas' gradients; the gradient buckets average
    them, so each replica's gradient is scaled by G here (the same convention as
    :class:`_AverageOverGroup`).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Optional[ProcessGroup]) -> torch.Tensor:
        ctx.size = size_of(group)
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.size, None


class _BatchStatistic(torch.autograd.Function):
    """The mean over the group of a statistic each rank reduced over its rows (forward
    all-reduce / G), its gradient averaged over the group in backward (all-reduce / G).

    For a value a model reduces over the batch and then uses non-linearly (a mixture of
    experts' load-balancing loss: the fraction of tokens routed to each expert times its
    mean router probability): every rank computes on the global statistic, and each
    rank's share of the statistic receives the mean of the ranks' gradients, so that the
    data ranks' averaged gradients are the single-device model's (a sum of equal-sized
    shards divided by the local row count becomes the global sum over the global count;
    a ratio of two such statistics the ratio of the global sums)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Optional[ProcessGroup]) -> torch.Tensor:
        ctx.group = group
        return _all_reduce(x, group) / size_of(group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_reduce(grad.contiguous(), ctx.group) / size_of(ctx.group), None


class _GatherRows(torch.autograd.Function):
    """All-gather of every rank's rows along dim 0 in forward; in backward the gradients
    the ranks computed for the whole batch's rows are summed and each rank keeps its own
    rows' (a reduce-scatter of the sum).

    For a score between this rank's rows and every row of the batch (a contrastive loss
    over a data-parallel batch): each rank's loss reads every rank's rows, so a row's
    gradient is the sum of what every rank's loss sends it (open_clip's
    ``gather_features(gather_with_grad=True)``; ``torch.distributed.nn.all_gather``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Optional[ProcessGroup]) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = x.new_empty((x.shape[0] * size_of(group), *x.shape[1:]))
        all_gather_flat(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = grad.new_empty((grad.shape[0] // size_of(ctx.group), *grad.shape[1:]))
        reduce_scatter_flat(out, grad, group=ctx.group)
        return out, None


def gather_rows(x: torch.Tensor, group: str) -> torch.Tensor:
    """Every rank's rows of ``x`` (dim 0) in rank order forward; backward, the sum over the
    ranks of their gradients for this rank's rows (:class:`_GatherRows`)."""
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return x
    return _GatherRows.apply(x, process_group)


def global_rows(positions: torch.Tensor, local_rows: int, group: str) -> torch.Tensor:
    """Row positions counted on this rank's share (``arange(local_rows)``) as positions in
    the whole batch: offset by the rank's first row, ``rank_in(group) · local_rows``."""
    process_group = get_group(group)
    if size_of(process_group) == 1:
        return positions
    return positions + rank_in(process_group) * local_rows


def batch_statistic(x: torch.Tensor, group: str) -> torch.Tensor:
    """``x``, a rank's statistic over its rows, as the mean over ``group`` (:class:`_BatchStatistic`)."""
    if not x.is_floating_point():   # counts: their mean is fractional
        x = x.to(torch.get_default_dtype())
    return _BatchStatistic.apply(x, get_group(group))


def average_over_group(x: torch.Tensor, group: str) -> torch.Tensor:
    """Mean of ``x`` over the ranks of ``group`` (see :class:`_AverageOverGroup`)."""
    return _AverageOverGroup.apply(x, get_group(group))


def sum_over_group(x: torch.Tensor, group: str) -> torch.Tensor:
    """Sum of ``x`` over the ranks of ``group`` (see :class:`_SumOverGroup`)."""
    return _SumOverGroup.apply(x, get_group(group))


def vocab_parallel_embedding(
    ids: torch.Tensor,
    weight_shard: torch.Tensor,
    vocab_start: int,
    group: str,
    padding_idx: Optional[int] = None,
    reduce: bool = True,
) -> torch.Tensor:
    """Embedding lookup with the table split by rows (vocabulary) over ``group``.

    Rank r holds rows ``[vocab_start, vocab_start + weight_shard.shape[0])``. Ids outside
    that range look up row 0 and have their output zeroed, then g sums the ranks'
    partial outputs (Megatron-LM's VocabParallelEmbedding; g is §2.3's all-reduce).
    ``padding_idx`` is a global, non-negative row index, as ``nn.Embedding`` stores it.
    ``reduce=False``: the rank's partial output, for a sum that another collective makes
    (sequence parallelism's reduce-scatter over the tokens, Korthikanti et al. §4.2.2).
    """
    if padding_idx is not None and padding_idx < 0:
        raise ValueError(f"padding_idx must be a non-negative global index, got {padding_idx}")
    local_vocab = weight_shard.shape[0]
    local_padding = None
    if padding_idx is not None and vocab_start <= padding_idx < vocab_start + local_vocab:
        local_padding = padding_idx - vocab_start
    outside = (ids < vocab_start) | (ids >= vocab_start + local_vocab)
    local_ids = (ids - vocab_start).masked_fill(outside, 0)
    out = torch.nn.functional.embedding(local_ids, weight_shard, padding_idx=local_padding)
    out = out.masked_fill(outside.unsqueeze(-1), 0.0)
    return reduce_from_tensor_region(out, group) if reduce else out


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy of vocab-sharded logits: softmax statistics all-reduced in forward,
    local ``softmax - one_hot`` in backward (no communication).

    Forward (Megatron-LM's vocab-parallel cross-entropy, built on §2.3's split of the
    output embedding): all-reduce MAX of the row maxima, then one all-reduce SUM of
    [sum of exp, target logit], where only the rank owning the target contributes its
    logit. Backward: ``(softmax - one_hot(target)) * dloss`` on the local columns.
    """

    @staticmethod
    def forward(ctx, logits, target, vocab_start, group, ignore_index, reduction, vocab_size):
        ctx.logits_shape, ctx.logits_dtype = logits.shape, logits.dtype
        local_vocab = logits.shape[-1]
        # at least fp32 (half-precision logits are upcast; float64 stays float64)
        logits = logits.reshape(-1, local_vocab).to(torch.promote_types(logits.dtype, torch.float32))
        target = target.reshape(-1)
        if vocab_size is not None and vocab_start + local_vocab > vocab_size:
            # Padded vocabulary entries must not enter the softmax.
            valid_columns = max(0, vocab_size - vocab_start)
            logits = logits.clone()
            logits[:, valid_columns:] = float("-inf")
        row_max = _all_reduce(logits.max(dim=-1).values, group, dist.ReduceOp.MAX)
        shifted = logits - row_max.unsqueeze(-1)
        owned = (target >= vocab_start) & (target < vocab_start + local_vocab)
        local_target = (target - vocab_start).masked_fill(~owned, 0)
        target_logit = shifted.gather(1, local_target.unsqueeze(-1)).squeeze(-1)
        target_logit = target_logit.masked_fill(~owned, 0.0)
        exp = shifted.exp_()
        sum_exp, target_logit = _all_reduce(torch.stack([exp.sum(dim=-1), target_logit]), group)
        counted = target != ignore_index
        loss = (sum_exp.log() - target_logit).masked_fill(~counted, 0.0)

        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local_target, owned, counted)
        ctx.reduction = reduction
        if reduction == "none":
            result = loss
        elif reduction == "sum":
            result = loss.sum()
        else:  # "mean": over the targets that are not ignored, like F.cross_entropy
            ctx.count = counted.sum()
            result = loss.sum() / ctx.count
        return result

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        softmax, local_target, owned, counted = ctx.saved_tensors
        scale = grad.to(softmax.dtype) * counted
        if ctx.reduction == "mean":
            # All targets ignored: the loss is nan (0/0) but, as in torch, the gradient is 0.
            scale = scale / ctx.count.clamp(min=1)
        # Out of place, so that a second backward (retain_graph=True) sees the same softmax.
        grad_logits = softmax * scale.unsqueeze(-1)
        rows = torch.arange(grad_logits.shape[0], device=grad_logits.device)
        grad_logits[rows, local_target] -= owned * scale
        grad_logits = grad_logits.reshape(ctx.logits_shape).to(ctx.logits_dtype)
        return grad_logits, None, None, None, None, None, None


def vocab_parallel_cross_entropy(
    logits_shard: torch.Tensor,
    target: torch.Tensor,
    vocab_start: int,
    group: str,
    ignore_index: int = -100,
    reduction: str = "mean",
    vocab_size: Optional[int] = None,
) -> torch.Tensor:
    """``F.cross_entropy(full_logits, target)`` for logits split along the last (vocab) dim.

    Rank r holds columns ``[vocab_start, vocab_start + logits_shard.shape[-1])``;
    ``logits_shard`` is ``[N, V_local]``, ``[B, T, V_local]`` (target ``[N]``, ``[B, T]``)
    or ``[V_local]`` with a 0-d target. Computed in fp32 with the global max subtracted;
    targets equal to ``ignore_index`` contribute nothing and ``mean`` divides by the
    number of the others. Columns at or past ``vocab_size`` (a padded vocabulary) are
    left out of the softmax. The result has ``logits_shard``'s dtype.
    Forward / backward: see :class:`_VocabParallelCrossEntropy`.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if target.is_floating_point():
        raise TypeError("vocab_parallel_cross_entropy takes class-index targets, not probabilities")
    loss = _VocabParallelCrossEntropy.apply(
        logits_shard, target, vocab_start, get_group(group), ignore_index, reduction, vocab_size
    )
    if reduction == "none":
        loss = loss.reshape(target.shape)
    return loss.to(logits_shard.dtype)


class _SyncBatchNorm(torch.autograd.Function):
    """Batch norm in training mode whose statistics cover the whole batch, split over a
    group of ranks (each holds a batch shard): what the single-device model computes.

    Forward: the per-channel mean is an all-reduced sum over the count of all ranks;
    the biased variance a second all-reduce of squared deviations from that mean (two
    passes, as the single-device kernel, rather than E[x^2] - E[x]^2, which cancels
    badly). Running statistics are updated in place with the global mean and the
    unbiased variance, so every rank's buffers stay equal to the single-device model's.

    Backward: with ``g = dy * weight`` and ``x̂`` the normalised input,
    ``dx = invstd * (g - Σg/N - x̂ Σ(g x̂)/N)`` where both sums are all-reduced over the
    group; ``dweight = Σ dy x̂`` and ``dbias = Σ dy`` stay local sums and are averaged
    with every other gradient by the data-parallel buckets. Each rank back-propagates
    its own loss, so the all-reduced sums are G times the global loss's and the
    averaging restores the single-device gradients (the convention of
    :class:`_AverageOverGroup`). Half and bfloat16 inputs are normalised in float32, as
    torch's kernel does; float64 stays float64.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum: float, eps: float,
                group: Optional[ProcessGroup]):
        dims = [d for d in range(x.dim()) if d != 1]
        shape = [1, -1] + [1] * (x.dim() - 2)
        acc = torch.promote_types(x.dtype, torch.float32)   # half and bfloat16 in float32; float64 kept
        xf = x.to(acc)
        # the count stays a tensor on x's device: no host synchronisation per batch norm
        count = torch.full((1,), x.numel() // x.shape[1], dtype=torch.float64, device=x.device)
        total = _all_reduce(torch.cat([xf.sum(dims).double(), count]), group)
        n = total[-1]
        mean = (total[:-1] / n).to(acc)
        centred = xf - mean.view(shape)
        var = (_all_reduce(centred.pow(2).sum(dims).double(), group) / n).to(acc)
        invstd = torch.rsqrt(var + eps)
        xhat = centred * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.to(acc).view(shape)
        if bias is not None:
            y = y + bias.to(acc).view(shape)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                unbiased = var * (n / (n - 1).clamp(min=1)).to(acc)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.meta = (dims, shape, n, group, bias is not None, acc)
        return y.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        xhat, invstd, weight = ctx.saved_tensors
        dims, shape, n, group, has_bias, acc = ctx.meta
        dyf = dy.to(acc)
        g = dyf * weight.to(acc).view(shape) if weight is not None else dyf
        sums = _all_reduce(torch.cat([g.sum(dims), (g * xhat).sum(dims)]), group)
        sum_g, sum_gx = sums.chunk(2)
        n = n.to(acc)
        dx = invstd.view(shape) * (g - (sum_g / n).view(shape) - xhat * (sum_gx / n).view(shape))
        dweight = (dyf * xhat).sum(dims).to(weight.dtype) if weight is not None else None
        dbias = dyf.sum(dims).to(dy.dtype) if has_bias else None
        return dx.to(dy.dtype), dweight, dbias, None, None, None, None, None


def sync_batch_norm(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                    running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor],
                    momentum: float, eps: float, group: str) -> torch.Tensor:
    """Training-mode batch norm over the batch that the ranks of ``group`` share
    (see :class:`_SyncBatchNorm`); ``momentum`` is the running statistics' update factor."""
    return _SyncBatchNorm.apply(x, weight, bias, running_mean, running_var, momentum, eps, get_group(group))


GRAPH_FUNCTIONS = (
    copy_to_tensor_region,
    reduce_from_tensor_region,
    gather_from_tensor_region,
    scatter_to_tensor_region,
    all_gather_batch,
    average_over_group,
    sum_over_group,
    vocab_parallel_embedding,
    vocab_parallel_cross_entropy,
    sync_batch_norm,
    batch_statistic,
)
"""The graph-callable collectives; pass as ``fx.Tracer(autowrap_functions=...)`` to keep
them as leaves when a rewritten program is traced again."""

for _fn in GRAPH_FUNCTIONS:
    torch.fx.wrap(_fn.__name__)
