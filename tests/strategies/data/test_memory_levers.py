"""The memory levers of every plan (docs/memory.md): gradient accumulation, ZeRO and
recomputation forced beside any family's keys.

On gloo ranks against the single-device model in float64 (outputs, loss, every gradient,
the gradient norm, the parameters after 3 AdamW steps):

* gradient accumulation over 2 microbatches under data (GPT-2, an export graph), data ×
  tensor, D&SP and an AxoNN grid: each training program runs a microbatch's rows;
* ZeRO-1, -2 and -3 on ``data=4``, ZeRO-3 on ``data=2 × tensor=2`` and in a pipeline
  (``pipeline=2 × data=2``; ZeRO-1 and -2 on the last two in the extended suite): every
  rank holds a quarter (a half) of the parameters it would hold without ZeRO, and ZeRO-3
  reads them through all-gathers, prefetched;
* selective recomputation of the attention cores (data × tensor, and a GPT-2 pipeline);
  ZeRO-3 with accumulation and full recomputation at once (full recomputation under pure
  data parallelism in the extended suite).

Without ranks: the forcing keys and their errors, the row shards' arithmetic.
"""
import pytest
import torch

import autopar
import shared_ranks
from autopar.planning.strategy import PlanError, Strategy
from autopar.strategies.data.zero import RowShard, shardable
from autopar.testing import equivalence_job
from examples.factories import inception, transformer

F64 = {"dtype": "float64", "batch": 8}
CASES = [
    # gradient accumulation in every family without a pipeline
    ("gpt2", {"data": 4, "microbatches": 2}, F64),
    ("transformer", {"data": 2, "tensor": 2, "microbatches": 2}, F64),
    # ZeRO's stages on data, data × tensor and in a pipeline
    ("transformer", {"data": 4, "zero": 3}, F64),
    ("gpt2", {"data": 2, "tensor": 2, "zero": 3}, F64),
    # selective recomputation: the attention cores only (an fx graph, and GPT-2's export graph under a pipeline)
    ("transformer", {"data": 2, "tensor": 2, "recompute": "selective"}, F64),
    # all three levers at once
    ("transformer", {"data": 2, "tensor": 2, "zero": 3, "microbatches": 2, "recompute": "full"}, F64),
]
# ZeRO-1 and 2 on data × tensor and in a pipeline and ZeRO-1 on data 4 (ZeRO-3 there, ZeRO-2
# on data 4 in the main suite), full recomputation under data parallelism alone (with tensor and ZeRO-3 in the
# main suite's case of all three levers): the extended suite
EXTENDED = [("gpt2", {"data": 2, "tensor": 2, "zero": 2}, F64),
            ("towers", {"subgrids": 2, "microbatches": 2}, {"dtype": "float64"}),
            ("transformer", {"x": 2, "y": 2, "z": 1, "data": 1, "microbatches": 2}, F64),
            ("transformer", {"data": 4, "zero": 2}, F64),
            ("transformer", {"pipeline": 2, "data": 2, "microbatches": 2, "zero": 3}, F64),
            ("gpt2", {"pipeline": 2, "data": 2, "microbatches": 2, "recompute": "selective"}, F64),
            ("transformer", {"data": 4, "zero": 1}, F64),
            ("transformer", {"pipeline": 2, "data": 2, "microbatches": 2, "zero": 2}, F64),
            ("gpt2", {"data": 2, "tensor": 2, "zero": 1}, F64),
            ("transformer", {"pipeline": 2, "data": 2, "microbatches": 2, "zero": 1}, F64),
            ("transformer", {"data": 4, "recompute": "full"}, F64)]
_EQUIVALENCE = shared_ranks.register(4, __name__, equivalence_job, (CASES,), timeout_s=600)
_EXTENDED = shared_ranks.register(4, __name__ + ":extended", equivalence_job, (EXTENDED,), timeout_s=600,
                                  extended=True)


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_levers_match_single_device(index):
    _check(CASES[index][1], [reports[index] for reports in _EQUIVALENCE()])


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(EXTENDED)), ids=[f"{c[0]}-{i}" for i, c in enumerate(EXTENDED)])
def test_the_levers_beside_tensor_and_pipeline_match_single_device(index):
    _check(EXTENDED[index][1], [reports[index] for reports in _EXTENDED()])


