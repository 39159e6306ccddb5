"""A fused Q/K/V projection in each layout model code writes (``examples/qkv_layouts.py``):
the attention analysis reads whether the heads or Q, K and V are outermost from the
reshape after the projection (and, with three heads, from the dimension the query is
taken along), and each layout trains under tensor parallelism as on one device, its
attention split by heads."""
import pytest

import shared_ranks
from autopar.api import _global_graph
from autopar.ir import regions
from examples.qkv_layouts import HEAD_MAJOR, LAYOUTS, SEQ, VOCAB, FusedAttentionLM, lm_loss, qkv_layouts_job


def _attention(layout: str, heads: int):
    import torch
    ids = torch.randint(0, VOCAB, (4, SEQ))
    gm = _global_graph(FusedAttentionLM(layout, heads, 8 * heads), (ids,), lm_loss, ids)
    found = regions(gm, "attention")
    return found[0].details if found else None


@pytest.mark.parametrize("heads", [4, 3])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_layout_decides_how_the_fused_projection_splits(layout, heads):
    details = _attention(layout, heads)
    assert details is not None, f"{layout}: no attention region"
    assert details["fused_qkv"] and details["heads"] == heads
    assert details["qkv_blocks"] == (1 if layout in HEAD_MAJOR else 3), (layout, heads, details)


CASES = [(layout, 4, {"tensor": 2}) for layout in LAYOUTS]
EXTENDED = [(layout, 4, {"data": 2, "tensor": 2}) for layout in LAYOUTS]

_TWO = shared_ranks.register(2, __name__, qkv_layouts_job, (CASES,), timeout_s=300)
_FOUR = shared_ranks.register(4, __name__ + ":extended", qkv_layouts_job, (EXTENDED,), timeout_s=300, extended=True)


def _check(row):
    assert "error" not in row, row.get("traceback")
    for kind, bound in (("output", 1e-12), ("loss", 1e-12), ("grad", 1e-12), ("param", 1e-10)):
        assert row[kind][1] <= bound, (row["layout"], kind, row[kind])
    assert "megatron" in row["strategies"] and row["attention"] == ["megatron"], row


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_each_layout_trains_split_by_heads_as_on_one_device(index):
    for rank_rows in _TWO():
        _check(rank_rows[index])


@pytest.mark.extended
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(EXTENDED)), ids=[c[0] for c in EXTENDED])
def test_each_layout_trains_under_data_and_tensor_extended(index):
    for rank_rows in _FOUR():
        _check(rank_rows[index])
