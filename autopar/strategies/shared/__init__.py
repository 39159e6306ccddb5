"""Planning and rewriting code several families share, each module named for what it
is: the data × tensor pricing the families build on (:mod:`.mesh`), the memory levers
(:mod:`.levers`), the batch norms that keep a plan from splitting the batch
(:mod:`.batch_norms`), the layout propagator through a region (:mod:`.propagation`), the
per-op sharding rules (:mod:`.sharding`) and the tensor-parallel rewriter
(:mod:`.tensor_rewrite`, with Megatron-SP's token split, :mod:`.sequence_split`) used by
Megatron, the 3D layers and the cube; the 3D grid AxoNN's family, the cube and mixed
plans share (:mod:`.grid3d`); the multi-branch regions and their branches' costs D&SP and
mixed plans read (:mod:`.branches`, :mod:`.branch_cost`); the loss rules and the outputs
under a split batch (:mod:`.losses`, :mod:`.outputs`); the pipeline stages' facts the
pipeline and mixed stages price with (:mod:`.stage_ends`); a mixed plan's form, which a
pipeline of mixed stages shows too (:mod:`.forms`). A shared home imports no
family; a family that composes another asks for it through
:meth:`autopar.strategies.family.PlanContext.peer`."""