def _check(strategy, reports) -> None:
    for report in reports:
        for key in ("output", "loss", "grad", "grad_norm"):
            assert report[key][1] < 1e-12, (key, report)
        assert report["param"][0] < 1e-12, report
        data = strategy.get("data", 4)
        rows = 8 // data // strategy.get("microbatches", 1) if "subgrids" not in strategy else 1
        if "microbatches" in strategy and "pipeline" not in strategy:
            assert report["program_rows"] == [rows], report["program_rows"]  # a microbatch at a time
        if "zero" in strategy:
            # every parameter of these models has at least one row per data rank: a 1/d share
            # of what the rank holds without ZeRO, but for blocks that do not divide evenly
            assert report["held_params"] <= report["held_without_zero"] / data * 1.02 + 64, report
            assert report["held_without_zero"] < report["all_params"] or data == 4
            stats = report["zero_stats"]
            if strategy["zero"] == 3:  # units prefetched; backward gathers again what forward freed
                # (a pipeline stage's last unit is still held when its backward starts, and the
                # other's, an embedding, keeps no weight for backward)
                assert stats["prefetched"] > 0 and (stats["regathered"] > 0 or "pipeline" in strategy), stats
            else:
                assert stats == {"gathered": 0, "prefetched": 0, "regathered": 0}, stats
        if strategy.get("recompute") == "full":
            assert report["recomputed"] == 2, report["recomputed"]  # one checkpointed call per block
        if "pipeline" in strategy:  # the data all-reduce launched during the last backwards (ZeRO's after)
            assert (report["buckets_in_backward"] > 0) == ("zero" not in strategy), report["buckets_in_backward"]
        if strategy.get("recompute") == "selective":  # one per attention core of the rank's program(s)
            assert report["recomputed"] == (1 if "pipeline" in strategy else 2), report["recomputed"]
            assert "recompute_attention" in report["code"] and "recompute_block" not in report["code"]


