"""AxoNN Algorithm 1 on 8 real gloo ranks against single-process math.

Two consecutive linear layers with a GELU between them, the second "transposed" (x and y
swap roles), so the first layer's output layout is the second's input layout with no
re-layout (axonn end of §III-B). Checked: the output, the input gradient, and every
weight and bias gradient against the same part of the reference's, on a 2x2x2 grid and
on 1x2x4 and 4x2x1 grids (a size-1 axis turns its collectives off), with the overlap
optimisations of axonn §IV all on and all off, and the full parameters gathered back.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import shared_ranks
from autopar.grid import Grid3D

GRIDS = [(2, 2, 2), (1, 2, 4), (4, 2, 1)]


def _input_block(x, grid, c, in_axis):
    return x.chunk(grid.z, 0)[c["z"]].chunk(getattr(grid, in_axis), -1)[c[in_axis]].clone()


def _two_layers(grids):
    from autopar.runtime import groups as G
    from autopar.strategies.shared.grid3d import runtime as T3
    from autopar.strategies.tensor3d.runtime import linear_3d
    torch.manual_seed(0)
    m, k, h, n = 8, 8, 16, 8
    x = torch.randn(m, k, dtype=torch.float64, requires_grad=True)
    w1, b1 = torch.randn(h, k, dtype=torch.float64), torch.randn(h, dtype=torch.float64)
    w2, b2 = torch.randn(n, h, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    r = torch.randn(m, n, dtype=torch.float64)
    ref_params = [p.clone().requires_grad_() for p in (w1, b1, w2, b2)]
    ref_out = F.linear(F.gelu(F.linear(x, ref_params[0], ref_params[1])), ref_params[2], ref_params[3])
    (ref_out * r).sum().backward()
    reports = []
    for dims in grids:
        grid = Grid3D(*dims)
        groups = grid.rank_grid().process_groups(grid.group_specs(), dist.get_rank())
        c = grid.coordinates(dist.get_rank())
        specs = [T3.Grid3DShard(0, False), T3.Grid3DShard(0, False, vector=True),
                 T3.Grid3DShard(0, True), T3.Grid3DShard(0, True, vector=True)]
        for overlap in (T3.Overlap(), T3.Overlap(False, False, False, False)):
            runtime = T3.Tensor3DRuntime(overlap)
            with G.use_groups(groups), T3.use_runtime(runtime):
                parts = [T3.local_part(p, s, grid, c).requires_grad_() for p, s in zip((w1, b1, w2, b2), specs)]
                xi = _input_block(x.detach(), grid, c, "y").requires_grad_()
                hidden = linear_3d(xi, parts[0], parts[1], T3.block_shape(w1.shape, specs[0], grid), "y", "x",
                                      prefetch=parts[2])
                out = linear_3d(F.gelu(hidden), parts[2], parts[3], T3.block_shape(w2.shape, specs[2], grid),
                                   "x", "y")
                # the output block: rows over z, columns over the second layer's out axis (y)
                expected = r.chunk(grid.z, 0)[c["z"]].chunk(grid.y, 1)[c["y"]]
                (out * expected).sum().backward()
                deferred = runtime.pending
                runtime.finish()
                for b in (parts[1], parts[3]):  # biases: rows are split over z (the runtime's buckets do this)
                    if groups["z"] is not None:
                        dist.all_reduce(b.grad, group=groups["z"])
                want_out = ref_out.detach().chunk(grid.z, 0)[c["z"]].chunk(grid.y, 1)[c["y"]]
                diffs = {"output": (out - want_out).abs().max().item(),
                         "grad_input": (xi.grad - _input_block(x.grad, grid, c, "y")).abs().max().item()}
                for name, p, ref, s in zip(("w1", "b1", "w2", "b2"), parts, ref_params, specs):
                    diffs[f"grad_{name}"] = (p.grad - T3.local_part(ref.grad, s, grid, c)).abs().max().item()
                    full = T3.gather_part(p.detach(), s, grid, ref.shape)
                    diffs[f"gathered_{name}"] = (full - ref.detach()).abs().max().item()
            reports.append((dims, overlap, deferred, diffs))
    return reports


# one launch with other modules' jobs, in the extended suite (make test-extended, CI): 8 ranks
_LAUNCHED = shared_ranks.register(8, __name__ + ":extended", _two_layers, (GRIDS,), extended=True)


@pytest.mark.extended
@pytest.mark.multiprocess
def test_algorithm_1_two_layers_on_8_ranks():
    results = _LAUNCHED()
    for rank, reports in enumerate(results):
        for dims, overlap, deferred, diffs in reports:
            for what, diff in diffs.items():
                assert diff < 1e-12, (rank, dims, overlap, what, diff)
            # §IV-B: with reduce-scatters overlapped, both layers' wait until finish()
            assert deferred == (2 if overlap.reduce_scatter and dims[2] > 1 else 0), (dims, overlap, deferred)


def test_shapes_a_grid_does_not_divide_are_named():
    from autopar.strategies.shared.grid3d import runtime as T3
    grid = Grid3D(3, 2, 2)
    with pytest.raises(ValueError, match=r"16 output features \(1 block\(s\)\) do not divide by Gx = 3"):
        T3.local_part(torch.zeros(16, 8), T3.Grid3DShard(0, False), grid, grid.coordinates(0))
    with pytest.raises(ValueError, match=r"does not split into Gz = 2 shards"):
        T3.local_part(torch.zeros(3, 2), T3.Grid3DShard(0, False), Grid3D(1, 2, 2), Grid3D(1, 2, 2).coordinates(0))


def test_overlap_options_parse_and_name_unknown_ones():
    from autopar.strategies.shared.grid3d.runtime import Overlap
    assert Overlap.parse(None) == Overlap()
    assert Overlap.parse(False) == Overlap(False, False, False, False)
    assert Overlap.parse({"all_gather": False}) == Overlap(all_gather=False)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['prefetch'\]"):
        Overlap.parse({"prefetch": True})
