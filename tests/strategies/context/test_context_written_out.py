"""Context parallelism of attention written out in the graph (docs/context.md, "Attention
written out"): ``q @ k^T``, elementwise ops on the scores (scaling, soft-capping, an
additive mask or bias), ``softmax`` over the keys, ``@ v``, run with the keys and values
all-gathered over the context group (each rank its queries' rows), against the single
device on gloo ranks in float64: Hugging Face Gemma 2 (eager attention, alternating
sliding-window and global layers, soft-capped scores, a right-padded row), hand-written models
with a causal mask built in ``forward`` and with a learned attention bias; a softmax over
the queries refused, naming the node."""
import pytest
import torch

import autopar
import shared_ranks
from autopar.planning.strategy import PlanError
from examples.written_attention import SEQ, VOCAB, WrittenAttentionLM, gemma2, lm_loss, logits_loss
from test_context_parallel import _equal
from test_sequence_parallel import _report


def _ids(rows: int = 4):
    return torch.randint(0, VOCAB, (rows, SEQ), generator=torch.Generator().manual_seed(1))


def _padding(rows: int = 4):
    """Right padding of 3 tokens on the last row: fewer than the sliding window, so every
    query sees a key (a row with none gives Gemma 2 NaN in float64: its float32 softmax
    overflows the float32 minimum the mask adds)."""
    mask = torch.ones(rows, SEQ, dtype=torch.long)
    mask[rows - 1, SEQ - 3:] = 0
    return mask


def _gemma2(strategy):
    ids = _ids()
    torch.manual_seed(0)
    assert gemma2().double()(ids, attention_mask=_padding()).logits.isfinite().all()   # NaN == NaN in the comparison
    return _report(gemma2, strategy, inputs=(ids,), target=ids, loss_fn=logits_loss,
                   kwargs={"attention_mask": _padding()}, dtype=torch.float64)


def _hand_written(form, strategy):
    ids = _ids()
    return _report(lambda: WrittenAttentionLM(form), strategy, inputs=(ids,), target=ids, loss_fn=lm_loss,
                   dtype=torch.float64)


def two_ranks_job():
    c2 = {"context": 2}
    return {"gemma2": _gemma2(c2), "causal": _hand_written("causal", c2), "bias": _hand_written("bias", c2),
            "key_bias": _hand_written("key_bias", c2)}


def four_ranks_job():
    return {"gemma2_context2_data2": _gemma2({"context": 2, "data": 2}),
            "gemma2_context2_tensor2": _gemma2({"context": 2, "tensor": 2}),
            "gemma2_context2_pipeline2": _gemma2({"context": 2, "pipeline": 2}),
            "causal_context4": _hand_written("causal", {"context": 4})}


_TWO = shared_ranks.register(2, __name__, two_ranks_job, timeout_s=300)
_FOUR = shared_ranks.register(4, __name__ + ".extended", four_ranks_job, timeout_s=600, extended=True)


@pytest.mark.multiprocess
def test_written_out_attention_trains_as_the_single_device_model():
    """Gemma 2 (sliding window 4 of 16 tokens, soft-capping, grouped-query heads repeated
    in the graph, a right-padded row), a causal mask built in forward, a learned bias, a
    bias per key computed from the hidden states (its key columns gathered)."""
    for rank_out in _TWO():
        for case in ("gemma2", "causal", "bias", "key_bias"):
            _equal(rank_out[case])


@pytest.mark.multiprocess
@pytest.mark.extended
def test_written_out_attention_composes_with_data_tensor_and_pipeline_ranks():
    """Gemma 2 with data, Megatron (its heads split) and pipeline ranks; four context ranks."""
    for rank_out in _FOUR():
        for case, report in rank_out.items():
            _equal(report, 4 if case == "causal_context4" else 2)


# ------------------------------------------------------------ the rank's program and the plan, no ranks

