"""Mixed plans (docs/mixed_plans.md): each region its own family over one tensor group.

On gloo ranks against the single-device model in float64 (outputs, loss, every gradient,
the gradient norm, and the parameters after 3 AdamW steps):

* a multi-branch convolutional stem feeding a transformer trunk (``StemTrunk``) with
  D&SP on the stem and Megatron on the trunk, on ``data=2 × tensor=2``;
* the same with the trunk on a ``2 × 2 × 1`` AxoNN grid of the tensor group, and with
  three families at once (D&SP stem, Megatron attention, 3D MLPs), on ``tensor=4``;
* two 3D regions back to back (the MLP), where the first's transposed layer feeds the
  second's plain layer split over y with no re-layout (the programme's one non-trivial
  boundary state);
* pipelines of mixed stages: the stem's D&SP in the first stage and Megatron attention
  in both (``pipeline=2 × tensor=2``); GPT-2 under PTD-P with the tied embedding and
  head split over the vocabulary on both ends; on 8 ranks PTD-P with a ``2 × 2 × 1``
  AxoNN grid inside the stages, and the D&SP stem in a pipeline with data parallelism
  (``pipeline=2 × data=2 × tensor=2``), both over two microbatches;
* attention between dense mixtures of expert towers (``TowerTrunk``): D&SP of the towers
  over the tensor group beside Megatron attention and vocabulary; on 8 ranks
  (``data=2 × tensor=4``) the towers over 2 sub-grids of 2 tensor ranks, each tower
  Megatron-split inside its sub-grid.

Without ranks: the branch concat's collective against single-process math is in the
same launch; pins that cannot run are errors naming the region or pattern; the
dynamic programme's boundary credit; the plan's JSON round trip.
"""
import re

import pytest
import torch
import torch.distributed as dist

import autopar
import shared_ranks
from autopar.engine.executable import rank_graph_code
from autopar.planning.plan import Plan
from autopar.planning.strategy import PlanError
from autopar.testing import equivalence_job
from examples.factories import inception as inception_factory, mlp, stem_trunk, transformer
from examples.models import StemTrunk

F64 = {"dtype": "float64"}
TRUNK_MEGATRON = {"kind:attention": "megatron", "kind:linear_chain": "megatron"}
GRID_2X2 = {"tensor3d": {"x": 2, "y": 2}}
GRID_1X2X2 = {"tensor3d": {"x": 1, "y": 2, "z": 2}}
GRID_2X1X2 = {"tensor3d": {"x": 2, "y": 1, "z": 2}}
CASES = [
    ("stem_trunk", {"data": 2, "tensor": 2, "regions": {"kind:fork_join": "dsp", **TRUNK_MEGATRON}}, F64),
    ("stem_trunk", {"data": 1, "tensor": 4, "regions": {"kind:fork_join": "dsp", "kind:attention": GRID_2X2,
                                                        "kind:linear_chain": GRID_2X2}}, F64),
    ("stem_trunk", {"data": 1, "tensor": 4, "regions": {"kind:fork_join": "dsp", "kind:attention": "megatron",
                                                        "kind:linear_chain": GRID_2X2}}, F64),
    ("mlp", {"data": 1, "tensor": 4, "regions": {"kind:linear_chain": GRID_2X2}}, F64),
    ("stem_trunk", {"pipeline": 2, "tensor": 2, "regions": {"kind:fork_join": "dsp", "kind:attention": "megatron"}},
     F64),
    ("gpt2", {"pipeline": 2, "tensor": 2, "microbatches": 2}, F64),
    ("tower_trunk", {"data": 2, "tensor": 2, "regions": {"kind:fork_join": "dsp", "kind:attention": "megatron",
                                                         "kind:vocab": "megatron"}}, F64),
    # AxoNN grids with Gz > 1: the 3D regions split their rows over z, kept split between them
    ("stem_trunk", {"data": 1, "tensor": 4, "regions": {"kind:fork_join": "dsp", "kind:attention": GRID_1X2X2,
                                                        "kind:linear_chain": GRID_1X2X2}}, F64),
    ("transformer", {"data": 1, "tensor": 4, "regions": {"kind:attention": GRID_2X1X2,
                                                         "kind:linear_chain": GRID_2X1X2, "kind:vocab": "megatron"}},
     F64),
]
CASES8 = [
    ("transformer", {"pipeline": 2, "x": 2, "y": 2, "z": 1, "microbatches": 2}, F64),
    ("tower_trunk", {"data": 2, "tensor": 4, "regions": {"kind:fork_join": {"dsp": {"subgrids": 2}},
                                                         "kind:attention": "megatron"}}, F64),
    ("stem_trunk", {"pipeline": 2, "data": 2, "tensor": 2, "microbatches": 2,
                    "regions": {"kind:fork_join": "dsp", **TRUNK_MEGATRON}}, F64),
]


