"""Rewrite pass: Bian et al.'s load-balanced 3D tensor parallelism on a ``p × p × p`` cube
(bian §3; the layer itself is :mod:`autopar.strategies.cube.collectives`).

It runs where the plan chose ``cube`` for a linear chain or attention region, on the
grid ``Gx = Gy = Gz = p`` (times any data degree), in two walks over the graph:

1. **Columns** (the :mod:`~autopar.strategies.shared.grid3d.rewrite` rewriter over the ``x`` group, with
   cube layers): each linear becomes :func:`~autopar.strategies.cube.collectives.linear_cube` with
   the orientation the data flow gives (plain: in y, out x; transposed: in x, out y);
   its bias becomes :func:`~autopar.strategies.cube.collectives.cube_vector` of the rank's diagonal
   piece (Algorithm 7). Between the layers Megatron's layout rules carry the x-split of
   the columns (head counts in views, dropout streams). At the region's input the flow
   enters: columns cut over y, then rows (dim 0) over x, Bian's ``A_ijl``; at its
   output it leaves: the transposed layer's ``C`` (columns over y, rows over x) is
   all-gathered over y and then over x. Where one region's transposed layer feeds the
   next region's plain layers, that layout *is* their input layout, and neither
   re-layout is made ("exchange the input and output directions", bian §3.1.1).
2. **Rows**: a second :class:`~autopar.strategies.shared.propagation.LayoutPropagator`,
   over the ``y`` group along dim 0, carries the row split the plain layers' output has
   (``C_ilj``: rows over the in axis y) through the ops between the layers to the
   transposed layer, which reads it as its ``A``. This is what makes the activations
   balanced (each rank holds ``1/p³`` of them); it rescales the batch size views and
   ``expand`` bake in, reads sizes back at their global meaning, slices replicated
   operands that span the rows (an attention mask) and sends parameters used there
   through Megatron's f over y (their gradients are partial sums over the rows).

Rows are the batch (dim 0): each rank's graph is captured at its batch chunk (z and
data), which the cube splits further over x and y, so the chunk must divide by p.
"""
from __future__ import annotations

import torch.fx as fx

from autopar.grid import Grid3D, MeshAxis
from autopar.ir import PARAM_SHARDS, RANDOM_SITE, tensor_spec
from autopar.passes.analysis import ops
from autopar.strategies.shared.propagation import LayoutPropagator, TensorParallelError
from autopar.strategies.shared.sharding import Shard, normalize_dim
from autopar.strategies.shared.grid3d.rewrite import Grid3DRewriter
from autopar.runtime import collectives
from autopar.strategies.cube.collectives import cube_vector, linear_cube
from autopar.strategies.shared.grid3d.runtime import Grid3DShard


def check_cube(grid: Grid3D) -> None:
    """Bian's algorithms are for a ``p × p × p`` cube (bian §3.1.1)."""
    if not grid.x == grid.y == grid.z:
        raise TensorParallelError(
            f"the cube form (Bian et al.) needs Gx = Gy = Gz = p; the grid is {grid.x}x{grid.y}x{grid.z}"
            f"{f'x{grid.data}' if grid.data > 1 else ''}. Use a world of p^3 ranks (times a data degree), e.g. "
            f"8 = 2x2x2 or 27 = 3x3x3, or AxoNN's form, which takes any Gx x Gy x Gz")


def check_rows(rows: int | None, grid: Grid3D, where: str) -> None:
    """A rank's rows (dim 0 of a region's input, at its batch chunk) split over x and y."""
    if rows is None or rows % (grid.x * grid.y):
        have = "no rows" if rows is None else f"{rows} rows (dim 0) per batch chunk"
        raise TensorParallelError(
            f"{where}: the cube splits each rank's rows over x and y (p^2 = {grid.x * grid.y} parts), and its "
            f"input has {have}; give a batch that divides by Gz·Gdata·p^2 = "
            f"{grid.z * grid.data * grid.x * grid.y}, or use AxoNN's form")


