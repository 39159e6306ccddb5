"""The peer suite: model code from other libraries (``examples/peers/``), trained on 4
gloo ranks in float64 against one process, and the plan read: what a family splits is
split. torchtitan's Llama 3 (complex rotary, fused ``[heads, 3, d]`` Q/K/V, state-dict
hooks) under data 4, ZeRO-3, data × tensor with sequence parallelism, tensor 4 and
``"auto"``; with grouped-query attention (its fused projection ``[groups, H/G + 2, d]``)
under tensor 4 and data × tensor. torchtitan is installed by ``make peers`` (``make test-extended`` runs it)."""
import pytest

import shared_ranks
from examples.peers import hf_models, survey, torchtitan_llama, torchtitan_qwen3

# a strategy, or (strategy, key/value heads): grouped-query attention as the larger flavours have it
STRATEGIES = [{"data": 4}, {"data": 4, "zero": 3}, {"data": 2, "tensor": 2, "sequence_parallel": True},
              {"tensor": 4}, "auto", ({"tensor": 4}, 4), ({"data": 2, "tensor": 2, "sequence_parallel": True}, 4)]

def _check_exact(row):
    """A row equal to one process within float64's rounding, and, where the plan has a
    tensor group, every attention split by heads (OLMo 2's q/k norms span every head:
    test_a_norm_of_each_heads_features_splits_with_the_heads; multi-query Falcon
    has one key/value head: test_multi_query_attention_stays_whole)."""
    shared_ranks.assert_as_on_one_device(row, (row.get("model"), row["strategy"]))
    if row.get("model") not in ("olmo2", "falcon_mq") and row["mesh"].get("tensor", 1) > 1:
        assert row["attention"] and set(row["attention"]) == {"megatron"}, row


_MISSING = torchtitan_llama.available()
_TORCHTITAN = None if _MISSING else shared_ranks.register(
    4, __name__ + ":extended", torchtitan_llama.peers_job, (STRATEGIES,), timeout_s=600, extended=True)


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
@pytest.mark.parametrize("index", range(len(STRATEGIES)), ids=[str(s) for s in STRATEGIES])
def test_torchtitan_llama3_trains_as_on_one_device(index):
    for rank_rows in _TORCHTITAN():
        _check_exact(rank_rows[index])   # every attention split by heads, as torchtitan's own plan


_QWEN3 = None if _MISSING else shared_ranks.register(
    2, __name__ + ".qwen3:extended", torchtitan_qwen3.qwen3_job,
    ([{"tensor": 2}, {"tensor": 2, "sequence_parallel": True}, {"data": 2, "zero": 3}, "auto"],), timeout_s=600,
    extended=True)


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
@pytest.mark.parametrize("index", range(4))
def test_torchtitan_qwen3_trains_as_on_one_device(index):
    """torchtitan's Qwen 3: a fused grouped-query projection, RMSNorm of each head's query
    and key (its weight's gradient summed over the heads of every tensor rank), tied head."""
    for rank_rows in _QWEN3():
        _check_exact(rank_rows[index])


def _attention_plan(name: str) -> list:
    import torch

    from autopar.api import plan
    ids = torch.randint(0, hf_models.VOCAB, (4, 8))
    made = plan(hf_models.build(name), 2, (ids,), loss_fn=hf_models.logits_loss, example_target=ids,
                strategy={"tensor": 2})
    return [(r.strategy, r.reason) for r in made.regions if r.region.startswith("attention:")]


def test_a_norm_of_each_heads_features_splits_with_the_heads():
    """Qwen 3 normalises each query and key head (RMSNorm over head_dim after the view to
    heads): split by heads; OLMo 2 normalises the whole projection before the view, a
    reduction over every head: the region stays replicated, saying so."""
    assert [s for s, _ in _attention_plan("qwen3")] == ["megatron", "megatron"]
    olmo = _attention_plan("olmo2")
    assert [s for s, _ in olmo] == ["replicate", "replicate"], olmo
    assert all("reduction over the split dimension" in why for _, why in olmo), olmo


