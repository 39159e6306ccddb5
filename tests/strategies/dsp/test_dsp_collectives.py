"""D&SP and D&SP-cSub segmented collectives against single-process math (SUPER §III-IV).

Each world (4 and 8 ranks) is launched once (shared with other modules' jobs,
tests/shared_ranks.py); its worker runs every check for g = 2 and 4
sub-grids in the naive and the topology-aware rank order and returns
``{(config, operation, kind): (parallel, reference)}``. Every rank builds the full tensors from one seed and
slices out what it should hold; gradients come from ``(out * w).sum()`` with a known
``w`` per rank, whose analytic gradient is a slice of a sum of the ``w``.
"""
from __future__ import annotations

import pytest
import torch

import shared_ranks
import torch.distributed as dist

from autopar.grid import GroupSpec, RankGrid, subgrid_dims
from autopar.strategies.dsp.cost import subgrid_coordinates, subgrid_groups
from autopar.runtime import get_group, group_rank, set_groups, use_groups
from autopar.strategies.dsp.collectives import (
    common_batch_chunk,
    segmented_all_gather,
    segmented_all_to_all,
    segmented_all_to_all_slice,
    segmented_broadcast,
    segmented_gather,
    segmented_reduce,
    segmented_reduce_scatter,
    segmented_scatter,
)

TIGHT = dict(rtol=1e-5, atol=1e-6)
ROWS = 2  # batch rows per rank in the common layers: B = ROWS * n
CONFIGS = [(g, order) for g in (2, 4) for order in ("naive", "topology")]


class _Layout:
    """Rank (s, p) of n ranks in g sub-grids, and the row ranges it holds."""

    def __init__(self, n: int, g: int, topology_aware: bool):
        self.n, self.g, self.n_g, self.batch = n, g, n // g, ROWS * n
        self.s, self.p = subgrid_coordinates(dist.get_rank(), n, g, topology_aware)
        self.c = common_batch_chunk(dist.get_rank(), n, g, topology_aware)
        self.widths = [s + 1 for s in range(g)]  # uneven per sub-grid on purpose

    def common(self, t):  # chunk c of n: D&SP common layers
        return t.chunk(self.n)[self.c].clone()

    def branch(self, t):  # chunk p of n_g: branch layers (and D&SP-cSub common layers)
        return t.chunk(self.n_g)[self.p].clone()

    def piece(self, t):  # this sub-grid's piece along the last dim
        return t.split(self.widths, -1)[self.s].clone()


def _leaf(t):
    return t.clone().requires_grad_()


def _placeholder(t):
    """What a D&SP-cSub rank off sub-grid 0 passes: t's shape, no memory, no data."""
    return torch.empty(()).expand(t.shape)


def _check_dsp(out, tag, lay: _Layout, gen):
    B, H, W = lay.batch, 3, sum(lay.widths)
    x, w_branch = torch.randn(B, H, generator=gen), torch.randn(lay.g, B, H, generator=gen)
    xi = _leaf(lay.common(x))
    y = segmented_all_gather(xi, "segment")
    (y * lay.branch(w_branch[lay.s])).sum().backward()
    out[tag, "all_gather", "value"] = (y.detach(), lay.branch(x))
    out[tag, "all_gather", "grad"] = (xi.grad, lay.common(w_branch.sum(0)))

    branch_out, w = torch.randn(lay.g, B, H, generator=gen), torch.randn(B, H, generator=gen)
    yi = _leaf(lay.branch(branch_out[lay.s]))
    z = segmented_reduce_scatter(yi, "segment")
    (z * lay.common(w)).sum().backward()
    out[tag, "reduce_scatter", "value"] = (z.detach(), lay.common(branch_out.sum(0)))
    out[tag, "reduce_scatter", "grad"] = (yi.grad, lay.branch(w))

    full, w = torch.randn(B, 2, W, generator=gen), torch.randn(B, 2, W, generator=gen)
    yi = _leaf(lay.branch(lay.piece(full)))
    z = segmented_all_to_all(yi, -1, lay.widths, "segment")
    (z * lay.common(w)).sum().backward()
    out[tag, "all_to_all", "value"] = (z.detach(), lay.common(full))
    out[tag, "all_to_all", "grad"] = (yi.grad, lay.branch(lay.piece(w)))

    xi = _leaf(lay.common(full))
    z = segmented_all_to_all_slice(xi, 2, lay.widths, "segment")
    (z * lay.branch(lay.piece(w))).sum().backward()
    out[tag, "all_to_all_slice", "value"] = (z.detach(), lay.branch(lay.piece(full)))
    out[tag, "all_to_all_slice", "grad"] = (xi.grad, lay.common(w))