def conversion_job():
    """Every conversion a mixed plan inserts at a region boundary, forward and backward,
    against single-process math on integer-valued float64 tensors (so every sum is
    exact), over the tensor group (the 4 ranks) and over D&SP's sub-grid segments
    (``tensor_seg``: ranks {0, 2} and {1, 3}). Each entry is ``(from layout, to layout)``
    → the largest forward and backward error on this rank. A replicated value's
    gradient is the same on every rank (the convention every family keeps); a value
    split or partial over the group has one per rank."""
    from autopar.runtime import collectives as C
    from autopar.runtime.groups import use_groups
    from autopar.strategies.dsp.collectives import branch_all_gather
    rank, world = dist.get_rank(), dist.get_world_size()
    segments = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    generator = torch.Generator().manual_seed(5)

    def ints(*shape):
        return torch.randint(-8, 8, shape, generator=generator).to(torch.float64)

    def err(a, b):
        return float((a - b).abs().max())

    out = {}
    with use_groups({"tensor": dist.group.WORLD, "tensor_seg": segments[rank % 2]}):
        for group, members in (("tensor", list(range(world))), ("tensor_seg", [rank % 2, rank % 2 + 2])):
            me = members.index(rank)
            n = len(members)
            # replicated -> entry of a split region (Megatron's f, D&SP's fork): identity,
            # the gradients of every rank's use summed backward
            x = ints(2, 6)
            per_rank = [ints(2, 6) for _ in range(world)]
            xr = x.clone().requires_grad_(True)
            y = C.copy_to_tensor_region(xr, group)
            (y * per_rank[rank]).sum().backward()
            out[(group, "replicated", "copied into a split region")] = (
                err(y.detach(), x), err(xr.grad, sum(per_rank[m] for m in members)))
            # partial sums -> replicated (Megatron's g, a D&SP sum join): summed forward,
            # the replicated gradient passed back
            parts = [ints(2, 6) for _ in range(world)]
            upstream = ints(2, 6)
            pr = parts[rank].clone().requires_grad_(True)
            y = C.reduce_from_tensor_region(pr, group)
            (y * upstream).sum().backward()
            out[(group, "partial sums", "replicated")] = (
                err(y.detach(), sum(parts[m] for m in members)), err(pr.grad, upstream))
            # a 3D region's entry cut and exit all-gather: over y on the hidden dimension, and
            # with Gz > 1 over z on the rows
            for dim, split in ((1, "split on hidden"), (0, "rows split")):
                whole = (2 * n, 4) if dim == 0 else (2, 4 * n)
                # replicated -> split: own block / all-gather of the gradient
                x = ints(*whole)
                per_rank = [ints(2, 4) for _ in range(world)]
                xr = x.clone().requires_grad_(True)
                y = C.scatter_to_tensor_region(xr, dim, group)
                (y * per_rank[rank]).sum().backward()
                out[(group, "replicated", split)] = (
                    err(y.detach(), x.chunk(n, dim)[me]), err(xr.grad, torch.cat([per_rank[m] for m in members], dim)))
                # split -> replicated: all-gather / own block of the gradient
                pieces = [ints(2, 4) for _ in range(world)]
                upstream = ints(*whole)
                pr = pieces[rank].clone().requires_grad_(True)
                y = C.gather_from_tensor_region(pr, dim, group)
                (y * upstream).sum().backward()
                out[(group, split, "replicated")] = (
                    err(y.detach(), torch.cat([pieces[m] for m in members], dim)),
                    err(pr.grad, upstream.chunk(n, dim)[me]))
            # branches of uneven widths -> replicated concat (a D&SP concat join)
            widths = [1 + (m % 3) for m in members]
            pieces = [ints(2, w, 3) for w in widths]
            upstream = ints(2, sum(widths), 3)
            pr = pieces[me].clone().requires_grad_(True)
            y = branch_all_gather(pr, 1, widths, group)
            (y * upstream).sum().backward()
            begin = sum(widths[:me])
            out[(group, "branches (uneven widths)", "replicated concat")] = (
                err(y.detach(), torch.cat(pieces, 1)), err(pr.grad, upstream[:, begin:begin + widths[me]]))
    for g in segments:
        dist.destroy_process_group(g)
    return out


