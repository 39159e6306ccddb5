"""The search's bounds (docs/planner.md "Bounds"): the mixed configurations' lower bound
is never above the step their programme prices, and the plans with the cut are the
plans without it."""
from __future__ import annotations

import pytest

from autopar.cost.hardware import get_hardware
from autopar.passes.analysis.analyse import analyse
from autopar.planning.model import ModelFacts
from autopar.planning.search import plan_graph
from autopar.strategies.family import PlanContext
from autopar.strategies.mixed import planner as mixed_planner
from autopar.strategies.mixed.bound import lower_bound
from autopar.strategies.mixed.planner import Mixed
from autopar.strategies.mixed.pricer import MixedPricer
from autopar.trace.capture import capture
from examples.factories import gpt_meta, gpt_user_meta, transformer

CASES = {
    # (a model builder, world, preset)
    "tiny-8-cpu": (transformer, 8, "cpu-gloo"),
    "gpt-64-selene": (lambda: gpt_meta(4, 1024, 16, 64, 256, vocab=4096), 64, "a100-selene"),
    "gpt-user-48-h100": (lambda: gpt_user_meta(3, 768, 12, 48, 128, vocab=3000), 48, "h100"),
}


def _context(name: str):
    build, world, preset = CASES[name]
    gm = analyse(capture(*build()))
    hw = get_hardware(preset)
    return gm, world, hw, PlanContext(ModelFacts(gm, fusion=hw.fused_kernels), world, hw.on_world(world), None, name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_mixed_bound_is_never_above_the_programmes_step(name):
    _, _, _, ctx = _context(name)
    checked = deep = 0
    for config in Mixed().candidates(ctx):
        if ctx.model.batch % config.data:
            continue
        pricer = MixedPricer(ctx, config.data, config.tensor, config.grid, subgrids=config.tensor_subgrids)
        bound = lower_bound(pricer.options)
        if bound is None:
            continue
        step = pricer.table(materialize=False).step_s
        assert bound <= step * (1 + 1e-12), (config, bound, step)
        checked += 1
        deep += config.grid is not None and config.grid.z > 1
    assert checked >= 3 and deep >= 1, (checked, deep)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_plan_is_the_one_without_the_cut(name, monkeypatch):
    gm, world, hw, _ = _context(name)
    cut = plan_graph(gm, world, hw)
    monkeypatch.setattr(mixed_planner, "lower_bound", lambda options: None)
    whole = plan_graph(gm, world, hw)
    assert (cut.mesh, cut.form, cut.pipeline, cut.zero, cut.recompute, cut.microbatches) == \
        (whole.mesh, whole.form, whole.pipeline, whole.zero, whole.recompute, whole.microbatches)
    assert cut.step_s == whole.step_s
    # the configurations listed are those of the search without the cut, less the mixed ones it dropped
    listed = {(str(c.mesh), c.form) for c in whole.candidates}
    assert {(str(c.mesh), c.form) for c in cut.candidates} <= listed
    if name == "gpt-64-selene":  # where the cut drops configurations the search would list
        assert len(cut.candidates) < len(whole.candidates)
