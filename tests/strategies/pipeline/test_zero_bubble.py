"""Zero-bubble pipelines (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024):
the backward split into input and weight passes, the ZB-H1, interleaved zero-bubble and
ZB-V orders (against torch.distributed.pipelining's own), the timeline simulator, the
cost model's pricing of them and the planner's choice. The numerics on ranks are in
tests/strategies/pipeline/test_pipeline_numerics.py."""
import pytest
import torch
import torch.nn as nn

from autopar.planning.schedules import SCHEDULES, ScheduleError, check_chunks, rank_of, schedule, stage_of
from autopar.planning.strategy import PlanError, Strategy
from autopar.planning.timeline import DeadlockError, simulate
from autopar.strategies.pipeline import cost as pipeline_cost
from autopar.strategies.pipeline.backward import input_pass


# ---------------------------------------------------------------- the B/W split
class _Stage(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8)
        self.b = nn.Linear(8, 6)
        self.scale = nn.Parameter(torch.ones(6))

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.b(self.norm(h) + h) * self.scale + x


def _twins():
    one, two = _Stage().double(), _Stage().double()
    two.load_state_dict(one.state_dict())
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    g = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    return one, two, x, g


def test_input_pass_gives_the_inputs_their_gradient_and_the_weights_none_until_w():
    whole, split, x, g = _twins()
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.autograd.backward(whole(x1), g)
    weights = input_pass([split(x2)], [g], [x2])
    assert torch.equal(x2.grad, x1.grad)
    assert all(p.grad is None for p in split.parameters())  # nothing of W ran in I
    assert weights.groups  # the linears' and the norm's backward nodes are the intermediates
    weights.run()
    for (name, p1), p2 in zip(whole.named_parameters(), split.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-14, atol=1e-14, msg=name)


def test_weight_pass_fires_the_gradient_hooks_the_buckets_rely_on():
    _, split, x, g = _twins()
    x = x.requires_grad_()
    ready = []
    for p in split.parameters():
        p.register_post_accumulate_grad_hook(lambda p: ready.append(p))
    weights = input_pass([split(x)], [g], [x])
    assert not ready
    weights.run()
    assert len(ready) == len(list(split.parameters()))


def test_first_stage_defers_its_whole_backward_to_w():
    whole, split, x, g = _twins()
    torch.autograd.backward(whole(x), g)
    weights = input_pass([split(x)], [g], [x])  # x needs no gradient (token ids)
    assert all(p.grad is None for p in split.parameters())
    weights.run()
    for p1, p2 in zip(whole.parameters(), split.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-14, atol=1e-14)


class _Modulated(nn.Module):
    """adaLN-style: a conditioning's weights scale the input path at two points, one below
    the other (DiT's modulations, a decoder's cross-attention memory used twice)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.cond = nn.Linear(3, 12)
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.c = nn.Linear(6, 6)

    def forward(self, x, cond):
        s1, s2 = self.cond(cond).chunk(2, -1)
        h = self.a(x) * (1 + s1)
        return self.c(self.b(h) * (1 + s2))


def test_weights_whose_value_meets_the_input_path_twice_get_their_whole_gradient():
    """The conditioning's weights reach the input path at two intermediates, the lower one
    through ``b``'s matmul, whose own pass (run earlier or later) must not have freed it."""
    one, two = _Modulated().double(), _Modulated().double()
    two.load_state_dict(one.state_dict())
    g = torch.Generator().manual_seed(1)
    x, cond, grad = (torch.randn(4, n, dtype=torch.float64, generator=g) for n in (6, 3, 6))
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.autograd.backward(one(x1, cond), grad)
    weights = input_pass([two(x2, cond)], [grad], [x2])
    assert any(len(group[0]) > 1 for group in weights.groups) and any(len(group[0]) == 1 for group in weights.groups)
    weights.run()
    for (name, p1), p2 in zip(one.named_parameters(), two.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-13, atol=1e-13, msg=name)