_EQUIVALENCE = shared_ranks.register(4, __name__, equivalence_job, (CASES,), timeout_s=600)
_CONVERSION = shared_ranks.register(4, __name__ + ".conversion", conversion_job, (), timeout_s=60)
_EQUIVALENCE8 = shared_ranks.register(8, __name__ + ":extended", equivalence_job, (CASES8,), timeout_s=900, extended=True)


def _assert_equal_to_single_device(report):
    """Outputs, loss, gradients and their norm within 1e-12 relative, parameters after
    the optimizer steps within 1e-12 absolute (float64)."""
    for key in ("output", "loss", "grad", "grad_norm"):
        assert report[key][1] < 1e-12, report
    assert report["param"][0] < 1e-12, report


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(CASES)), ids=["-".join(map(str, c[:1])) + f"-{i}" for i, c in
                                                          enumerate(CASES)])
def test_mixed_plan_matches_single_device(index):
    for rank_reports in _EQUIVALENCE():
        _assert_equal_to_single_device(rank_reports[index])
    plan = _EQUIVALENCE()[0][index]["plan"]
    if "regions" in CASES[index][1]:
        assert "mixed: each region its own family over the tensor group" in plan
    else:  # Megatron inside the stages, its vocabulary split on both ends of the pipeline
        assert [line.split()[2] for line in plan.splitlines() if line.startswith("vocab:")] == ["megatron"]


@pytest.mark.extended   # 8 ranks: make test-extended (CI)
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(CASES8)), ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES8)])
def test_mixed_plan_matches_single_device_on_8_ranks(index):
    for rank_reports in _EQUIVALENCE8():
        report = rank_reports[index]
        _assert_equal_to_single_device(report)
        if "pipeline" in CASES8[index][1]:
            # two microbatches, their backward whole or split into input and weight passes
            assert sorted(report["executed"].split()) in (["B0", "B1", "F0", "F1"],
                                                          ["F0", "F1", "I0", "I1", "W0", "W1"])
    plan = _EQUIVALENCE8()[0][index]["plan"]
    assert re.search(r"pipeline (1f1b|zb-h1), mixed", plan) or "over 2 sub-grids of 2 tensor ranks" in plan


@pytest.mark.multiprocess
def test_every_boundary_conversion_and_its_backward_are_exact():
    for report in _CONVERSION():
        assert len(report) == 14
        for pair, errors in report.items():
            assert errors == (0.0, 0.0), pair


def _plan(factory, world, strategy, **kw):
    model, inputs, loss_fn, target = factory()
    return autopar.plan(model, world, inputs, loss_fn, strategy, example_target=target, **kw)


