"""The 3D grid (axonn §III) as AxoNN's family, Bian's cube and mixed plans' 3D regions
share it: its communication model (:mod:`.cost`), its parameter parts and the layers'
run-time state (:mod:`.runtime`), the rewriter the 3D layers are placed by
(:mod:`.rewrite`), the pricing of a grid's regions (:mod:`.pricing`), the families'
common part (:mod:`.family`) and where their gradients go (:mod:`.layout`). Each family
keeps its own layer (AxoNN's :func:`autopar.strategies.tensor3d.runtime.linear_3d`,
Bian's :func:`autopar.strategies.cube.collectives.linear_cube`) and its own grids."""
