"""The parallelism families, one package each (docs/architecture.md, "The family
interface"): :mod:`.family` is the interface, :mod:`.registry` the list the planner,
the compiler and the runtime loop over, :mod:`.placement` builds a rank's parameter
layout from the families, and :mod:`.shared` holds the code several families use."""