def test_forced_mixed_plan_uses_each_family_where_pinned():
    plan = _plan(stem_trunk, 4, {"data": 1, "tensor": 4, "regions": {
        "kind:fork_join": "dsp", "kind:attention": "megatron", "kind:linear_chain": GRID_2X2}})
    by_kind = {}
    for r in plan.regions:
        by_kind.setdefault(r.kind, set()).add(r.strategy)
    assert by_kind == {"fork_join": {"dsp"}, "attention": {"megatron"}, "linear_chain": {"tensor3d"},
                       "-": {"replicate"}}
    assert plan.mixed and plan.tensor_grid == {"x": 2, "y": 2} and plan.form == "mixed tensor3d 2x2"
    assert Plan.from_json(plan.to_json()).to_json() == plan.to_json()
    text = plan.explain()
    assert "best single-family plan: none weighed (the mixed plan was forced)" in text
    fork = next(r.region for r in plan.regions if r.kind == "fork_join")
    assert plan.why_not("dsp", region=fork).startswith(f"{fork}: chosen: dsp")
    attention = next(r.region for r in plan.regions if r.kind == "attention")
    assert "tensor3d lost" in plan.why_not("tensor3d", region=attention)


def test_three_d_regions_with_rows_over_z_keep_them_split_between_them():
    """On a ``2 × 1 × 2`` grid (Gz = 2) the trunk's 3D regions cut their rows to z blocks
    once, at the first region's entry (its input and the residual beside it), and keep
    them split through the residual adds and layer norms; the rows are gathered over z
    once, before the vocabulary's head (Megatron's, which reads whole rows)."""
    strategy = {"data": 1, "tensor": 4, "regions": {"kind:attention": GRID_2X1X2, "kind:linear_chain": GRID_2X1X2,
                                                    "kind:vocab": "megatron"}}
    plan = _plan(transformer, 4, strategy)
    assert plan.tensor_grid == {"x": 2, "y": 1, "z": 2} and plan.form == "mixed tensor3d 2x1x2"
    assert plan.region_grid.z == 2 and plan.rank_grid().coordinates(3) == {"data": 0, "z": 1, "y": 0, "x": 1}
    assert Plan.from_json(plan.to_json()).to_json() == plan.to_json()
    chains = [r for r in plan.regions if r.strategy == "tensor3d"]
    assert "rows cut to z blocks" in chains[0].details["boundary"]
    assert all("rows kept split over z from the previous 3D region" in r.details["boundary"] for r in chains[1:])
    assert "their rows split over z" in plan.explain()
    model, inputs, loss_fn, target = transformer()
    code = rank_graph_code(autopar.rank_graph(model, plan, 3, inputs, loss_fn, target), plan, 3)
    assert code.count(", 0, 'z')") == 3  # two cuts at the first entry, one gather before the head
    assert code.count("autopar_runtime_collectives_gather_from_tensor_region(") == 1 + 4  # + each exit over y


def test_rows_over_z_must_divide_a_data_replica():
    model, inputs, loss_fn, target = transformer()
    with pytest.raises(PlanError, match=r"region attention:\S+: pinned to tensor3d 1x1x8 .* its 4 rows per data rank "
                                        r"\(dim 0 of its input\) do not divide by Gz = 8"):
        autopar.plan(model, 8, inputs, loss_fn, {"data": 1, "tensor": 8, "regions": {
            "kind:attention": {"tensor3d": {"x": 1, "y": 1, "z": 8}}}}, example_target=target)


def test_pipeline_of_mixed_stages_plans_each_stage_with_its_own_families():
    plan = _plan(stem_trunk, 4, {"pipeline": 2, "tensor": 2, "regions": {"kind:fork_join": "dsp",
                                                                         "kind:attention": "megatron"}})
    fork = next(r for r in plan.regions if r.kind == "fork_join")
    assert fork.strategy == "dsp" and fork.details["stage"] == 0
    assert plan.region_details("dsp", 0) and not plan.region_details("dsp", 1)
    assert [len(plan.regions_with("megatron", s)) for s in (0, 1)] == [1, 1]
    assert plan.form == f"pipeline {plan.pipeline['schedule']}, mixed" and plan.mesh == {"pipeline": 2, "data": 1,
                                                                                        "tensor": 2}
    assert Plan.from_json(plan.to_json()).to_json() == plan.to_json()
    grid = _plan(transformer, 8, {"pipeline": 2, "x": 2, "y": 2, "z": 1})
    assert grid.form == f"pipeline {grid.pipeline['schedule']}, mixed tensor3d 2x2" and grid.tensor_grid == {"x": 2, "y": 2}
    assert {r.strategy for r in grid.regions if r.kind in ("attention", "linear_chain")} == {"tensor3d"}
    assert grid.rank_grid().coordinates(5) == {"pipeline": 1, "data": 0, "y": 0, "x": 1}


