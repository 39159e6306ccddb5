"""The way to the first training step: ``pm.timings`` (docs/guide/compile_and_train.md).
Behaviour only: which phases are there and that they add up, never how long they took."""
import time

import autopar
from autopar.timing import COMPILE_PHASES, PROGRAM_PHASES, Timings, phase, recording
from examples.factories import transformer


def test_timings_hold_compile_phases_then_the_programs_and_the_first_run():
    model, inputs, loss_fn, target = transformer()
    pm = autopar.compile(model, None, inputs, loss_fn, example_target=target)
    # compile builds the program the first step on the example runs
    assert set(pm.timings) == {f"compile.{p}" for p in COMPILE_PHASES} | {f"program.{p}" for p in PROGRAM_PHASES}
    assert all(s >= 0 for s in pm.timings.values()) and pm.timings["program.capture"] > 0
    at_compile = dict(pm.timings)
    pm.step(*inputs, target=target)
    after_first = dict(pm.timings)
    assert set(after_first) == set(at_compile) | {"first_step.run"}
    assert after_first["first_step.run"] > 0
    assert {k: v for k, v in after_first.items() if k != "first_step.run"} == at_compile   # nothing rebuilt
    pm.step(*inputs, target=target)   # an ordinary step builds nothing and times nothing
    assert dict(pm.timings) == after_first
    pm(*inputs)                        # a forward-only program is one more build
    assert pm.timings["program.capture"] > after_first["program.capture"]
    assert pm.timings["first_step.run"] == after_first["first_step.run"]


def test_phases_keep_their_own_time_only():
    t = Timings()
    start = time.perf_counter()
    with recording(t, "a."), phase("outer"):
        time.sleep(0.02)
        with phase("inner"):
            time.sleep(0.02)
        with recording(t, "b."), phase("inner"):
            time.sleep(0.02)
    wall = time.perf_counter() - start
    assert set(t) == {"a.outer", "a.inner", "b.inner"}
    assert 0.015 < t["a.outer"] < wall - 0.035        # less its two inner phases
    assert abs(sum(t.values()) - wall) < 0.01          # they add up to the wall time
    with phase("nothing recorded"):
        pass
    assert "a.nothing recorded" not in t
