"""Expert parallelism's collectives: a routed mixture-of-experts layer's tokens sent to
the ranks that hold their experts, and the experts' outputs sent back.

An *expert group* of ``P`` ranks holds the layer's ``E`` experts, ``E / P`` each: rank
``r`` of the group holds experts ``[r E/P, (r+1) E/P)`` (``P`` divides ``E``). Every rank
of the group routes its own tokens (its share of the batch): token ``t`` goes to its
``k`` experts ``top_k_index[t]`` with weights ``top_k_weights[t]``.

* :func:`dispatch`: each (token, slot) pair is sent to the rank holding its expert, with
  one ``all_to_all_single`` of variable counts (the counts exchanged first with a small
  all-to-all). No capacity, no token dropped: the layer computes what the single-device
  layer computes, in any routing (GShard and Switch drop tokens beyond a capacity; this
  is Megatron-Core's "dropless" all-to-all dispatcher and DeepSpeed-MoE's
  ``drop_tokens=False``). The rank receives the rows its experts process and each row's
  local expert id.
* the experts run on the rows they received (any expert function: Hugging Face's grouped
  matmul over the rank's expert slices, a ``ModuleList``'s MLPs);
* :func:`combine`: the conjugate all-to-all sends each output row back to the rank whose
  token it is; there the rows are put back in (token, slot) order, weighted by the
  routing weights and summed over the ``k`` slots, as Hugging Face's experts do
  (``(out * w).view(T, k, H).sum(1)``).

Both all-to-alls are differentiable (:class:`_AllToAllRows`: the backward of an
all-to-all is the all-to-all with send and receive counts swapped), so a token's gradient
comes back from the ranks its experts ran on, and an expert's weight gradient sums over
every token of the group routed to it. The expert weights are replicated only across
expert groups: their gradients are reduced over the ranks holding the same experts, not
over the whole data group.

Gloo accepts ``all_to_all_single`` with uneven split sizes (and refuses ``all_to_all`` of
unequal tensors); NCCL takes both.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from autopar.grid import MeshAxis
from autopar.runtime.family_runtime import RankRuntime
from autopar.runtime.groups import get_group, size_of


LOAD: dict[str, int] = {}
"""Rows each MoE layer's experts processed on this rank since :func:`reset_load` (the
last forward or step of the compiled model), by region id: the measured load beside the
planner's uniform ``tokens × top_k`` (``ParallelModule.expert_load``)."""


def record_load(layer: str, rows: int) -> None:
    LOAD[layer] = LOAD.get(layer, 0) + int(rows)


def reset_load(layers) -> None:
    for layer in layers:
        LOAD.pop(layer, None)


def _group(group):
    """A process group given by name (the plan's, :mod:`autopar.runtime.groups`) or as itself."""
    return get_group(group) if isinstance(group, str) else group


@dataclass
class Routing:
    """How one call's (token, slot) pairs went out, for :func:`combine`: ``order`` sorts
    the ``tokens × top_k`` pairs by destination rank (stable: within a rank in token
    order), ``sent[j]`` pairs went to group rank ``j``, ``received[j]`` came from it."""
    order: torch.Tensor
    sent: list[int]
    received: list[int]
    tokens: int
    top_k: int

    @property
    def rows(self) -> int:
        """Rows this rank's experts processed (the measured load, against the uniform
        ``tokens × top_k`` the planner assumes)."""
        return sum(self.received)


class _AllToAllRows(torch.autograd.Function):
    """Rows of ``x`` (first dimension) to the group's ranks, ``send[j]`` to rank ``j``;
    ``recv[j]`` rows back from each. Backward: the same exchange reversed. ``anchor``
    (gets a zero gradient) keeps the exchange in every rank's backward when ``x`` does not
    need one here: a rank whose experts received no rows returns outputs that depend on
    nothing, yet its peers' backward all-to-all waits for it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, anchor, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        ctx.anchor = None if anchor is None else (anchor.shape, anchor.dtype, anchor.device)
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        anchor = None if ctx.anchor is None else torch.zeros(ctx.anchor[0], dtype=ctx.anchor[1],
                                                             device=ctx.anchor[2])
        return out, anchor, None, None, None


def all_to_all_rows(x: torch.Tensor, send: list[int], recv: list[int], group,
                    anchor: torch.Tensor | None = None) -> torch.Tensor:
    """Differentiable all-to-all of ``x``'s rows with variable counts (see :class:`_AllToAllRows`)."""
    return _AllToAllRows.apply(x, anchor, list(send), list(recv), _group(group))


