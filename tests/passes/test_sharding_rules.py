"""Tier 1: how a split dimension travels through reshapes, transposes and broadcasts."""
import pytest

from autopar.strategies.shared.sharding import Shard, map_permute, map_reshape, map_transpose, reshape_groups, scale_literal


def test_reshape_groups_pair_runs_of_equal_product():
    assert reshape_groups([2, 16, 64], [32, 64]) == [([0, 1], [0]), ([2], [1])]
    assert reshape_groups([2, 16, 4, 16], [2, 16, 64]) == [([0], [0]), ([1], [1]), ([2, 3], [2])]


@pytest.mark.parametrize("src, dst, shard, expected", [
    ([2, 16, 64], [32, 64], Shard(2), Shard(1)),                       # flatten the batch: split follows
    ([2, 16, 4, 16], [2, 16, 64], Shard(2), Shard(2)),                 # merge heads: heads are the outer factor
    ([2, 16, 4, 16], [2, 16, 64], Shard(3), Shard(2, blocks=4)),       # inner factor split: one block per head
    ([2, 16, 64], [2, 16, 4, 16], Shard(2, blocks=4), Shard(3)),       # ... and back
    ([6, 2, 32], [6, 8, 8], Shard(2), Shard(1, blocks=2)),             # [T, B, H·d] -> [T, B·H, d] (export's MHA)
    ([8, 6, 8], [2, 4, 6, 8], Shard(0, blocks=2), Shard(1)),           # ... -> [B, H, T, d]
    ([6, 2, 96], [6, 2, 3, 32], Shard(2, blocks=3), Shard(3)),         # unflatten(-1, [3, E]) of a fused QKV
    ([2, 16, 192], [2, 16, 3, 4, 16], Shard(2, blocks=3), Shard(3)),   # fused QKV -> (3, heads, d): heads split
    ([32, 192], [2, 16, 192], Shard(1, blocks=3), Shard(2, blocks=3)),  # blocks stay inside one dim
    ([2, 4, 16, 16], [2, 4, 16, 16], Shard(1), Shard(1)),
])
def test_map_reshape(src, dst, shard, expected):
    assert map_reshape(src, dst, shard, 2) == expected


def test_permute_and_transpose():
    assert map_permute([0, 2, 1, 3], Shard(2)) == Shard(1)
    assert map_transpose(1, 2, 4, Shard(2)) == Shard(1)
    assert map_transpose(-2, -1, 4, Shard(1)) == Shard(1)


def test_scale_literal_keeps_inferred_sizes_and_rejects_indivisible():
    assert scale_literal(12, 4) == 3 and scale_literal(-1, 4) == -1
    with pytest.raises(ValueError, match="not divisible by the tensor degree 4"):
        scale_literal(6, 4)
