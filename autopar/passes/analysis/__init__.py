"""The analysis passes: they read a captured graph and write regions into its metadata,
never changing the graph (docs/architecture.md, "Stage 2: analysis"). :mod:`.analyse`
runs them in order; :mod:`.ops` recognises nodes whatever the tracer's spelling,
:mod:`.naming` names regions after the user's modules, :mod:`.flops` counts work."""
