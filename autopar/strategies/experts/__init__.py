"""autopar/strategies/experts: expert parallelism for routed mixture-of-experts layers
(issue 24). Today its collectives (:mod:`.collectives`: the token dispatch and combine);
the analysis, planner, cost and rewrite come next (docs/experts.md)."""
