"""3D and 4D tensor parallelism, AxoNN's grid and Bian's cube, on 8 real gloo ranks
against the single-device model.

Grids (Gx, Gy, Gz, Gdata): 2x2x2x1, 2x1x2x2 and 1x2x2x2 (axonn §III; the last two are 4D:
3D combined with data parallelism). Models: the MLP, the plain-PyTorch transformer and
Hugging Face GPT-2 (captured by torch.export: ``Conv1D`` weights stored [in, out], a
fused Q/K/V projection cut per block). Each case compares the outputs, the loss and
every gradient after one step, and every parameter after 3 AdamW steps, in float64
(where the parallel and single-device sums differ only by rounding: each tensor to
:data:`TOLERANCE`). The overlap
optimisations of axonn §IV are on by default; the transformer also runs with all of them
off, and (marked ``extended``, with the transformer's 4D grids and the MLP's 1x2x2x2)
with each one off alone; three cases recompute in backward (their blocks; the MLP's split
regions) (activation checkpointing), with and without the all-gather cache of axonn §IV-D, and
with the cache bounded to one layer (the others gathered again in the recomputation).
Bian's load-balanced cube (``{"cube": 2}``: 2x2x2, activations split over all 8 ranks,
biases on the diagonal) runs the same models at batch 8 (z, then x and y split the
rows), with GPT-2's blocks recomputed (with the overlaps off and the MLP recomputed in
the extended suite). Each case also checks, from the
runtime's counters, that each overlap switched on did its work and one switched off
did not. The cube times data 2 on 16 ranks runs in the extended suite.
"""
import pytest

import shared_ranks
from autopar.testing import equivalence_job

F64 = {"dtype": "float64"}
GRIDS = [{"x": 2, "y": 2, "z": 2}, {"x": 2, "y": 1, "z": 2, "data": 2}, {"x": 1, "y": 2, "z": 2, "data": 2}]
# every overlap off runs in the main suite; each one off alone in the extended one
OVERLAPS = [False]
EACH_OVERLAP_OFF = [{"all_reduce": False}, {"reduce_scatter": False}, {"all_gather": False}]
# GPT-2 (the export spelling) runs on the 3D grid, and on the 4D 1x2x2x2 grid with
# recomputation below; its other 4D cases added nothing the transformer's do not check
# the MLP's 2x1x2x2 case runs with recomputation only (below)
# the transformer's 4D grids and the MLP's 1x2x2x2: the extended suite (the MLP's 2x1x2x2
# and GPT-2's 1x2x2x2 cases with recomputation below run the 4D paths in the main one)
FOUR_D = [("transformer", GRIDS[1], F64), ("transformer", GRIDS[2], F64), ("mlp", GRIDS[2], F64)]
# the transformer on the plain 3D grid: its overlaps-off and recomputed cases below run it
PLAIN_EXTENDED = [("transformer", GRIDS[0], F64)]
CASES = [(model, grid, F64) for model in ("mlp", "transformer", "gpt2") for grid in GRIDS
         if (model != "gpt2" or grid is GRIDS[0]) and (model, grid) != ("mlp", GRIDS[1])
         and (model, grid, F64) not in FOUR_D + PLAIN_EXTENDED] + [
    ("transformer", GRIDS[0], {**F64, "overlap": overlap}) for overlap in OVERLAPS] + [
    ("transformer", GRIDS[0], {**F64, "recompute": True}),
    ("mlp", GRIDS[1], {**F64, "recompute": True, "overlap": {"cache_layers": 1}}),
    ("gpt2", GRIDS[2], {**F64, "recompute": True, "overlap": {"cache": False}})]
CUBE = {"cube": 2}
CUBE_F64 = {**F64, "batch": 8}
CASES += [  # GPT-2 on the cube: with recomputation, some overlaps off
    ("gpt2", CUBE, {**CUBE_F64, "recompute": True, "overlap": {"cache": False, "all_reduce": False}})]
# the transformer on the cube (overlaps on, and every overlap off), and the MLP's split
# regions recomputed on it: the extended suite
CUBE_EXTENDED = [("transformer", CUBE, CUBE_F64), ("transformer", CUBE, {**CUBE_F64, "overlap": False}),
                 ("mlp", CUBE, {**CUBE_F64, "recompute": True})]
SPLIT_REGIONS = {"mlp": 2, "transformer": 4, "gpt2": 4}
# full recomputation outlines the blocks (the MLP has none: its split regions)
RECOMPUTED = {"mlp": 2, "transformer": 2, "gpt2": 2}

# the MLP (two split regions): 16 ranks on 2 cores, and the transformer's and GPT-2's
# spellings are checked on the cube above; what this case adds is the data dimension
CUBE_WITH_DATA = ("mlp", {"cube": 2, "data": 2}, {**F64, "batch": 16, "recompute": True})
EXTENDED = [("transformer", GRIDS[0], {**F64, "overlap": overlap}) for overlap in EACH_OVERLAP_OFF] + FOUR_D \
    + CUBE_EXTENDED + PLAIN_EXTENDED
