"""Megatron sequence parallelism (docs/sequence.md): the values between the tensor-parallel
regions split over the tokens, against the single-device model on gloo ranks; the
planner's choice; the forcing key's refusals."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers

import autopar
import shared_ranks
from autopar.planning.strategy import PlanError
from autopar.strategies.megatron import collectives as sequence_collectives
from autopar.testing import compare_with_single_device

V = 96


def llama():
    config = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


def qwen2():
    config = transformers.Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.Qwen2ForCausalLM(config)


def gpt2():
    config = transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0,
                                     embd_pdrop=0, attn_pdrop=0)
    return transformers.GPT2LMHeadModel(config)


def encoder():
    """nn.TransformerEncoderLayers, sequence first (``[seq, batch, features]``), and a head
    outside the regions."""
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0)
    return nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Linear(32, 8))


def batch(rows: int = 4, tokens: int = 16, padded: bool = True):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (rows, tokens), generator=g)
    mask = torch.ones(rows, tokens, dtype=torch.long)
    if padded:
        mask[rows - 1, :5] = 0   # left padding on the last row
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}


def _sequence_collectives(pm) -> dict[str, int]:
    code = pm.rank_graph_code()
    return {name: code.count(name + "(") for name in
            ("reduce_scatter_to_sequence_region", "gather_from_sequence_region", "reduce_from_tensor_region")}


def _report(factory, strategy, **kwargs) -> dict:
    report = compare_with_single_device(factory, kwargs.pop("inputs", ()), kwargs.pop("target", None),
                                        kwargs.pop("loss_fn", None), strategy, steps=3, **kwargs)
    out = {k: report[k] for k in ("mesh", "output", "loss", "grad", "grad_norm", "param")}
    out["sequence_parallel"] = "sequence parallel" in report["plan"]
    return out


def two_ranks_job():
    sp = {"tensor": 2, "sequence_parallel": True}
    out = {"llama": _report(llama, sp, kwargs=batch()),
           "llama_one_sequence": _report(llama, sp, kwargs=batch(rows=1, tokens=16, padded=False)),
           "gpt2": _report(gpt2, sp, kwargs=batch())}
    x, y = torch.randn(16, 4, 32), torch.randn(16, 4, 8)
    out["encoder"] = _report(encoder, sp, inputs=(x,), target=y, loss_fn=F.mse_loss)
    # where the split runs; a length the degree does not divide runs without it
    torch.manual_seed(0)
    for name, kwargs, strategy in (("collectives", batch(), sp),
                                   ("collectives_odd", batch(rows=1, tokens=15, padded=False), {"tensor": 2})):
        # (the odd case left to the planner: it fits without sequence parallelism anyway)
        pm = autopar.compile(llama(), None, example_kwargs=kwargs, strategy=strategy)
        pm.step(**kwargs)
        out[name] = _sequence_collectives(pm)
        out[name + "_planned"] = pm.plan.sequence_parallel
    # each column linear's gathered input is kept as the rank's chunk for backward
    kept = []
    own = sequence_collectives._match
    sequence_collectives._match = lambda t: (lambda r: kept.append(r is not None) or r)(own(t))
    try:
        pm = autopar.compile(llama(), None, example_kwargs=batch(), strategy=sp)
        pm.step(**batch())
    finally:
        sequence_collectives._match = own
    out["kept_split"] = sum(kept)
    pm = autopar.compile(llama(), None, example_kwargs=batch(), strategy={"tensor": 2, "sequence_parallel": False})
    pm.step(**batch())
    out["collectives_off"] = _sequence_collectives(pm)
    return out


def four_ranks_job():
    out = {}
    for name, factory in (("llama", llama), ("qwen2", qwen2)):
        for label, strategy in (("data2_tensor2", {"data": 2, "tensor": 2, "sequence_parallel": True}),
                                ("pipeline2_tensor2", {"pipeline": 2, "tensor": 2, "sequence_parallel": True})):
            out[f"{name}_{label}"] = _report(factory, strategy, kwargs=batch())
    return out


_TWO = shared_ranks.register(2, __name__, two_ranks_job, timeout_s=600)
_FOUR = shared_ranks.register(4, __name__ + ".extended", four_ranks_job, timeout_s=900, extended=True)


def _equal(report) -> None:
    assert report["sequence_parallel"], report   # the plan ran it
    assert report["output"][1] < 1e-5, report
    assert report["loss"][1] < 1e-5, report
    assert report["grad"][1] < 1e-5, report
    assert report["grad_norm"][1] < 1e-5, report
    assert report["param"][0] < 5e-4, report


@pytest.mark.multiprocess
def test_sequence_parallel_trains_as_the_single_device_model():
    """Llama (GQA, rotary, a padded row), one sequence alone (the split falls on the
    sequence), GPT-2 (Conv1D's flattened tokens, position embeddings) and a sequence-first
    nn encoder with a head outside the regions."""
    for rank_out in _TWO():
        for case in ("llama", "llama_one_sequence", "gpt2", "encoder"):
            _equal(rank_out[case])


@pytest.mark.multiprocess
def test_the_split_runs_between_the_regions_and_stops_where_no_token_dimension_divides():
    out = _TWO()[0]
    # 2 layers x (attention, MLP) rows end in a reduce-scatter, the embedding too; each
    # column input (QKV once, gate/up once, the head) is one all-gather
    assert out["collectives"]["reduce_scatter_to_sequence_region"] == 5
    assert out["collectives"]["gather_from_sequence_region"] == 5
    assert out["collectives"]["reduce_from_tensor_region"] == 0
    assert out["collectives_planned"]
    # one sequence of 15 tokens over 2 ranks: the plan runs Megatron's all-reduces
    assert not out["collectives_odd_planned"]
    assert out["collectives_odd"]["reduce_scatter_to_sequence_region"] == 0
    assert out["collectives_odd"]["reduce_from_tensor_region"] > 0
    assert out["collectives_off"]["reduce_scatter_to_sequence_region"] == 0
    # the queries', keys' and values' input and each MLP's and the head's, saved as chunks
    assert out["kept_split"] >= 5


@pytest.mark.multiprocess
@pytest.mark.extended
def test_sequence_parallel_with_data_and_pipeline_ranks():
    for rank_out in _FOUR():
        for report in rank_out.values():
            _equal(report)


# ------------------------------------------------------------ planning, no ranks

def _plan(strategy, world=4, model=llama, **kwargs):
    torch.manual_seed(0)
    return autopar.plan(model(), world, example_kwargs=batch(), strategy=strategy, hardware="cpu-gloo", **kwargs)


def test_the_planner_takes_sequence_parallel_where_activations_do_not_fit_without_it():
    on = _plan({"data": 2, "tensor": 2, "sequence_parallel": True})
    off = _plan({"data": 2, "tensor": 2, "sequence_parallel": False})
    assert on.sequence_parallel and "sequence parallel" in on.explain()
    assert not off.sequence_parallel and "sequence parallel" not in off.explain()
    # the activations between the regions are divided by the tensor degree; backward
    # gathers each split region's input again
    assert on.total.memory_bytes < off.total.memory_bytes and on.step_s > off.step_s
    # it costs time: a configuration that fits runs without it, one that fits only with it takes it
    assert not _plan({"data": 2, "tensor": 2}).sequence_parallel
    tight = _plan({"data": 2, "tensor": 2}, memory_limit=(on.total.memory_bytes + off.total.memory_bytes) / 2)
    assert tight.sequence_parallel and tight.total.memory_bytes == on.total.memory_bytes
    assert not _plan({"data": 4}).sequence_parallel
    # alone, the key lets the planner choose among the plans with a tensor group
    alone = _plan({"sequence_parallel": True})
    assert alone.sequence_parallel and alone.degree("tensor") > 1


def test_a_long_context_on_a_preset_takes_sequence_parallel():
    """A 16-layer GPT of width 8192 at one 32k-token sequence on 8 A100s (a100-selene):
    the whole-batch activations do not fit a tensor group of 8 without it."""
    from autopar.cost.hardware import get_hardware
    from autopar.passes.analysis.analyse import analyse
    from autopar.driver.search import plan_graph
    from autopar.trace.capture import capture
    from examples.factories import gpt_meta
    facts = analyse(capture(*gpt_meta(16, 8192, 64, 1, seq=32768)))
    plan = plan_graph(facts, 8, get_hardware("a100-selene"), strategy={"data": 1, "tensor": 8})
    assert plan.mesh == {"data": 1, "tensor": 8} and plan.sequence_parallel
    # "auto" may also split the sequence over a context group instead (its attention is
    # written out, which context parallelism runs with the keys and values all-gathered)
    chosen = plan_graph(facts, 8, get_hardware("a100-selene"))
    assert chosen.sequence_parallel or chosen.mesh.get("context", 1) > 1, chosen.mesh
    off = plan_graph(facts, 8, get_hardware("a100-selene"), strategy={"data": 1, "tensor": 8,
                                                                       "sequence_parallel": False})
    assert not off.sequence_parallel and off.total.memory_bytes > plan.total.memory_bytes


def test_forcing_sequence_parallel_where_it_cannot_run_names_the_plan():
    with pytest.raises(PlanError, match="sequence_parallel=True.*tensor"):
        _plan({"data": 4, "sequence_parallel": True})
    with pytest.raises(PlanError, match="no token dimension .* divisible by the tensor degree 2"):
        torch.manual_seed(0)
        autopar.plan(llama(), 2, example_kwargs=batch(rows=1, tokens=15, padded=False),
                     strategy={"tensor": 2, "sequence_parallel": True}, hardware="cpu-gloo")
    with pytest.raises(PlanError, match="sequence_parallel='yes'"):
        _plan({"tensor": 2, "sequence_parallel": "yes"}, world=2)
