"""Training the reviewed plan: ``compile(..., plan=Plan.load(dir))`` runs the plan saved at
review, equal to the single-device model, and refuses a plan that no longer fits the run
(another world, model, batch or hardware) with what differs (autopar.planning.reviewed)."""
from __future__ import annotations

import os

import pytest
import torch

import autopar
import shared_ranks
from autopar.planning.reviewed import PlanMismatchError

# (case, strategy the reviewer planned with); the pipeline in the extended suite
CASES = [("gpt2", {"data": 2, "tensor": 2})]
EXTENDED = [("llama", {"pipeline": 2, "data": 2, "microbatches": 2})]
_ROOT = shared_ranks.scratch_dir("reviewed")


def _case(name):
    from examples.factories import training_case
    return training_case(name)


def _summed_loss(output, target):
    logits = output.logits if hasattr(output, "logits") else output
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum")


def _saved_plan(name, strategy, world=4, root=_ROOT, directory=None) -> str:
    """The plan a reviewer saved: planned in this process (no ranks), written to a directory."""
    factory, inputs, target, loss = _case(name)
    torch.manual_seed(0)
    plan = autopar.plan(factory(), world, inputs, loss, strategy, example_target=target, hardware="cpu-gloo")
    directory = directory or os.path.join(root, f"{name}-{world}")
    plan.save(directory, max_ranks=world)
    return directory


def reviewed_job(cases, root):
    import torch.distributed as dist
    from autopar.testing import compare_with_single_device
    out = []
    for index, (name, strategy) in enumerate(cases):
        directory = os.path.join(root, f"{name}-4-{index}")
        if dist.get_rank() == 0:
            _saved_plan(name, strategy, root=root, directory=directory)
        dist.barrier()
        factory, inputs, target, loss = _case(name)
        # compile's own planning would be told nothing: strategy left at "auto"
        report = compare_with_single_device(factory, inputs, target, loss, plan=autopar.Plan.load(directory))
        report["saved"] = autopar.Plan.load(directory).to_json()
        out.append(report)
    return out


def refused_job(root):
    import torch.distributed as dist
    directory = _saved_plan("gpt2", {"data": 2, "tensor": 2}, world=4,
                            root=os.path.join(root, f"rank{dist.get_rank()}"))
    factory, inputs, target, loss = _case("gpt2")
    try:
        autopar.compile(factory(), None, inputs, loss, example_target=target, plan=directory)
    except PlanMismatchError as e:
        return str(e)
    return "compiled"


_REVIEWED = shared_ranks.register(4, __name__, reviewed_job, (CASES, _ROOT))
_EXTENDED = shared_ranks.register(4, __name__ + ":extended", reviewed_job, (EXTENDED, _ROOT), extended=True)
_REFUSED = shared_ranks.register(2, __name__ + ":refused", refused_job, (_ROOT,))


def _check(cases, launched, index):
    for rank, reports in enumerate(launched()):
        report = reports[index]
        for kind in ("output", "loss", "grad"):
            assert report[kind][1] < 1e-4, f"rank {rank}, {cases[index][0]}: {kind} {report[kind]}"
        assert report["param"][0] < 5e-4, f"rank {rank}, {cases[index][0]}: param {report['param']}"
        assert report["mesh"] == autopar.Plan.from_json(report["saved"]).mesh


@pytest.mark.parametrize("index", range(len(CASES)))
def test_the_reviewed_plan_trains_equal_to_one_device(index):
    _check(CASES, _REVIEWED, index)


@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(EXTENDED)))
def test_a_reviewed_pipeline_plan_trains_equal_to_one_device(index):
    _check(EXTENDED, _EXTENDED, index)


def test_a_plan_for_four_ranks_is_refused_on_two_with_what_differs():
    for rank, message in enumerate(_REFUSED()):
        assert "ranks: the plan is for 4, this run has 2" in message, f"rank {rank}: {message}"
        assert "replan=True" in message


