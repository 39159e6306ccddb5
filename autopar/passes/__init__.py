"""Graph passes: analysis passes write metadata, rewrite passes build each rank's graph.

A pass is a plain function ``name_pass(gm, ..., **options) -> GraphModule``; the
:mod:`autopar.passes.manager` runs them in order, times them, logs node-count diffs and
names the failing pass together with those that ran before it.
"""
