"""A fused Q/K/V projection in each layout model code writes (``examples/qkv_layouts.py``):
the attention analysis reads whether the heads or Q, K and V are outermost from the
reshape after the projection (and, with three heads, from the dimension the query is
taken along), and each layout trains under tensor parallelism as on one device, its
attention split by heads: with torchtitan's rotary embedding in complex numbers too, and
with torchtitan's state-dict hooks (the fused weight saved as q, k and v), whose full
state dict has the single device's keys and loads back exactly."""
import pytest

import shared_ranks
from autopar.api import _global_graph
from autopar.ir import regions
from examples.qkv_layouts import GROUPED, HEAD_MAJOR, LAYOUTS, SEQ, UNSPLIT, VOCAB, FusedAttentionLM, lm_loss, qkv_layouts_job


def _attention(layout: str, heads: int, **options):
    import torch
    ids = torch.randint(0, VOCAB, (4, SEQ))
    gm = _global_graph(FusedAttentionLM(layout, heads, 8 * heads, **options), (ids,), lm_loss, ids)
    found = regions(gm, "attention")
    return found[0].details if found else None


# (grouped-query attention with H/2 groups needs an even head count)
@pytest.mark.parametrize("layout,heads", [(layout, heads) for heads in (4, 3) for layout in LAYOUTS
                                          if heads % 2 == 0 or layout not in GROUPED])
def test_the_layout_decides_how_the_fused_projection_splits(layout, heads):
    details = _attention(layout, heads)
    assert details is not None, f"{layout}: no attention region"
    assert details["fused_qkv"] and details["heads"] == heads
    assert details["kv_heads"] == (heads // 2 if layout in GROUPED else heads), details
    assert details["qkv_blocks"] == (1 if layout in HEAD_MAJOR else 3), (layout, heads, details)


@pytest.mark.parametrize("layout", UNSPLIT)
def test_unequal_blocks_cut_by_sizes_are_not_a_region(layout):
    """A grouped-query projection cut ``[H·d, G·d, G·d]``: equal blocks would mix K and V."""
    assert _attention(layout, 4) is None


@pytest.mark.parametrize("layout", ["heads_3_d", "3_heads_d"])
def test_a_complex_rotary_embedding_is_part_of_the_attention(layout):
    """``view_as_complex`` and ``view_as_real`` are views of every dimension but the pairs'."""
    details = _attention(layout, 4, rotary=True)
    assert details is not None and details["qkv_blocks"] == (1 if layout in HEAD_MAJOR else 3), details


CASES = [(layout, 4, {"tensor": 2}) for layout in LAYOUTS] + [
    ("heads_3_d", 4, {"tensor": 2}, {"rotary": True}),
    ("chunk", 4, {"tensor": 2}, {"rotary": True, "saved_apart": True, "tied": True})]
EXTENDED = [(layout, 4, {"data": 2, "tensor": 2}) for layout in LAYOUTS] + [
    ("heads_3_d", 4, {"data": 2, "tensor": 2}, {"rotary": True}),
    ("chunk", 4, {"data": 2, "tensor": 2}, {"rotary": True, "saved_apart": True}),
    ("chunk", 4, {"data": 4, "zero": 3}, {"rotary": True, "saved_apart": True})]
_IDS = [c[0] + ("-" + "-".join(sorted(c[3])) if len(c) > 3 else "") for c in CASES]
_EXTENDED_IDS = [c[0] + ("-" + "-".join(sorted(c[3])) if len(c) > 3 else "") + "-" + "x".join(map(str, c[2].values()))
                 for c in EXTENDED]

_TWO = shared_ranks.register(2, __name__, qkv_layouts_job, (CASES,), timeout_s=300)
_FOUR = shared_ranks.register(4, __name__ + ":extended", qkv_layouts_job, (EXTENDED,), timeout_s=300, extended=True)


def _check(row):
    shared_ranks.assert_as_on_one_device(row, row["layout"])
    if "tensor" in row["strategy"]:
        assert "megatron" in row["strategies"] and row["attention"] == ["megatron"], row
    if row["options"].get("saved_apart"):
        keys = row["round_trip"]["keys"]
        assert "attn.q.weight" in keys and "attn.qkv.weight" not in keys, keys
        assert row["round_trip"]["equal"] and row["round_trip"]["checkpoint"], row["round_trip"]
        assert "state-dict hooks" in row["round_trip"]["save_pretrained"], row["round_trip"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(CASES)), ids=_IDS)
def test_each_layout_trains_split_by_heads_as_on_one_device(index):
    for rank_rows in _TWO():
        _check(rank_rows[index])


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(EXTENDED)), ids=_EXTENDED_IDS)
def test_each_layout_trains_under_data_and_tensor_extended(index):
    for rank_rows in _FOUR():
        _check(rank_rows[index])
