"""Training a reviewed plan: ``autopar.compile(model, mesh, ..., plan=Plan.load(dir))``.

The plan saved at review (``autopar plan``, :meth:`Plan.save`) is run as it is: no
search, whatever the cost model, the calibrated profile or autopar's planner would
choose today. What it was made for is checked against what ``compile`` is given first,
and every difference is named; with ``replan=True`` compile plans afresh instead (with
a warning naming them). Checked:

* the number of ranks, the model's class and its global batch;
* each graph input's shape and dtype (a sequence length, an image size), the
  parameters' bytes (their dtype and sizes) and the model's FLOPs per step (a width, a
  depth): the plan's splits, memory and prices are for those;
* the regions the analysis finds in the captured graph now (their names and kinds) and
  the plan's: a changed model, or a changed autopar reading it otherwise, differs here;
* where rows of the batch meet (:mod:`autopar.passes.analysis.batch_rows`): the plan's
  remedies are for the couplings it was made for;
* the hardware, where ``compile`` is given one: its name must be the plan's; a 2-D
  ``mesh`` whose degrees are not the plan's.

* the loss's reductions over the batch (:data:`~autopar.ir.LOSS_TERMS`: a mean, a sum):
  the plan's data averaging and pipeline weighing are for those (a loss changed from a
  mean to a sum is refused; the planner may reject a pipeline for a mix of both).

The names of those reductions' nodes are read from the graph ``compile`` captured.

What is not checked here is each rank's rewritten program: the golden check
(:func:`autopar.testing.assert_plan_unchanged`, ``autopar plan --check``) compares those.
"""
from __future__ import annotations

import json
import os
from typing import Any

from autopar.planning.plan import Plan
from autopar.planning.declared import DECLARED
from autopar.planning.strategy import PlanError


class PlanMismatchError(PlanError):
    """The reviewed plan does not fit what ``compile`` was given; the message lists
    each difference and what to do."""