@pytest.mark.parametrize("outputs", ["sum", "gram", "bias", "leaf"])
def test_a_weight_reaching_an_output_beside_the_inputs_graph_is_not_split(outputs):
    """A weight the inputs' graph meets that also reaches an output another way (a bias
    sent on beside the hidden state, an output made of weights alone, a parameter
    returned as it is): W from the intermediates alone would lose that part."""
    def run(split):
        torch.manual_seed(0)
        p0 = nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
        x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
        bias = p0[0] * 1.0
        outs = {"sum": [x @ p0, p0.sum(0) * 3], "gram": [x @ p0, p0.t() @ p0],
                "bias": [x @ p0 + bias, bias], "leaf": [x @ p0, p0]}[outputs]
        grads = [torch.ones_like(o) for o in outs]
        if split:
            input_pass(outs, grads, [x]).run()
        else:
            torch.autograd.backward(outs, grads)
        return x.grad, p0.grad
    (x1, p1), (x2, p2) = run(False), run(True)
    torch.testing.assert_close(x2, x1, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(p2, p1, rtol=1e-14, atol=1e-14)


def test_a_received_input_passed_on_still_splits():
    """A stage that sends on a value it received unchanged (Llama's rotary tables) has a
    leaf among its outputs; that is no parameter, and the split is made."""
    whole, split, x, g = _twins()
    cos = torch.randn(4, 6, dtype=torch.float64)
    outs = {}
    for name, model in (("whole", whole), ("split", split)):
        xi, ci = x.clone().requires_grad_(), cos.clone().requires_grad_()
        y = model(xi) * ci
        grads = [g, torch.ones_like(ci)]
        if name == "whole":
            torch.autograd.backward([y, ci], grads)
        else:
            weights = input_pass([y, ci], grads, [xi, ci])
            assert weights.groups and all(p.grad is None for p in model.parameters())
            weights.run()
        outs[name] = (xi.grad, ci.grad, [p.grad for p in model.parameters()])
    for a, b in zip(outs["whole"][:2] + tuple(outs["whole"][2]), outs["split"][:2] + tuple(outs["split"][2])):
        torch.testing.assert_close(b, a, rtol=1e-14, atol=1e-14)


def test_a_weight_read_beside_the_inputs_graph_is_not_split():
    """A weight whose gradient reaches the outputs without meeting the input's graph
    would lose it in W: I runs the whole backward instead."""
    w = nn.Parameter(torch.randn(3, dtype=torch.float64))
    u = nn.Parameter(torch.randn(3, dtype=torch.float64))
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y, z = x * u, w * 2
    weights = input_pass([y, z], [torch.ones(3, dtype=torch.float64)] * 2, [x])
    assert w.grad is not None and u.grad is not None and not weights.groups
    weights.run()
    torch.testing.assert_close(w.grad, torch.full((3,), 2.0, dtype=torch.float64))


# ---------------------------------------------------------------- the orders
_TORCH = pytest.importorskip("torch.distributed.pipelining.schedules")


def _torch_order(cls, p, m, v, rank):
    """torch.pipelining's own order of ``cls`` on ``rank`` (its per-rank calculation, run
    on the attributes it reads; the stage objects it takes carry only these)."""
    kinds = {_TORCH._ComputationType.FORWARD: "F", _TORCH._ComputationType.BACKWARD_INPUT: "I",
             _TORCH._ComputationType.BACKWARD_WEIGHT: "W", _TORCH._ComputationType.FULL_BACKWARD: "B"}
    s = object.__new__(cls)
    s.pp_group_size, s.n_local_stages, s._n_microbatches, s.num_stages = p, v, m, p * v
    s.number_of_rounds = max(1, m // p)
    s.microbatches_per_round = m // s.number_of_rounds
    return [(kinds[a.computation_type], a.microbatch_index, a.stage_index)
            for a in s._calculate_single_rank_operations(rank) if a is not None]


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_orders_are_torch_pipelinings(p):
    for m in range(1, 3 * p + 1):
        for r in range(p):
            for v, name in ((1, "zb-h1"), (2, "interleaved-zb"), (3, "interleaved-zb")):
                if pipeline_cost.accepts(name, p, m, v):
                    ours = [(a.kind, a.microbatch, stage_of(name, p, r, a.chunk)) for a in schedule(name, p, m, r, v)]
                    assert ours == _torch_order(_TORCH.ScheduleInterleavedZeroBubble, p, m, v, r), (name, p, m, v, r)
            ours = [(a.kind, a.microbatch, stage_of("zbv", p, r, a.chunk)) for a in schedule("zbv", p, m, r, 2)]
            assert ours == _torch_order(_TORCH.ScheduleZBVZeroBubble, p, m, 2, r), ("zbv", p, m, r)


@pytest.mark.parametrize("name,v", [("zb-h1", 1), ("interleaved-zb", 2), ("zbv", 2)])
def test_every_pass_once_and_no_deadlock(name, v):
    for p in (2, 3, 4, 6):
        for m in range(1, 3 * p + 1):
            if not pipeline_cost.accepts(name, p, m, v):
                continue
            timeline = simulate(name, p, m, v)  # raises DeadlockError on a cycle
            for r in range(p):
                actions = schedule(name, p, m, r, v)
                assert sorted((a.kind, a.microbatch, a.chunk) for a in actions) == sorted(
                    (k, i, c) for k in "FIW" for i in range(m) for c in range(v)), (p, m, r)
                done = set()
                for a in actions:  # W after its own I
                    assert a.kind != "W" or ("I", a.microbatch, a.chunk) in done, (p, m, r, a)
                    done.add((a.kind, a.microbatch, a.chunk))
            assert timeline.makespan > 0


def test_the_v_layout():
    assert [stage_of("zbv", 4, r, c) for r in range(4) for c in (0, 1)] == [0, 7, 1, 6, 2, 5, 3, 4]
    assert [rank_of("zbv", 4, s) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [rank_of("interleaved-zb", 4, s) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_a_hand_made_cycle_is_a_deadlock():
    orders = [[schedule("zb-h1", 2, 2, 0)[0]] + schedule("zb-h1", 2, 2, 0)[1:], list(reversed(schedule("zb-h1", 2, 2, 1)))]
    with pytest.raises(DeadlockError):
        simulate("zb-h1", 2, 2, orders=orders)


def test_bubbles_against_the_paper():
    """Equal passes (F = I = W = 1): 1F1B's bubble is (p − 1)(F + I + W) = 3(p − 1),
    ZB-H1's (p − 1)(F + I − W) = p − 1, a third (Qi et al. 2024 §3.1); ZB-V's is
    smaller still with 1F1B's memory."""
    for p in (2, 4, 8):
        one = simulate("1f1b", p, 4 * p)
        zb = simulate("zb-h1", p, 4 * p)
        assert one.makespan - one.busy == pytest.approx(3 * (p - 1))
        assert zb.makespan - zb.busy == pytest.approx(p - 1)
        v = simulate("zbv", p, 4 * p, 2, forward=0.5, backward=1.0)
        assert v.makespan - v.busy <= zb.makespan - zb.busy


def test_in_flight_counts_are_the_orders():
    """The closed forms of the activations each rank keeps (F until its W) against the
    action lists."""
    for name, v in (("zb-h1", 1), ("interleaved-zb", 2), ("interleaved-zb", 3), ("zbv", 2)):
        for p in (2, 3, 4, 8):
            for m in range(1, 3 * p + 1):
                if not pipeline_cost.accepts(name, p, m, v):
                    continue
                for r in range(p):
                    alive, peak = [0] * v, [0] * v
                    for a in schedule(name, p, m, r, v):
                        alive[a.chunk] += 1 if a.kind == "F" else -1 if a.kind == "W" else 0
                        if sum(alive) > sum(peak):
                            peak = list(alive)
                    assert pipeline_cost.in_flight(name, p, m, v, r) == peak, (name, p, m, v, r)


@pytest.mark.parametrize("name,v", [("zb-h1", 1), ("interleaved-zb", 2), ("zbv", 2)])
def test_priced_bubble_is_the_simulated_one(name, v):
    """The planner's bubble: simulated exactly for small steps, extrapolated along p for
    large ones (ZB-V), in closed form (the others) — equal to the whole simulation
    (ratios on the 1/8 grid the memo rounds to)."""
    for f, i, w in ((1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (1.0, 0.5, 1.5), (2.0, 2.5, 1.0), (1.0, 1.25, 0.625),
                    (1.0, 2.0, 5.0), (1.0, 1.5, 2.0)):  # I > F with W > F: recomputing
        for p in (4, 12, 16):
            for m in (p, 2 * p, 4 * p):
                if not pipeline_cost.accepts(name, p, m, v) or (name == "zbv" and m < 2 * p and p * m * 6 > 4096):
                    continue
                t = simulate(name, p, m, v, forward=f, backward=i + w, input_grad=i, weight_grad=w)
                assert pipeline_cost.split_bubble(name, p, m, v, f, i, w) == pytest.approx(
                    t.makespan - t.busy, rel=1e-9, abs=1e-9), (p, m, f, i, w)


def test_schedule_keys():
    assert Strategy.parse({"pipeline": 2, "schedule": "zbv"}).chunks == 2
    assert Strategy.parse({"pipeline": 2, "schedule": "zb-h1"}).chunks == 1
    assert Strategy.parse({"pipeline": 2}).schedule is None  # the planner chooses
    with pytest.raises(PlanError, match="zbv schedule runs exactly 2 chunks"):
        Strategy.parse({"pipeline": 2, "schedule": "zbv", "chunks": 3})
    with pytest.raises(PlanError, match="chunks=2 needs an interleaved schedule"):
        Strategy.parse({"pipeline": 2, "schedule": "zb-h1", "chunks": 2})
    with pytest.raises(PlanError, match="unknown schedule"):
        Strategy.parse({"pipeline": 2, "schedule": "zb-h3"})
    assert set(SCHEDULES) >= {"zb-h1", "interleaved-zb", "zbv"}
    with pytest.raises(ScheduleError):
        check_chunks("interleaved-zb", 1)


# ---------------------------------------------------------------- the planner's choice
def test_auto_picks_a_zero_bubble_schedule_where_the_preset_says_it_wins():
    """GPT-3's width, 24 layers, on 256 A100s: "auto" takes a pipeline, and among the
    schedules of its chunks a zero-bubble one, predicted faster than the 1F1B-shaped one
    at the same layout (the plan lists them)."""
    import autopar
    from autopar.planning.schedules import SPLIT_BACKWARD
    from examples.factories import gpt_meta
    model, inputs, loss, target = gpt_meta(24, 12288, 96, 256, vocab=51200)
    plan = autopar.plan(model, 256, inputs, loss, "auto", example_target=target, hardware="a100-selene")
    assert plan.pipeline and plan.pipeline["schedule"] in SPLIT_BACKWARD
    rivals = {r["schedule"]: r["step_s"] for r in plan.pipeline["schedules"]}
    plain = "1f1b" if plan.pipeline["chunks"] == 1 else "interleaved"
    assert rivals[plan.pipeline["schedule"]] == pytest.approx(plan.step_s, rel=1e-3) and rivals[plain] > plan.step_s
    assert f"schedules at m={plan.pipeline['microbatches']}" in plan.explain()


def test_recomputing_keeps_a_schedule_for_every_count():
    """Recomputing, "auto" prefers the whole-backward schedules; where none takes the
    microbatch count (3 on 2 ranks, two chunks: not a multiple of p) the zero-bubble
    ones still run it."""
    import autopar
    from examples.factories import training_case
    factory, inputs, target, loss = training_case("gpt2", 6, 4)
    plan = autopar.plan(factory(), 2, inputs, loss, {"pipeline": 2, "chunks": 2, "microbatches": 3,
                                                      "recompute": "full"}, example_target=target)
    assert plan.pipeline["schedule"] in ("interleaved-zb", "zbv") and plan.recompute
    plan = autopar.plan(factory(), 2, inputs, loss, {"pipeline": 2, "chunks": 2, "recompute": "full"},
                        example_target=target)
    assert plan.pipeline["schedule"] == "interleaved" and plan.recompute


def test_a_forced_zbv_plan_places_its_stages_in_a_v():
    import autopar
    from examples.factories import training_case
    factory, inputs, target, loss = training_case("gpt2", 8, 4)
    plan = autopar.plan(factory(), 2, inputs, loss, {"pipeline": 2, "schedule": "zbv", "microbatches": 4},
                        example_target=target)
    pp = plan.pipeline
    assert pp["schedule"] == "zbv" and pp["chunks"] == 2 and pp["stage_ranks"] == [0, 1, 1, 0]
    assert pp["tied"] == []  # the tied embedding and head both sit on rank 0
    text = plan.explain()
    assert "stages r and 2p-1-r on rank r, a V" in text and "I1" in text and "W1" in text
