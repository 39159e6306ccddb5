"""The peer suite: model code from other libraries (``examples/peers/``), trained on 4
gloo ranks in float64 against one process, and the plan read: what a family splits is
split. torchtitan's Llama 3 (complex rotary, fused ``[heads, 3, d]`` Q/K/V, state-dict
hooks) under data 4, ZeRO-3, data × tensor with sequence parallelism, tensor 4 and
``"auto"``; with grouped-query attention (its fused projection ``[groups, H/G + 2, d]``)
under tensor 4 and data × tensor. torchtitan is installed by ``make peers`` (``make test-extended`` runs it)."""
import pytest

import shared_ranks
from examples.peers import torchtitan_llama

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
