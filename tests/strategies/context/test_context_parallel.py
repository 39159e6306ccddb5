"""Context parallelism (docs/context.md): the sequence split over a ``context`` mesh
dimension, attention as a ring, against the single-device model on gloo ranks; ring
attention against ``scaled_dot_product_attention``; the forcing key and the planner."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import autopar
import shared_ranks
from autopar.planning.strategy import PlanError
from autopar.runtime.groups import use_groups
from autopar.strategies.context.collectives import gather_tokens, positions, take_tokens
from autopar.strategies.context.ring import ring_attention
from examples.zoo import ZOO
from test_sequence_parallel import _report, batch, encoder, gpt2, llama, qwen2


def _ring_against_sdpa() -> list:
    """Ring attention (and its all-gather mode) against SDPA on the whole sequence:
    output and the gradients of queries, keys and values, causal, padded, GQA."""
    out = []
    with use_groups({"context": dist.group.WORLD}):
        for seq, causal, padded, kv_heads, mode in ((16, True, False, 4, "ring"), (16, False, True, 2, "ring"),
                                                     (16, True, True, 2, "ring"), (16, True, True, 2, "allgather"),
                                                     (14, True, False, 4, "ring")):
            g = torch.Generator().manual_seed(0)
            q = torch.randn(2, 4, seq, 8, generator=g)
            k, v = torch.randn(2, kv_heads, seq, 8, generator=g), torch.randn(2, kv_heads, seq, 8, generator=g)
            grad = torch.randn(2, 4, seq, 8, generator=g)
            mask = None
            if padded:
                keep = torch.ones(2, seq, dtype=torch.bool)
                keep[1, :5] = False
                mask = keep[:, None, None, :].expand(2, 1, seq, seq)
                mask = mask & torch.ones(seq, seq, dtype=torch.bool).tril() if causal else mask
            qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
            F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=causal and mask is None,
                                           enable_gqa=kv_heads != 4).backward(grad)
            balanced = seq % 4 == 0
            local = [take_tokens(t, 2, 1, seq, "context", balanced).detach().requires_grad_() for t in (q, k, v)]
            o = ring_attention(*local, mask, is_causal=causal and mask is None, seq=seq, group="context",
                               balanced=balanced, mode=mode)
            o.backward(take_tokens(grad, 2, 1, seq, "context", balanced))
            whole = gather_tokens(o.detach(), 2, 1, seq, "context", balanced)
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                                 enable_gqa=kv_heads != 4)
            errors = [(whole - ref).abs().max()] + [
                (t.grad - take_tokens(s.grad, 2, 1, seq, "context", balanced)).abs().max()
                for t, s in zip(local, (qs, ks, vs))]
            out.append(float(max(errors)))
    return out


def two_ranks_job():
    c2 = {"context": 2}
    out = {"ring": _ring_against_sdpa(),
           "llama": _report(llama, c2, kwargs=batch()),
           "qwen2_causal": _report(qwen2, c2, kwargs=batch(padded=False))}
    x, y = torch.randn(16, 4, 32), torch.randn(16, 4, 8)
    out["encoder"] = _report(encoder, c2, inputs=(x,), target=y, loss_fn=F.mse_loss)
    t5 = ZOO["t5"]()   # encoder-decoder, a learned relative-position bias: its attention runs on the whole sequence
    out["t5"] = _report(t5.factory, c2, inputs=t5.inputs, target=t5.target, loss_fn=t5.loss_fn, kwargs=t5.kwargs)
    torch.manual_seed(0)
    pm = autopar.compile(llama(), None, example_kwargs=batch(), strategy=c2)
    pm.step(**batch())
    out["code"] = pm.rank_graph_code()
    out["positions"] = positions(16, 2, dist.get_rank(), True)
    return out


def two_ranks_extended_job():
    c2 = {"context": 2}
    return {"llama_unbalanced": _report(llama, c2, kwargs=batch(tokens=14, padded=False)),
            "gpt2": _report(gpt2, c2, kwargs=batch()),
            "llama_zero3": _report(llama, {"context": 2, "zero": 3}, kwargs=batch())}


def four_ranks_job():
    out = {}
    for name, factory in (("llama", llama), ("qwen2", qwen2)):
        for label, strategy in (("context2_tensor2", {"context": 2, "tensor": 2}),
                                ("context2_pipeline2", {"context": 2, "pipeline": 2}),
                                # a microbatch per row of the data rank, each row over the context ranks
                                ("context2_pipeline2_m4", {"context": 2, "pipeline": 2, "microbatches": 4}),
                                ("context2_data2", {"context": 2, "data": 2})):
            out[f"{name}_{label}"] = _report(factory, strategy, kwargs=batch())
    out["llama_context4"] = _report(llama, {"context": 4}, kwargs=batch(padded=False))
    return out


_TWO = shared_ranks.register(2, __name__, two_ranks_job, timeout_s=600)
_TWO_MORE = shared_ranks.register(2, __name__ + ".extended", two_ranks_extended_job, timeout_s=600, extended=True)
_FOUR = shared_ranks.register(4, __name__ + ".extended", four_ranks_job, timeout_s=900, extended=True)


def _equal(report, context: int = 2) -> None:
    assert report["mesh"]["context"] == context, report
    assert report["output"][1] < 1e-5, report
    assert report["loss"][1] < 1e-5, report
    assert report["grad"][1] < 1e-5, report
    assert report["grad_norm"][1] < 1e-5, report
    assert report["param"][0] < 5e-4, report


@pytest.mark.multiprocess
def test_ring_attention_equals_sdpa_over_the_whole_sequence():
    for rank_out in _TWO():
        assert max(rank_out["ring"]) < 1e-5, rank_out["ring"]


@pytest.mark.multiprocess
def test_context_parallel_trains_as_the_single_device_model():
    """Llama (GQA, rotary, a padded row, a loss over ignored targets), Qwen2 causal, a
    sequence-first nn encoder, and T5 (its attention, biased by a learned relative
    position table, on the whole sequence)."""
    for rank_out in _TWO():
        for case in ("llama", "qwen2_causal", "encoder", "t5"):
            _equal(rank_out[case])


@pytest.mark.multiprocess
@pytest.mark.extended
def test_context_parallel_unbalanced_lengths_position_embeddings_and_zero():
    """A sequence of 14 tokens (2c does not divide it: contiguous chunks), GPT-2 (position
    embeddings, Conv1D's addmm rows), ZeRO-3 over data × context."""
    for rank_out in _TWO_MORE():
        for report in rank_out.values():
            _equal(report)


@pytest.mark.multiprocess
def test_the_rank_program_rings_attention_and_cuts_the_whole_inputs():
    out = _TWO()
    assert out[0]["positions"] == [0, 1, 2, 3, 12, 13, 14, 15]     # chunks 0 and 3 of 4
    assert out[1]["positions"] == [4, 5, 6, 7, 8, 9, 10, 11]       # chunks 1 and 2
    code = out[0]["code"]
    assert code.count("ring_attention(") == 2                      # both layers' attention
    assert "scaled_dot_product_attention" not in code
    assert "gather_tokens(" not in code                            # nothing ran on the whole sequence
    assert "context_sum(" in code                                  # the loss's sum over the sequence


@pytest.mark.multiprocess
@pytest.mark.extended
def test_context_parallel_composes_with_tensor_pipeline_and_data_ranks():
    for rank_out in _FOUR():
        for case, report in rank_out.items():
            _equal(report, 4 if case == "llama_context4" else 2)


# ------------------------------------------------------------ planning, no ranks

def _plan(strategy, world=4, model=llama, kwargs=None, **options):
    torch.manual_seed(0)
    return autopar.plan(model(), world, example_kwargs=kwargs or batch(), strategy=strategy, hardware="cpu-gloo",
                        **options)


def test_a_context_pipeline_divides_a_data_ranks_rows_into_microbatches():
    # 4 rows on the one data rank, each spread over 2 context ranks: 4 microbatches of a row
    # (they were counted over data x context ranks: 2 rows, and 4 microbatches refused)
    plan = _plan({"context": 2, "pipeline": 2, "microbatches": 4})
    assert plan.mesh["context"] == 2 and plan.pipeline["microbatches"] == 4
    assert plan.pipeline["microbatch_size"] == 1
    with pytest.raises(PlanError, match="microbatches=3 does not divide the batch of each data rank"):
        _plan({"context": 2, "pipeline": 2, "microbatches": 3})


def test_forced_context_degrees_make_a_context_mesh():
    plan = _plan({"context": 2, "tensor": 2})
    assert plan.mesh == {"data": 1, "context": 2, "tensor": 2}
    assert plan.context["seq"] == 16 and plan.context["balanced"] and plan.context["mode"] in ("ring", "allgather")
    assert "context" in plan.explain()
    assert plan.why_not("context").startswith("context: chosen")
    assert _plan({"context": 2, "pipeline": 2}).mesh == {"pipeline": 2, "data": 1, "context": 2, "tensor": 1}
    assert _plan({"context": 4}).mesh == {"data": 1, "context": 4, "tensor": 1}


def test_the_planner_weighs_context_degrees_under_auto():
    # where data parallelism runs, splitting the sequence instead only adds the ring
    plan = _plan("auto")
    assert not any(c.mesh.get("context", 1) > 1 for c in plan.candidates)
    assert plan.why_not("context").startswith("context: not weighed")
    # one sequence on 4 ranks: data parallelism cannot split it, the context degrees can
    one = _plan("auto", kwargs=batch(rows=1, padded=False))
    weighed = [c for c in one.candidates if c.mesh.get("context", 1) > 1]
    assert weighed and all(c.feasible for c in weighed)


def test_auto_offers_context_only_where_every_attention_rings():
    t5 = ZOO["t5"]()
    torch.manual_seed(0)
    plan = autopar.plan(t5.factory(), 4, t5.inputs, t5.loss_fn, example_target=t5.target, example_kwargs=t5.kwargs,
                        hardware="cpu-gloo")
    assert not any(c.mesh.get("context", 1) > 1 for c in plan.candidates)
    assert plan.why_not("context").startswith("context: not weighed")


def test_forcing_context_where_it_cannot_run_names_the_argument():
    with pytest.raises(PlanError, match="15 tokens is not divisible by the context degree 2"):
        _plan({"context": 2}, world=2, kwargs=batch(tokens=15, padded=False))
    with pytest.raises(PlanError, match="context=3 does not divide the 4 ranks"):
        _plan({"context": 3})
    with pytest.raises(PlanError, match="context='2'"):
        _plan({"context": "2"})
    with pytest.raises(PlanError, match="sequence_parallel"):
        _plan({"context": 2, "tensor": 2, "sequence_parallel": True})
    with pytest.raises(PlanError, match="not \\['subgrids'\\]"):
        _plan({"context": 2, "subgrids": 2})


def test_a_long_context_on_a_preset_takes_context_parallelism():
    """A Llama-3-8B-shaped model (32 layers, width 4096, 8 key/value heads, vocabulary
    128256) at one sequence of 128k tokens on 8 h100s: the planner splits the sequence."""
    import transformers
    config = transformers.LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                      max_position_embeddings=131072)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    ids = torch.zeros(1, 131072, dtype=torch.long, device="meta")
    plan = autopar.plan(model, 8, example_kwargs={"input_ids": ids, "labels": ids}, hardware="h100")
    assert plan.degree("context") > 1 and plan.context["seq"] == 131072 and plan.context["balanced"]
    assert plan.why_not("context").startswith("context: chosen")
    assert plan.total.memory_bytes <= 80 * 2**30
    # Megatron alone fits only with sequence parallelism and recomputation, and is slower
    tensor = [c for c in plan.candidates if c.mesh == {"data": 1, "tensor": 8}]
    assert tensor and tensor[0].feasible and tensor[0].step_s > plan.step_s


