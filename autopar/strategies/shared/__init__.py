"""Planning and rewriting code several families share: the memory levers
(:mod:`.levers`), the batch norms that keep a plan from splitting the batch
(:mod:`.batch_norms`), the layout propagator through a region (:mod:`.propagation`) and
the per-op sharding rules (:mod:`.sharding`) used by Megatron, the 3D layers and the cube."""
