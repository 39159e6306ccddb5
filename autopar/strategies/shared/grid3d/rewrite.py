"""AxoNN's 3D tensor parallelism on one rank's graph (axonn §III-B, Algorithm 1): the
rewriter the 3D family's pass (:mod:`autopar.strategies.tensor3d.rewrite`) and Bian's
cube (:mod:`autopar.strategies.cube.rewrite`) run, each with its own layer.

For every region the plan splits over the ``Gx × Gy × Gz`` grid: linear chains (an MLP)
and attention (its Q/K/V and output projections), :class:`Grid3DRewriter`

* replaces each linear by the family's layer (AxoNN's
  :func:`~autopar.strategies.tensor3d.runtime.linear_3d`), whose weight is this
  rank's flat z-shard ``Ŵ`` of its block, with the orientation given by the data flow
  (:func:`region_linears`): the region's *column* linears (those reading the region's
  input) are plain (in axis y, out axis x), the *row* linear (reading their output) is
  transposed (in x, out y), so the first layer's output layout is exactly the second's
  input layout and nothing is re-laid-out between them (axonn end of §III-B);
* at the region's boundary, where the data flow leaves the chain, re-lays out: the
  region's input (replicated over x and y, as everything outside split regions is) is
  cut to this rank's y block of columns (backward: an all-gather over y), and the row
  linear's output, split over y, is all-gathered over y (backward: keep the own block).
  These are the re-layouts the planner counts (``grid3d.cost.boundary_comm``). Where one
  region's transposed layer feeds the next region's plain layers directly, the flow
  allows alternation across regions too and neither re-layout is made;
* carries the x-split through every node between the linears with the layout rules of
  Megatron's pass (:class:`~autopar.strategies.shared.tensor_rewrite.TensorRewriter`:
  views that bake the head count in, softmax per head, dropout from the sharded stream)
  over the ``x`` group;
* names in each linear the next one's ``Ŵ`` in topological order, whose all-gather it
  issues ahead (axonn §IV-C).

The parameter cuts are :class:`~autopar.strategies.shared.grid3d.runtime.Grid3DShard`
(:func:`planned_grid3d_shards`).
"""
from __future__ import annotations

import torch.fx as fx

from autopar.grid import Grid3D, MeshAxis
from autopar.ir import tensor_spec
from autopar.passes.analysis import ops
from autopar.strategies.shared.propagation import TensorParallelError
from autopar.strategies.shared.sharding import Shard
from autopar.strategies.shared.tensor_rewrite import TensorRewriter
from autopar.runtime import collectives
from autopar.strategies.shared.grid3d.runtime import Grid3DShard, block_shape


def planned_grid3d_shards(gm: fx.GraphModule, *, regions: list[str], grid: Grid3D) -> dict[str, Grid3DShard]:
    """The parameter cuts :func:`autopar.strategies.tensor3d.rewrite.tensor3d_pass` makes on any capture of this model,
    without touching ``gm`` (the runtime cuts the parts before any rank program exists)."""
    if not regions or grid.x * grid.y * grid.z == 1:
        return {}
    return dict(Grid3DRewriter(gm, set(regions), grid, 0).shards)


def region_linears(region) -> list[tuple[str, bool]]:
    """The linears of a 3D region with their orientation (transposed?) by data flow: the
    ones reading the region's input are plain, the one reading their output transposed."""
    d = region.details
    if region.kind == "linear_chain":
        return [(n, False) for n in d["column"]] + [(d["row"], True)]
    return [(n, False) for n in dict.fromkeys((d["q_proj"], d["k_proj"], d["v_proj"]))] + [(d["out_proj"], True)]