def test_dsp_sub_grids_of_the_tensor_group_split_their_branches_with_megatron():
    """D&SP over 2 sub-grids of a tensor group of 4: the towers' chains are Megatron
    regions over their sub-grid (group ``tensor_sub``); the rank grid names the
    sub-grid and the place in it."""
    from examples.factories import training_case
    factory, inputs, target, loss_fn = training_case("tower_trunk")
    plan = autopar.plan(factory(), 4, inputs, loss_fn, {"data": 1, "tensor": 4, "regions": {
        "kind:fork_join": {"dsp": {"subgrids": 2}}, "kind:attention": "megatron"}}, example_target=target)
    assert plan.tensor_subgrids == 2
    towers = [r for r in plan.regions if ".towers." in r.region]
    assert {r.strategy for r in towers} == {"megatron"}
    assert {r.details["group"] for r in towers} == {"tensor_sub"} and {r.details["degree"] for r in towers} == {2}
    assert plan.rank_grid().coordinates(3) == {"data": 0, "tensor_seg": 1, "tensor_sub": 1}
    code = rank_graph_code(autopar.rank_graph(factory(), plan, 3, inputs, loss_fn, target), plan, 3)
    assert "'tensor_sub'" in code and "'tensor_seg'" in code
    with pytest.raises(PlanError, match="combine with no 3D grid"):
        autopar.plan(factory(), 4, inputs, loss_fn, {"data": 1, "tensor": 4, "regions": {
            "kind:fork_join": {"dsp": {"subgrids": 2}}, "kind:attention": GRID_2X2}}, example_target=target)


def test_three_d_regions_back_to_back_meet_split_over_y():
    """The programme's state: the first chain's transposed layer leaves its output split
    over y and the second chain's plain layer reads it so (axonn end of §III-B); the
    rank program has no re-layout between them."""
    plan = _plan(mlp, 4, {"data": 1, "tensor": 4, "regions": {"kind:linear_chain": GRID_2X2}})
    chains = [r for r in plan.regions if r.kind == "linear_chain"]
    assert [r.strategy for r in chains] == ["tensor3d", "tensor3d"]
    assert "output read split over y by the next 3D region" in chains[0].details["boundary"]
    assert "input read split over y from the previous 3D region" in chains[1].details["boundary"]
    model, inputs, loss_fn, target = mlp()
    code = rank_graph_code(autopar.rank_graph(model, plan, 0, inputs, loss_fn, target), plan, 0)
    assert code.count("= autopar_runtime_collectives_scatter_to_tensor_region(") == 1
    assert code.count("= autopar_runtime_collectives_gather_from_tensor_region(") == 1


