"""Pipeline schedules (megatron §2.2): the per-rank orders of GPipe, 1F1B and interleaved
1F1B, their bubble by simulation against (p−1)/m and (p−1)/(v·m) (and as the benchmark
reads it off ranks' traces), and bad sizes.

Figure 4 of the paper is an image that the text copy in ``../shared/papers`` does not
hold; the 1F1B rows below are its top half as §2.2.1 describes it (device 1: four
warm-up forwards... then one forward, one backward). The interleaved rows follow
§2.2.2's rules as Megatron-LM implements them: forwards take the chunks in groups of p
microbatches, backwards the chunks in reverse, rank r warms up with 2(p−r−1) + (v−1)·p
forwards.
"""
import expecttest
import pytest

from autopar.planning.timeline import DeadlockError, simulate
from autopar.planning.schedules import Action, ScheduleError, bubble_fraction, schedule


def _row(name, p, m, rank, v=1):
    return " ".join(str(a) for a in schedule(name, p, m, rank, v))


def test_1f1b_matches_figure_4_top():
    # microbatches 1-based in the figure, 0-based here
    assert _row("1f1b", 4, 8, 0) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"
    assert _row("1f1b", 4, 8, 1) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7"
    assert _row("1f1b", 4, 8, 2) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7"
    assert _row("1f1b", 4, 8, 3) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"


def test_interleaved_matches_figure_4_bottom():
    # device 1 (rank 0): ten warm-up forwards (chunk 0 of microbatches 1-4, chunk 1 of
    # 1-4, chunk 0 of 5-6), then 1F1B, backwards starting from the last chunk
    assert _row("interleaved", 4, 8, 0, 2) == (
        "F0 F1 F2 F3 F0.1 F1.1 F2.1 F3.1 F4 F5 "
        "F6 B0.1 F7 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0 F7.1 B1 "
        "B2 B3 B4.1 B5.1 B6.1 B7.1 B4 B5 B6 B7")
    assert _row("interleaved", 4, 8, 3, 2) == (
        "F0 F1 F2 F3 F0.1 "
        "B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4 B0 F5 B1 F6 B2 F7 B3 F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 "
        "B4 B5 B6 B7")
    for rank, warmup in enumerate((10, 8, 6, 4)):
        order = schedule("interleaved", 4, 8, rank, 2)
        assert [a.kind for a in order[:warmup + 1]] == ["F"] * (warmup + 1) and order[warmup + 1].kind == "B"


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)])
def test_every_pass_once_backward_after_forward_first_in_first_out(name, v):
    p, m = 4, 12
    for rank in range(p):
        order = schedule(name, p, m, rank, v)
        assert sorted(order) == sorted(Action(k, i, c) for k in "FB" for i in range(m) for c in range(v))
        for chunk in range(v):
            backwards = [a.microbatch for a in order if a.kind == "B" and a.chunk == chunk]
            assert backwards == sorted(backwards)  # first in, first out
        for i, a in enumerate(order):
            if a.kind == "B":
                assert Action("F", a.microbatch, a.chunk) in order[:i]


def test_1f1b_keeps_at_most_p_minus_rank_microbatches_in_flight():
    p, m = 4, 8
    for rank in range(p):
        for name, bound in (("1f1b", p - rank), ("gpipe", m)):
            in_flight = peak = 0
            for a in schedule(name, p, m, rank):
                in_flight += 1 if a.kind == "F" else -1
                peak = max(peak, in_flight)
            assert peak == bound, (name, rank)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (3, 9)])
def test_simulated_bubble_is_the_papers(p, m):
    for name in ("gpipe", "1f1b"):
        assert simulate(name, p, m).bubble_fraction == pytest.approx(bubble_fraction(p, m))
    if m % p == 0 and m > p:
        timeline = simulate("interleaved", p, m, 2, forward=0.5, backward=1.0)
        assert timeline.bubble_fraction == pytest.approx(bubble_fraction(p, m, 2))


def test_measured_bubble_of_a_simulated_step_is_the_papers():
    """``measured_bubbles`` (how the benchmark reads the bubble off the ranks' traces) on
    spans shaped like a simulated 1F1B step on 2 ranks gives (p−1)/m, falling as m grows.
    The bubble the real ranks show on a clock is a benchmark (bench_pipeline.py, p = 2)."""
    from autopar.testing import measured_bubbles
    measured = {}
    for m in (2, 4, 8):
        timeline = simulate("1f1b", 2, m)
        # per rank (first action's start, last action's end, busy), as PipelineExecutor.span
        spans = [(run[0][1], run[-1][2], sum(end - start for _, start, end in run)) for run in timeline.runs]
        measured[m] = measured_bubbles([{"spans": [span]} for span in spans])[0]
        assert measured[m] == pytest.approx(bubble_fraction(2, m)) == pytest.approx(timeline.bubble_fraction)
    assert measured[2] > measured[4] > measured[8], measured


def test_bad_sizes_are_named():
    with pytest.raises(ScheduleError, match=r"needs the number of microbatches to be a multiple of the pipeline "
                                            r"ranks \(Narayanan et al. 2021, §2.2.2\); m=6 is not a multiple of p=4. Use m=8"):
        schedule("interleaved", 4, 6, 0, 2)
    with pytest.raises(ScheduleError, match=r"rank 4 is outside a pipeline of 4 ranks"):
        schedule("1f1b", 4, 8, 4)
    with pytest.raises(ScheduleError, match=r"unknown schedule 'zb'; choose one of gpipe, 1f1b, interleaved"):
        schedule("zb", 4, 8, 0)


def test_a_cyclic_order_is_reported_as_a_deadlock():
    good = [schedule("1f1b", 2, 2, r) for r in range(2)]
    # rank 1 runs microbatch 1 before 0 while rank 0 waits for microbatch 0's backward first
    bad = [good[0], [Action("F", 1), Action("B", 1), Action("F", 0), Action("B", 0)]]
    simulate("1f1b", 2, 2, orders=good)
    bad[0] = [Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1)]
    with pytest.raises(DeadlockError, match=r"deadlocks: rank 0 at B0, rank 1 at F1"):
        simulate("1f1b", 2, 2, orders=bad)


class TestTimeline(expecttest.TestCase):
    def test_1f1b_timeline_text(self):
        self.assertExpectedInline(simulate("1f1b", 4, 8).text(3), """\
rank 0 | F1 F2 F3 F4 .  .  .  .  .  .  B1 B1 F5 B2 B2 F6 B3 B3 F7 B4 B4 F8 B5 B5 .  B6 B6 .  B7 B7 .  B8 B8|
rank 1 | .  F1 F2 F3 .  .  .  .  B1 B1 F4 B2 B2 F5 B3 B3 F6 B4 B4 F7 B5 B5 F8 B6 B6 .  B7 B7 .  B8 B8 .  . |
rank 2 | .  .  F1 F2 .  .  B1 B1 F3 B2 B2 F4 B3 B3 F5 B4 B4 F6 B5 B5 F7 B6 B6 F8 B7 B7 .  B8 B8 .  .  .  . |
rank 3 | .  .  .  F1 B1 B1 F2 B2 B2 F3 B3 B3 F4 B4 B4 F5 B5 B5 F6 B6 B6 F7 B7 B7 F8 B8 B8 .  .  .  .  .  . |
1f1b: p=4 m=8; step 33 units, compute 24 per rank, bubble 0.375 of the ideal time""")
