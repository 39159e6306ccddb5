"""Running a rank: what ``autopar.compile`` hands back and everything it owns, above the
families (docs/architecture.md, "Layers"). :mod:`.module` (``ParallelModule``: the
user's module, its step, its state), :mod:`.runner` (the rank's state and the
one-program runner), :mod:`.executable` (a rank's program as the module it executes),
the checkpoints (:mod:`.checkpoint`, :mod:`.checkpoint_dir`, :mod:`.checkpoint_chunks`)
and the weights that come in from outside (:mod:`.materialise`, :mod:`.init_weights`,
:mod:`.pretrained`). It reaches the families only through what ``compile`` hands it
(the registry's runtimes, :mod:`autopar.runtime.family_runtime`); the primitives it
runs on are :mod:`autopar.runtime`'s."""
