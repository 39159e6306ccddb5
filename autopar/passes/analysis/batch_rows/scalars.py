"""The numbers a capture holds, compared between the plan's capture (the whole batch) and a
rank's (its share): a number that differs is the batch's size read as a number, which
``torch.export`` bakes into the graph as a constant (``h * (x.shape[0] / 4)`` becomes
``mul(h, 2.0)`` at 8 rows, ``mul(h, 1.0)`` at 4), where symbolic tracing would have kept
the size read as a node the analysis sees (docs/batch_rows.md). Each rank's program is
compared with the plan's capture when it is built; a difference outside the divisions
the analysis read as a mean over the batch refuses the plan."""
from __future__ import annotations

import torch.fx as fx

from autopar.passes.analysis.batch_rows.loss_terms import BATCH_CONSTANT, constant_division
from autopar.passes.analysis.batch_rows.op_tables import bare_name
from autopar.passes.analysis.experts.statistics import router_statistics

def _value_type(kind: str) -> bool:
    """Whether an ATen argument of type ``kind`` takes a value (a Scalar, a float, a
    number wrapped as a Tensor), not a dimension, a size or an index."""
    return "int" not in kind.lower() and "Layout" not in kind and "Device" not in kind and "ScalarType" not in kind


# the factory of positions: its length is a size (an arange as long as the batch the
# analysis reads as the rows' positions; any other length is no value of a row)
_POSITIONS = {"arange"}


def _numbers(node: fx.Node) -> tuple:
    """``(argument, value)`` for each number ``node`` is called with that is a value, not a
    size: a float, or an int where the op's schema takes a value (``div(x, 32)``)."""
    if bare_name(node) in _POSITIONS:
        return ()
    schema = getattr(node.target, "_schema", None)
    types = [str(a.type) for a in schema.arguments] if schema is not None else []
    names = [a.name for a in schema.arguments] if schema is not None else []
    out = []
    for i, a in enumerate(node.args):
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            continue
        if isinstance(a, float) or (i < len(types) and _value_type(types[i])):
            out.append((i, a))
    for k, a in node.kwargs.items():
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            continue
        if isinstance(a, float) or (k in names and _value_type(types[names.index(k)])):
            out.append((k, a))
    return tuple(out)


def scalar_constants(gm: fx.GraphModule, loss_terms: list | None = None) -> dict[str, tuple]:
    """Each call's numbers (:func:`_numbers`) by node name, but the divisions of a sum over
    the batch by its size that the analysis read as a mean (``loss_terms``) and of the
    routers' load-balancing statistics by their tokens' count."""
    table = {n.name: n for n in gm.graph.nodes}
    means = set()
    for name, kind in loss_terms or ():
        if kind in ("mean", BATCH_CONSTANT) and name in table:
            division = constant_division(table[name])
            if division is not None:
                means.add(division.name)
    # the routers' statistics divided by their tokens' count (a mean per rank, which the
    # data pass averages over the ranks: the whole batch's)
    stack = [table[name] for name in router_statistics(gm) if name in table]
    seen: set = set()
    while stack:   # over the sums of the layers' statistics, to their division
        node = stack.pop()
        for user in node.users:
            if user in seen:
                continue
            seen.add(user)
            name = bare_name(user)
            if name in ("div", "true_divide", "truediv") and user.args[0] is node:
                means.add(user.name)
            elif name in ("add", "sub", "to", "_to_copy", "clone", "float", "type_as"):
                stack.append(user)
    return {n.name: (_target(n), numbers) for n in gm.graph.nodes if n.op in ("call_function", "call_method")
            and n.name not in means and (numbers := _numbers(n))}


def _target(node: fx.Node) -> str:
    return node.target if isinstance(node.target, str) else str(node.target)


def differing_scalars(gm: fx.GraphModule, expected: dict[str, tuple]) -> list[str]:
    """The nodes of ``gm`` (a rank's capture) whose numbers differ from ``expected`` (the
    plan's capture's, :func:`scalar_constants`), each as ``"name: plan's -> rank's"``."""
    out = []
    for n in gm.graph.nodes:
        if n.name in expected and n.op in ("call_function", "call_method"):
            got = _numbers(n)
            target, want = expected[n.name]
            if target != _target(n):
                continue   # another op under that name: the captures differ in structure, not in numbers
            if [k for k, _ in got] == [k for k, _ in want] and got != want:
                out.append(f"{n.name} ({bare_name(n)}): "
                           f"{[v for _, v in want]} -> {[v for _, v in got]}")
    return out
