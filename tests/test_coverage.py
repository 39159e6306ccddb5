"""The model-coverage suite (examples/coverage.py, docs/coverage.md): Hugging Face GPT-2,
BERT, Llama, T5, ViT and ResNet from small configs, and the project's examples, each
captured, planned, trained 3 steps on 4 gloo ranks and compared with single-device
training. One spawn runs the whole suite."""
import pytest

import shared_ranks
from examples.coverage import DEFAULT_RUNS, HF_TRANSFORMERS, coverage_job, is_equal, table

# every model under "auto" here; the transformers forced to Megatron (data 2 x tensor 2)
# in the extended suite (GPT-2, BERT and T5 under that split train with their own loss
# in test_keyword_inputs)
# the Hugging Face models under "auto" in the main suite; the hand-written examples (which
# the golden and numerics suites train under every family) and the forced Megatron runs:
# the extended suite
HF_AUTO = ("gpt2", "bert", "llama", "t5", "vit", "resnet")
RUNS = [run for run in DEFAULT_RUNS if run[1] == "auto" and run[0] in HF_AUTO]
FORCED = [run for run in DEFAULT_RUNS if run[1] != "auto" or run[0] not in HF_AUTO]
# the 4-rank launch is shared with other modules' jobs (tests/shared_ranks.py)
_LAUNCHED = shared_ranks.register(4, __name__, coverage_job, (RUNS,), timeout_s=900)
_FORCED = shared_ranks.register(4, __name__ + ":extended", coverage_job, (FORCED,), timeout_s=900, extended=True)


@pytest.fixture(scope="module")
def rows():
    return _LAUNCHED()


@pytest.mark.multiprocess
def test_every_model_of_the_suite_trains_like_the_single_device_model(rows):
    failed = [(r["model"], r["strategy"], r.get("error"), r.get("traceback")) for r in rows[0] if not r["equal"]]
    assert not failed, f"{failed}\n{table(rows[0])}"
    assert {r["model"] for r in rows[0]} >= set(HF_AUTO)


@pytest.mark.multiprocess
def test_every_rank_reports_the_same_plan_and_verdict(rows):
    summary = [[(r["model"], r.get("plan"), r["equal"]) for r in rank_rows] for rank_rows in rows]
    assert all(s == summary[0] for s in summary)


@pytest.mark.multiprocess
@pytest.mark.extended
def test_forced_megatron_splits_every_transformer_and_the_examples_train_under_auto():
    rows = _FORCED()[0]
    assert not [r for r in rows if not r["equal"]], table(rows)
    forced = [r for r in rows if r["strategy"] != "auto"]
    assert {r["model"] for r in forced} == set(HF_TRANSFORMERS)
    for r in forced:
        assert r["mesh"] == {"data": 2, "tensor": 2} and "megatron" in r["strategies"], r["model"]
    tracers = {r["model"]: r["tracer"] for r in rows if r["strategy"] == "auto"}
    assert tracers == {m: "symbolic_trace" for m in ("mlp", "transformer", "inception", "towers")}


@pytest.mark.multiprocess
def test_hugging_face_models_are_captured_by_export(rows):
    tracers = {r["model"]: r["tracer"] for r in rows[0]}
    assert all(tracers[m] == "export" for m in HF_AUTO)   # (the examples': the extended suite)


def test_equality_criterion_rejects_a_real_difference():
    good = {"output": (0.0, 0.0), "loss": (1e-7, 1e-7), "grad": (1e-8, 2e-7), "grad_norm": (1e-8, 1e-7),
            "param": (2e-6, 1e-4)}
    assert is_equal(good)
    assert not is_equal({**good, "grad": (1e-3, 1e-2)})
    # a small gradient 1% off: tiny in absolute terms, and still a wrong gradient
    assert not is_equal({**good, "grad": (1e-9, 1e-2)})
    assert not is_equal({**good, "grad_norm": (1e-7, 1e-5)})
    assert not is_equal({**good, "param": (1e-5, 1e-2)})
