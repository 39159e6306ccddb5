"""Where a value comes from: walks back through casts and views to an ``arange``, a batch
input or a parameter, and back to the sort whose order a value carries."""
from __future__ import annotations

import torch.fx as fx

from autopar.passes.analysis.batch_rows.op_tables import bare_name

_REFORMS = {"to", "_to_copy", "long", "int", "unsqueeze", "expand", "view", "reshape", "contiguous", "clone",
            "detach", "alias", "lift_fresh_copy", "flatten"}
"""Ops that change how a tensor is held (dtype, view, broadcast), not its values."""


def _behind(node, through: set = _REFORMS, steps: int = 8):
    """The first node before ``node`` (``node`` itself included) that is not one of the ops
    ``through`` applied to its first argument; None past ``steps`` or at a non-node."""
    for _ in range(steps):
        if not isinstance(node, fx.Node):
            return None
        if node.op not in ("call_function", "call_method") or bare_name(node) not in through:
            return node
        node = node.args[0] if node.args else None
    return None


def bare_positions(node) -> bool:
    """Whether ``node`` is ``arange`` over the batch itself (cast, viewed, broadcast), not
    positions transformed (flipped, rolled, shifted, compared)."""
    source = _behind(node)
    return source is not None and bare_name(source) == "arange"


_REARRANGE = _REFORMS - {"expand", "unsqueeze"} | {"permute", "transpose", "t", "select", "slice", "narrow",
                                                    "getitem", "squeeze", "view_as", "reshape_as", "_unsafe_view",
                                                    "float", "half", "bfloat16", "type_as", "numpy_T"}


def held_table(node: fx.Node) -> bool:
    """Whether ``node`` is a parameter or buffer, its entries rearranged (viewed, cut,
    transposed, cast), each entry where it was: not a value computed from one, nor one
    broadcast to a size."""
    for _ in range(8):
        if node.op == "get_attr":
            return True
        if node.op not in ("call_function", "call_method") or not node.args or not isinstance(node.args[0], fx.Node):
            return False
        if bare_name(node) not in _REARRANGE:
            return False
        node = node.args[0]
    return False


def is_input_rows(node: fx.Node) -> bool:
    """Targets read from a batch input (casts and views of it): the runtime splits them with
    the rows, so they already hold the whole batch's positions."""
    source = _behind(node)
    return source is not None and source.op == "placeholder"


def sorted_at(node: fx.Node) -> fx.Node:
    """The sort along the batch whose order ``node`` carries (``node`` itself if none is found)."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if bare_name(n) in ("sort", "argsort"):
            return n
        stack.extend(n.all_input_nodes)
    return node