@pytest.mark.parametrize("strategy, message", [
    ({"tensor": 2, "regions": {"linear_chain:nowhere.*": "megatron"}}, "names no region of"),
    ({"tensor": 2, "regions": {"kind:fork_join": {"dsp": {"subgrids": 4}}}}, "must divide the tensor degree 2"),
    ({"tensor": 4, "regions": {"kind:linear_chain": {"tensor3d": {"x": 2, "y": 1}}}}, "x·y·z = 4"),
    ({"tensor": 4, "regions": {"kind:linear_chain": {"tensor3d": {"x": 2, "y": 2, "z": 2}}}}, "has 8 ranks, the tensor "
                                                                                        "group 4"),
    ({"tensor": 4, "regions": {"kind:attention": "cube"}}, "Bian's cube has no per-region layout"),
    ({"tensor": 2, "pipeline": 2, "regions": {"kind:attention": {"tensor3d": {"x": 1, "y": 1, "z": 2}}}},
     "which pipeline stages do not"),
    ({"tensor": 4, "regions": {"kind:attention": "dsp"}}, "it is no multi-branch region"),
    ({"tensor": 4, "regions": {"kind:fork_join": "megatron"}}, "a multi-branch region is split by D&SP"),
    ({"tensor": 4, "regions": {"kind:attention": "sideways"}}, "is no family"),
    ({"tensor": 4, "regions": {"kind:blocks": "megatron"}}, "unknown region kind"),
    ({"tensor": 4, "pipeline": 2, "x": 2, "y": 1, "z": 2}, "inside pipeline stages is x × y × 1"),
    ({"tensor": 2, "pipeline": 2, "subgrids": 2, "regions": {"kind:attention": "megatron"}}, "not ['subgrids']"),
    ({"tensor": 2, "pipeline": 2, "x": 2, "y": 2}, "tensor=2 is not the 3D grid's x·y = 4"),
    ({"tensor": 2, "pipeline": 2, "regions": {"kind:fork_join": {"dsp": {"subgrids": 4}}}}, "must divide the tensor"),
    ({"tensor": 2, "pipeline": 2, "regions": {"linear_chain:nowhere.*": "megatron"}}, "names no region of"),
    ({"tensor": 1, "data": 2, "pipeline": 2, "regions": {"kind:fork_join": "dsp"}}, "give 'tensor' above 1"),
])
def test_pins_that_cannot_run_are_clear_errors(strategy, message):
    with pytest.raises(PlanError, match=None) as caught:
        _plan(stem_trunk, 4, {"data": 4 // strategy["tensor"] if "pipeline" not in strategy else 1, **strategy})
    assert message in str(caught.value), caught.value


def test_megatron_pin_on_an_indivisible_region_names_it():
    # TinyTransformer: 4 heads, so a tensor degree of 8 does not divide them
    model, inputs, loss_fn, target = transformer()
    with pytest.raises(PlanError, match=r"region attention:.*pinned to megatron.*not divisible by the tensor "
                                        r"degree 8"):
        autopar.plan(model, 8, inputs, loss_fn, {"data": 1, "tensor": 8, "regions": {"kind:attention": "megatron"}},
                     example_target=target)


def test_auto_with_pins_alone_picks_the_mesh():
    plan = _plan(stem_trunk, 4, {"regions": {"kind:fork_join": "dsp"}})
    assert plan.mixed and plan.degree("tensor") in (2, 4)
    assert {r.strategy for r in plan.regions if r.kind == "fork_join"} == {"dsp"}


def test_a_dsp_pin_on_too_few_branches_names_the_region():
    with pytest.raises(PlanError, match=r"region fork_join:.*pinned to dsp.*3 branches cannot fill 4 sub-grids "
                                        r"of the tensor group"):
        _plan(inception_factory, 4, {"data": 1, "tensor": 4, "regions": {"kind:fork_join": "dsp"}})


def test_a_dsp_pin_on_branches_with_dropout_names_the_dropout():
    """Tensor ranks that run different branches would draw different numbers of dropout
    masks, and every later mask of a replicated value would differ between them."""
    import torch.nn as nn

    class Dropping(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(8, 8)
            self.a = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.1))
            self.b = nn.Linear(8, 8)
            self.out = nn.Linear(8, 2)

        def forward(self, x):
            h = self.inp(x)
            return self.out(self.a(h) + self.b(h))

    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    with pytest.raises(PlanError, match=r"pinned to dsp.*its branches hold dropout"):
        autopar.plan(Dropping(), 2, (x,), torch.nn.functional.cross_entropy,
                     {"data": 1, "tensor": 2, "regions": {"kind:fork_join": "dsp"}}, example_target=y)


def test_the_planner_picks_a_mixed_plan_where_it_is_predicted_fastest():
    """A wide multi-branch stem before a transformer trunk on 8 A100s (on the meta device):
    the trunk pays for Megatron over a tensor group of 2, and the stem's four branches
    then run one half each on the group's ranks rather than twice; the plan says what the
    best single-family plan would take."""
    with torch.device("meta"):
        model = StemTrunk(width=4096, heads=16, layers=2, side=16, stem=256)
    x = torch.zeros(16, 3, 16, 16, device="meta")
    y = torch.zeros(16, dtype=torch.long, device="meta")
    plan = autopar.plan(model, 8, (x,), torch.nn.functional.cross_entropy, "auto", example_target=y,
                        hardware="a100-selene")
    assert plan.mixed and plan.mesh == {"data": 4, "tensor": 2}
    strategies = {r.kind: r.strategy for r in plan.regions}
    assert strategies["fork_join"] == "dsp" and strategies["attention"] == "megatron"
    single = [c for c in plan.candidates if c.feasible and "mixed" not in c.form]
    assert min(c.step_s for c in single) > plan.step_s
    assert "best single-family plan: " in plan.explain() and "x the mixed plan's" in plan.explain()
    assert plan.why_not("mixed").startswith("mixed: chosen")


def _selene_estimates():
    """The Selene preset with its unfitted estimates (the raw link rates,
    matmul efficiency 0.8, full memory bandwidth): the hardware the two scenarios below
    were built on. Which family wins depends on the hardware; what they test is that the
    search finds a mixed plan where it is predicted fastest."""
    import dataclasses
    from autopar.cost.hardware import get_hardware
    return dataclasses.replace(get_hardware("a100-selene"), name="a100-selene-estimates", matmul_efficiency=0.8,
                               memory_efficiency=1.0, intra_node_bandwidth=300e9, inter_node_bandwidth=25e9)


def test_auto_weighs_pipelines_of_mixed_stages_and_takes_them_where_predicted_faster():
    """8 trunk layers on 32 A100s: in the second round of the search, PTD-P whose first
    stage spreads the stem with D&SP over the tensor group (Megatron on the trunk) is
    predicted faster than PTD-P with Megatron inside at the same layout and schedule; the
    plan is the fastest of all (a deeper zero-bubble pipeline without a tensor group,
    docs/pipelining.md#zero-bubble-schedules, wins on these estimates)."""
    with torch.device("meta"):
        model = StemTrunk(width=4096, heads=16, layers=8, classes=1000, side=16, stem=256)
    x = torch.zeros(64, 3, 16, 16, device="meta")
    y = torch.zeros(64, dtype=torch.long, device="meta")
    plan = autopar.plan(model, 32, (x,), torch.nn.functional.cross_entropy, "auto", example_target=y,
                        hardware=_selene_estimates())
    feasible = [c for c in plan.candidates if c.feasible]
    assert plan.step_s == pytest.approx(min(c.step_s for c in feasible))
    mixed = [c for c in feasible if c.form.startswith("pipeline") and c.form.endswith(", mixed")]
    assert mixed
    for c in mixed:  # the same layout and schedule with Megatron inside
        plain = [o for o in feasible if o.mesh == c.mesh and o.form == c.form[:-len(", mixed")]]
        if plain:
            assert c.step_s < plain[0].step_s, (c.mesh, c.form)
    forced = autopar.plan(model, 32, (x,), torch.nn.functional.cross_entropy, {"pipeline": 4, "tensor": 2,
                          "regions": {"kind:fork_join": "dsp"}}, example_target=y, hardware=_selene_estimates())
    fork = next(r for r in forced.regions if r.kind == "fork_join")
    assert fork.strategy == "dsp" and fork.details["stage"] == 0
    assert {r.strategy for r in forced.regions if r.kind == "attention"} == {"megatron"}


def test_auto_picks_a_mixed_plan_for_attention_between_expert_towers():
    """A second model: TowerTrunk (4 blocks of attention then four summed MLP towers of
    widths h..4h, h = 8192) on 8 A100s. Megatron splits the attention and the vocabulary;
    D&SP spreads each block's towers over the tensor pair, one all-reduce at the join
    instead of one per tower."""
    from examples.models import TowerTrunk
    with torch.device("meta"):
        model = TowerTrunk(vocab=32000, width=8192, heads=32, layers=4, block=2048)
    x = torch.zeros(8, 2048, dtype=torch.long, device="meta")
    from examples.models import lm_loss
    plan = autopar.plan(model, 8, (x,), lm_loss, "auto", example_target=x, hardware="a100-selene")
    assert plan.mixed and not plan.pipeline and plan.mesh == {"data": 4, "tensor": 2}
    kinds = {}
    for r in plan.regions:
        kinds.setdefault(r.kind, set()).add(r.strategy)
    assert kinds["fork_join"] == {"dsp"} and kinds["attention"] == {"megatron"}
    single = [c for c in plan.candidates if c.feasible and "mixed" not in c.form]
    assert min(c.step_s for c in single) > plan.step_s


def test_auto_picks_a_mixed_plan_with_a_3d_trunk_whose_rows_are_split_over_z():
    """A GPT of width 8192 (4 layers, 32k vocabulary) at batch 8 on 16 A100s: the tensor
    group of 8 as AxoNN's ``4 × 1 × 2`` grid for attention and MLPs (rows over z, kept
    split between them) with the vocabulary Megatron-split, ahead of Megatron over 8
    and of every whole-network 3D grid (which keeps the vocabulary whole)."""
    from examples.models import TinyTransformer, lm_loss
    with torch.device("meta"):
        model = TinyTransformer(vocab=32000, width=8192, heads=64, layers=4, block=2048)
    x = torch.zeros(8, 2048, dtype=torch.long, device="meta")
    plan = autopar.plan(model, 16, (x,), lm_loss, "auto", example_target=x, hardware=_selene_estimates())
    assert plan.mixed and plan.mesh == {"data": 2, "tensor": 8} and plan.form == "mixed tensor3d 4x1x2"
    kinds = {}
    for r in plan.regions:
        kinds.setdefault(r.kind, set()).add(r.strategy)
    assert kinds["vocab"] == {"megatron"} and kinds["attention"] == kinds["linear_chain"] == {"tensor3d"}
    single = [c for c in plan.candidates if c.feasible and "mixed" not in c.form]
    assert min(c.step_s for c in single) > plan.step_s
    assert "best single-family plan: data=2 x tensor=8 (megatron)" in plan.explain()


def test_auto_spreads_towers_over_sub_grids_of_the_tensor_group_where_it_balances_them():
    """TowerTrunk (h = 16384, 2 blocks) on 16 A100s: a tensor group of 4 is needed, and
    the towers (widths h..4h) balance on 2 sub-grids of 2 ranks ({h, 4h} and {2h, 3h}),
    each tower Megatron-split inside its sub-grid, better than one tower per rank or
    Megatron over all 4."""
    from examples.models import TowerTrunk, lm_loss
    with torch.device("meta"):
        model = TowerTrunk(vocab=32000, width=16384, heads=32, layers=2, block=2048)
    x = torch.zeros(16, 2048, dtype=torch.long, device="meta")
    plan = autopar.plan(model, 16, (x,), lm_loss, "auto", example_target=x, hardware="a100-selene")
    assert plan.mesh == {"data": 4, "tensor": 4} and plan.tensor_subgrids == 2
    assert plan.form == "mixed dsp 2 sub-grids"
    towers = [r for r in plan.regions if ".towers." in r.region]
    assert {(r.strategy, r.details["group"]) for r in towers} == {("megatron", "tensor_sub")}
    single = [c for c in plan.candidates if c.feasible and "mixed" not in c.form]
    assert min(c.step_s for c in single) > plan.step_s
    assert "D&SP over 2 sub-grids of it" in plan.explain()
