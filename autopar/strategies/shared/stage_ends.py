"""The facts of a pipeline's stages that more than one family prices with: a region both
ends of a pipeline compute (a tied embedding and LM head, whose vocabulary a pipeline
keeps on its first and last stage), its figures shared out per end
(:func:`spread_over_ends`). The pipeline family's Megatron stages
(:mod:`autopar.strategies.pipeline.numbers`) and the mixed stages it plans through the
mixed family (:mod:`autopar.strategies.mixed.stages`) both price a split vocabulary so."""
from __future__ import annotations


def spread_over_ends(model, hw, parts: dict[int, list[str]], compute: float, comm: float, act: float
                     ) -> list[tuple[int, float, float, float]]:
    """A region both ends of a pipeline compute (a tied vocabulary: ``parts``, its nodes
    per stage): ``(stage, compute, communication, activation bytes)`` per end, the
    compute and the activations by the share of the region's work on that end, the
    communication shared equally by its ends. The Megatron and the mixed stage figures
    both price a split vocabulary so (``model``: the planner's ``ModelFacts``)."""
    key = (tuple((s, tuple(nodes)) for s, nodes in sorted(parts.items())), hw)
    memo = model.memo("pipeline.end_shares")
    if key not in memo:
        work = {s: model.seconds(nodes, hw, 1.0) for s, nodes in parts.items()}
        total = sum(work.values()) or 1.0
        memo[key] = {s: w / total for s, w in work.items()}
    shares = memo[key]
    return [(s, compute * shares[s], comm / len(parts), act * shares[s]) for s in sorted(parts)]
