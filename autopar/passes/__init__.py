"""Everything that reads or rewrites an fx graph: the analysis passes (:mod:`.analysis`),
the pass runner (:mod:`.manager`), recomputation (:mod:`.recompute`), fusion and its
kernel generation (:mod:`.fusion`). Each family's own rewrite stays in its package under
:mod:`autopar.strategies`, and the driver that runs them for one rank is
:mod:`autopar.driver.rank_program`."""
