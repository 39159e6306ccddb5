"""Everything that reads or rewrites an fx graph: the analysis passes (:mod:`.analysis`),
the pass runner (:mod:`.manager`), recomputation (:mod:`.recompute`), fusion and its
kernel generation (:mod:`.fusion`), and the driver that builds a rank's program from the
families' passes (:mod:`.rank_program`). Each family's own rewrite stays in its package
under :mod:`autopar.strategies` and is plugged in through the family protocol."""
