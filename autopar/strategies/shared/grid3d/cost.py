"""The communication model of AxoNN's 3D tensor-parallel grid (Singh et al., §III-B, §V);
the grid itself, :class:`autopar.grid.Grid3D`, lives with the rank grid. AxoNN's family
prices its layers with it (:mod:`.pricing`), Bian's cube its grids and their bandwidths
(:mod:`autopar.strategies.cube.cost`), mixed plans their 3D regions and boundaries.

A ``Gx × Gy × Gz × Gdata`` grid; the rank of ``(x, y, z, d)`` is
``((d·Gz + z)·Gy + y)·Gx + x``: x innermost, then y, z and data, the hierarchy of axonn
§V-B, so the ranks of an x group are adjacent, a y group has stride ``Gx``, a z group
``Gx·Gy`` and a data group ``Gx·Gy·Gz``.

One linear layer ``O[m×n] = I[m×k] × W[k×n]`` (Algorithm 1) on rank ``g_{i,j,k}``:
``I`` is split into row blocks over z and column blocks over y, ``W`` into row blocks
over y and column blocks over x and each block further sharded over z (``Ŵ``). Forward:
all-gather ``Ŵ`` over z, local matmul, all-reduce over y. Backward: the input gradient
all-reduced over x, the weight gradient reduce-scattered over z. The output's columns are
split over x, so the next layer is "transposed": x and y swap roles (end of §III-B).

Per layer, the ring times of eqs 4-8 (here with the latency term α per step that
:mod:`autopar.cost.model` adds to eqs 1-3, and the placement-aware bandwidth of eq 10
through :func:`autopar.cost.model.group_link`)::

    t_AG,z   = (Gz − 1) · k·n/(Gx·Gy·Gz) / β_z                  (4)
    t_RS,z   = (Gz − 1)/Gz · k·n/(Gx·Gy) / β_z                  (5)
    t_AR,y   = 2 (Gy − 1)/Gy · m·n/(Gz·Gx) / β_y                (6)
    t_AR,x   = 2 (Gx − 1)/Gx · m·k/(Gz·Gy) / β_x                (7)
    t_AR,data = 2 (Gdata − 1)/Gdata · k·n/(Gx·Gy·Gz) / β_data   (8)
    t_comm = sum of (4)-(8)                                      (9)

``m`` is the rows of one data-parallel replica (batch·sequence / Gdata); sizes are
elements, multiplied by the element size for bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from autopar.grid import Grid3D, MeshAxis  # noqa: F401 - the grid's geometry lives with the rank grid
from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware


@dataclass(frozen=True)
class LayerComm:
    """Predicted seconds of one layer's collectives (axonn eqs 4-8), by collective."""

    all_gather_z: float
    reduce_scatter_z: float
    all_reduce_y: float
    all_reduce_x: float
    all_reduce_data: float
    transposed: bool = False

    @property
    def forward_axis(self) -> str:
        """The physical group of the forward all-reduce (eq 6): the layer's in axis."""
        return MeshAxis.X if self.transposed else MeshAxis.Y

    @property
    def backward_axis(self) -> str:
        """The physical group of the input-gradient all-reduce (eq 7): the layer's out axis."""
        return MeshAxis.Y if self.transposed else MeshAxis.X

    @property
    def total(self) -> float:
        """Eq 9."""
        return self.all_gather_z + self.reduce_scatter_z + self.all_reduce_y + self.all_reduce_x + self.all_reduce_data

    def by_group(self) -> dict[str, float]:
        """Seconds on each physical group (a transposed layer's eq-6 all-reduce runs on x)."""
        out = {MeshAxis.X: 0.0, MeshAxis.Y: 0.0, MeshAxis.Z: self.all_gather_z + self.reduce_scatter_z,
               MeshAxis.DATA: self.all_reduce_data}
        out[self.forward_axis] += self.all_reduce_y
        out[self.backward_axis] += self.all_reduce_x
        return out


def layer_volumes(m: int, k: int, n: int, grid: Grid3D, *, transposed: bool = False) -> dict[str, float]:
    """The message size ``m`` (elements, as axonn eqs 1-3 define it) of each collective of
    one layer ``[m×k] × [k×n]``; a transposed layer swaps Gx and Gy."""
    g = grid.swapped() if transposed else grid
    return {
        "all_gather_z": k * n / (g.x * g.y * g.z),   # eq 4: each rank's shard Ŵ
        "reduce_scatter_z": k * n / (g.x * g.y),     # eq 5: the weight block's gradient
        "all_reduce_y": m * n / (g.z * g.x),         # eq 6: the output block
        "all_reduce_x": m * k / (g.z * g.y),         # eq 7: the input block's gradient
        "all_reduce_data": k * n / (g.x * g.y * g.z),  # eq 8: the shard's gradient
    }


