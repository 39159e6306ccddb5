"""AxoNN Algorithm 1 on 8 real gloo ranks against single-process math.

Two consecutive linear layers with a GELU between them, the second "transposed" (x and y
swap roles), so the first layer's output layout is the second's input layout with no
re-layout (axonn end of §III-B). Checked: the output, the input gradient, and every
weight and bias gradient, gathered back to full shapes, on a 2x2x2 grid and on 1x2x4 and
4x2x1 grids (a size-1 axis turns its collectives off).
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from autopar.planning.grid3d import Grid3D
from autopar.runtime.launcher import launch

GRIDS = [(2, 2, 2), (1, 2, 4), (4, 2, 1)]


def _gather_all(t: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return out


def _two_layers(grids):
    from autopar.runtime import tensor3d as T3
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
        groups = T3.make_grid_process_groups(grid)
        c = grid.coordinates(dist.get_rank())
        xi = T3.input_block(x.detach(), grid, c, False).requires_grad_()
        s1 = T3.weight_shard(w1, grid, c, False).requires_grad_()
        c1 = T3.bias_block(b1, grid, c, False).requires_grad_()
        s2 = T3.weight_shard(w2, grid, c, True).requires_grad_()
        c2 = T3.bias_block(b2, grid, c, True).requires_grad_()
        hidden = T3.linear_3d(xi, s1, c1, T3.weight_block(w1, grid, c, False).shape, groups)
        out = T3.linear_3d(F.gelu(hidden), s2, c2, T3.weight_block(w2, grid, c, True).shape, groups, transposed=True)
        # the output block: rows over z, columns over the second layer's out axis (y)
        expected = r.chunk(grid.z, 0)[c["z"]].chunk(grid.y, 1)[c["y"]]
        (out * expected).sum().backward()
        want_out = ref_out.detach().chunk(grid.z, 0)[c["z"]].chunk(grid.y, 1)[c["y"]]
        # every rank holds gradient shards; compare each with the reference's same shard
        diffs = {
            "output": (out - want_out).abs().max().item(),
            "grad_input": (xi.grad - T3.input_block(x.grad, grid, c, False)).abs().max().item(),
            "grad_w1": (s1.grad - T3.weight_shard(ref_params[0].grad, grid, c, False)).abs().max().item(),
            "grad_b1": (c1.grad - T3.bias_block(ref_params[1].grad, grid, c, False)).abs().max().item(),
            "grad_w2": (s2.grad - T3.weight_shard(ref_params[2].grad, grid, c, True)).abs().max().item(),
            "grad_b2": (c2.grad - T3.bias_block(ref_params[3].grad, grid, c, True)).abs().max().item(),
        }
        reports.append((dims, diffs))
    return reports


@pytest.mark.multiprocess
def test_algorithm_1_two_layers_on_8_ranks():
    results = launch(_two_layers, 8, (GRIDS,), timeout_s=300)
    for rank, reports in enumerate(results):
        for dims, diffs in reports:
            for what, diff in diffs.items():
                assert diff < 1e-12, (rank, dims, what, diff)


def test_shapes_a_grid_does_not_divide_are_named():
    from autopar.runtime import tensor3d as T3
    grid = Grid3D(3, 2, 2)
    with pytest.raises(ValueError, match=r"out features 16 must divide by Gx = 3"):
        T3.weight_block(torch.zeros(16, 8), grid, grid.coordinates(0), False)
    with pytest.raises(ValueError, match=r"does not split into Gz = 2 shards"):
        T3.weight_shard(torch.zeros(3, 2), Grid3D(1, 2, 2), Grid3D(1, 2, 2).coordinates(0), False)
