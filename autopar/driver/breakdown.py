"""What a plan keeps of its winning configuration's figures for the reconciliation of
its step and memory (:mod:`autopar.planning.totals`, which the explanation and the
report print): the figures that neither the region rows nor the totals hold.

:func:`record` fills :attr:`autopar.planning.plan.Plan.breakdown` from the priced
winner (the search calls it once, after adding the per-step terms):

``memory_rank``
    the pipeline rank whose memory is the plan's (the one needing the most), None
    without a pipeline (every rank alike);
``param_elems``
    the parameter elements that rank holds (its tensor part, its stages');
``memory``
    the rank's predicted bytes by part: ``parameters``, ``gathered`` (ZeRO-3's two
    largest parameters held whole), ``gradients``, ``optimizer`` (AdamW's moments), as
    :func:`autopar.strategies.shared.levers.state_parts` prices them, ``activations``
    (saved for backward; the family's own figure, or for a pipeline its rank's memory
    less the state, the activations of its microbatches in flight), ``gathered_weights``
    (3D layers' all-gathered weights kept for backward) and ``experts_spread`` (a
    pipeline's experts spread over their group: the state it no longer holds, negative);
``batch_s``, ``counts_targets``
    of the data communication, the search's per-step terms over the ranks splitting
    the batch (:func:`autopar.strategies.family.per_step_s`: the targets' count, the
    remedies where rows of the batch meet), and whether the loss counts its targets;
``tied_s``
    of a pipeline's data communication, the tied weights' all-reduce over their stages.
"""
from __future__ import annotations

from autopar.grid import MeshAxis
from autopar.planning.plan import Plan
from autopar.strategies.shared.levers import state_parts


def record(plan: Plan, priced, batch_s: float, largest: float, counts_targets: bool) -> None:
    """Fill ``plan.breakdown`` from the priced winner ``priced`` (a
    :class:`~autopar.strategies.family.Priced`); ``batch_s``: the search's per-step
    terms in the data communication (``counts_targets``: whether they count the loss's
    targets); ``largest``: the model's two largest ZeRO-3 units' elements (ZeRO-3 holds
    them gathered)."""
    out = {"batch_s": batch_s, "counts_targets": counts_targets, "tied_s": 0.0, "memory_rank": None}
    detail, spread = priced.detail, 0.0
    if priced.table is None and isinstance(detail, dict) and "base" in detail:   # experts over a pipeline
        spread = priced.memory_bytes - detail["base"].memory_bytes
        detail = detail["base"].detail
    if priced.table is not None:
        table = priced.table
        params = table.param_elems
        parts = state_parts(params, plan.degree(MeshAxis.DATA) * plan.degree(MeshAxis.CONTEXT), plan.zero,
                            plan.microbatches, table.largest_params)
        parts["activations"] = table.activation_bytes - table.gathered_bytes
        parts["gathered_weights"] = table.gathered_bytes
    elif hasattr(detail, "rank_params") and detail.rank_params:
        n = detail
        kept = [mem[1 if n.recompute else 0] for mem in n.memory]
        rank = max(range(len(kept)), key=kept.__getitem__)
        params = n.rank_params[rank]
        parts = state_parts(params, n.data, n.zero, n.m, largest)
        parts["activations"] = kept[rank] - sum(parts.values())
        parts["experts_spread"] = spread
        out.update(memory_rank=rank, tied_s=n.tied_s)
    else:
        plan.breakdown = out
        return
    out["param_elems"] = float(params)
    out["memory"] = {k: float(v) for k, v in parts.items()}
    plan.breakdown = out
