"""Planning Bian's load-balanced 3D form (bian §3) on every ``p × p × p × data`` of the world.

The cube is priced as AxoNN's grid is (:mod:`autopar.strategies.shared.grid3d.pricing`:
:func:`price_grid`, the same search over identical regions, the same data-parallel
gradients), with the :class:`CubeForm` of a layer: its collectives by
``cube.cost.cube_layer_comm`` (bian Algorithms 1-8: all-gather A's rows over the
out axis and W over z, reduce-scatter the output's rows over the in axis; backward the
conjugates; biases on the diagonal ranks), its boundary by ``cube_boundary_comm``
(all-gathers over y, then x), the ops between the layers split over y as well (their
rows, so each rank's rows must divide by p², :func:`autopar.strategies.cube.rewrite.check_rows`),
activations and biases balanced over the cube, and the biases' gradients summed over
data only.
"""
from __future__ import annotations

from autopar.cost.hardware import Hardware
from autopar.grid import Grid3D, MeshAxis
from autopar.ir import tensor_spec
from autopar.passes.analysis.ops import match_linear
from autopar.planning.model import ModelFacts
from autopar.planning.strategy import PlanError, Strategy
from autopar.strategies.cube.cost import cube_boundary_comm, cube_layer_comm
from autopar.strategies.cube.rewrite import check_rows, cube_pass, planned_cube_shards
from autopar.strategies.family import PlanContext, Priced, rejected
from autopar.strategies.shared.grid3d.cost import grids_of
from autopar.strategies.shared.grid3d.family import Grid3DFamily
from autopar.strategies.shared.grid3d.pricing import Form3D, check_forced_grid
from autopar.strategies.shared.grid3d.rewrite import region_linears


class CubeForm(Form3D):
    """Bian's cube layer on a cubic grid (see the module docstring)."""

    strategy = "cube"
    label = "cube"
    form = "cube"
    vectors_sharded = True

    def shards(self, model: ModelFacts, r, grid: Grid3D, parts: int) -> dict:
        shards = planned_cube_shards(model.gm, regions=[r.id], grid=grid)
        # the rows of each rank's batch chunk split over x and y
        spec = tensor_spec(match_linear(model.table[region_linears(r)[0][0]], model.gm).input)
        rows = spec.shape[0] // parts if spec is not None and len(spec.shape) > 1 else None
        check_rows(rows, grid, f"region {r.id}")
        return shards

    def layer_comm(self, rows: int, match, spec, grid: Grid3D, hw: Hardware, transposed: bool) -> dict[str, float]:
        return cube_layer_comm(rows, match.in_features, match.out_features, grid, hw, transposed=transposed,
                               bias=match.bias is not None, element_bytes=spec.dtype.itemsize)

    def boundary(self, enters: float, leaves: float, grid: Grid3D, hw: Hardware) -> tuple[dict[str, float], str]:
        text = ("input " + ("cut to y column blocks and x row blocks (backward all-gathers over y and x)" if enters
                            else "read as A_ijl from the previous region (no re-layout)")
                + ", output " + ("all-gathered over y, then x" if leaves else
                                 "read as A_ijl by the next region (no re-layout)"))
        return cube_boundary_comm(enters, leaves, grid, hw), text

    def row_split(self, grid: Grid3D) -> int:
        return grid.x * grid.y

    def vector_elems(self, numel: int, out_group: int, grid: Grid3D) -> float:
        return numel / (out_group * grid.z)  # a diagonal rank holds 1/(p·Gz) of it, the others none

    def details(self) -> dict:
        return {"form": "cube (Bian et al.)"}


CUBE = CubeForm()


class Cube(Grid3DFamily):
    """Bian's cube family: the grids of AxoNN's
    (:class:`~autopar.strategies.tensor3d.planner.Tensor3D`) with ``Gx = Gy = Gz = p >= 2``."""

    name = "cube"
    form3d = CUBE
    plan_form = "cube"
    region_strategy = "cube"

    def shards_of(self, gm, *, regions, grid) -> dict:
        return planned_cube_shards(gm, regions=regions, grid=grid)

    def pass_fn(self):
        return cube_pass

    def rank_runtime(self, plan, rank: int, options: dict) -> None:
        return None  # the cube's layers run on the 3D family's runtime (Tensor3D.rank_runtime)

    def candidates(self, ctx: PlanContext) -> list[Strategy | Priced]:
        world, forced = ctx.world, ctx.forced
        if forced is None:
            if not self.regions(ctx.model):
                return []
            cubes = [Strategy(g.data, 1, grid=g, form=self.name) for g in grids_of(world) if g.x == g.y == g.z > 1]
            return cubes or [rejected(self.name, Strategy(world, 1), {MeshAxis.DATA: world},
                                      f"Bian's cube form: {world} ranks are no p^3 x data with p >= 2", form="cube")]
        if forced.kind() != "cube":
            return []
        p = forced.grid.x
        if world % p ** 3 or (forced.data is not None and p ** 3 * forced.data != world):
            raise PlanError(f"strategy: the cube form with p={p} needs p^3 x data = {p ** 3} x "
                            f"{forced.data if forced.data is not None else 'd'} ranks, and the world has "
                            f"{world}, which is not {'that' if forced.data is not None else 'a multiple of it'};"
                            f" give a world of p^3·d ranks, or AxoNN's grid {{'x', 'y', 'z'}}, which need not be a "
                            f"cube")
        config = Strategy(world // p ** 3, 1, grid=Grid3D(p, p, p, world // p ** 3), form=self.name)
        check_forced_grid(ctx, config.grid)
        return [config]