def cube_pass(gm: fx.GraphModule, *, regions: list[str], grid: Grid3D, rank: int) -> fx.GraphModule:
    """Rewrite ``gm`` into rank ``rank`` of the cube ``grid`` (see the module docstring)."""
    gm.meta[PARAM_SHARDS] = {}
    if not regions or grid.x * grid.y * grid.z == 1:
        return gm
    check_cube(grid)
    rewriter = _RewriterCube(gm, set(regions), grid, grid.coordinates(rank)[MeshAxis.X])
    gm.meta[PARAM_SHARDS] = rewriter.shards
    rewriter.run()
    rewriter.drop_unused_gathers()
    rewriter.link_prefetches()
    _Rows(gm, grid.y, rewriter.plain, rewriter.transposed).run()
    gm.graph.lint()
    gm.recompile()
    return gm


def planned_cube_shards(gm: fx.GraphModule, *, regions: list[str], grid: Grid3D) -> dict[str, Grid3DShard]:
    """The parameter cuts :func:`cube_pass` makes, without touching ``gm``."""
    if not regions or grid.x * grid.y * grid.z == 1:
        return {}
    check_cube(grid)
    return dict(_RewriterCube(gm, set(regions), grid, 0).shards)


class _RewriterCube(Grid3DRewriter):
    """The 3D rewriter with Bian's layers, diagonal biases and the cube's boundary."""

    def __init__(self, gm: fx.GraphModule, chosen: set[str], grid: Grid3D, x_rank: int):
        self.plain: set[fx.Node] = set()
        self.transposed: set[fx.Node] = set()
        super().__init__(gm, chosen, grid, x_rank)

    def _claim(self, region) -> None:
        if region.kind not in ("linear_chain", "attention"):
            raise TensorParallelError(f"region {region.id}: the cube form applies to linear chains and attention, "
                                      f"not to {region.kind} regions")
        super()._claim(region)

    def _cut(self, node_name: str, transposed: bool, blocks: int) -> None:
        super()._cut(node_name, transposed, blocks)
        match = ops.match_linear(self._node(node_name), self.gm)
        if match.bias:
            g_out = self.grid.y if transposed else self.grid.x
            if (match.out_features // g_out) % self.grid.z:
                raise TensorParallelError(
                    f"region {self._region.id}, linear {node_name}: its bias block of {match.out_features // g_out} "
                    f"does not split into Gz = {self.grid.z} diagonal pieces; choose another grid")
            self.shards[match.bias] = Grid3DShard(0, transposed, blocks, vector=True, cube=True)

    # ------------------------------------------------------------------ the rewrite
    LAYER = staticmethod(linear_cube)

    def _bias(self, match, in_group: str, out_group: str) -> fx.Node:
        """Bian's diagonal piece, assembled into the out block (Algorithm 7)."""
        length = match.out_features // getattr(self.grid, out_group)
        return self.graph.call_function(cube_vector, (self.graph.get_attr(match.bias), length, in_group, out_group))

    def _linear(self, node: fx.Node, x: fx.Node, transposed: bool) -> fx.Node:
        new = super()._linear(node, x, transposed)
        (self.transposed if transposed else self.plain).add(new)
        return new

    def _rewrite_column(self, node: fx.Node) -> None:
        """A plain layer reads ``A_ijl``: the previous region's output as it left its
        transposed layer, or the region's input cut over y (columns) and x (rows)."""
        match = ops.match_linear(node, self.gm)
        x = self._replicated(match.input, node.name)
        dim = len(tensor_spec(x).shape) - 1
        inner = _cube_exit_of(x, dim)
        if inner is None:
            spec = tensor_spec(x)
            check_rows(spec.shape[0] if spec is not None and len(spec.shape) > 1 else None, self.grid,
                       f"region {self._region.id}, linear {node.name}")

            def enter():
                cols = self._call(collectives.scatter_to_tensor_region, (x, dim, MeshAxis.Y), after=x)
                return self._call(collectives.scatter_to_tensor_region, (cols, 0, MeshAxis.X), after=cols)
            inner = self._cached(("cube_entry", x), enter)
        new = self._linear(node, inner, False)
        self.layout[new] = Shard(len(tensor_spec(new).shape) - 1, self.columns[node.name])

    def _leave(self, new: fx.Node, out_dim: int) -> list[fx.Node]:
        """A transposed layer's ``C`` (columns over y, rows over x) leaves the region
        through all-gathers over y, then over x."""
        with self.graph.inserting_after(new):
            cols = self.graph.call_function(collectives.gather_from_tensor_region, (new, out_dim, MeshAxis.Y))
        with self.graph.inserting_after(cols):
            rows = self.graph.call_function(collectives.gather_from_tensor_region, (cols, 0, MeshAxis.X))
        cols.meta.update(new.meta)
        rows.meta.update(new.meta)
        return [cols, rows]

    def drop_unused_gathers(self) -> None:
        """Exit gathers only the next region's plain layers read through go (rows first,
        then the columns gather that fed it)."""
        changed = True
        while changed:
            changed = False
            for node in reversed(list(self.graph.nodes)):
                if node.target is collectives.gather_from_tensor_region and not node.users:
                    self.graph.erase_node(node)
                    changed = True


def _cube_exit_of(node: fx.Node, dim: int) -> fx.Node | None:
    """The transposed cube layer behind ``node`` when ``node`` is its exit gathers."""
    if not (node.op == "call_function" and node.target is collectives.gather_from_tensor_region
            and node.args[1] == 0 and node.args[2] == MeshAxis.X):
        return None
    cols = node.args[0]
    if not (isinstance(cols, fx.Node) and cols.target is collectives.gather_from_tensor_region
            and cols.args[1] == dim and cols.args[2] == MeshAxis.Y):
        return None
    inner = cols.args[0]
    return inner if isinstance(inner, fx.Node) and inner.target is linear_cube else None


_REGION_COLLECTIVES = {collectives.copy_to_tensor_region: None, collectives.reduce_from_tensor_region: None,
                       collectives.scatter_to_tensor_region: 1, collectives.gather_from_tensor_region: 1}


class _Rows(LayoutPropagator):
    """The row walk: the split of dim 0 over y from the plain cube layers' outputs to the
    transposed layers' inputs (see the module docstring)."""

    def __init__(self, gm: fx.GraphModule, degree: int, plain: set[fx.Node], transposed: set[fx.Node]):
        super().__init__(gm, degree, MeshAxis.Y)
        self.plain, self.transposed = plain, transposed

    def rewrite(self, node: fx.Node) -> bool:
        if node in self.plain:
            self.layout[node] = Shard(0)                                # C_ilj: rows over y
        elif node in self.transposed:
            if self.layout.get(node.args[0]) != Shard(0):               # it reads A_ijl
                node.replace_input_with(node.args[0], self._scatter(self._replicated(node.args[0], node.name), 0))
            self.layout[node] = None  # rows over x: the exit gathers' business
        elif (node.target in _REGION_COLLECTIVES or RANDOM_SITE in node.meta) and self._sharded_inputs(node):
            self.layout[node] = self._along_rows(node)
        else:  # a global size the column walk made takes the rows too (LayoutPropagator._global_size)
            return False
        return True

    def _along_rows(self, node: fx.Node):
        """The x-group collectives and dropouts the column walk placed act on columns (or
        element-wise): the rows' split passes through, unless one gathers or cuts dim 0."""
        position = _REGION_COLLECTIVES.get(node.target)
        if position is not None:
            ndim = len(tensor_spec(node.args[0]).shape)
            if normalize_dim(node.args[position], ndim) == 0:
                self._fallback(node, "a column collective along the rows")
                return None
        return self._only_first_split(node, self.layout.get(node.args[0]))