def layer_comm(m: int, k: int, n: int, grid: Grid3D, hw: Hardware, *, transposed: bool = False,
               element_bytes: int = 2) -> LayerComm:
    """Eqs 4-8 for one layer on ``hw``, each group's bandwidth by eq 10 from its stride;
    the collectives the runtime issues asynchronously (eqs 4, 5, 7) at the fraction
    ``hw.async_exposed`` of their time.

    A transposed layer swaps the sizes of x and y (and so their bandwidths: its "x"
    collectives run on the physical y groups)."""
    v = {key: size * element_bytes for key, size in layer_volumes(m, k, n, grid, transposed=transposed).items()}
    # the physical groups: a transposed layer all-reduces its output over x and its
    # input gradient over y
    out_axis, in_axis = (MeshAxis.X, MeshAxis.Y) if transposed else (MeshAxis.Y, MeshAxis.X)
    size = {MeshAxis.X: grid.x, MeshAxis.Y: grid.y}
    # issued asynchronously by the runtime (axonn §IV: the all-gather prefetched, the
    # reduce-scatter deferred, the backward all-reduce beside the weight gradient): the
    # part a step waits for, ``hw.async_exposed`` (1 in the presets: eq 9 as it stands)
    hidden = hw.async_exposed
    return LayerComm(
        all_gather_z=hidden * cost_model.all_gather_time(grid.z, v["all_gather_z"], hw, grid.stride(MeshAxis.Z)),
        reduce_scatter_z=hidden * cost_model.reduce_scatter_time(grid.z, v["reduce_scatter_z"], hw,
                                                                 grid.stride(MeshAxis.Z)),
        all_reduce_y=cost_model.all_reduce_time(size[out_axis], v["all_reduce_y"], hw, grid.stride(out_axis)),
        all_reduce_x=hidden * cost_model.all_reduce_time(size[in_axis], v["all_reduce_x"], hw, grid.stride(in_axis)),
        all_reduce_data=cost_model.all_reduce_time(grid.data, v["all_reduce_data"], hw, grid.stride(MeshAxis.DATA)),
        transposed=transposed,
    )


def group_bandwidth(grid: Grid3D, axis: str, hw: Hardware) -> float:
    """β of an ``axis`` group by axonn eq 10 (§V-B): intra-node when the product of the
    sizes up to and including ``axis`` fits in a node, else the node-pair bandwidth
    shared by the min(G_node, stride) rings crossing it."""
    return cost_model.group_link(getattr(grid, axis), grid.stride(axis), hw)[0]


def boundary_comm(in_bytes: float, out_bytes: float, grid: Grid3D, hw: Hardware) -> float:
    """The re-layout where the data flow enters and leaves a 3D region (seconds on y):
    the region's output, split over y by its last (transposed) layer, is all-gathered
    over y in forward; the gradient of its input, cut to y blocks by the first (plain)
    layers, is all-gathered over y in backward. ``in_bytes``/``out_bytes`` are the full
    activations of all rows; each rank holds ``1/(Gz·Gdata·Gy)`` of them."""
    if grid.y == 1:
        return 0.0
    share = grid.z * grid.data * grid.y
    return (cost_model.all_gather_time(grid.y, out_bytes / share, hw, grid.stride(MeshAxis.Y))
            + cost_model.all_gather_time(grid.y, in_bytes / share, hw, grid.stride(MeshAxis.Y)))


def rows_boundary_comm(in_bytes: float, out_bytes: float, grid: Grid3D, hw: Hardware) -> float:
    """A mixed plan's 3D region on a grid with ``Gz > 1`` (seconds on z): its rows are cut
    to z blocks where the flow enters (backward: the input's gradient all-gathered over z)
    and all-gathered over z where it leaves, since the plan's other regions hold their data
    replica's rows whole. Each rank gives ``1/(Gdata·Gz)`` of the full activations
    (``in_bytes``/``out_bytes``, all rows) to each all-gather, ring times as eq 4's."""
    if grid.z == 1:
        return 0.0
    share = grid.z * grid.data
    return (cost_model.all_gather_time(grid.z, out_bytes / share, hw, grid.stride(MeshAxis.Z))
            + cost_model.all_gather_time(grid.z, in_bytes / share, hw, grid.stride(MeshAxis.Z)))


def grids_of(world: int) -> list[Grid3D]:
    """Every ``Gx × Gy × Gz × Gdata = world`` with at least one of x, y, z above 1, in a
    fixed order (x, then y, then z ascending)."""
    found = []
    for x in range(1, world + 1):
        for y in range(1, world // x + 1):
            for z in range(1, world // (x * y) + 1):
                if world % (x * y * z) == 0 and x * y * z > 1:
                    found.append(Grid3D(x, y, z, world // (x * y * z)))
    return found