@pytest.mark.parametrize("name", ["gpt_neo", "falcon", "falcon_heads"])
def test_attention_written_otherwise_is_found_and_split(name):
    """GPT-Neo masks its float32 scores with ``where(causal, scores, min)`` before the
    softmax; Falcon's new architecture views its fused projection as ``H + 2G`` slots of
    ``d``, then as ``[B, T, G, H/G + 2, d]``, and takes each group's queries by a slice and
    its key and value by integer indexes (multiplying by its weight's ``.T``); Falcon
    without groups regroups its slots ``unflatten(-2, (H, 3))``. (The older Falcon form,
    indexes with lists and ``broadcast_to``, is ``examples/qkv_layouts.py``'s
    ``indexed_groups``.)"""
    assert [s for s, _ in _attention_plan(name)] == ["megatron", "megatron"]


def test_multi_query_attention_stays_whole():
    """Falcon's multi-query projection has one key and one value head for all queries:
    no split by heads keeps them, so the attention is no region (its MLPs still split)."""
    assert _attention_plan("falcon_mq") == []


def test_layers_alike_but_for_their_lifted_constants_are_repeated_blocks():
    """Falcon's layers each index their fused projection with a list (``[-2]``), which the
    export lifts as constants named per use (``lifted_tensor_0``, ``lifted_tensor_2``):
    the layers are alike all the same, and a pipeline cuts between them."""
    import torch

    from autopar.api import plan
    ids = torch.randint(0, hf_models.VOCAB, (4, 8))
    made = plan(hf_models.build("falcon"), 2, (ids,), loss_fn=hf_models.logits_loss, example_target=ids,
                strategy={"pipeline": 2, "microbatches": 2})
    assert made.mesh.get("pipeline") == 2


HF = [("gptj", {"tensor": 2}), ("falcon", {"pipeline": 2, "microbatches": 2}), ("qwen3", {"tensor": 2}), ("olmo2", {"tensor": 2}), ("falcon", {"tensor": 2}),
      ("falcon", {"tensor": 2, "sequence_parallel": True}), ("falcon_heads", {"tensor": 2}), ("falcon_mq", {"tensor": 2})]
HF_EXTENDED = [("gptj", {"data": 2, "tensor": 2})]
_HF = shared_ranks.register(2, __name__ + ".hf:extended", hf_models.hf_job, (HF,), timeout_s=300, extended=True)
_HF_EXTENDED = shared_ranks.register(4, __name__ + ".hf:extended", hf_models.hf_job, (HF_EXTENDED,), timeout_s=300,
                                     extended=True)




def test_gptj_attention_is_planned_split_by_heads():
    import torch

    from autopar.api import plan
    ids = torch.randint(0, hf_models.VOCAB, (4, 8))
    made = plan(hf_models.build("gptj"), 2, (ids,), loss_fn=hf_models.logits_loss, example_target=ids,
                strategy={"tensor": 2})
    attention = [r.strategy for r in made.regions if r.region.startswith("attention:")]
    assert attention == ["megatron", "megatron"], made.explain()


# autoparallel's Hugging Face list (examples/peers/survey.py runs each under every family;
# docs/coverage.md has the table): here each under tensor 2, its attention split by heads
# where the model has attention the analysis reads
LIST = [m for m in survey.MODELS if m not in ("gptj", "falcon")]
NO_ATTENTION_SPLIT = {"bloom": "scores by baddbmm with ALiBi rows per (batch, head)", "rwkv": "no attention",
                      "olmo2": "its q/k norms span every head"}
_LIST = shared_ranks.register(2, __name__ + ".list:extended", hf_models.hf_job, ([(m, {"tensor": 2}) for m in LIST],),
                              timeout_s=900, extended=True)


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(LIST)), ids=LIST)
def test_autoparallel_hugging_face_list_splits_under_tensor_parallelism(index):
    for rank_rows in _LIST():
        row = rank_rows[index]
        assert "error" not in row, row.get("traceback")
        bound = 1e-5 if row["model"] in survey.LOOSER else 1e-10
        assert max(row[k][1] for k in ("output", "loss", "grad", "param")) <= bound, row
        if row["model"] not in NO_ATTENTION_SPLIT:
            assert row["attention"] and set(row["attention"]) == {"megatron"}, row


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(HF)), ids=[f"{m}-{s}" for m, s in HF])
def test_hugging_face_peers_split_their_attention(index):
    for rank_rows in _HF():
        _check_exact(rank_rows[index])


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(HF_EXTENDED)), ids=[f"{m}-{s}" for m, s in HF_EXTENDED])
def test_hugging_face_peers_split_their_attention_extended(index):
    for rank_rows in _HF_EXTENDED():
        _check_exact(rank_rows[index])
