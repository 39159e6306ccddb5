"""autopar/strategies/experts: expert parallelism for routed mixture-of-experts layers
(issue 24). Today its collectives (:mod:`.collectives`: the token dispatch and combine),
one layer's cost (:mod:`.cost`) and the rewrite of a rank's graph (:mod:`.rewrite`); the
regions are found by :mod:`autopar.passes.analysis.experts`; the rank grid's groups, the layout
and the planner come next (docs/experts.md)."""
