"""The tensor-parallel layout rule of Python indexing (``x[index]``, one ``getitem`` under
symbolic tracing) checked against PyTorch's own indexing on generated indexes: where the
rule says the split dimension lands, each rank's part of ``x`` indexed equals that rank's
part of the single device's ``x[index]``; where it has no rule, the index touches the
split dimension or mixes list indexes with ints."""
import operator
import random

import pytest
import torch
import torch.fx as fx

from autopar.ir import SPEC, spec_from_value
from autopar.strategies.shared.propagation import LayoutPropagator
from autopar.strategies.shared.propagation.state import NoSplitRule
from autopar.strategies.shared.sharding import Shard

SHAPE = (4, 6, 4, 6)


def _entry(rng: random.Random, extent: int):
    kind = rng.choice(["int", "slice", "whole", "list", "none", "bool"])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.randrange(-extent, extent)
    if kind == "slice":
        return slice(rng.choice([None, 1]), rng.choice([None, -1]), rng.choice([None, 2]))
    if kind == "list":
        return [rng.randrange(-extent, extent) for _ in range(rng.randint(1, 2))]
    return None if kind == "none" else slice(None)


def _index(rng: random.Random):
    entries, dim = [], 0
    while dim < len(SHAPE) and rng.random() < 0.8:
        entry = _entry(rng, SHAPE[dim])
        entries.append(entry)
        dim += entry is not None and not isinstance(entry, bool)
    if rng.random() < 0.4:
        entries.insert(rng.randint(0, len(entries)), Ellipsis)
    return tuple(entries) if len(entries) != 1 or rng.random() < 0.5 else entries[0]


def _rule(index, split: int, shape=SHAPE):
    """The rule's output layout for ``x[index]`` with ``x`` of ``shape`` split along ``split``."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    out = graph.call_function(operator.getitem, (x, index))
    graph.output(out)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    value = torch.randn(shape)
    x.meta[SPEC] = spec_from_value(value)
    out.meta[SPEC] = spec_from_value(value[index])
    walk = LayoutPropagator(gm, 2, "tensor")
    walk.layout[x] = Shard(split)
    return walk.propagate(out)


@pytest.mark.parametrize("seed", range(6))
def test_the_split_lands_where_pytorch_indexing_puts_it(seed):
    rng = random.Random(seed)
    value = torch.arange(float(torch.tensor(SHAPE).prod())).reshape(SHAPE)
    carried = refused = 0
    for _ in range(60):
        index, split = _index(rng), rng.randrange(len(SHAPE))
        try:
            whole = value[index]
        except IndexError:
            continue
        try:
            layout = _rule(index, split)
        except NoSplitRule:
            refused += 1
            continue
        carried += 1
        for rank in range(2):
            part = value.chunk(2, split)[rank][index]
            assert torch.equal(part, whole.chunk(2, layout.dim)[rank]), (index, split, layout)
    assert carried > 10 and refused > 5, (carried, refused)


def test_the_forms_falcon_writes_are_carried():
    grouped = (2, 3, 2, 4, 8)   # [B, T, G, H/G + 2, d] split by groups (dim 2)
    assert _rule((Ellipsis, slice(None, -2), slice(None)), 2, grouped) == Shard(2)
    assert _rule((Ellipsis, -2, slice(None)), 2, grouped) == Shard(2)
    assert _rule((slice(None), slice(None), slice(None), [-2]), 2, grouped) == Shard(2)
    assert _rule((slice(None), slice(None), slice(None), None), 2, grouped) == Shard(2)
    with pytest.raises(NoSplitRule):
        _rule((slice(None), slice(None), 1), 2, grouped)
    with pytest.raises(NoSplitRule):
        _rule((slice(None), 0, [1]), 2, grouped)
    with pytest.raises(NoSplitRule):   # True adds a dimension of one element
        _rule((slice(None), True), 2, grouped)
