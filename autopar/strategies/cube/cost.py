"""The communication model of Bian et al.'s cube layer (bian §3.1, Algorithms 1-8) on a
``p × p × p`` cube of the 3D grid (times any data degree): the grid's rank order, strides
and each group's bandwidth by axonn eq 10 are the 3D grid's
(:mod:`autopar.strategies.shared.grid3d.cost`)."""
from __future__ import annotations

from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.grid import Grid3D, MeshAxis


def cube_volumes(m: int, k: int, n: int, p: int, *, bias: bool = False) -> dict[str, float]:
    """Elements each rank sends into every collective of one of Bian's cube layers
    ``[m×k] × [k×n]`` on a ``p × p × p`` cube (``m`` the rows of one data replica;
    all-gathers: the piece each rank gives, reduce-scatters: the buffer it reduces).

    Each forward all-gather/reduce-scatter moves ``(mk + kn + mn)/p³`` per rank over p
    ranks (bian §3.1.2); backward adds the gathered ``Ċ``, A gathered again, and the
    reduce-scatters of ``Ȧ`` and ``Ḃ``."""
    p3 = p ** 3
    out = {
        "all_gather_rows_out": m * k / p3,     # Alg 1 line 1: A_il over the out axis (again in backward)
        "all_gather_z": k * n / p3,            # line 2: B_lj from the shards Ŵ over z (eq 4)
        "reduce_scatter_rows_in": m * n / p ** 2,  # line 4: C_ilj over the in axis
        "all_gather_rows_in": m * n / p3,      # Alg 2: Ċ_ij over the in axis
        "reduce_scatter_rows_out": m * k / p ** 2,  # Alg 2 line 1: Ȧ over the out axis
        "reduce_scatter_z": k * n / p ** 2,    # Alg 2 line 2: Ḃ over z (eq 5)
        "all_reduce_data": k * n / p3,         # eq 8
    }
    if bias:  # Algorithms 7-8: the diagonal piece broadcast over the in axis, gathered over z; back again
        out.update({"vector_in": n / p ** 2, "vector_z": n / p ** 2})
    return out


def cube_layer_comm(m: int, k: int, n: int, grid: Grid3D, hw: Hardware, *, transposed: bool = False,
                    bias: bool = False, element_bytes: int = 2) -> dict[str, float]:
    """Seconds of one cube layer's collectives by physical group (``x``, ``y``, ``z``,
    ``data``), each group's bandwidth by axonn eq 10 from its stride; a transposed layer
    exchanges x and y (in x, out y)."""
    p = grid.x
    v = {key: size * element_bytes for key, size in cube_volumes(m, k, n, p, bias=bias).items()}
    in_axis, out_axis = (MeshAxis.X, MeshAxis.Y) if transposed else (MeshAxis.Y, MeshAxis.X)
    s_in, s_out, s_z = grid.stride(in_axis), grid.stride(out_axis), grid.stride(MeshAxis.Z)
    out = {MeshAxis.X: 0.0, MeshAxis.Y: 0.0}
    out[out_axis] += (2 * cost_model.all_gather_time(p, v["all_gather_rows_out"], hw, s_out)
                      + cost_model.reduce_scatter_time(p, v["reduce_scatter_rows_out"], hw, s_out))
    out[in_axis] += (cost_model.reduce_scatter_time(p, v["reduce_scatter_rows_in"], hw, s_in)
                     + cost_model.all_gather_time(p, v["all_gather_rows_in"], hw, s_in))
    out[MeshAxis.Z] = (cost_model.all_gather_time(grid.z, v["all_gather_z"], hw, s_z)
                       + cost_model.reduce_scatter_time(grid.z, v["reduce_scatter_z"], hw, s_z))
    if bias:
        out[in_axis] += 2 * cost_model.broadcast_time(p, v["vector_in"], hw, s_in)  # broadcast; reduce back
        out[MeshAxis.Z] += (cost_model.all_gather_time(grid.z, v["vector_z"], hw, s_z)
                            + cost_model.reduce_scatter_time(grid.z, v["vector_z"] * grid.z, hw, s_z))
    out[MeshAxis.DATA] = cost_model.all_reduce_time(grid.data, v["all_reduce_data"], hw, grid.stride(MeshAxis.DATA))
    return out


def cube_boundary_comm(in_bytes: float, out_bytes: float, grid: Grid3D, hw: Hardware) -> dict[str, float]:
    """The cube's re-layout where the flow enters and leaves a region, by group: the
    output (each rank ``1/(Gdata·p³)`` of it) all-gathered over y, then over x; the
    input's gradient the same way in backward."""
    p, d = grid.x, grid.data
    if p == 1:
        return {MeshAxis.X: 0.0, MeshAxis.Y: 0.0}
    y = sum(cost_model.all_gather_time(p, b / (d * p ** 3), hw, grid.stride(MeshAxis.Y)) for b in (in_bytes, out_bytes))
    x = sum(cost_model.all_gather_time(p, b / (d * p ** 2), hw, grid.stride(MeshAxis.X)) for b in (in_bytes, out_bytes))
    return {MeshAxis.X: x, MeshAxis.Y: y}