def _walked(model, ids, loss_fn, kwargs=None, degree=2, graph=False):
    from autopar.api import _global_graph
    from autopar.strategies.context.rewrite import CONTEXT, context_parallel_pass
    gm = _global_graph(model, (ids,), loss_fn, ids, kwargs)
    gm = context_parallel_pass(gm, degree=degree, group="context", seq=ids.shape[1], balanced=True, mode="ring",
                               local_batch=ids.shape[0])
    return (gm.code, gm.meta[CONTEXT]) + ((gm,) if graph else ())


def test_the_rank_program_gathers_keys_and_values_and_cuts_the_masks_rows():
    from autopar.ir import SPEC
    from autopar.strategies.context.collectives import gather_tokens
    torch.manual_seed(0)
    code, report, gm = _walked(gemma2(), _ids(), logits_loss, {"attention_mask": _padding()}, graph=True)
    assert not report["gathers"] and report["written"] == 2, report   # nothing ran on the whole sequence
    # per layer the keys and the values gathered, nothing else: their 2 key/value heads
    # (4 rows x 16 tokens x 2 heads x 8), not the 4 heads repeat_kv makes of them after
    gathers = [n for n in gm.graph.nodes if n.target is gather_tokens]
    assert len(gathers) == 4 and all(n.meta[SPEC].numel == 4 * 16 * 2 * 8 for n in gathers), code
    # the sliding-window and the global mask, each cut to the rank's rows (dimension 2)
    assert code.count("take_tokens(where") == 2, code
    assert "ring_attention" not in code and code.count("softmax.int(") == 2


def test_a_model_with_written_out_attention_plans_context_parallelism():
    torch.manual_seed(0)
    ids = _ids()
    plan = autopar.plan(gemma2(), 4, (ids,), example_kwargs={"labels": ids}, strategy={"context": 2, "data": 2},
                        hardware="cpu-gloo")
    assert plan.mesh == {"data": 2, "context": 2, "tensor": 1}
    assert plan.context["seq"] == SEQ and plan.context["mode"] == "allgather"
    assert plan.context["written"] == 2 and plan.context["whole"] == 0
    assert plan.total.comm_s["context"] > 0          # the keys' and values' all-gathers priced
    assert "2 written out, their keys and values all-gathered" in plan.explain()


def test_a_softmax_over_the_queries_is_refused_naming_the_node():
    torch.manual_seed(0)
    ids = _ids()
    with pytest.raises(PlanError, match=r"written out at softmax.*dimension -2 \(the queries'\)"):
        autopar.plan(WrittenAttentionLM("queries"), 2, (ids,), lm_loss, example_target=ids, strategy={"context": 2},
                     hardware="cpu-gloo")


def test_auto_weighs_context_degrees_for_written_out_attention():
    """One sequence on 4 ranks: data parallelism cannot split it, the context degrees can."""
    torch.manual_seed(0)
    ids = _ids(rows=1)
    plan = autopar.plan(gemma2(), 4, example_kwargs={"input_ids": ids, "labels": ids}, hardware="cpu-gloo")
    weighed = [c for c in plan.candidates if c.mesh.get("context", 1) > 1]
    assert weighed and all(c.feasible for c in weighed), plan.explain()


def test_a_bias_split_by_the_keys_is_gathered_and_the_scores_stay_split():
    code, report = _walked(WrittenAttentionLM("key_bias"), _ids(), lm_loss)
    assert not report["gathers"] and report["written"] == 2, report
    assert code.count("gather_tokens(") == 6, code     # per layer: the keys, the values, the bias's columns


def test_attention_whose_inputs_are_whole_is_refused_naming_the_cause():
    """Dropout on the embeddings is drawn for the whole sequence: everything after it is
    whole, so no attention runs on the rank's rows, which the plan priced."""
    with pytest.raises(PlanError, match=r"written out at softmax cannot run on the rank's rows: dropout runs on "
                                        r"the whole sequence \(dropout with p=0.1"):
        _walked(WrittenAttentionLM("causal", dropout=0.1).train(), _ids(), lm_loss)
