"""Planning a pipeline (megatron §2.2-§3): the cost model's bubble, activations in flight
and microbatch choice, the stage table of explain(), and bad input named clearly."""
import re

import pytest
import torch

import autopar
import shared_ranks
from autopar.strategies.pipeline import cost as pp
from autopar.cost.hardware import get_hardware
from examples.models import TinyTransformer, gpt2, gpt2_loss, lm_loss


def _lm(batch=8, layers=4, model="transformer"):
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (batch, 16))
    target = torch.randint(0, 64, (batch, 16))
    if model == "gpt2":
        return gpt2(layers=layers), ids, target, gpt2_loss
    return TinyTransformer(layers=layers), ids, target, lm_loss


def _plan(world, strategy, **kw):
    model, ids, target, loss = _lm(**kw)
    return autopar.plan(model, world, (ids,), loss, strategy, example_target=target)


def test_in_flight_follows_the_schedule():
    # GPipe keeps every microbatch, 1F1B at most p - r (megatron §2.2.1)
    assert [pp.in_flight("gpipe", 4, 8, 1, r) for r in range(4)] == [[8]] * 4
    assert [pp.in_flight("1f1b", 4, 8, 1, r) for r in range(4)] == [[4], [3], [2], [1]]
    # interleaved: the warm-up's 2(p-r-1) + (v-1)p forwards and one more (megatron §2.2.2)
    assert [sum(pp.in_flight("interleaved", 4, 8, 2, r)) for r in range(4)] == [11, 9, 7, 5]


def test_in_flight_closed_form_equals_the_schedules_action_lists():
    # the planner counts in closed form; the runtime's schedules are the truth
    from autopar.planning.schedules import schedule

    def simulated(name, p, m, v, rank):
        held, worst, at = [0] * v, -1, [0] * v
        for action in schedule(name, p, m, rank, v):
            held[action.chunk] += 1 if action.kind == "F" else -1
            if sum(held) > worst:
                worst, at = sum(held), list(held)
        return at

    for name, chunks in (("gpipe", (1,)), ("1f1b", (1,)), ("interleaved", (1, 2, 3))):
        for p in range(1, 7):
            for v in chunks:
                for m in range(1, 25):
                    if v > 1 and m % p:
                        continue
                    for r in range(p):
                        assert pp.in_flight(name, p, m, v, r) == simulated(name, p, m, v, r), (name, p, m, v, r)


def test_bubble_and_memory_in_the_plan():
    gpipe = _plan(4, {"pipeline": 4, "microbatches": 8, "schedule": "gpipe"})
    one_f = _plan(4, {"pipeline": 4, "microbatches": 8, "schedule": "1f1b"})
    inter = _plan(4, {"pipeline": 4, "microbatches": 8, "chunks": 2, "schedule": "interleaved"}, layers=8)
    assert gpipe.pipeline["bubble_fraction"] == one_f.pipeline["bubble_fraction"] == 3 / 8
    assert inter.pipeline["bubble_fraction"] == 3 / 16
    # the same work, the same bubble: GPipe and 1F1B predict the same step ...
    assert gpipe.step_s == pytest.approx(one_f.step_s)
    # ... but 1F1B keeps fewer microbatches' activations on every rank but the first
    assert max(one_f.pipeline["memory_bytes"]) < max(gpipe.pipeline["memory_bytes"])
    # recomputation keeps only each stage's inputs per microbatch in flight
    assert all(a < b for a, b in zip(gpipe.pipeline["memory_bytes_recompute"], gpipe.pipeline["memory_bytes"]))
    # the bubble's seconds: (p-1)/(v·m) of the ideal m·t
    t = max(one_f.pipeline["rank_s"])
    assert one_f.pipeline["bubble_s"] == pytest.approx(3 * t)
    assert one_f.mesh == {"pipeline": 4, "data": 1, "tensor": 1}


def test_point_to_point_bytes_are_the_hidden_state():
    plan = _plan(2, {"pipeline": 2, "microbatches": 4})
    # b·s·h float32: 2 rows x 16 positions x 32 wide per microbatch (megatron §4.1)
    assert plan.pipeline["p2p_bytes"] == [2 * 16 * 32 * 4]
    with_t = _plan(4, {"pipeline": 2, "tensor": 2, "microbatches": 4})
    assert with_t.pipeline["scatter_gather"] is True


def test_microbatch_count_follows_eq_1():
    """Without 'microbatches' the planner takes the fastest m: with free kernels and links
    the bubble decides (the most microbatches); with costly launches, fewer."""
    import dataclasses
    fast = dataclasses.replace(get_hardware("a100-selene"), kernel_launch_s=0.0, inter_node_latency_s=0.0,
                               intra_node_latency_s=0.0, saturation_flops=0.0)
    slow = dataclasses.replace(fast, kernel_launch_s=1e-3)
    model, ids, target, loss = _lm(batch=16)
    free = autopar.plan(model, 2, (ids,), loss, {"pipeline": 2}, example_target=target, hardware=fast)
    costly = autopar.plan(model, 2, (ids,), loss, {"pipeline": 2}, example_target=target, hardware=slow)
    assert free.pipeline["microbatches"] == 16
    assert costly.pipeline["microbatches"] < 16


def test_tied_embedding_and_head_split_the_vocabulary_on_both_ends_under_tensor_parallelism():
    """Megatron keeps the tie with a split vocabulary: the vocab region runs on the first
    stage (lookups) and the last (head), both over the tensor ranks with the same rows."""
    plan = _plan(4, {"pipeline": 2, "tensor": 2, "microbatches": 2}, model="gpt2")
    vocab = next(r for r in plan.regions if r.kind == "vocab")
    assert vocab.strategy == "megatron" and vocab.details["stage"] == [0, 1]
    assert plan.pipeline["tied"] == ["model.lm_head.weight"]
    assert plan.regions_with("megatron", 0)[0] == vocab.region and plan.regions_with("megatron", 1)[0] == vocab.region