# ---------------------------------------------------------------------- without ranks
def test_row_shards_cover_every_row_once_and_round_trip():
    for rows, size in [(8, 4), (5, 4), (4, 4), (7, 2), (96, 3)]:
        spans = [RowShard.block(rows, size, i) for i in range(size)]
        assert spans[0][0] == 0 and spans[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert max(b - a for a, b in spans) - min(b - a for a, b in spans) <= 1
        assert min(b - a for a, b in spans) >= 1  # a shardable parameter leaves no rank empty
        full = torch.arange(rows * 3.0).view(rows, 3)
        cuts = [RowShard("data", size, i, rows, 2) for i in range(size)]
        padded = torch.cat([c.pad(c.local(full)) for c in cuts])
        assert torch.equal(cuts[0].unpad(padded, (rows, 3)), full)
    assert not shardable((), 2) and not shardable((3,), 4) and shardable((4, 2), 4)


@pytest.mark.parametrize("strategy,message", [
    ({"data": 4, "microbatches": 0}, "microbatches=0"),
    ({"data": 2, "tensor": 2, "microbatches": 3}, "microbatches=3 does not divide the 2 rows of each data rank"),
    ({"data": 4, "zero": 4}, "zero=4"),
    ({"data": 1, "tensor": 4, "zero": 1}, "has 1; give 'data': d with d > 1"),
    ({"data": 4, "recompute": "attention"}, "recompute='attention'"),
    ({"subgrids": 2, "csub": True, "microbatches": 2}, "D&SP-cSub"),
    ({"x": 2, "y": 2, "z": 1, "data": 1, "zero": 1}, "has 1"),
])
def test_levers_that_cannot_run_are_clear_errors(strategy, message):
    model, inputs, loss_fn, target = transformer()  # batch 4
    if "subgrids" in strategy:
        model, inputs, loss_fn, target = inception()
    with pytest.raises(PlanError, match=message.replace("(", r"\(")):
        autopar.plan(model, 4, inputs, loss_fn, strategy, example_target=target)


def test_levers_ride_on_any_family_and_alone():
    model, inputs, loss_fn, target = transformer()
    plan = autopar.plan(model, 4, inputs, loss_fn, {"data": 2, "tensor": 2, "zero": 2, "microbatches": 2},
                        example_target=target)
    assert (plan.mesh, plan.zero, plan.microbatches) == ({"data": 2, "tensor": 2}, 2, 2)
    assert autopar.planning.plan.Plan.from_json(plan.to_json()).zero == 2
    alone = Strategy.parse({"zero": 3})
    assert alone.levers_only and alone.levers() == {"zero": 3}
    plan = autopar.plan(model, 4, inputs, loss_fn, {"zero": 3}, example_target=target)
    assert plan.zero == 3 and plan.degree("data") > 1
    assert Strategy.parse({"pipeline": 2, "microbatches": 4, "zero": 1}).microbatches == 4


def test_forced_recomputation_is_priced_in_a_pipeline():
    """A pipeline forced to recompute its blocks is priced recomputing them (a second
    forward in each backward), not priced without and marked afterwards; forcing "none"
    prices it keeping them."""
    model, inputs, loss_fn, target = transformer()
    kept, full = (autopar.plan(model, 4, inputs, loss_fn, {"pipeline": 2, "microbatches": 2, "recompute": mode},
                               example_target=target) for mode in ("none", "full"))
    assert full.recompute and not kept.recompute
    assert full.step_s > kept.step_s and full.flops_per_step == 4 / 3 * kept.flops_per_step
    assert full.total.memory_bytes < kept.total.memory_bytes


def test_megatron_table_1_small_models_plan_data_parallel_with_accumulation():
    """Megatron Table 1's 1.7B on 32 A100s ran as t=1 p=1 d=32 with gradient accumulation:
    the whole batch of a data rank (16 sequences of 2048) does not fit, 4 microbatches do."""
    from autopar.trace.capture import capture
    from autopar.passes.analysis.analyse import analyse
    from autopar.cost.hardware import get_hardware
    from autopar.driver.search import plan_graph
    from examples.factories import gpt_meta
    model, inputs, loss, target = gpt_meta(24, 2304, 24, 512)
    plan = plan_graph(analyse(capture(model, inputs, loss, target)), 32, get_hardware("a100-selene"))
    assert plan.mesh == {"data": 32, "tensor": 1} and not plan.pipeline and not plan.recompute
    assert plan.microbatches > 1 and plan.total.memory_bytes <= get_hardware("a100-selene").memory_bytes
    assert f"gradients accumulated over {plan.microbatches} microbatches" in plan.explain()


def test_axonn_cache_keeps_the_layers_that_fit():
    """axonn §IV-D: under full recomputation the all-gather cache keeps the gathered
    weights of the layers that fit (the paper: 28 of 32 layers); the rest are gathered
    again when backward recomputes them. A 32-block GPT (hidden 8192) on a 4x4x4 grid:
    with 80 GiB every block's weights are cached; with 2.5 blocks' worth less, 28
    blocks' (and the block being recomputed its own: 29 blocks' worth); each block's
    four linears gather 12·8192²/16 weights, 192 MiB."""
    import dataclasses
    from autopar.trace.capture import capture
    from autopar.passes.analysis.analyse import analyse
    from autopar.cost.hardware import get_hardware
    from autopar.driver.search import plan_graph
    from examples.factories import gpt_meta
    facts = analyse(capture(*gpt_meta(32, 8192, 64, 16)))
    strategy = {"x": 4, "y": 4, "z": 4, "data": 1, "recompute": "full"}
    roomy = plan_graph(facts, 64, get_hardware("a100-selene"), strategy=strategy)
    assert roomy.recompute and roomy.gather_cache is None  # every layer's weights cached
    block = 12 * 8192 ** 2 / 16 * 4
    limit = roomy.total.memory_bytes - 2.5 * block
    tight = plan_graph(facts, 64, dataclasses.replace(get_hardware("a100-selene"), memory_bytes=limit),
                       strategy=strategy)
    assert tight.recompute and tight.gather_cache == 28 * 4 and tight.microbatches == 1
    assert tight.step_s > roomy.step_s and tight.total.memory_bytes <= limit
    assert "keeps at most 112 3D layers' gathered weights" in tight.explain()
    assert autopar.planning.plan.Plan.from_json(tight.to_json()).gather_cache == 112
