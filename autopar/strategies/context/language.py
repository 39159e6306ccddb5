"""Context parallelism's declaration to the generic layers (:mod:`autopar.planning.declared`):
the key ``context`` around a data × tensor strategy (or a pipeline), the ``context`` axis
and the ``data_context`` group."""
from __future__ import annotations

import dataclasses

from autopar.grid import GroupSpec, MeshAxis
from autopar.planning.declared import DECLARED, Language
from autopar.planning.strategy import LEVER_KEYS, PlanError, Strategy

COMBINES_WITH = ("data", "megatron", "pipeline")
"""The families whose keys a strategy with ``context`` may hold (beside the levers)."""


class ContextLanguage(Language):
    name = "context"
    kind = "context"
    built_in = True
    precedence = 80
    keys = ("context",)
    axes = (MeshAxis.CONTEXT, MeshAxis.DATA_CONTEXT)
    absent = ("the model has no scaled_dot_product_attention to run as a ring, no data degree above 1 that "
              "divides the sequence, or a strategy without 'context' was forced")

    def outer(self, strategy: dict, parse) -> Strategy | None:
        """``{"context": c, "data": d, "tensor": t, levers...}``: context parallelism on a
        data × tensor configuration (a degree left out: the planner's)."""
        if "context" not in strategy:
            return None
        c = strategy["context"]
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise PlanError(f"strategy: context={c!r}; give the context degree, the number of ranks the sequence "
                            f"is split over (an integer at least 1)")
        rest = {k: v for k, v in strategy.items() if k != "context"}
        allowed = {k for name in COMBINES_WITH if name in DECLARED for k in DECLARED[name].keys}
        other = set(rest) - allowed - set(LEVER_KEYS)
        if other:
            raise PlanError(f"strategy: context parallelism combines with 'data', 'tensor', a pipeline and the "
                            f"memory levers in this version, not {sorted(other)}; drop them or 'context'")
        parsed = parse(rest) if rest else Strategy(levers_only=True)
        return dataclasses.replace(parsed, context=c, levers_only=False) if c > 1 else parsed

    def is_kind(self, strategy) -> bool:
        return strategy.context > 1

    def owns(self, candidate) -> bool:
        return candidate.mesh.get(MeshAxis.CONTEXT, 1) > 1

    def refine_groups(self, plan, specs: dict, tied: tuple) -> dict:
        """The sequence's split, and the gradients' average over data × context."""
        if plan.degree(MeshAxis.CONTEXT) <= 1:
            return specs
        return {**specs, MeshAxis.CONTEXT: GroupSpec((MeshAxis.CONTEXT,)),
                MeshAxis.DATA_CONTEXT: GroupSpec((MeshAxis.DATA, MeshAxis.CONTEXT))}

    def rank_note(self, plan) -> str | None:
        return ", then context" if plan.degree(MeshAxis.CONTEXT) > 1 else None


LANGUAGE = ContextLanguage()
