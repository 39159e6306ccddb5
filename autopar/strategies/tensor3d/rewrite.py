"""Rewrite pass: AxoNN's 3D tensor parallelism on one rank's graph (axonn §III-B, Algorithm 1).

For every region the plan splits over the ``Gx × Gy × Gz`` grid (``tensor3d``): linear
chains (an MLP) and attention (its Q/K/V and output projections), the 3D rewriter
(:class:`autopar.strategies.shared.grid3d.rewrite.Grid3DRewriter`, which Bian's cube
runs with its own layer) replaces each linear by
:func:`~autopar.strategies.tensor3d.runtime.linear_3d` with the orientation the data
flow gives, re-lays out where the flow enters and leaves the region, carries the
x-split between the linears and names in each linear the next one's ``Ŵ`` to prefetch
(axonn §IV-C).

Rows (the batch) are split over z and data by the data-parallel pass: each rank's graph
is captured at its batch chunk. In a mixed plan (``rows_over_z``) the graph holds its
data replica's rows, which the plan's other regions share over the whole tensor group,
so a grid with ``Gz > 1`` splits the rows of its own regions only: :class:`_RowSplit`
first cuts each 3D region's input to this rank's z block of rows (backward: an
all-gather over z), carries the row split through the region's nodes (views with the
batch baked in are scaled, as Megatron's pass scales head counts) and all-gathers the
rows over z where the flow leaves it (backward: keep the own block); a 3D region whose
plain layers read the previous one's transposed output directly takes its rows split as
they are. The 3D rewrite then runs on that graph unchanged. The pass records ``gm.meta[PARAM_SHARDS]``: parameter
name → :class:`~autopar.strategies.shared.grid3d.runtime.Grid3DShard`.
"""
from __future__ import annotations

import torch.fx as fx

from autopar.grid import Grid3D, MeshAxis
from autopar.ir import PARAM_SHARDS, regions as analysis_regions, tensor_spec
from autopar.passes.analysis import ops
from autopar.strategies.shared.grid3d.rewrite import Grid3DRewriter, region_linears
from autopar.strategies.shared.propagation import LayoutPropagator, TensorParallelError
from autopar.strategies.shared.sharding import Shard
from autopar.runtime import collectives
from autopar.strategies.tensor3d.runtime import linear_3d


def tensor3d_pass(gm: fx.GraphModule, *, regions: list[str], grid: Grid3D, rank: int,
                  rows_over_z: bool = False) -> fx.GraphModule:
    """Rewrite ``gm`` into rank ``rank`` of ``grid`` (see the module docstring);
    ``rows_over_z``: ``gm`` holds the rows of the whole z group (a mixed plan), and the
    regions split them over z themselves."""
    gm.meta.setdefault(PARAM_SHARDS, {})  # a mixed plan's other split passes record theirs too
    if not regions or grid.x * grid.y * grid.z == 1:
        return gm
    if rows_over_z and grid.z > 1:
        _RowSplit(gm, regions, grid.z).run()
    # a pipeline's position is outside the grid (outermost)
    rewriter = _Rewriter3D(gm, set(regions), grid, grid.coordinates(rank % grid.size)[MeshAxis.X])
    gm.meta[PARAM_SHARDS].update(rewriter.shards)
    rewriter.run()
    rewriter.drop_unused_gathers()
    rewriter.link_prefetches()
    gm.graph.lint()
    gm.recompile()
    return gm


class _Rewriter3D(Grid3DRewriter):
    """The 3D rewriter with AxoNN's layer."""

    LAYER = staticmethod(linear_3d)


class _RowSplit(LayoutPropagator):
    """A mixed plan's 3D regions on a grid with ``Gz > 1``: their rows (dim 0) split over
    z, the rest of the graph keeping its data replica's rows (see the module docstring).
    The layouts are :class:`Shard` of dim 0 (or of the dimension the rows become through
    views) over the ``z`` group.

    Past a region's exit the rows stay split through the nodes outside every region (the
    residual add, a layer norm: AxoNN's whole-network layout, axonn §III), so that the
    next 3D region reads them as they are; they are all-gathered over z where a node of
    another region (Megatron's, D&SP's, a replicated one) reads them, where a node has no
    rule for split rows (a reduction over them, the loss), and at the output."""

    def __init__(self, gm: fx.GraphModule, regions: list[str], z: int):
        super().__init__(gm, z, MeshAxis.Z)
        chosen = set(regions)
        found = analysis_regions(gm)
        self.inside = {n for r in found if r.id in chosen for n in r.nodes}
        # the tensor regions of other families (a repeated block is no split region)
        self.others = {n for r in found if r.id not in chosen and r.kind in ("attention", "linear_chain", "vocab")
                       for n in r.nodes} - self.inside
        self.linears = {name for r in found if r.id in chosen for name, _ in region_linears(r)}

    def run(self) -> None:
        super().run()
        self.graph.lint()

    def rewrite(self, node: fx.Node) -> bool:
        if node.name in self.linears:
            self._linear(node)
        elif not self._sharded_inputs(node):
            return False
        elif node.name in self.others or node.target in _COLLECTIVES:  # another region reads whole rows
            for arg in self._sharded_inputs(node):
                node.replace_input_with(arg, self._gather(arg, self.layout[arg], node.name))
            self.layout[node] = None
        elif ops.is_dropout(node, self.gm) and node.name in self.inside:
            # the 3D pass draws it (its stream sharded over x and z)
            self.layout[node] = self._only_first_split(node, self.layout.get(node.args[0]))
        else:
            return False
        return True

    def _fallback(self, node: fx.Node, why: str) -> None:
        """Leaving the split rows outside the regions is planned: logged only inside."""
        self.quiet = node.name not in self.inside
        super()._fallback(node, why)
        self.quiet = False

    def _linear(self, node: fx.Node) -> None:
        """A 3D layer: its input's rows this rank's z block (cut here when they are not
        yet), its output split the same way."""
        match = ops.match_linear(node, self.gm)
        layout = self.layout.get(match.input)
        ndim = len(tensor_spec(match.input).shape)
        if layout is None:
            node.replace_input_with(match.input, self._scatter(match.input, 0))
            layout = Shard(0)
        elif layout.dim == ndim - 1:
            raise TensorParallelError(f"node {node.name}: its input's rows are split over its features")
        self.layout[node] = layout


# the other families' conversions (Megatron's f and g, D&SP's fork and join, ...): they read whole rows
_COLLECTIVES = {fn for fn in vars(collectives).values() if callable(fn) and getattr(fn, "__module__", "") == collectives.__name__}
