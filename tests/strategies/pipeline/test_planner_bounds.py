"""The search's bounds (docs/planner.md "Bounds"): the mixed configurations' lower bound
is never above the step their programme prices, and the plans with the cut are the
plans without it."""
from __future__ import annotations

import pytest

from autopar.cost.hardware import get_hardware
from autopar.passes.analysis.analyse import analyse
from autopar.planning.model import ModelFacts
from autopar.driver.search import plan_graph
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
    """(graph, world, hardware, the search's context) of a case of :data:`CASES` or
    :data:`PIPELINE_CASES`."""
    build, world, preset = {**CASES, **PIPELINE_CASES}[name]
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


# the pipeline's bound (autopar.strategies.pipeline.bound): models with pipelines worth
# weighing, on GPU presets (CPU ranks have no bound: waiting stages free cores)
PIPELINE_CASES = {
    "gpt-user-64-selene": (lambda: gpt_user_meta(8, 1024, 16, 64, 256, vocab=4096), 64, "a100-selene"),
    "gpt-48-h100": (lambda: gpt_meta(6, 768, 12, 48, 128, vocab=3000), 48, "h100"),
    "gpt-user-384-selene": (lambda: gpt_user_meta(12, 12288, 96, 192, 2048, vocab=8192), 384, "a100-selene"),
    "mixtral-64-h100": (lambda: _zoo("Mixtral-8x7B", 256), 64, "h100"),  # the experts' second round
}


def _zoo(name: str, batch: int):
    from examples.zoo import logits_loss
    from test_plan_zoo import build
    model, ids = build(name, batch)
    return model, (ids,), logits_loss, ids


@pytest.mark.parametrize("name", sorted(PIPELINE_CASES))
def test_the_pipeline_bound_is_never_above_a_layouts_step(name):
    """Every layout ``"auto"`` weighs, priced in full (its best schedule, microbatch count,
    recomputation and ZeRO stage), takes at least its bound; the bound is not vacuous."""
    from autopar.strategies.pipeline.bound import step_floor
    from autopar.strategies.pipeline.planner import Pipeline
    _, _, _, ctx = _context(name)
    family, checked, tight = Pipeline(), 0, 0
    for config in family.candidates(ctx):
        priced = family.price(ctx, config)  # ctx.best_s is infinite: nothing is cut
        floor = step_floor(ctx.model, ctx.hw, config)
        if priced.step_s is None:
            continue
        assert 0 < floor <= priced.step_s * (1 + 1e-12), (config, floor, priced.step_s)
        checked += 1
        tight += floor > 0.5 * priced.step_s
    assert checked >= 10 and tight >= checked // 3, (checked, tight)


def test_no_pipeline_bound_on_cpu_ranks():
    """Ranks sharing a host's cores compute faster while other stages wait
    (``Hardware.while_busy``): no bound holds there, none is used."""
    from autopar.strategies.pipeline.bound import step_floor
    from autopar.strategies.pipeline.planner import Pipeline
    import dataclasses
    _, _, _, ctx = _context("gpt-48-h100")
    shared = dataclasses.replace(ctx.hw, host_cores=2)  # as ``autopar calibrate`` measures CPU ranks
    configs = Pipeline().candidates(ctx)
    assert any(step_floor(ctx.model, ctx.hw, c) > 0 for c in configs)
    assert all(step_floor(ctx.model, shared, c) == 0.0 for c in configs)


@pytest.mark.parametrize("name", sorted(PIPELINE_CASES))
def test_the_plan_is_the_one_without_the_pipeline_cut(name, monkeypatch):
    """With the layouts that cannot win cut, the plan, the second rounds' configurations
    (pipelines of mixed stages, experts spread over the fastest pipelines) and what
    ``explain`` shows (the fastest five, each family's best) are the search's without
    the cut; the cut layouts left are listed with their bound."""
    from autopar.planning.explain import top, why_not
    from autopar.strategies.pipeline import bound
    from autopar.strategies.pipeline import planner as pipeline_planner
    from autopar.strategies.registry import FAMILIES
    gm, world, hw, _ = _context(name)
    second: dict[str, list] = {"cut": [], "whole": []}  # what each family's second round weighs
    run = ["cut"]
    for family in FAMILIES:
        def recorded(ctx, weighed, _f=family.follow_ups):
            out = _f(ctx, weighed)
            second[run[0]].extend(out)
            return out
        monkeypatch.setattr(family, "follow_ups", recorded)
    cuts = []
    monkeypatch.setattr(pipeline_planner, "cut", lambda *a: cuts.append(a) or bound.cut(*a))
    cut = plan_graph(gm, world, hw)
    monkeypatch.setattr(pipeline_planner, "step_floor", lambda model, hw, config: 0.0)
    run[0] = "whole"
    whole = plan_graph(gm, world, hw)
    assert cuts or name == "gpt-48-h100", "no layout was cut"  # (there each layout above the best is refused)
    assert second["cut"] == second["whole"]
    if name == "gpt-user-384-selene":  # pipelines of mixed stages at the fastest layouts
        assert any(c.pipeline > 1 and c.mixed for c in second["cut"])
    if name == "mixtral-64-h100":  # the fastest pipelines with their experts spread
        assert any(c.pipeline > 1 and c.experts > 1 for c in second["cut"])
    assert (cut.mesh, cut.form, cut.pipeline, cut.zero, cut.recompute, cut.microbatches, cut.step_s) == \
        (whole.mesh, whole.form, whole.pipeline, whole.zero, whole.recompute, whole.microbatches, whole.step_s)
    assert top(cut) .split("\n")[1:] == top(whole).split("\n")[1:]  # the header counts the rejected rows
    for family in ("data", "megatron", "tensor3d", "pipeline"):
        assert why_not(cut, family) == why_not(whole, family)
    assert len(cut.candidates) == len(whole.candidates)
    for c, w in zip(cut.candidates, whole.candidates):  # in the same order: each cut one slower than the plan
        if c.reason.startswith(bound.CUT):
            assert w.step_s is None or w.step_s > cut.step_s, (c, w)
        else:
            assert (str(c.mesh), c.form, c.step_s) == (str(w.mesh), w.form, w.step_s), (c, w)
