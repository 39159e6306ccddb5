"""The loops over the registered families, a layer above them (docs/architecture.md,
"Layers"): :mod:`.search` weighs every family's candidate configurations and picks the
plan (with :mod:`.conflicts`, the regions two families claim, and :mod:`.breakdown`,
the winning plan's cost rows); :mod:`.rank_program` builds one rank's program from the
plan, running the families' passes in their declared order. They name no family: they
ask :mod:`autopar.strategies.registry`."""