# the largest relative error over every tensor of each kind (autopar.testing): outputs,
# loss, gradients and their norms agree to ~1e-15 (largest seen 1.4e-15), the parameters
# after 3 AdamW steps to ~1e-13 (largest 4.2e-13: Adam normalises each entry's gradient,
# which magnifies the rounding of entries whose gradient is near zero)
TOLERANCE = {"output": 1e-14, "loss": 1e-14, "grad": 1e-14, "grad_norm": 1e-14, "param": 2e-12}
# one launch per world size, shared with other modules' jobs (tests/shared_ranks.py)
# 8 ranks on the 2-core machine take minutes: these cases run in the extended suite (the 3D
# regions of mixed plans are checked on 8 ranks in the main one, tests/strategies/mixed/test_mixed_plans.py)
_LAUNCHED = {8: shared_ranks.register(8, __name__, equivalence_job, (CASES,), timeout_s=900, extended=True),
             16: shared_ranks.register(16, __name__, equivalence_job, ([CUBE_WITH_DATA],), timeout_s=900,
                                       extended=True)}
_EXTENDED = shared_ranks.register(8, __name__ + ":extended", equivalence_job, (EXTENDED,), timeout_s=900,
                                  extended=True)


def _case_id(c) -> str:
    return f"{c[0]}-{c[1]}-{c[2].get('overlap', 'overlap on')}{'-recompute' if c[2].get('recompute') else ''}"


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(CASES)), ids=[_case_id(c) for c in CASES])
def test_matches_single_device(index):
    _check(CASES[index], [reports[index] for reports in _LAUNCHED[8]()])


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(EXTENDED)), ids=[_case_id(c) for c in EXTENDED])
def test_each_overlap_switched_off_alone_and_the_other_4d_grids_match_single_device(index):
    _check(EXTENDED[index], [reports[index] for reports in _EXTENDED()])


def _check(case, reports) -> None:
    from autopar.strategies.shared.grid3d.runtime import Overlap
    for rank, report in enumerate(reports):
        assert report["case"] == case
        grid = case[1]
        if "cube" in grid:
            grid = {"x": grid["cube"], "y": grid["cube"], "z": grid["cube"]}
        assert report["mesh"] == {"data": grid.get("data", 1), "z": grid["z"], "y": grid["y"], "x": grid["x"]}
        assert report["strategies"] == {"cube" if "cube" in case[1] else "tensor3d"}
        # Bian's diagonal vectors: a bias per split linear, held only where x = y
        x, y = rank % 2, rank // 2 % 2
        off_diagonal = "cube" in case[1] and x != y
        assert report["empty_params"] == (2 * SPLIT_REGIONS[case[0]] if off_diagonal else 0), report
        for what, bound in TOLERANCE.items():
            assert report[what][1] < bound, (rank, case, what, report[what], report.get(f"worst_{what}"))
        options = case[2]
        overlap, stats = Overlap.parse(options.get("overlap")), report["tensor3d_stats"]
        assert (stats["prefetched"] > 0) == overlap.all_gather, (case, stats)
        assert (stats["deferred"] > 0) == overlap.reduce_scatter, (case, stats)
        recompute = options.get("recompute", False)
        assert report["recomputed"] == (RECOMPUTED[case[0]] if recompute else 0)
        assert (stats["cached"] > 0) == (recompute and overlap.cache), (case, stats)
        # a bounded cache: the layers past the bound gathered again when recomputed
        assert (stats["regathered"] > 0) == (recompute and overlap.cache_layers is not None), (case, stats)
        if overlap.cache_layers is not None:
            assert stats["cached"] == stats["regathered"] // 3, (case, stats)  # 1 of the 4 layers, every step


@pytest.mark.multiprocess
@pytest.mark.extended
def test_cube_with_data_on_16_ranks():
    """4D with Bian's cube: 2x2x2 times data 2 on 16 gloo ranks (the MLP at batch 16,
    with recomputation): weight shards and diagonal vectors summed over the cube, then
    over data; everything matches the single device."""
    for rank, (report,) in enumerate(_LAUNCHED[16]()):
        assert report["mesh"] == {"data": 2, "z": 2, "y": 2, "x": 2} and report["strategies"] == {"cube"}
        for what, bound in TOLERANCE.items():
            assert report[what][1] < bound, (rank, what, report[what], report.get(f"worst_{what}"))
        x, y = rank % 2, rank // 2 % 2
        regions = SPLIT_REGIONS["mlp"]
        assert report["empty_params"] == (0 if x == y else 2 * regions) and report["recomputed"] == RECOMPUTED["mlp"]
