"""The peer suite: model code from other libraries (``examples/peers/``), trained on 4
gloo ranks in float64 against one process, and the plan read: what a family splits is
split. torchtitan's Llama 3 (complex rotary, fused ``[heads, 3, d]`` Q/K/V, state-dict
hooks) under data 4, ZeRO-3, data × tensor with sequence parallelism, tensor 4 and
``"auto"``; with grouped-query attention (its fused projection ``[groups, H/G + 2, d]``)
under tensor 4 and data × tensor. torchtitan is installed by ``make peers`` (``make test-extended`` runs it)."""
import pytest

import shared_ranks
from examples.peers import hf_models, torchtitan_llama

# a strategy, or (strategy, key/value heads): grouped-query attention as the larger flavours have it
STRATEGIES = [{"data": 4}, {"data": 4, "zero": 3}, {"data": 2, "tensor": 2, "sequence_parallel": True},
              {"tensor": 4}, "auto", ({"tensor": 4}, 4), ({"data": 2, "tensor": 2, "sequence_parallel": True}, 4)]

_MISSING = torchtitan_llama.available()
_TORCHTITAN = None if _MISSING else shared_ranks.register(
    4, __name__ + ":extended", torchtitan_llama.peers_job, (STRATEGIES,), timeout_s=600, extended=True)


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
@pytest.mark.parametrize("index", range(len(STRATEGIES)), ids=[str(s) for s in STRATEGIES])
def test_torchtitan_llama3_trains_as_on_one_device(index):
    for rank_rows in _TORCHTITAN():
        row = rank_rows[index]
        assert "error" not in row, row.get("traceback")
        for kind, bound in (("output", 1e-12), ("loss", 1e-12), ("grad", 1e-12), ("param", 1e-10)):
            assert row[kind][1] <= bound, (row["strategy"], kind, row[kind])
        if row["mesh"].get("tensor", 1) > 1:   # every attention split by heads, as torchtitan's own plan
            assert row["attention"] and set(row["attention"]) == {"megatron"}, row


HF = [("gptj", {"tensor": 2})]
HF_EXTENDED = [("gptj", {"data": 2, "tensor": 2})]
_HF = shared_ranks.register(2, __name__ + ".hf:extended", hf_models.hf_job, (HF,), timeout_s=300, extended=True)
_HF_EXTENDED = shared_ranks.register(4, __name__ + ".hf:extended", hf_models.hf_job, (HF_EXTENDED,), timeout_s=300,
                                     extended=True)


def _check_hf(row):
    assert "error" not in row, row.get("traceback")
    for kind, bound in (("output", 1e-12), ("loss", 1e-12), ("grad", 1e-12), ("param", 1e-10)):
        assert row[kind][1] <= bound, (row["model"], row["strategy"], kind, row[kind])
    assert row["attention"] and set(row["attention"]) == {"megatron"}, row


def test_gptj_attention_is_planned_split_by_heads():
    import torch

    from autopar.api import plan
    ids = torch.randint(0, hf_models.VOCAB, (4, 8))
    made = plan(hf_models.build("gptj"), 2, (ids,), loss_fn=hf_models.logits_loss, example_target=ids,
                strategy={"tensor": 2})
    attention = [r.strategy for r in made.regions if r.region.startswith("attention:")]
    assert attention == ["megatron", "megatron"], made.explain()


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(HF)), ids=[f"{m}-{s}" for m, s in HF])
def test_hugging_face_peers_split_their_attention(index):
    for rank_rows in _HF():
        _check_hf(rank_rows[index])


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(HF_EXTENDED)), ids=[f"{m}-{s}" for m, s in HF_EXTENDED])
def test_hugging_face_peers_split_their_attention_extended(index):
    for rank_rows in _HF_EXTENDED():
        _check_hf(rank_rows[index])
