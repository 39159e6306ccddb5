"""autopar/strategies/experts: expert parallelism for routed mixture-of-experts layers
(docs/experts.md): its collectives (:mod:`.collectives`: the token dispatch and combine),
one layer's cost (:mod:`.cost`), the planner (:mod:`.planner`), where the experts'
weights live (:mod:`.layout`) and the rewrite of a rank's graph (:mod:`.rewrite`); the
regions are found by :mod:`autopar.passes.analysis.experts`."""
