"""autopar/strategies/experts: expert parallelism for routed mixture-of-experts layers
(issue 24). Today its collectives (:mod:`.collectives`: the token dispatch and combine);
the regions it will plan are found by :mod:`autopar.analysis.experts`; the planner, cost
and rewrite come next (docs/experts.md)."""