def as_plan(plan: Any) -> Plan:
    """A :class:`Plan`, or the directory / ``plan.json`` a plan was saved in."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        path = os.fspath(plan)
        if os.path.isfile(path):
            with open(path) as f:
                return Plan.from_json(f.read())
        if os.path.isfile(os.path.join(path, "plan.json")):
            return Plan.load(path)
        raise FileNotFoundError(f"plan={path!r}: no plan.json there; give the directory Plan.save or autopar plan "
                                f"wrote, or a Plan")
    raise TypeError(f"plan=: a Plan or the directory of a saved plan, not {type(plan).__name__}")


def differences(plan: Plan, *, world: int, model_name: str, global_batch: int, regions: list[tuple[str, str]],
                couplings: list, hardware: str | None, inputs: list | None = None, param_bytes: float | None = None,
                flops_per_step: float | None = None, degrees: dict | None = None,
                loss_terms: list | None = None) -> list[str]:
    """What differs between the reviewed ``plan`` and the run ``compile`` is asked for,
    one readable line each (empty: it fits)."""
    out = []
    if plan.family and plan.family not in DECLARED:
        out.append(f"family: the plan is {plan.family!r}'s, a family this process has not registered; call "
                   f"autopar.register_family on every rank before compiling with it")
    if plan.world_size != world:
        out.append(f"ranks: the plan is for {plan.world_size}, this run has {world}")
    if plan.model != model_name:
        out.append(f"model: the plan is of {plan.model}, this model is a {model_name}")
    if plan.global_batch != global_batch:
        out.append(f"global batch: the plan is for {plan.global_batch} rows, the example inputs have {global_batch}")
    if inputs is not None and plan.inputs and plan.inputs != inputs:
        before, now = {i[0]: i[1:] for i in plan.inputs}, {i[0]: i[1:] for i in inputs}
        changed = [f"{name}: {_spec(before.get(name))} in the plan, {_spec(now.get(name))} now"
                   for name in sorted(set(before) | set(now)) if before.get(name) != now.get(name)]
        out.append("inputs: " + "; ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else ""))
    if loss_terms is not None and plan.loss_terms is not None and _kinds(plan.loss_terms) != _kinds(loss_terms):
        out.append(f"the loss: it reduces over the batch as {_kinds(loss_terms) or 'nothing'} now, "
                   f"{_kinds(plan.loss_terms) or 'nothing'} when the plan was made (another loss_fn)")
    if param_bytes is not None and plan.param_bytes and plan.param_bytes != param_bytes:
        out.append(f"parameters: {plan.param_bytes / 2**20:.2f} MiB in the plan, {param_bytes / 2**20:.2f} MiB now "
                   f"(another dtype or size)")
    if flops_per_step is not None and plan.flops_per_step and \
            abs(plan.flops_per_step - flops_per_step) > 1e-9 * max(plan.flops_per_step, flops_per_step):
        out.append(f"FLOPs per step: {plan.flops_per_step:.10g} in the plan, {flops_per_step:.10g} now, "
                   f"{flops_per_step - plan.flops_per_step:+.3g} (another width, depth or sequence, or a loss: a "
                   f"plan made with example_target= counts the loss's, a run without it does not)")
    if degrees and any(plan.degree(k) != v for k, v in degrees.items()):
        out.append(f"mesh: its degrees {degrees} are not the plan's {plan.mesh}")
    if hardware is not None and hardware != plan.hardware:
        out.append(f"hardware: the plan was priced for {plan.hardware!r}, compile was given {hardware!r}")
    planned = {c.region: c.kind for c in plan.regions if not c.region.startswith("(")}
    found = dict(regions)
    missing = sorted(set(planned) - set(found))
    # the model's regions a plan lists: those of the kinds it splits (a data plan of a model
    # with fork/joins lists them; a model's blocks and routed layers a plan need not)
    listed = set(planned.values()) | {"vocab", "attention", "linear_chain"}
    new = sorted(r for r in set(found) - set(planned) if found[r] in listed)
    if missing:
        out.append(f"regions: {_few(missing)} of the plan are not in this model's graph")
    if new:
        out.append(f"regions: {_few(new)} of this model's graph are not in the plan")
    changed = sorted(r for r in set(planned) & set(found) if planned[r] != found[r])
    if changed:
        out.append("regions: " + ", ".join(f"{r} is a {found[r]} region now, {planned[r]} in the plan"
                                           for r in changed[:4]))
    if plan.batch_couplings is None and couplings:
        out.append("rows of the batch meet in this model, and the plan predates autopar's reading of where they do")
    elif plan.batch_couplings is not None and _couplings(plan.batch_couplings) != _couplings(couplings):
        out.append("rows of the batch meet elsewhere than when the plan was made (its remedies are for those "
                   "couplings)")
    return out


def _spec(spec) -> str:
    if spec is None:
        return "absent"
    return "no tensor" if spec[0] is None else f"{tuple(spec[0])} {spec[1]}"


def _kinds(terms: list) -> list[str]:
    """The loss's reductions over the batch, by kind and count ("mean", "sum")."""
    return sorted(kind for _, kind in terms)


def _couplings(items: list) -> list:
    """The couplings in a canonical form: a saved plan's JSON sorts every dict's keys
    (a coupling's ``details`` too), a fresh analysis keeps them in the order found."""
    return sorted(json.dumps(c, sort_keys=True, default=repr) if isinstance(c, dict) else repr(c) for c in items)


def _few(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def mismatch_message(plan: Plan, found: list[str], replanning: bool = False) -> str:
    """The account of ``found``: the refusal's, or with ``replanning`` the warning's."""
    ending = ("Re-plan and review again (autopar plan, Plan.save), or replan=True. Planning afresh (replan=True)."
              if replanning else
              "Re-plan and review again (autopar plan, Plan.save), or pass replan=True to plan afresh for this run.")
    return (f"compile(plan=...): the reviewed plan ({plan.model} on {plan.world_size} ranks, {plan.form or 'mesh'} "
            f"{plan.mesh}) does not fit this run:\n  - " + "\n  - ".join(found) + "\n" + ending)