class Grid3DRewriter(TensorRewriter):
    """Megatron's rewriter over the ``x`` group, with 3D linears in place of its column and
    row linears. ``LAYER`` is the layer function, the family's: AxoNN's
    (:func:`autopar.strategies.tensor3d.runtime.linear_3d`, :mod:`autopar.strategies.tensor3d.rewrite`)
    or Bian's (:mod:`autopar.strategies.cube.rewrite`, which also overrides :meth:`_bias`,
    :meth:`_leave` and the entry); the parameter cuts (:attr:`shards`) need none."""

    LAYER = None   # a static method: the layer function the rewrite calls

    def __init__(self, gm: fx.GraphModule, chosen: set[str], grid: Grid3D, x_rank: int):
        self.grid = grid
        self.layers: list[fx.Node] = []
        super().__init__(gm, chosen, grid.x, x_rank, MeshAxis.X)

    # ------------------------------------------------------------------ which parameters
    def _check(self, region, what: str, size: int) -> None:
        if size % self.grid.x:
            raise TensorParallelError(
                f"region {region.id}: {what} = {size} is not divisible by Gx = {self.grid.x}; choose a grid whose x "
                f"size divides it, or let the planner choose (strategy='auto')")

    def _claim(self, region) -> None:
        if region.kind not in ("linear_chain", "attention"):
            raise TensorParallelError(f"region {region.id}: 3D tensor parallelism applies to linear chains and "
                                      f"attention, not to {region.kind} regions")
        if region.details.get("experts") or region.details.get("blocks", 1) > 1:
            raise TensorParallelError(f"region {region.id}: 3D tensor parallelism has no layout for "
                                      f"{'experts (grouped matmuls)' if region.details.get('experts') else 'fused column blocks'}"
                                      f" in a linear chain; Megatron tensor parallelism splits them")
        self._region = region
        super()._claim(region)

    def _cut(self, node_name: str, transposed: bool, blocks: int) -> None:
        match = ops.match_linear(self._node(node_name), self.gm)
        out_dim = match.out_dim_of_weight
        in_axis, out_axis = (MeshAxis.X, MeshAxis.Y) if transposed else (MeshAxis.Y, MeshAxis.X)
        g_in, g_out = getattr(self.grid, in_axis), getattr(self.grid, out_axis)
        where = f"region {self._region.id}, linear {node_name} ({match.in_features} -> {match.out_features})"
        if match.out_features % (blocks * g_out) or match.in_features % g_in:
            raise TensorParallelError(
                f"{where}: as a {'transposed' if transposed else 'plain'} layer its output features must divide by "
                f"{blocks if blocks > 1 else ''}{'·' if blocks > 1 else ''}G{out_axis} = {g_out} and its input "
                f"features by G{in_axis} = {g_in}; choose another grid")
        if (match.out_features // g_out) * (match.in_features // g_in) % self.grid.z:
            raise TensorParallelError(f"{where}: its weight block of {match.out_features // g_out}x"
                                      f"{match.in_features // g_in} does not split into Gz = {self.grid.z} shards")
        self.shards[match.weight] = Grid3DShard(out_dim, transposed, blocks)
        if match.bias:
            self.shards[match.bias] = Grid3DShard(0, transposed, blocks, vector=True)

    def _column(self, node_name: str, blocks: int = 1) -> None:
        self.columns[node_name] = blocks
        self._cut(node_name, False, blocks)

    def _split_parameter(self, name: str, dim: int, blocks: int = 1) -> None:
        """Attention sinks stay whole on the grid: the propagation slices their expanded
        logits to the rank's heads where they meet the scores (its backward all-gathers)."""

    def _row(self, node_name: str) -> None:
        self.rows.add(node_name)
        self._cut(node_name, True, 1)

    # ------------------------------------------------------------------ the rewrite
    def _linear(self, node: fx.Node, x: fx.Node, transposed: bool) -> fx.Node:
        match = ops.match_linear(node, self.gm)
        shard = self.shards[match.weight]
        weight_shape = tuple(self.gm.get_parameter(match.weight).shape)
        block = block_shape(weight_shape, shard, self.grid)
        in_group, out_group = (MeshAxis.X, MeshAxis.Y) if transposed else (MeshAxis.Y, MeshAxis.X)
        old_inputs = [a for a in node.all_input_nodes if a is not match.input]
        with self.graph.inserting_before(node):
            weight = self.graph.get_attr(match.weight)
            bias = self._bias(match, in_group, out_group) if match.bias else None
            new = self.graph.call_function(
                self.LAYER, (x, weight, bias, block, in_group, out_group, match.weight_layout == "in_out"),
                {"prefetch": None, "checkpointed": False})  # the recompute pass sets it
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        self.graph.erase_node(node)
        for old in old_inputs:  # the weight's transposes and views the old spelling needed
            _erase_if_unused(self.graph, old)
        self.layers.append(new)
        return new

    def _bias(self, match, in_group: str, out_group: str) -> fx.Node:
        """The bias argument of a layer (inserted before it): AxoNN's is its out block."""
        return self.graph.get_attr(match.bias)

    def _leave(self, new: fx.Node, out_dim: int) -> list[fx.Node]:
        """The re-layout where the flow leaves a transposed layer, inserted after ``new``
        (the first node reads ``new``, each next one the one before): its output, split
        over y, all-gathered over y."""
        with self.graph.inserting_after(new):
            gathered = self.graph.call_function(collectives.gather_from_tensor_region, (new, out_dim, MeshAxis.Y))
        gathered.meta.update(new.meta)
        return [gathered]

    def _rewrite_column(self, node: fx.Node) -> None:
        """A plain layer: columns of the replicated input cut over y; output split over x."""
        match = ops.match_linear(node, self.gm)
        x = self._replicated(match.input, node.name)
        dim = len(tensor_spec(x).shape) - 1
        if _is_gather_over_y(x, dim):
            # the previous region's transposed layer left its output split over y, which is
            # this plain layer's input layout: no re-layout (axonn end of §III-B)
            x_y = x.args[0]
        else:
            x_y = self._cached(("scatter_y", x), lambda: self._call(collectives.scatter_to_tensor_region,
                                                                    (x, dim, MeshAxis.Y), after=x))
        blocks = self.columns[node.name]
        new = self._linear(node, x_y, False)
        self.layout[new] = Shard(len(tensor_spec(new).shape) - 1, blocks)

    def _rewrite_row(self, node: fx.Node) -> None:
        """A transposed layer: input split over x (the plain layers' output, no re-layout);
        output split over y, all-gathered over y where the data flow leaves the region."""
        match = ops.match_linear(node, self.gm)
        x = match.input
        dim = len(tensor_spec(x).shape) - 1
        if self.layout.get(x) != Shard(dim):
            x = self._scatter(self._replicated(x, node.name), dim)
        new = self._linear(node, x, True)
        chain = self._leave(new, len(tensor_spec(new).shape) - 1)
        new.replace_all_uses_with(chain[-1], delete_user_cb=lambda user: user is not chain[0])
        for n in (new, *chain):
            self.layout[n] = None

    def drop_unused_gathers(self) -> None:
        """A region output all-gathered over y only for the next region's plain layers,
        which read the split form directly, needs no gather."""
        for node in list(self.graph.nodes):
            if node.target is collectives.gather_from_tensor_region and not node.users:
                self.graph.erase_node(node)

    def link_prefetches(self) -> None:
        """Each 3D linear names the next one's ``Ŵ`` (topological order): axonn §IV-C."""
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        layers = sorted(self.layers, key=order.__getitem__)
        for layer, following in zip(layers, layers[1:]):
            with self.graph.inserting_before(layer):
                ahead = self.graph.get_attr(following.args[1].target)
            layer.kwargs = {**layer.kwargs, "prefetch": ahead}


def _erase_if_unused(graph: fx.Graph, node: fx.Node) -> None:
    if node.users or node.op in ("placeholder", "output"):
        return
    inputs = list(node.all_input_nodes)
    graph.erase_node(node)
    for arg in inputs:
        if arg.op in ("get_attr", "call_function", "call_method"):
            _erase_if_unused(graph, arg)


def _is_gather_over_y(node: fx.Node, dim: int) -> bool:
    return (node.op == "call_function" and node.target is collectives.gather_from_tensor_region
            and node.args[1] == dim and node.args[2] == MeshAxis.Y)
