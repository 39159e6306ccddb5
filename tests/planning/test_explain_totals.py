"""The plan's region table adds up (autopar.planning.totals): the predicted step is the
sum of the region rows on the rank that sets it and named terms, the rank's memory the
sum of its parameters, gradients, optimizer state and activations, in the structured
figures and in the printed table and report.

Plans of a small GPT on the meta device, forced: plain data parallelism, Megatron's
data x tensor, an interleaved pipeline, ZeRO-3, full recomputation with accumulation,
and a recomputing pipeline under ZeRO-2.
"""
from __future__ import annotations

import re

import pytest

import autopar
from autopar.planning.plan import Plan
from autopar.planning.totals import OUTSIDE, memory_reconciliation, on_rank, slow_rank, step_reconciliation
from examples.factories import gpt_meta

STRATEGIES = {
    "data": {"data": 8},
    "megatron": {"data": 2, "tensor": 4},
    "interleaved": {"pipeline": 2, "data": 2, "tensor": 2, "chunks": 2, "schedule": "interleaved", "microbatches": 4},
    "zero3": {"data": 8, "zero": 3},
    "recompute": {"data": 2, "tensor": 4, "recompute": "full", "microbatches": 2},
    "pipeline_recompute_zero2": {"pipeline": 4, "data": 2, "recompute": "full", "zero": 2, "microbatches": 8},
}
LAYERS = 8


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    out = {}
    for name, strategy in STRATEGIES.items():
        model, inputs, loss, target = gpt_meta(LAYERS, 256, 8, 16, seq=64, vocab=512)
        out[name] = autopar.plan(model, 8, inputs, loss, strategy, example_target=target, hardware="a100-selene")
    return out


def _close(a: float, b: float, rel: float = 1e-9) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def _block(text: str, start: str) -> list[tuple[str, float, str]]:
    """The lines of a printed sum from the one starting with ``start`` to its total:
    ``(mark, figure, label)``."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(start))
    out = []
    for line in lines[i + 1:]:
        mark, figure, label = re.match(r"  ([= ]) +(-?[\d.]+)  (.*)", line).groups()
        out.append((mark, float(figure), label))
        if mark == "=":
            return out
    raise AssertionError(f"no total after {start!r}")


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_the_terms_add_up_to_the_step_and_the_memory(plans, name):
    plan = plans[name]
    step, memory = step_reconciliation(plan), memory_reconciliation(plan)
    assert _close(sum(t.value for t in step.terms), plan.step_s), [(t.key, t.value) for t in step.terms]
    assert memory is not None
    assert _close(sum(t.value for t in memory.terms), plan.total.memory_bytes), \
        [(t.key, t.value) for t in memory.terms]
    parts = {t.key: t.value for t in memory.terms}
    d = plan.degree("data")
    shard = d if plan.zero >= 3 else 1
    assert _close(parts["memory.parameters"], 4 * plan.breakdown["param_elems"] / shard)
    assert _close(parts["memory.optimizer"], 8 * plan.breakdown["param_elems"] / (d if plan.zero else 1))
    assert parts["memory.activations"] > 0
    assert ("memory.gathered" in parts) == (plan.zero == 3)
    # read back from JSON, the same sums
    again = Plan.from_json(plan.to_json())
    assert [(t.key, t.value) for t in step_reconciliation(again).terms] == [(t.key, t.value) for t in step.terms]
    assert [(t.key, t.value) for t in memory_reconciliation(again).terms] == [(t.key, t.value) for t in memory.terms]


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_the_printed_table_closes_with_its_sums(plans, name):
    """The text: units in the header, the rows' figures per step (a folded row one
    block's: N of them are the regions' term), the step and memory lines summing to the
    predicted figures at their printed precision, nothing unattributed."""
    plan = plans[name]
    text = plan.explain()
    assert "compute ms" in text and "memory MiB" in text and "alternatives ms" in text
    assert "not attributed" not in text
    step = _block(text, "the step on ")
    assert step[-1][1] == pytest.approx(plan.step_s * 1e3, abs=5e-4) and step[-1][2] == "predicted step"
    assert sum(f for mark, f, _ in step if mark != "=") == pytest.approx(step[-1][1], abs=5e-4 * len(step))
    memory = _block(text, "memory on ")
    assert memory[-1][1] == pytest.approx(plan.total.memory_bytes / 2**20, abs=5e-3)
    assert sum(f for mark, f, _ in memory if mark != "=") == pytest.approx(memory[-1][1], abs=5e-3 * len(memory))
    if not plan.pipeline:  # every row is every rank's: N times a folded row, once each other, is the regions' term
        table = text[text.index("\nregion "):text.index("\nthe step on")]
        column = table.splitlines()[1].split().index("compute")
        total = blocks = 0.0
        for line in table.splitlines()[3:]:
            if line.strip() and not line.startswith(OUTSIDE):
                fold = re.search(r"\(x(\d+), each\)", line)
                cells = re.sub(r".*\(x\d+, each\)", "name", line).split()
                count = int(fold.group(1)) if fold else 1
                total, blocks = total + float(cells[column]) * count, blocks + count
        regions = next(f for _, f, label in step if label.startswith("regions") and label.endswith("compute"))
        assert total == pytest.approx(regions, abs=5e-4 * (blocks + 1))  # each printed figure rounded


@pytest.mark.parametrize("name", ["data", "megatron", "zero3"])
def test_without_recomputation_the_rows_are_the_rank_s_compute_and_communication(plans, name):
    """No recomputation, no pipeline: the region rows and the nodes outside regions are
    the rank's whole compute, the tensor group's rows its whole tensor communication;
    beside them only the data group's terms."""
    plan = plans[name]
    keys = {t.key for t in step_reconciliation(plan).terms}
    assert keys <= {"regions.compute", "regions.comm.tensor", "outside.compute", "comm.data", "comm.data.batch",
                    "runtime"}, keys
    assert _close(sum(r.cost.compute_s for r in plan.regions), plan.total.compute_s)
    assert ("regions.comm.tensor" in keys) == (plan.degree("tensor") > 1)


