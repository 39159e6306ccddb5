"""Carrying tensor-parallel layouts through a rank graph, op by op.

:class:`LayoutPropagator` walks a graph in which some values are split over the tensor
group (:class:`~autopar.strategies.shared.sharding.Shard`) and, for each node with a split input,
applies the op's rule: the output's layout, and the literal arguments that change on a
rank (a view's head count, a split's sizes). Replicated operands meeting a split value
are sliced (``scatter_to_tensor_region``, whose backward all-gathers) or routed through
Megatron's f (``copy_to_tensor_region``) when their gradient would be a partial sum. A
node no rule covers gets its split inputs all-gathered first — a logged fallback that
is correct and visible in the rank graph. Values reaching the output are gathered.

Every walk is :meth:`LayoutPropagator.run`; a subclass claims the nodes its strategy
decides through :meth:`LayoutPropagator.rewrite`: the tensor-parallel rewrite
(:mod:`autopar.strategies.shared.tensor_rewrite`: column/row linears, embeddings, the
loss; Megatron's, AxoNN's 3D and Bian's cube subclass it), the cube's row walk and a mixed plan's rows over
z (:mod:`autopar.strategies.tensor3d.rewrite`). A size another walk scaled back to its
global meaning is kept right by each later walk (:meth:`LayoutPropagator._global_size`).
The package: :mod:`.state` (the layouts found so far and the collectives a walk inserts),
:mod:`.rules` (each op's rule: its output's layout and the arguments that change on a
rank) and :mod:`.propagator` (the walk, and which rule each op takes).
"""
from autopar.strategies.shared.propagation.propagator import LayoutPropagator
from autopar.strategies.shared.propagation.state import NoSplitRule, TensorParallelError

__all__ = ["LayoutPropagator", "NoSplitRule", "TensorParallelError"]
