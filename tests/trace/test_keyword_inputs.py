"""Keyword inputs and models that compute their own loss (docs/guide/compile_and_train.md).

Hugging Face models are called ``model(input_ids=..., attention_mask=..., labels=...)``
and return their loss. Tier 2 (one 4-rank spawn): GPT-2, BERT (masked LM) and T5 called
that way, with padding, against the single-device model under data, data x tensor
and pipeline plans (D&SP and 3D in the extended suite). Tier 1 (one process): how keywords enter the graph, the
rewrite that makes a mean over counted targets a share of the whole batch's mean, and
the errors of bad calls.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
from autopar.trace.capture import ModelLossError, capture
from autopar.ir import CAPTURE, LOSS_REDUCTION
from autopar.strategies.shared.outputs import loss_reduction
from autopar.strategies.data.rewrite import data_parallel_pass
import shared_ranks
from autopar.runtime.target_count import TARGET_COUNT, global_mean, use_target_count
from autopar.testing import zoo_equivalence_job
from examples.zoo import OWN_LOSS

# ---------------------------------------------------------------------- tier 2: 4 gloo ranks

WORLD_4 = [
    ("gpt2_labels", {"data": 2, "tensor": 2}),
    ("gpt2_labels", {"pipeline": 2, "data": 2, "microbatches": 2}),
]
# an encoder's masked-LM loss, and the D&SP and 3D families with the model's own loss: the
# extended suite
EXTENDED = [
    ("bert_mlm", {"data": 2, "tensor": 2}),
    ("t5_labels", {"data": 2, "tensor": 2}),
    ("gpt2_labels", {"data": 4}),   # the data path: in the data x tensor and pipeline x data cases too
    ("gpt2_labels", {"data": 4, "subgrids": 2}),
    ("gpt2_labels", {"x": 2, "y": 1, "z": 2}),
]

# the 4-rank launch is shared with other modules' jobs (tests/shared_ranks.py)
_world_4 = shared_ranks.register(4, __name__, zoo_equivalence_job, (WORLD_4,), timeout_s=900)
_extended = shared_ranks.register(4, __name__ + ":extended", zoo_equivalence_job, (EXTENDED,), timeout_s=900,
                                  extended=True)


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(WORLD_4)), ids=[f"{m}-{s}" for m, s in WORLD_4])
def test_own_loss_models_with_padding_train_like_the_single_device_model(index):
    _check(WORLD_4[index], [reports[index] for reports in _world_4()])


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.parametrize("index", range(len(EXTENDED)), ids=[f"{m}-{s}" for m, s in EXTENDED])
def test_own_loss_under_dsp_and_3d(index):
    _check(EXTENDED[index], [reports[index] for reports in _extended()])


def _check(case, reports) -> None:
    """``reports``: every rank's report of ``case`` (every rank has the full outputs, loss
    and parameters)."""
    for report in reports:
        assert report["output"][1] < 1e-5, report  # logits, and the loss the output carries
        assert report["loss"][1] < 1e-5, report
        assert report["grad"][1] < 1e-5, report
        assert report["grad_norm"][1] < 1e-5, report
        assert report["param"][0] < 5e-4, report
    model, strategy = case
    report = reports[0]
    assert report["tracer"] == "export"
    if "tensor" in strategy and "pipeline" not in strategy:
        assert "megatron" in report["strategies"], report["plan"]
    if "pipeline" in strategy:
        assert report["executed"], report["plan"]
    if "x" in strategy:
        assert "tensor3d" in report["strategies"], report["plan"]
    if "subgrids" in strategy:
        assert "dsp" in report["strategies"], report["plan"]


@pytest.mark.parametrize("name", sorted(OWN_LOSS))
def test_the_padding_makes_every_share_of_the_batch_count_other_targets(name):
    """What the multi-rank cases prove is not trivial: the mean of per-share means (what
    averaging each rank's own loss gives) is not the batch's mean for these batches."""
    case = OWN_LOSS[name]()
    torch.manual_seed(0)
    model = case.factory()
    with torch.no_grad():
        whole = model(**case.kwargs).loss
        shares = [model(**{k: v.chunk(4)[i] for k, v in case.kwargs.items()}).loss for i in range(4)]
    assert abs(torch.stack(shares).mean() - whole) > 1e-5 * abs(whole)
    assert len({int((case.kwargs["labels"].chunk(4)[i] != -100).sum()) for i in range(4)}) > 1


# ---------------------------------------------------------------------- tier 1: capture


class Tagger(nn.Module):
    """Token tagging called with keywords; returns a dict with a loss when given labels."""

    def __init__(self, vocab=16, width=8, tags=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, tags)

    def forward(self, input_ids, attention_mask=None, labels=None, scale=1.0, return_dict=True):
        h = self.embed(input_ids) * scale
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1)
        logits = self.head(h)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return out if return_dict else logits


def _batch(rows=4, seq=6, lengths=(6, 2, 5, 1)):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 16, (rows, seq), generator=g)
    mask = torch.zeros(rows, seq, dtype=torch.long)
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100) % 5}


def test_keyword_tensors_are_graph_inputs_in_the_examples_order_and_constants_are_baked_in():
    kwargs = _batch()
    example = {"labels": kwargs["labels"], "input_ids": kwargs["input_ids"], "scale": 2.0}
    gm = capture(Tagger(), (), example_kwargs=example)
    assert gm.meta[CAPTURE].input_names == ("labels", "input_ids")
    assert gm.meta[CAPTURE].tracer == "symbolic_trace" and not gm.meta[CAPTURE].with_loss
    assert "2.0" in gm.code  # scale=2.0 is a constant of the capture
    # a keyword that clashes with the wrapper's own names is passed under another name
    gm = capture(_Difference(), (torch.randn(3, 4),), nn.functional.mse_loss, torch.randn(3, 4),
                 example_kwargs={"target": torch.randn(3, 4)})
    assert gm.meta[CAPTURE].input_names == ("input_0", "kw_target", "target")


class _Difference(nn.Module):
    def forward(self, x, target):
        return x - target


def test_the_models_own_loss_is_captured_when_its_output_carries_one():
    kwargs = _batch()
    gm = capture(Tagger(), (), example_kwargs=kwargs, model_loss="required")
    assert gm.meta[CAPTURE].with_loss
    output = next(n for n in gm.graph.nodes if n.op == "output")
    assert output.args[0].target is F.cross_entropy
    # "if_present" keeps the output when there is no loss
    no_labels = {k: v for k, v in kwargs.items() if k != "labels"}
    gm = capture(Tagger(), (), example_kwargs=no_labels, model_loss="if_present")
    assert not gm.meta[CAPTURE].with_loss
    with pytest.raises(ModelLossError, match=r"carries no loss; pass the labels keyword"):
        capture(Tagger(), (), example_kwargs=no_labels, model_loss="required")
    with pytest.raises(ModelLossError, match=r"returns a tensor of shape \[4, 6, 5\], not a scalar loss"):
        capture(Tagger(), (), example_kwargs={**no_labels, "return_dict": False}, model_loss="required")


def test_one_process_compile_with_keywords_matches_the_model():
    kwargs = _batch()
    torch.manual_seed(0)
    model = Tagger()
    pm = autopar.compile(model, None, example_kwargs=kwargs)
    with torch.no_grad():
        out = pm(**kwargs)
    ref = model(**kwargs)
    torch.testing.assert_close(out["logits"], ref["logits"].detach())
    torch.testing.assert_close(out["loss"], ref["loss"].detach())
    loss = pm.step(**kwargs)
    ref["loss"].backward()
    torch.testing.assert_close(loss, ref["loss"].detach())
    grads = pm.full_gradients()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad)
    # positional and keyword inputs together, and a loss_fn with a target
    pm = autopar.compile(Tagger(), None, example_inputs=(kwargs["input_ids"],),
                         example_kwargs={"attention_mask": kwargs["attention_mask"]},
                         loss_fn=lambda out, y: F.cross_entropy(out["logits"].flatten(0, 1), y.flatten()),
                         example_target=kwargs["labels"])
    assert torch.isfinite(pm.step(kwargs["input_ids"], attention_mask=kwargs["attention_mask"],
                                  target=kwargs["labels"]))


# ---------------------------------------------------------------------- tier 1: a mean over counted targets


def _two_shares_sum_to_the_batch_mean(loss_fn, lengths=(6, 2, 5, 1)):
    """Capture ``loss_fn(model(ids), labels)`` at half the batch, rewrite it for 2 data
    ranks, run both halves with the whole batch's count: their sum is the batch mean."""
    kwargs = _batch(lengths=lengths)
    torch.manual_seed(0)
    model = Tagger()
    ids, labels = kwargs["input_ids"], kwargs["labels"]
    halves = list(zip(ids.chunk(2), labels.chunk(2)))
    gm = capture(model, (halves[0][0],), loss_fn, halves[0][1])
    gm = data_parallel_pass(gm, degree=2, local_batch=2, reduce_scalars=False)
    counter = gm.meta[TARGET_COUNT]
    count = sum(counter(y) for _, y in halves)
    assert int(count) == int((labels != -100).sum())
    with use_target_count(count):
        parts = [gm(x, y) for x, y in halves]
    torch.testing.assert_close(sum(parts), loss_fn(model(ids), labels))
    return gm


@pytest.mark.parametrize("spelling", ["functional", "module", "nll"])
def test_a_mean_over_counted_targets_becomes_a_share_of_the_whole_batchs_mean(spelling):
    def logits(out):
        return out["logits"].flatten(0, 1)
    loss_fn = {"functional": lambda out, y: F.cross_entropy(logits(out), y.flatten()),
               "module": _ModuleLoss(nn.CrossEntropyLoss()),
               "nll": lambda out, y: F.nll_loss(F.log_softmax(logits(out), -1), y.flatten())}[spelling]
    gm = _two_shares_sum_to_the_batch_mean(loss_fn)
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert output.target is global_mean and loss_reduction(output) == "sum"
    assert gm.meta[LOSS_REDUCTION] == "sum"
    assert "reduction = 'sum'" in gm.code
    gm.graph.lint()


class _ModuleLoss(nn.Module):
    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def forward(self, out, y):
        return self.loss(out["logits"].flatten(0, 1), y.flatten())


def test_sums_weights_and_probability_targets_are_left_alone():
    ids = _batch()["input_ids"]
    weight = torch.rand(5)
    for loss_fn, target in [
        (lambda out, y: F.cross_entropy(out["logits"].flatten(0, 1), y.flatten(), reduction="sum"), ids % 5),
        (lambda out, y: F.cross_entropy(out["logits"].flatten(0, 1), y.flatten(), weight=weight), ids % 5),
        (lambda out, y: F.cross_entropy(out["logits"], y), torch.rand(4, 6, 5).softmax(-1)),
    ]:
        gm = capture(Tagger(), (ids,), loss_fn, target)
        gm = data_parallel_pass(gm, degree=2, local_batch=4, reduce_scalars=False)
        assert TARGET_COUNT not in gm.meta and "global_mean" not in gm.code


def test_without_a_split_batch_the_loss_is_untouched():
    kwargs = _batch()
    gm = capture(Tagger(), (), example_kwargs=kwargs, model_loss="required")
    assert data_parallel_pass(gm, degree=1, local_batch=4) is gm and TARGET_COUNT not in gm.meta


def test_the_global_mean_says_what_is_missing_when_run_without_a_count():
    with pytest.raises(RuntimeError, match="no target count is current"):
        global_mean(torch.tensor(3.0))


def test_pipeline_stages_take_keywords_and_the_last_averages_over_the_whole_batch():
    from autopar.driver.rank_program import rewrite
    from autopar.strategies.pipeline.program import pipeline_rank_code
    case = OWN_LOSS["gpt2_labels"]()
    torch.manual_seed(0)
    model = case.factory()
    plan = autopar.plan(model, 4, example_kwargs=case.kwargs,
                        strategy={"pipeline": 2, "data": 2, "microbatches": 2})
    first = pipeline_rank_code(model, plan, 0, (), rewrite=rewrite, example_kwargs=case.kwargs)
    last = pipeline_rank_code(model, plan, 2, (), rewrite=rewrite, example_kwargs=case.kwargs)
    assert "def forward(self, input_ids, attention_mask)" in first
    assert "labels" in last and "global_mean" in last and "global_mean" not in first


# ---------------------------------------------------------------------- tier 1: bad calls


def test_a_keyword_the_example_did_not_have_is_named_with_the_examples_keys():
    kwargs = _batch()
    pm = autopar.compile(Tagger(), None, example_kwargs=kwargs)
    with pytest.raises(ValueError, match=r"forward\(\): keyword argument token_type_ids was not in the example "
                                         r"\(the example's keyword inputs are input_ids, attention_mask, labels\)"):
        pm(**kwargs, token_type_ids=kwargs["input_ids"])
    plain = autopar.compile(Tagger(), None, example_inputs=(kwargs["input_ids"],))
    with pytest.raises(ValueError, match=r"step\(\): keyword argument labels was not in the example \(the example "
                                         r"had no keyword inputs\)"):
        plain.step(kwargs["input_ids"], labels=kwargs["labels"])


def test_a_missing_keyword_is_named():
    kwargs = _batch()
    pm = autopar.compile(Tagger(), None, example_kwargs=kwargs)
    with pytest.raises(ValueError, match=r"step\(\): keyword argument attention_mask missing; the example had "
                                         r"input_ids, attention_mask, labels"):
        pm.step(input_ids=kwargs["input_ids"], labels=kwargs["labels"])


def test_a_keyword_tensor_of_another_batch_is_named_with_both_sizes():
    kwargs = _batch()
    bad = {**kwargs, "attention_mask": kwargs["attention_mask"][:3]}
    with pytest.raises(ValueError, match=r"the example: keyword input attention_mask has batch dimension 3 \(shape "
                                         r"\[3, 6\]\), the other inputs 4 \(keyword input input_ids has shape \[4, 6\]\)"):
        autopar.compile(Tagger(), None, example_kwargs=bad)
    pm = autopar.compile(Tagger(), None, example_kwargs=kwargs)
    with pytest.raises(ValueError, match=r"forward\(\): keyword input labels has batch dimension 2 \(shape \[2, 6\]\), "
                                         r"the other inputs 4"):
        pm(**{**kwargs, "labels": kwargs["labels"][:2]})


def test_constants_must_repeat_the_examples_and_tensors_stay_tensors():
    kwargs = _batch()
    pm = autopar.compile(Tagger(), None, example_kwargs={**kwargs, "scale": 2.0})
    with pytest.raises(ValueError, match=r"keyword input scale=3.0 differs from the example's 2.0; it is not a "
                                         r"tensor, so it was baked into the captured graph"):
        pm(**kwargs, scale=3.0)
    with pytest.raises(ValueError, match=r"keyword input labels is NoneType; the example's was a tensor"):
        pm(**{**kwargs, "labels": None}, scale=2.0)
    with pytest.raises(ValueError, match=r"keyword input past: a list holding tensors"):
        autopar.compile(Tagger(), None, example_kwargs={**kwargs, "past": [torch.zeros(1)]})


def test_the_loss_arguments_of_step_are_checked():
    kwargs = _batch()
    pm = autopar.compile(Tagger(), None, example_kwargs=kwargs)
    with pytest.raises(ValueError, match=r"a target was given, but compile was given no loss_fn"):
        pm.step(**kwargs, target=kwargs["labels"])
    no_labels = {k: v for k, v in kwargs.items() if k != "labels"}
    pm = autopar.compile(Tagger(), None, example_kwargs=no_labels)
    with pytest.raises(ModelLossError, match=r"carries no loss"):
        pm.step(**no_labels)
    pm = autopar.compile(Tagger(), None, example_kwargs=no_labels, loss_fn=lambda out, y: out["logits"].sum(),
                         example_target=kwargs["labels"])
    with pytest.raises(ValueError, match=r"needs the batch's target: call pm.step\(..., target=y\)"):
        pm.step(**no_labels)
