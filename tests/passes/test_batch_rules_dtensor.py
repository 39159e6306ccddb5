"""autopar's batch rule against PyTorch's own, op by op (docs/batch_rows.md#where-each-rule-comes-from).

For every op of torch's OpInfo database (``torch.testing._internal.common_methods_invocations.op_db``)
whose first sample holds a batch (its first input, at least 2 rows along dimension 0), a
module calling the op on that input (the other tensors held as buffers) is captured and
read twice: by autopar's batch-rows walk (its own rule for the op, or the DTensor rule it
falls back to) and by DTensor's sharding propagation of the input ``Shard(0)``
(:func:`autopar.passes.analysis.batch_rows.dtensor_rules.rule_of`). Each says one of:
the rows kept in dimension d, a sum or mean over the rows (a ``Partial``), a value free
of the batch, or a meeting of rows (DTensor redistributes; autopar refuses or remedies).

Where both have a rule they must agree, except that autopar may refuse what DTensor
splits (it is stricter, never looser), and except the ops where autopar's own rule is
finer than DTensor's and proven on ranks elsewhere (:data:`OWN_RULES`).
"""
from __future__ import annotations

import itertools
import warnings
from collections import Counter

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

from autopar.passes.analysis.batch_rows.dtensor_rules import rule_of
from autopar.passes.analysis.batch_rows.op_tables import bare_name
from autopar.passes.analysis.batch_rows.walk import Walk
from autopar.trace.specs import propagate_specs

OWN_RULES = {
    "cross_entropy": "a loss's mean or sum over the rows: the parts' losses averaged or summed, a mean over counted "
                     "targets divided by the whole batch's count (docs/guide/limits.md#losses-inputs-and-outputs); "
                     "DTensor's loss strategies keep the batch whole",
    "nll_loss": "the same loss, and with reduction='none' one loss per row",
    "batch_norm": "batch norm in training mode, synchronised over the data ranks (sync_batch_norm)",
    "native_batch_norm": "the same",
    "_native_batch_norm_legit": "the same",
    "sort": "a sort along the batch is a permutation of the rank's own rows, refused unless undone (a mixture of "
            "experts' dispatch, docs/batch_rows.md)",
    "argsort": "the same",
}


class _Call(nn.Module):
    def __init__(self, fn, args, kwargs):
        super().__init__()
        self.fn, self.args, self.kwargs = fn, args, kwargs
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                self.register_buffer(f"c{i}", a)

    def forward(self, x):
        args = [getattr(self, f"c{i}") if isinstance(a, torch.Tensor) else a for i, a in enumerate(self.args)]
        return self.fn(x, *args, **self.kwargs)


def _verdicts(opinfo, sample):
    """``(op, autopar's, DTensor's)`` for one sample, or None where it does not apply."""
    x = sample.input
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] < 2:
        return None
    if any(isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in a) for a in sample.args):
        return None
    try:
        gm = fx.symbolic_trace(_Call(opinfo.op, list(sample.args), dict(sample.kwargs)))
        propagate_specs(gm, (x,))
    except Exception:   # noqa: BLE001 - an op fx cannot trace alone is no comparison
        return None
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    if len(calls) != 1:
        return None
    node = calls[0]
    walk = Walk(gm, x.shape[0])
    walk.run()
    reduced = [kind for n, kind in walk.reductions if n is node]
    state = walk.state.get(node)
    state = state[0] if isinstance(state, tuple) and state else state
    if any(c.node == node.name for c in walk.found) or any(k not in ("sum", "mean") for k in reduced):
        ours = "meet"
    elif reduced:
        ours = "partial"
    elif state is None:
        ours = "free"
    else:
        ours = f"rows{sorted(state.dims)}" + ("-positions" if state.pos else "")
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    verdict = rule_of(node, gm, {placeholder: ("rows", 0)})
    if verdict.none:
        theirs = "none"
    elif verdict.meets:
        theirs = "meet"
    else:
        kind = verdict.outputs[0] if verdict.outputs else ("free",)
        theirs = {"partial": "partial", "free": "free"}.get(kind[0], f"rows[{kind[1]}]" if kind[0] == "rows" else "")
    return bare_name(node), ours, theirs


def _compared(every: int) -> list:
    """The verdicts on every ``every``-th op of OpInfo's database."""
    from torch.testing._internal.common_methods_invocations import op_db
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for opinfo in op_db[::every]:
            try:
                samples = list(itertools.islice(opinfo.sample_inputs("cpu", torch.float32), 3))
            except Exception:   # noqa: BLE001 - an OpInfo without CPU float samples
                continue
            for sample in samples:
                found = _verdicts(opinfo, sample)
                if found is not None:
                    rows.append((opinfo.name, *found))
                    break
    return rows


def _check(compared: list, every: int) -> Counter:
    both = [(name, op, ours, theirs) for name, op, ours, theirs in compared if theirs != "none"]
    assert len(compared) > 450 // every and len(both) > 400 // every, (len(compared), len(both))
    looser = [(name, op, ours, theirs) for name, op, ours, theirs in both
              if ours != theirs and ours != "meet" and op not in OWN_RULES]
    assert looser == [], looser   # autopar keeps apart, or sums, what DTensor says meets (or the reverse)
    counts = Counter("agree" if ours == theirs else "stricter" if ours == "meet" else "own rule"
                     for _, _, ours, theirs in both)
    assert counts["agree"] > 0.9 * len(both), counts
    return counts


@pytest.mark.extended  # about 25 s on the 2-core machine: the extended suite
def test_autopars_batch_rule_agrees_with_dtensors_on_an_eighth_of_the_ops():
    _check(_compared(8), 8)


@pytest.mark.extended
def test_autopars_batch_rule_agrees_with_dtensors_on_every_op_both_cover():
    _check(_compared(1), 1)