def test_a_changed_model_batch_or_hardware_is_named_and_replan_plans_afresh():
    directory = _saved_plan("gpt2", "auto", world=1)
    factory, inputs, target, loss = _case("gpt2")
    # the same run: the reviewed plan, not a fresh one (a fresh one here would be "auto")
    pm = autopar.compile(factory(), None, inputs, loss, example_target=target, plan=directory)
    assert pm.plan.to_json() == autopar.Plan.load(directory).to_json()
    from examples.factories import training_case
    other, _, _, _ = training_case("gpt2", layers=3)
    with pytest.raises(PlanMismatchError) as caught:
        autopar.compile(other(), None, inputs, loss, example_target=target, plan=directory)
    assert "regions:" in str(caught.value) and "not in the plan" in str(caught.value)
    with pytest.raises(PlanMismatchError, match="global batch: the plan is for 4 rows, the example inputs have 2"):
        autopar.compile(factory(), None, (inputs[0][:2],), loss, example_target=target[:2], plan=directory)
    with pytest.raises(PlanMismatchError, match=r"inputs: input_0: \(4, 16\) int64 in the plan, \(4, 8\) int64 now; target"):
        autopar.compile(factory(), None, (inputs[0][:, :8],), loss, example_target=target[:, :8], plan=directory)
    with pytest.raises(PlanMismatchError, match="parameters: .* MiB in the plan, .* MiB now"):
        autopar.compile(factory().double(), None, inputs, loss, example_target=target, plan=directory)
    # a loss that sums where the plan's averaged: its data averaging would be 4x off
    with pytest.raises(PlanMismatchError, match=r"the loss: it reduces over the batch as \['sum'\] now, \['mean'\]"):
        autopar.compile(factory(), None, inputs, _summed_loss, example_target=target, plan=directory)
    # the plan was made with example_target: a run without it names the FLOPs it lacks, in
    # figures that differ as printed
    with pytest.raises(PlanMismatchError) as caught:
        autopar.compile(factory(), None, inputs, loss, plan=directory)
    line = next(l for l in str(caught.value).splitlines() if "FLOPs per step" in l)
    before, now = line.split("FLOPs per step: ")[1].split(" in the plan, ")
    assert before != now.split(" now")[0] and "example_target" in line, line
    wider, _, _, _ = training_case("gpt2", vocab=128)
    with pytest.raises(PlanMismatchError, match="FLOPs per step"):
        autopar.compile(wider(), None, inputs, loss, example_target=target, plan=directory)
    with pytest.raises(PlanMismatchError, match="hardware: the plan was priced for 'cpu-gloo', compile was given "
                                                "'h100'"):
        autopar.compile(factory(), None, inputs, loss, example_target=target, plan=directory, hardware="h100")
    with pytest.warns(UserWarning, match="Planning afresh"):
        pm = autopar.compile(other(), None, inputs, loss, example_target=target, plan=directory, replan=True)
    assert len(pm.plan.regions) > len(autopar.Plan.load(directory).regions)


def test_a_plan_argument_that_is_no_plan_says_what_to_give():
    factory, inputs, target, loss = _case("gpt2")
    with pytest.raises(FileNotFoundError, match="no plan.json there"):
        autopar.compile(factory(), None, inputs, loss, example_target=target, plan=_ROOT + "/nowhere")
    with pytest.raises(TypeError, match="a Plan or the directory"):
        autopar.compile(factory(), None, inputs, loss, example_target=target, plan=3)


@pytest.mark.parametrize("name", ["inception", "t5", "clip_target"])
def test_a_plan_fits_the_capture_it_was_made_from(name):
    """What every rank but rank 0 checks of rank 0's plan (autopar.agreement): a fresh plan
    against a fresh capture of the same model has no difference (a model with fork/join
    regions, an encoder-decoder, rows of the batch meeting)."""
    from autopar import api, agreement
    from autopar.cost.hardware import get_hardware
    from autopar.planning.plan import Plan
    from examples.zoo import OWN_LOSS, ZOO
    if name == "clip_target":
        from examples import batch_rows
        factory, inputs, target, loss_fn, kwargs = batch_rows.CASES[name]()
    else:
        case = (ZOO.get(name) or OWN_LOSS[name])()
        factory, inputs, target, loss_fn, kwargs = case.factory, case.inputs, case.target, case.loss_fn, case.kwargs
    torch.manual_seed(0)
    model = factory()
    plan = autopar.plan(model, 4, inputs, loss_fn, example_target=target, example_kwargs=kwargs, hardware="cpu-gloo")
    gm = api._global_graph(model, inputs, loss_fn, target, kwargs)
    again = agreement.reviewed_or_planned((Plan.from_json(plan.to_json()), False), gm, 4, get_hardware("cpu-gloo"),
                                          "auto", None, "preset", announce=False)
    assert again.to_json() == Plan.from_json(plan.to_json()).to_json()