def test_plan_directory_has_the_timeline(tmp_path):
    plan = _plan(2, {"pipeline": 2, "microbatches": 4})
    plan.save(str(tmp_path), rank_graphs={}, region_dot=None)
    assert (tmp_path / "timeline.txt").read_text().startswith("rank 0 |")
    assert (tmp_path / "timeline.svg").read_text().startswith("<svg")
    assert "timeline (unit: one chunk's forward" in (tmp_path / "plan.txt").read_text()
    again = autopar.Plan.load(str(tmp_path))
    assert again.pipeline == plan.pipeline and again.to_json() == plan.to_json()


def test_bad_input_is_named():
    with pytest.raises(autopar.PlanError, match=r"pipeline: 4 stages need at least 4 repeated blocks to cut "
                                                r"between; the model has 2"):
        _plan(4, {"pipeline": 4}, layers=2)
    with pytest.raises(autopar.PlanError, match=r"4 stages need at least 4 repeated blocks.*p·v for the interleaved"):
        _plan(2, {"pipeline": 2, "chunks": 2}, layers=2)
    with pytest.raises(autopar.PlanError, match=r"interleaved schedule needs the number of microbatches to be a "
                                                r"multiple of the pipeline ranks .* microbatches=3 is not a multiple "
                                                r"of pipeline=2"):
        _plan(2, {"pipeline": 2, "chunks": 2, "microbatches": 3, "schedule": "interleaved"}, batch=6)
    with pytest.raises(autopar.PlanError, match=r"microbatches=3 does not divide the batch of each data rank "
                                                r"\(8 / data 1 = 8\)"):
        _plan(2, {"pipeline": 2, "microbatches": 3})
    with pytest.raises(autopar.PlanError, match=r"pipeline=3 does not divide the world of 4 ranks"):
        _plan(4, {"pipeline": 3})
    with pytest.raises(autopar.PlanError, match=r"chunks=2 needs an interleaved schedule .* not 'gpipe'"):
        _plan(2, {"pipeline": 2, "chunks": 2, "schedule": "gpipe"})
    with pytest.raises(autopar.PlanError, match=r"unknown schedule 'zigzag'"):
        _plan(2, {"pipeline": 2, "schedule": "zigzag"})
    with pytest.raises(autopar.PlanError, match=r"a pipeline combines with 'data', 'tensor', .* not \['subgrids'\]"):
        _plan(4, {"pipeline": 2, "subgrids": 2})
    with pytest.raises(autopar.PlanError, match=r"\['schedule'\] set up a pipeline; add 'pipeline'"):
        _plan(2, {"data": 2, "schedule": "1f1b"})
    # without a pipeline, microbatches are gradient accumulation (docs/memory.md)
    assert _plan(2, {"data": 2, "microbatches": 2}).microbatches == 2


def _step_with_other_batch():
    """The error each rank ends with: its own, or (a rank still leaving compile when the
    other already raised in step) the other's, quoted in a RankFailureError."""
    model, ids, target, loss = _lm(layers=2)
    try:
        pm = autopar.compile(model, None, example_inputs=(ids,), loss_fn=loss, example_target=target,
                             strategy={"pipeline": 2, "microbatches": 4})
        pm.step(ids[:6], target=target[:6])
        return "no error"
    except Exception as e:  # noqa: BLE001 - raised alike on both ranks, before any transfer
        return f"{type(e).__name__}: {e}"


_LAUNCHED = shared_ranks.register(2, __name__, _step_with_other_batch)  # one launch with other modules' jobs


@pytest.mark.multiprocess
def test_call_time_batch_not_divisible_by_the_microbatches_is_an_error_on_every_rank():
    for error in _LAUNCHED():
        assert re.search(r"the batch of each data rank \(6\) is not divisible by the 4 microbatches", error), error


def test_cli_parses_a_pipeline_strategy():
    from autopar.cli import _parse_strategy
    assert _parse_strategy("pipeline=4,microbatches=8,schedule=gpipe") == {
        "pipeline": 4, "microbatches": 8, "schedule": "gpipe"}


def test_auto_weighs_pipelines_and_takes_one_when_only_it_fits():
    import dataclasses
    model, ids, target, loss = _lm(layers=4)
    # without sequence parallelism's saving a tensor plan needs more memory than a pipeline
    auto = {"sequence_parallel": False}
    plan = autopar.plan(model, 4, (ids,), loss, auto, example_target=target)
    # each layout at its best schedule: one chunk per rank (1F1B or ZB-H1), or two
    offered = {(c.mesh.get("pipeline"), "v=2" in c.form) for c in plan.candidates if c.form.startswith("pipeline")}
    assert (2, False) in offered and (2, True) in offered
    assert (4, False) in offered and (4, True) not in offered  # 8 blocks needed
    # a device too small for the other meshes but not for a pipeline: auto pipelines
    piped = min(c.memory_bytes for c in plan.candidates if c.feasible and c.form.startswith("pipeline"))
    others = min(c.memory_bytes for c in plan.candidates if c.feasible and not c.form.startswith("pipeline"))
    assert piped < others
    small = dataclasses.replace(get_hardware(None), memory_bytes=(piped + others) / 2)
    chosen = autopar.plan(model, 4, (ids,), loss, auto, example_target=target, hardware=small)
    assert chosen.pipeline and not chosen.forced and chosen.total.memory_bytes <= small.memory_bytes
    assert any(not c.feasible and "needs" in c.reason for c in chosen.candidates)
    assert "* pipeline=" in chosen.explain()