def test_recomputation_is_its_own_term(plans):
    plan = plans["recompute"]
    terms = {t.key: t for t in step_reconciliation(plan).terms}
    assert plan.recompute and plan.microbatches == 2
    assert terms["compute.rest"].value > 0 and "recomputation" in terms["compute.rest"].label
    assert terms["comm.tensor"].value > 0 and "recomputation" in terms["comm.tensor"].label


@pytest.mark.parametrize("name", ["interleaved", "pipeline_recompute_zero2"])
def test_a_pipeline_s_step_is_its_slowest_rank_s(plans, name):
    """Only the blocks of the slowest rank's stages count (not every block of the model:
    a column times the layers is many steps), their figures plus the rest of its stages,
    the sends and the weight passes are its time per microbatch times m, and the bubble
    and the data group's terms close the step; the memory is the rank's that needs most."""
    plan = plans[name]
    pp = plan.pipeline
    rank = slow_rank(plan)
    assert pp["rank_s"][rank] == max(pp["rank_s"])
    terms = {t.key: t.value for t in step_reconciliation(plan).terms}
    mine = [r for r in plan.regions if r.region != OUTSIDE and on_rank(plan, r, rank) == "all"]
    stages = {s for s, r in enumerate(pp["stage_ranks"]) if r == rank}
    blocks = sum(1 for a in pp["assignment"] if a in stages)
    assert len(mine) == 2 * blocks and 0 < blocks < LAYERS  # an attention and an MLP per block
    assert _close(terms["regions.compute"], sum(r.cost.compute_s for r in mine))
    assert terms["regions.compute"] < plan.step_s < sum(r.cost.compute_s for r in plan.regions)
    assert _close(terms["pipeline.bubble"], pp["bubble_s"])
    on_the_rank = sum(v for k, v in terms.items() if k.startswith(("regions.", "stages.", "pipeline.sends",
                                                                   "pipeline.weight_passes")))
    assert _close(on_the_rank, pp["rank_s"][rank] * pp["microbatches"])
    assert terms["stages.rest.compute"] > 0
    mem = memory_reconciliation(plan)
    kept = pp["memory_bytes_recompute"] if plan.recompute else pp["memory_bytes"]
    assert plan.breakdown["memory_rank"] == kept.index(max(kept)) and _close(mem.total, max(kept))


def test_the_report_page_shows_the_same_sums(plans, tmp_path):
    from autopar.planning.report import report_html
    plan = plans["interleaved"]
    page = report_html(plan)
    assert "Where the step and the memory go" in page and "compute (ms)" in page and "memory (MiB)" in page
    assert f"= predicted step</td><td class=\"num\">{plan.step_s * 1e3:.3f}</td>" in page
    assert f"= predicted memory per rank</td><td class=\"num\">{plan.total.memory_bytes / 2**20:.2f}</td>" in page


def test_a_plan_saved_before_the_parts_says_so(plans):
    plan = Plan.from_json(plans["data"].to_json())
    plan.breakdown = {}
    text = plan.explain()
    assert "its parts are not in this plan" in text
    assert _close(sum(t.value for t in step_reconciliation(plan).terms), plan.step_s)