def _check_csub(out, tag, lay: _Layout, gen):
    B, H, W = lay.batch, 3, sum(lay.widths)
    root = lay.s == 0
    x, w_branch = torch.randn(B, H, generator=gen), torch.randn(lay.g, B, H, generator=gen)
    xi = _leaf(lay.branch(x)) if root else _placeholder(lay.branch(x))
    y = segmented_broadcast(xi, "segment")
    (y * lay.branch(w_branch[lay.s])).sum().backward()
    out[tag, "broadcast", "value"] = (y.detach(), lay.branch(x))
    out[tag, "broadcast", "grad"] = (xi.grad, lay.branch(w_branch.sum(0)) if root else None)

    branch_out, w = torch.randn(lay.g, B, H, generator=gen), torch.randn(B, H, generator=gen)
    yi = _leaf(lay.branch(branch_out[lay.s]))
    z = segmented_reduce(yi, "segment")
    (z * lay.branch(w + lay.s)).sum().backward()  # off the root the gradient is ignored
    expected = lay.branch(branch_out.sum(0)) if root else torch.zeros_like(yi)
    out[tag, "reduce", "value"] = (z.detach(), expected)
    out[tag, "reduce", "grad"] = (yi.grad, lay.branch(w))

    full, w = torch.randn(B, 2, W, generator=gen), torch.randn(B, 2, W, generator=gen)
    xi = _leaf(lay.branch(full)) if root else _placeholder(lay.branch(full))
    z = segmented_scatter(xi, -1, lay.widths, "segment")
    (z * lay.branch(lay.piece(w))).sum().backward()
    out[tag, "scatter", "value"] = (z.detach(), lay.branch(lay.piece(full)))
    out[tag, "scatter", "grad"] = (xi.grad, lay.branch(w) if root else None)

    yi = _leaf(lay.branch(lay.piece(full)))
    z = segmented_gather(yi, 2, lay.widths, "segment")
    (z * lay.branch(w + lay.s)).sum().backward()
    expected = lay.branch(full) if root else torch.zeros(B // lay.n_g, 2, W)
    out[tag, "gather", "value"] = (z.detach(), expected)
    out[tag, "gather", "grad"] = (yi.grad, lay.branch(lay.piece(w)))


def _sum_over_within(grad):
    """Sum a branch parameter's gradient over its sub-grid (``None`` is a sub-grid of one)."""
    if get_group("within") is not None:
        dist.all_reduce(grad, group=get_group("within"))


def _block_reference(lay: _Layout, gen):
    """The toy block on one device: h = tanh(x C); y_sum = sum_s h A_s; y_cat = concat_s
    (piece s of h[:, :W]) B_s. Returns the inputs, the outputs and every gradient of
    (y_sum * U).sum() + (y_cat * V).sum()."""
    B, W = lay.batch, sum(lay.widths)
    t = dict(x=torch.randn(B, 4, generator=gen), C=torch.randn(4, W + 1, generator=gen),
             A=torch.randn(lay.g, W + 1, 3, generator=gen),
             B=[torch.randn(w, 2, generator=gen) for w in lay.widths],
             U=torch.randn(B, 3, generator=gen), V=torch.randn(B, 2 * lay.g, generator=gen))
    x, C, A, Bs = _leaf(t["x"]), _leaf(t["C"]), _leaf(t["A"]), [_leaf(b) for b in t["B"]]
    h = torch.tanh(x @ C)
    y_sum = (h @ A).sum(0)
    y_cat = torch.cat([p @ b for p, b in zip(h[:, :W].split(lay.widths, -1), Bs)], -1)
    ((y_sum * t["U"]).sum() + (y_cat * t["V"]).sum()).backward()
    ref = dict(y_sum=y_sum.detach(), y_cat=y_cat.detach(), x_grad=x.grad, C_grad=C.grad,
               A_grad=A.grad[lay.s], B_grad=Bs[lay.s].grad)
    return t, ref


def _check_block(out, tag, lay: _Layout, gen):
    """D&SP end to end: common layers on chunk c, branch s on sub-grid s; split ->
    all-gather, sum -> reduce-scatter, slice and concat -> all-to-all."""
    t, ref = _block_reference(lay, gen)
    W = sum(lay.widths)
    x, C, A, Bs = _leaf(lay.common(t["x"])), _leaf(t["C"]), _leaf(t["A"][lay.s]), _leaf(t["B"][lay.s])
    h = torch.tanh(x @ C)
    y_sum = segmented_reduce_scatter(segmented_all_gather(h, "segment") @ A, "segment")
    piece = segmented_all_to_all_slice(h[:, :W], -1, lay.widths, "segment")
    y_cat = segmented_all_to_all(piece @ Bs, -1, [2] * lay.g, "segment")
    ((y_sum * lay.common(t["U"])).sum() + (y_cat * lay.common(t["V"])).sum()).backward()
    dist.all_reduce(C.grad)  # a replica's gradient is its chunk's share: sum the ranks
    for branch in (A, Bs):
        _sum_over_within(branch.grad)
    out[tag, "block", "sum_value"] = (y_sum.detach(), lay.common(ref["y_sum"]))
    out[tag, "block", "cat_value"] = (y_cat.detach(), lay.common(ref["y_cat"]))
    out[tag, "block", "grad_x"] = (x.grad, lay.common(ref["x_grad"]))
    out[tag, "block", "grad_common"] = (C.grad, ref["C_grad"])
    out[tag, "block", "grad_branch_sum"] = (A.grad, ref["A_grad"])
    out[tag, "block", "grad_branch_cat"] = (Bs.grad, ref["B_grad"])


def _check_block_csub(out, tag, lay: _Layout, gen):
    """D&SP-cSub end to end: common layers on sub-grid 0 only (chunk p of n_g); split ->
    broadcast, sum -> reduce, slice -> scatter, concat -> gather. Other sub-grids start
    their backward from the zeros that the joins return them."""
    t, ref = _block_reference(lay, gen)
    W, root = sum(lay.widths), lay.s == 0
    x, C, A, Bs = _leaf(lay.branch(t["x"])), _leaf(t["C"]), _leaf(t["A"][lay.s]), _leaf(t["B"][lay.s])
    h = torch.tanh(x @ C) if root else torch.empty(()).expand(lay.batch // lay.n_g, W + 1)
    y_sum = segmented_reduce(segmented_broadcast(h, "segment") @ A, "segment")
    piece = segmented_scatter(h[:, :W], -1, lay.widths, "segment")
    y_cat = segmented_gather(piece @ Bs, -1, [2] * lay.g, "segment")
    ((y_sum * lay.branch(t["U"])).sum() + (y_cat * lay.branch(t["V"])).sum()).backward()
    for branch in (A, Bs) + ((C,) if root else ()):
        _sum_over_within(branch.grad)
    out[tag, "csub_block", "grad_branch_sum"] = (A.grad, ref["A_grad"])
    out[tag, "csub_block", "grad_branch_cat"] = (Bs.grad, ref["B_grad"])
    if root:
        out[tag, "csub_block", "sum_value"] = (y_sum.detach(), lay.branch(ref["y_sum"]))
        out[tag, "csub_block", "cat_value"] = (y_cat.detach(), lay.branch(ref["y_cat"]))
        out[tag, "csub_block", "grad_x"] = (x.grad, lay.branch(ref["x_grad"]))
        out[tag, "csub_block", "grad_common"] = (C.grad, ref["C_grad"])
    else:
        out[tag, "csub_block", "grad_x"] = (x.grad, None)  # the common layers did not run here


def worker(n: int) -> dict:
    out: dict = {}
    for g, order in CONFIGS:
        topology_aware = order == "topology"
        grid = RankGrid(subgrid_dims(n, g, topology_aware))
        set_groups(grid.process_groups({"segment": GroupSpec(("subgrid",)), "within": GroupSpec(("position",))},
                                       dist.get_rank()))
        lay, tag = _Layout(n, g, topology_aware), f"g{g}_{order}"
        out[tag, "coordinates", ""] = (lay.s, lay.p, group_rank("segment"), group_rank("within"))
        for check in (_check_dsp, _check_csub, _check_block, _check_block_csub):
            check(out, tag, lay, torch.Generator().manual_seed(1000 * g + len(order)))
    return out


# ---------------------------------------------------------------- fixtures and tests


# one launch per world size, shared with other modules' jobs (tests/shared_ranks.py)
_LAUNCHED = {4: shared_ranks.register(4, __name__, worker, (4,), timeout_s=90),
             8: shared_ranks.register(8, __name__ + ":extended", worker, (8,), timeout_s=90, extended=True)}


@pytest.fixture(scope="module")
def world4():
    return _LAUNCHED[4]()


@pytest.fixture(scope="module")
def world8():
    return _LAUNCHED[8]()


OPERATIONS = ["all_gather", "reduce_scatter", "all_to_all", "all_to_all_slice", "broadcast",
              "reduce", "scatter", "gather", "block", "csub_block"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("g, order", CONFIGS)
@pytest.mark.parametrize("world", ["world4", pytest.param("world8", marks=pytest.mark.extended)])
def test_matches_single_device(world, g, order, operation, request):
    results = request.getfixturevalue(world)
    compared = 0
    for rank, checks in enumerate(results):
        for (tag, name, kind), value in checks.items():
            if (tag, name) != (f"g{g}_{order}", operation):
                continue
            (parallel, reference), compared = value, compared + 1
            if reference is None:
                assert parallel is None, f"rank {rank} {name} {kind}: expected no gradient"
                continue
            torch.testing.assert_close(
                parallel, reference, **TIGHT, msg=lambda m: f"rank {rank} {name} {kind}: {m}"
            )
    assert compared, f"no check named {operation} for g={g} {order}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("g, order", CONFIGS)
@pytest.mark.parametrize("world", ["world4", pytest.param("world8", marks=pytest.mark.extended)])
def test_group_ranks_are_subgrid_coordinates(world, g, order, request):
    for rank, checks in enumerate(request.getfixturevalue(world)):
        s, p, segment_rank, within_rank = checks[f"g{g}_{order}", "coordinates", ""]
        assert (segment_rank, within_rank) == (s, p), f"rank {rank}"


# ---------------------------------------------------------------- single process


def test_subgrid_groups_naive_and_topology_aware():
    assert subgrid_groups(8, 2, False) == ([[0, 4], [1, 5], [2, 6], [3, 7]], [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert subgrid_groups(8, 2, True) == ([[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 2, 4, 6], [1, 3, 5, 7]])
    assert subgrid_groups(8, 4, True) == ([[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]])
    assert [subgrid_coordinates(r, 8, 4, False) for r in (0, 3, 5)] == [(0, 0), (1, 1), (2, 1)]
    assert [subgrid_coordinates(r, 8, 4, True) for r in (0, 3, 5)] == [(0, 0), (3, 0), (1, 1)]
    # topology-aware: the common chunk is the rank; naive: p * g + s
    assert [common_batch_chunk(r, 8, 2, True) for r in range(8)] == list(range(8))
    assert [common_batch_chunk(r, 8, 2, False) for r in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]
    with pytest.raises(ValueError, match="4 sub-grids do not divide 6 ranks"):
        subgrid_groups(6, 4, False)


def test_segment_of_one_is_identity():
    with use_groups({"segment": None}):
        x = torch.randn(4, 3)
        for y in (segmented_all_gather(x, "segment"), segmented_reduce_scatter(x, "segment"),
                  segmented_all_to_all(x, 1, [3], "segment"), segmented_broadcast(x, "segment"),
                  segmented_all_to_all_slice(x, 1, [3], "segment"), segmented_reduce(x, "segment"),
                  segmented_scatter(x, 1, [3], "segment"), segmented_gather(x, 1, [3], "segment")):
            assert y is x
