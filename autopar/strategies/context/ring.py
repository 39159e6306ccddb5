"""Attention over a sequence split across the context group: ring attention.

Each rank holds the queries, keys and values of its tokens (:mod:`.collectives`: chunks
``r`` and ``2c−1−r`` of ``2c``). :func:`ring_attention` computes what
``scaled_dot_product_attention`` computes for this rank's queries against the keys and
values of the whole sequence, in ``c`` steps: at each step the rank attends to the keys
and values it holds while it sends them on to the next rank of the ring and receives the
previous rank's (the exchange overlaps the step's attention), and the partial results are
merged by their log-sum-exp (the online softmax of Milakov & Gimelshein 2018; blockwise
as in Liu et al., "Ring Attention with Blockwise Transformers", 2023). Backward runs the
ring again: the keys and values travel with the gradient accumulated for them, each rank
adding its queries' contribution, until after ``c`` steps every rank holds its own keys'
and values' gradients (the flash-attention backward of each block from the saved output
and log-sum-exp, Dao 2022 Algorithm 2).

Masks: ``is_causal`` by global positions (the load-balanced chunks make every rank's
work equal); an ``attn_mask`` (bool or additive, broadcastable to ``[batch, heads, seq,
seq]``, every rank holding the whole of it) is read at the block's rows and columns. A
block the causal mask, or a boolean mask, hides entirely is skipped, which is what a
sliding window or a causal mask saves. A mask that needs a gradient (a learned bias) is
not taken: the walk runs such attention on the whole sequence. Grouped-query attention (fewer key/value heads) sends the key/value
heads as they are and repeats them for the block. ``mode="allgather"`` gathers every
rank's keys and values once instead (one all-gather forward, one reduce-scatter of their
gradients backward): cheaper than ``c−1`` exchanges when the keys and values are small
(few key/value heads) and the blocks too small to hide the ring. ``mode="serial"`` is the
ring with each exchange finished before the step's attention starts: what the overlap is
measured against (``benchmarks/bench_context.py``).

The blocks are computed in float32 (as the softmax statistics must be), or in the queries'
dtype where it is wider; the output is cast back to the queries' dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.fx

from autopar._torch_compat import all_gather_flat, reduce_scatter_flat
from autopar.runtime.groups import get_group, rank_in, size_of

_NEG = float("-inf")


def _pieces(seq: int, c: int, r: int, balanced: bool) -> list[tuple[int, int, int]]:
    """Rank ``r``'s tokens as contiguous pieces ``(local start, global start, length)``."""
    if balanced:
        chunk = seq // (2 * c)
        return [(0, r * chunk, chunk), (chunk, (2 * c - 1 - r) * chunk, chunk)]
    return [(0, r * (seq // c), seq // c)]


def _mask_block(mask, rows: torch.Tensor, cols: torch.Tensor, seq: int):
    """``mask`` (broadcastable to ``[..., seq, seq]``) at ``rows`` × ``cols``."""
    if mask is None:
        return None
    if mask.dim() >= 2 and mask.shape[-2] == seq:
        mask = mask.index_select(-2, rows)
    if mask.shape[-1] == seq:
        mask = mask.index_select(-1, cols)
    return mask


def _scores(setup: _Setup, q, k, mask, pq: tuple[int, int], pk: tuple[int, int]):
    """The block's scores ``q k^T · scale`` with its mask applied (None: all masked);
    ``pq``, ``pk``: the queries' and keys' ``(global start, length)``; the scale, the
    causal mask and the sequence's length are the call's (``setup``)."""
    (q0, lq), (k0, lk) = pq, pk
    causal = setup.causal
    if causal and q0 + lq - 1 < k0:
        return None
    rows = torch.arange(q0, q0 + lq, device=q.device)
    cols = torch.arange(k0, k0 + lk, device=q.device)
    m = _mask_block(mask, rows, cols, setup.seq)
    if m is not None and m.dtype == torch.bool and not bool(m.any()):
        return None
    s = torch.matmul(q, k.transpose(-2, -1)) * setup.scale
    if m is not None:
        s = s.masked_fill(~m, _NEG) if m.dtype == torch.bool else s + m.to(s.dtype)
    if causal and q0 < k0 + lk - 1:
        s = s.masked_fill(rows[:, None] < cols[None, :], _NEG)
    return s


def _compute_dtype(q: torch.Tensor) -> torch.dtype:
    """The blocks' dtype: float32, or the queries' where wider (float64)."""
    return torch.promote_types(q.dtype, torch.float32)


def _safe(lse: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def _merge(out, lse, o_b, lse_b):
    """The online-softmax merge of two normalised partial results by their log-sum-exp."""
    m = _safe(torch.maximum(lse, lse_b))
    w1, w2 = torch.exp(lse - m), torch.exp(lse_b - m)
    den = w1 + w2
    safe_den = torch.where(den == 0, torch.ones_like(den), den)
    out = (out * w1[..., None] + o_b * w2[..., None]) / safe_den[..., None]
    return out, m + torch.log(den)


def _repeat(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Key/value heads repeated to the queries' ``heads`` (grouped-query attention)."""
    rep = heads // x.shape[-3]
    return x if rep == 1 else x.repeat_interleave(rep, dim=-3)


class _Setup:
    """What one call knows: the group, its size and rank, the pieces of every rank."""

    def __init__(self, group: str, seq: int, balanced: bool, causal: bool, scale, mode: str, heads: int):
        self.pg = get_group(group)
        self.c, self.r = size_of(self.pg), rank_in(self.pg)
        self.seq, self.balanced, self.causal, self.scale, self.mode, self.heads = \
            seq, balanced, causal, scale, mode, heads
        self.pieces = [_pieces(seq, self.c, s, balanced) for s in range(self.c)]

    def source(self, step: int) -> int:
        return (self.r - step) % self.c

    def peers(self) -> tuple[int, int]:
        return (self.r + 1) % self.c, (self.r - 1) % self.c


def _exchange(setup: _Setup, send: torch.Tensor, tag: int):
    """Send ``send`` to the next rank of the ring and receive the previous rank's
    (asynchronously): ``(received buffer, [work])``."""
    nxt, prev = setup.peers()
    recv = torch.empty_like(send)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, group=setup.pg, tag=tag, group_peer=nxt),
                                    dist.P2POp(dist.irecv, recv, group=setup.pg, tag=tag, group_peer=prev)])
    return recv, works


def _pass_on(setup: _Setup, kv: torch.Tensor, tag: int):
    """The keys and values sent on around the ring (:func:`_exchange`); in ``"serial"``
    mode the exchange finished (and waited once) before the step's attention starts."""
    received, works = _exchange(setup, kv, tag)
    if setup.mode == "serial":
        _wait(works)
        works = []
    return received, works


def _gather_kv(setup: _Setup, kv: torch.Tensor) -> torch.Tensor:
    """Every rank's keys and values (``[c, 2, ...]``): the all-gather mode's one collective."""
    every = kv.new_empty((setup.c * kv.shape[0], *kv.shape[1:]))
    all_gather_flat(every, kv, group=setup.pg)
    return every.unflatten(0, (setup.c, kv.shape[0]))


def _wait(works) -> None:
    for w in works:
        w.wait()


def _forward_block(setup: _Setup, qf, kv, source: int, mask, outs, lses) -> None:
    k, v = _repeat(kv[0].to(qf.dtype), setup.heads), _repeat(kv[1].to(qf.dtype), setup.heads)
    for i, (ql, qg, qn) in enumerate(setup.pieces[setup.r]):
        for kl, kg, kn in setup.pieces[source]:
            s = _scores(setup, qf[..., ql:ql + qn, :], k[..., kl:kl + kn, :], mask, (qg, qn), (kg, kn))
            if s is None:
                continue
            lse_b = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - _safe(lse_b)[..., None])
            outs[i], lses[i] = _merge(outs[i], lses[i], torch.matmul(p, v[..., kl:kl + kn, :]), lse_b)


@dataclass(frozen=True)
class _Backward:
    """What every block of one backward reads of this rank's queries, in the blocks'
    dtype: the queries ``qf``, the output's gradient ``dof``, the mask, per piece the
    log-sum-exp ``lses`` saved in forward and ``deltas`` (``rowsum(dO ∘ O)``, the ``D`` of
    the flash-attention backward), and ``dq``, the queries' gradient, accumulated in place."""

    qf: torch.Tensor
    dof: torch.Tensor
    mask: object
    lses: list
    deltas: list
    dq: torch.Tensor


def _backward_block(setup: _Setup, back: _Backward, kv, source: int) -> torch.Tensor:
    """This rank's queries' contribution to the gradients of ``source``'s keys and values
    ``kv`` (``[2, ...]`` in the blocks' dtype, key/value heads), ``back.dq`` accumulated in place."""
    qf, dof, lses, deltas, dq = back.qf, back.dof, back.lses, back.deltas, back.dq
    k, v = _repeat(kv[0].to(qf.dtype), setup.heads), _repeat(kv[1].to(qf.dtype), setup.heads)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for i, (ql, qg, qn) in enumerate(setup.pieces[setup.r]):
        q_i = qf[..., ql:ql + qn, :]
        for kl, kg, kn in setup.pieces[source]:
            s = _scores(setup, q_i, k[..., kl:kl + kn, :], back.mask, (qg, qn), (kg, kn))
            if s is None:
                continue
            p = torch.exp(s - _safe(lses[i])[..., None])
            do_i = dof[..., ql:ql + qn, :]
            dv[..., kl:kl + kn, :] += torch.matmul(p.transpose(-2, -1), do_i)
            ds = p * (torch.matmul(do_i, v[..., kl:kl + kn, :].transpose(-2, -1)) - deltas[i][..., None])
            dq[..., ql:ql + qn, :] += torch.matmul(ds, k[..., kl:kl + kn, :]) * setup.scale
            dk[..., kl:kl + kn, :] += torch.matmul(ds.transpose(-2, -1), q_i) * setup.scale
    hkv = kv.shape[-3]
    if hkv != setup.heads:   # the repeated heads' gradients summed back onto their key/value head
        rep = setup.heads // hkv
        dk = dk.unflatten(-3, (hkv, rep)).sum(-3)
        dv = dv.unflatten(-3, (hkv, rep)).sum(-3)
    return torch.stack([dk, dv])


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, setup: _Setup):
        qf = q.to(_compute_dtype(q))
        kv = torch.stack([k, v]).contiguous()
        n = len(setup.pieces[setup.r])
        length = setup.pieces[setup.r][0][2]
        outs = [qf.new_zeros(*qf.shape[:-2], length, v.shape[-1]) for _ in range(n)]
        lses = [qf.new_full((*qf.shape[:-2], length), _NEG) for _ in range(n)]
        if setup.mode == "allgather":
            every = _gather_kv(setup, kv)
            for s in range(setup.c):
                _forward_block(setup, qf, every[s], s, mask, outs, lses)
        else:
            for step in range(setup.c):
                works = []
                if step < setup.c - 1:
                    nxt, works = _pass_on(setup, kv, tag=0)
                _forward_block(setup, qf, kv, setup.source(step), mask, outs, lses)
                _wait(works)
                if step < setup.c - 1:
                    kv = nxt
        out = torch.cat(outs, dim=-2)
        ctx.setup = setup
        ctx.save_for_backward(q, k, v, mask if isinstance(mask, torch.Tensor) else None, out, *lses)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad):
        with torch.autocast(device_type=grad.device.type, enabled=False):   # the blocks in their own dtype
            return _RingAttention._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        setup = ctx.setup
        q, k, v, mask, out, *lses = ctx.saved_tensors
        qf, dof = q.to(_compute_dtype(q)), grad.to(_compute_dtype(q))
        n = len(lses)
        length = setup.pieces[setup.r][0][2]
        delta = (dof * out).sum(-1)
        deltas = [delta[..., i * length:(i + 1) * length] for i in range(n)]
        dq = torch.zeros_like(qf)
        back = _Backward(qf, dof, mask, lses, deltas, dq)
        kv = torch.stack([k, v]).contiguous()
        if setup.mode == "allgather":
            every = _gather_kv(setup, kv)
            grads = torch.cat([_backward_block(setup, back, every[s], s) for s in range(setup.c)]).contiguous()
            mine = grads.new_empty((2, *grads.shape[1:]))
            reduce_scatter_flat(mine, grads, group=setup.pg)
        else:
            pending = None
            for step in range(setup.c):
                works = []
                if step < setup.c - 1:
                    nxt, works = _pass_on(setup, kv, tag=1)
                contribution = _backward_block(setup, back, kv, setup.source(step))
                if pending is not None:
                    received, pending_works = pending
                    _wait(pending_works)
                    contribution = contribution + received
                pending = _exchange(setup, contribution.contiguous(), tag=2)
                if setup.mode == "serial":
                    _wait(pending[1])
                    pending = (pending[0], [])
                _wait(works)
                if step < setup.c - 1:
                    kv = nxt
            mine, last = pending
            _wait(last)
        return dq.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype), None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask=None, *, is_causal: bool = False,
                   scale: float | None = None, seq: int, group: str, balanced: bool,
                   mode: str = "ring") -> torch.Tensor:
    """``scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal,
    scale=scale)`` over the whole sequence of ``seq`` tokens, for this rank's queries
    (``[..., heads, seq/c, dim]``, its tokens those :func:`.collectives.positions` gives)
    against every rank's keys and values (``[..., kv heads, seq/c, dim]``) of the context
    ``group``: the ring (``mode="ring"``) or one all-gather (``"allgather"``), see the
    module docstring. ``attn_mask`` is the whole sequence's, on every rank."""
    setup = _Setup(group, seq, balanced, is_causal, scale if scale is not None else 1 / math.sqrt(q.shape[-1]),
                   mode, q.shape[-3])
    if isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad:
        raise ValueError("ring attention: the mask requires a gradient, which the ring does not return; run this "
                         "attention on the whole sequence")
    if q.shape[-3] % k.shape[-3]:
        raise ValueError(f"ring attention: {q.shape[-3]} query heads are not a multiple of {k.shape[-3]} "
                         f"key/value heads")
    with torch.autocast(device_type=q.device.type, enabled=False):   # the blocks in their own dtype
        return _RingAttention.apply(q, k, v, attn_mask, setup)


torch.fx.wrap("ring_attention")