# ------------------------------------------------------------ the walk on captured graphs, no ranks

class _NanoAttention(torch.nn.Module):
    """nanoGPT's attention: ``B, T, C = x.size()`` read back into the views."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(16, dim=2)
        q, k, v = (t.view(B, T, 2, C // 2).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).contiguous().view(B, T, C))


class _MaxOver(torch.nn.Module):
    def forward(self, x):
        return x.max(-1).values.sum()


class _FusedHeads(torch.nn.Module):
    """Falcon's fused query/key/value heads picked by an index, a broadcast, attention."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.register_buffer("pick", torch.tensor([0, 1]))

    def forward(self, x):
        B, T, _ = x.shape
        fused = self.qkv(x).view(B, T, 2, 3, 8)
        q, k, v = fused[:, :, :, 0], fused[:, :, :, 1], fused[:, :, :, 2]
        k = torch.broadcast_to(k[:, :, self.pick], (B, T, 2, 8))
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return y.sum()


def _walked(module, x, tracer="symbolic_trace"):
    from autopar.passes.analysis.analyse import analyse
    from autopar.strategies.context.rewrite import CONTEXT, context_parallel_pass
    from autopar.trace.capture import capture
    gm = analyse(capture(module, (x,), tracer=tracer))
    gm = context_parallel_pass(gm, degree=2, group="context", seq=x.shape[1], balanced=True, mode="ring",
                               local_batch=x.shape[0])
    return gm.code, gm.meta[CONTEXT]


def test_sizes_read_from_the_split_value_are_the_global_ones():
    code, report = _walked(_NanoAttention(), torch.randn(2, 8, 16))
    assert report["ring_attention"] == 1 and not report["gathers"], code
    # the views of q, k, v and of the output at the rank's 4 of 8 tokens
    assert code.count(".view(2, 4, 2,") == 3 and ".view(2, 4, 16)" in code, code


def test_a_reduction_read_through_a_named_tuple_field_still_sums_over_the_sequence():
    code, report = _walked(_MaxOver(), torch.randn(2, 8, 16))
    # max over the features keeps the tokens split; the sum over them adds the ranks' parts
    assert "context_sum(" in code, code


def test_an_index_and_a_broadcast_after_the_sequence_keep_it_split():
    code, report = _walked(_FusedHeads(), torch.randn(2, 8, 16), tracer="export")
    assert report["ring_attention"] == 1 and not report["gathers"], code
