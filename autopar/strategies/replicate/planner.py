"""Replication: every rank runs the whole model on the whole batch.

The plan ``"auto"`` falls back to when no other configuration is feasible: where no
split of the batch equals the single device (rows of the batch meet where autopar has
no exact form, :mod:`autopar.passes.analysis.batch_rows`) and no region splits over a
tensor group or into pipeline stages, every rank computes what the single device
computes. Its mesh is ``data = 1 × tensor = world`` with every region replicated: no
collective in forward or backward (each rank's gradients are the single device's), the
step the single device's, memory the whole model's. It is never weighed beside the
other configurations (it would only repeat work they share), only when every one of
them was refused; the plan then lists why each was (``Plan.candidates``).
"""
from __future__ import annotations

from autopar.grid import MeshAxis
from autopar.planning.plan import Plan
from autopar.planning.strategy import Strategy
from autopar.strategies.family import PlanContext, Priced
from autopar.strategies.shared.mesh import DataTensor, judge, price_mesh

REASON = "replicated: every rank computes the whole batch (no other configuration is feasible)"


class Replicate(DataTensor):
    """The whole model and batch on every rank, ``"auto"``'s last resort."""

    name = "replicate"

    def regions(self, model) -> list:
        return []

    def candidates(self, ctx: PlanContext) -> list[Strategy]:
        return []  # weighed only when nothing else is feasible (fallbacks)

    def fallbacks(self, ctx: PlanContext) -> list[Strategy]:
        """``data = 1 × tensor = world``, under ``"auto"`` on more than one rank."""
        return [Strategy(1, ctx.world)] if ctx.forced is None and ctx.world > 1 else []

    def price(self, ctx: PlanContext, config: Strategy) -> Priced:
        model = ctx.model
        table = price_mesh(model, ctx.hw, 1, config.tensor, False, keep_whole={r.id: REASON for r in model.regions})
        return judge(self.name, ctx, config, {MeshAxis.DATA: 1, MeshAxis.TENSOR: config.tensor}, table)

    def to_plan(self, ctx: PlanContext, priced: Priced) -> Plan:
        return super().to_plan(ctx, priced)
