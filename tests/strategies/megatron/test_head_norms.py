"""Attention whose query and key heads are each normalised over their own features
(``examples/head_norms.py``: ``F.rms_norm`` with the weight by position or by keyword,
``nn.RMSNorm``) splits by heads under tensor parallelism and trains as on one device, the
norms' weight gradients summed over the tensor group; a norm of the whole projection
before the view to heads keeps the attention whole."""
import pytest

import shared_ranks
from examples.head_norms import FORMS, head_norms_job

CASES = [(form, {"tensor": 2}) for form in FORMS]
_TWO = shared_ranks.register(2, __name__, head_norms_job, (CASES,), timeout_s=300)


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(CASES)), ids=[f for f, _ in CASES])
def test_head_norms_split_with_their_heads(index):
    for rank_rows in _TWO():
        row = rank_rows[index]
        shared_ranks.assert_as_on_one_device(row, row["form"])
        assert row["regions"]["attention:attention"] == ("replicate" if row["form"] == "whole" else "megatron"), row