def dispatch(x: torch.Tensor, top_k_index: torch.Tensor, num_experts: int, group
             ) -> tuple[torch.Tensor, torch.Tensor, Routing]:
    """Send each (token, slot) pair's row of ``x`` ``[tokens, hidden]`` to the rank of
    ``group`` holding its expert ``top_k_index[token, slot]``. Returns the rows this rank
    received ``[R, hidden]`` (grouped by source rank, in their token order), each row's
    expert id local to this rank (``0 .. E/P - 1``), and the :class:`Routing` that
    :func:`combine` reverses."""
    process_group = _group(group)
    ranks = size_of(process_group)
    if num_experts % ranks:
        raise ValueError(f"expert parallelism over {ranks} ranks: {num_experts} experts are not divisible by {ranks}; "
                         f"give an expert degree that divides the expert count")
    per_rank = num_experts // ranks
    tokens, top_k = top_k_index.shape
    ids = top_k_index.reshape(-1)
    destination = torch.div(ids, per_rank, rounding_mode="floor")
    order = torch.sort(destination, stable=True).indices
    sent_counts = torch.bincount(destination, minlength=ranks)
    received_counts = torch.empty_like(sent_counts)
    dist.all_to_all_single(received_counts, sent_counts, group=process_group)
    sent, received = sent_counts.tolist(), received_counts.tolist()
    rows = all_to_all_rows(x[torch.div(order, top_k, rounding_mode="floor")], sent, received, process_group)
    local_ids = (ids[order] - destination[order] * per_rank).contiguous()
    received_ids = local_ids.new_empty(sum(received))
    dist.all_to_all_single(received_ids, local_ids, received, sent, group=process_group)
    return rows, received_ids, Routing(order, sent, received, tokens, top_k)


def combine(out_rows: torch.Tensor, routing: Routing, top_k_weights: torch.Tensor, group,
            rows: torch.Tensor | None = None) -> torch.Tensor:
    """The experts' output rows (in the order :func:`dispatch` received them) sent back to
    their tokens' ranks, weighted by ``top_k_weights`` ``[tokens, k]`` and summed over the
    ``k`` slots: ``[tokens, hidden]``. ``rows``: what :func:`dispatch` returned, so that
    both all-to-alls run in this rank's backward even when its experts received nothing
    (and their output depends on nothing). The anchor needs gradients to flow to the
    tokens: with a frozen trunk (tokens that need no gradient) and an expert function that
    returns a detached value for no rows, a rank would skip its backward all-to-all;
    :func:`~.rewrite.local_experts` keeps its output connected to the rows."""
    back = all_to_all_rows(out_rows, routing.received, routing.sent, group, anchor=rows)
    pairs = back[torch.argsort(routing.order)]   # (token, slot) order again
    hidden = out_rows.shape[1:]
    weights = top_k_weights.reshape(routing.tokens, routing.top_k, *([1] * len(hidden))).to(pairs.dtype)
    weighted = pairs.view(routing.tokens, routing.top_k, *hidden) * weights
    return weighted.sum(1)


__all__ = ["LOAD", "Routing", "all_to_all_rows", "combine", "dispatch", "record_load", "reset_load"]


class ExpertsRankRuntime(RankRuntime):
    """Expert parallelism on a rank (:class:`~autopar.runtime.family_runtime.RankRuntime`):
    the load counter (:data:`LOAD`) reset before each call and ``pm.expert_load()``, the
    rows each expert-parallel MoE layer processed. Active under expert parallelism."""

    name = "experts"

    def __init__(self, plan):
        self.plan = plan
        self.active = plan.experts > 1
        self.layers = [r.region for r in plan.regions if r.kind == "experts" and r.strategy == "experts"]

    def before_call(self) -> None:
        reset_load(self.layers)

    def attributes(self) -> dict:
        return {"expert_load": lambda state: lambda: self.expert_load(state)}

    def expert_load(self, state) -> dict[str, list[int]]:
        """Under expert parallelism, the rows each MoE layer's experts processed in the last
        forward or step on each rank of this rank's expert group (all-gathered: a
        collective, every rank calls it), by region id; also written into the plan's
        region details (``measured_tokens_per_rank``), which ``explain()`` shows beside the
        uniform routing's prediction. {} without expert parallelism."""
        if not self.active:
            return {}
        # the layers this rank's programs ran (a pipeline rank: its stages'; the same on
        # every rank of its expert group, which sits at one pipeline position)
        layers = [layer for layer in self.layers if layer in LOAD]
        mine = torch.tensor([LOAD.get(layer, 0) for layer in layers], dtype=torch.long, device=state.device)
        parts = [torch.empty_like(mine) for _ in range(self.plan.experts)]
        dist.all_gather(parts, mine, group=state.groups.get(MeshAxis.EXPERTS))
        out = {layer: [int(p[i]) for p in parts] for i, layer in enumerate(layers)}
        for r in self.plan.regions:
            if r.region in out:
                r.details["measured_tokens_per_rank"] = out[r.region]
        return out
