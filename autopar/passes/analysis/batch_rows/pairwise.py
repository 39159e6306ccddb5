"""Pairwise scores (``a @ b.T``, both operands' rows the batch's): which values the
scores become, and whether every reader takes a row of them whole, so that gathering the
operands over the data ranks makes them exact (the ``gather`` remedy)."""
from __future__ import annotations

import torch.fx as fx
import torch.nn as nn

from autopar.ir import SPEC, TensorSpec
from autopar.passes.analysis import ops
from autopar.passes.analysis.batch_rows.op_tables import (CLASS_LOSSES, REDUCTIONS, TRANSPOSES, argument, bare_name,
                                                          is_pointwise_name, norm_dims, shape_of)
from autopar.passes.analysis.batch_rows.rows import Coupling
from autopar.passes.analysis.batch_rows.sources import bare_positions, is_input_rows
from autopar.passes.analysis.batch_rows.walk import Walk

_PAIRWISE_CHAIN = {"mul", "div", "add", "sub", "neg", "to", "_to_copy", "float", "type_as", "clone", "contiguous",
                   "exp", "true_divide", "masked_fill", "ones_like", "zeros_like", "full_like", "empty_like"}
_SIZE_READS = {"size", "sym_size", "dim", "numel", "len"}


def _reads_rows_count_only(user: fx.Node, value: fx.Node) -> bool:
    """Whether ``user`` reads only ``value``'s shape, and of it only its number of rows
    (``scores.shape[0]``, ``scores.size(0)``, ``len(scores)``): the same on this rank's rows
    of the gathered scores as on its own scores, so it may stay as it is."""
    name = bare_name(user)
    if name in ("size", "sym_size") and len(user.args) > 1:
        return user.args[1] in (0, -2) and len(shape_of(value) or ()) == 2
    if name == "len":
        return True
    if name == "getattr" or (user.op == "call_function" and user.target is getattr and user.args[1] == "shape"):
        return all(bare_name(u) == "getitem" and u.args[1] in (0, -2) for u in user.users) and \
            len(shape_of(value) or ()) == 2
    return False


def check_pairwise(walk: Walk, node: fx.Node) -> None:
    """A pairwise score ``a @ b.T`` (both operands' rows the batch's) is exact on split
    rows when every reader takes a row of it whole: pointwise ops with batch-free
    operands, transposes, and at the end a softmax, log-softmax, cross-entropy (targets
    the rows' positions or batch targets), a reduction over its last dimension or the
    graph's output."""
    a, b = node.args[0], node.args[1]
    b_path, src = [], b
    while True:   # b = casts/transposes of a batch-major tensor
        r = walk.rows(src)
        if r is not None and r.dims == {0}:
            break
        if src.op not in ("call_function", "call_method") or not src.args or not isinstance(src.args[0], fx.Node):
            src = None
            break
        b_path.append(src.name)
        src = src.args[0]
    problems, offsets, transposes, chain = [], [], [], [node.name]
    if src is None:
        problems.append(f"its right operand {b.name} is not a transpose of batch-major rows")
    frontier = [(node, False)]
    seen = set()
    while frontier:
        value, flipped = frontier.pop()
        for user in value.users:
            if (user, flipped) in seen:
                continue
            seen.add((user, flipped))
            name = bare_name(user)
            if user.op == "output":
                continue
            if _reads_rows_count_only(user, value) and not flipped:
                continue
            if name in TRANSPOSES or (name in ("transpose", "swapaxes") and len(user.args) >= 3
                                      and {user.args[1] % 2, user.args[2] % 2} == {0, 1}) or \
                    (name == "permute" and list(user.args[1] if len(user.args) == 2 else user.args[1:]) == [1, 0]):
                transposes.append(user.name)
                chain.append(user.name)
                frontier.append((user, not flipped))
            elif name in _PAIRWISE_CHAIN or is_pointwise_name(name):
                others = [o for o in user.all_input_nodes if o is not value]
                if any(walk.rows(o) is not None and walk.rows(o).dims for o in others):
                    problems.append(f"{user.name} ({name}) combines the scores with other batch values")
                    continue
                chain.append(user.name)
                frontier.append((user, flipped))
            elif name in ("softmax", "_softmax", "log_softmax", "_log_softmax"):
                dim = argument(user, 1, "dim", -1)
                if dim not in (-1, 1):
                    problems.append(f"{user.name} ({name}) runs along the rows, not within one")
            elif name in CLASS_LOSSES or (user.op == "call_module" and isinstance(
                    walk.gm.get_submodule(user.target), (nn.CrossEntropyLoss, nn.NLLLoss))):
                if user.args[0] is not value:
                    problems.append(f"{user.name} ({name}) takes the scores as its target")
                    continue
                target = user.args[1] if len(user.args) > 1 else user.kwargs.get("target")
                rt = walk.rows(target)
                if rt is not None and rt.pos == {0} and not rt.dims and bare_positions(target):
                    offsets.append(target.name)
                elif not (rt is not None and rt.dims == {0} and not rt.pos and is_input_rows(target)):
                    problems.append(f"{user.name} ({name}) reads targets autopar cannot place over the gathered "
                                    f"rows ({target.name if isinstance(target, fx.Node) else target!r})")
            elif name in REDUCTIONS and name in ("sum", "mean", "amax", "max", "logsumexp", "argmax", "amin", "min",
                                                 "argmin"):
                shape = shape_of(value)
                dims = norm_dims(argument(user, 1, "dim", None), len(shape) if shape else 2)
                if dims != [1]:
                    problems.append(f"{user.name} ({name}) reduces the scores over the batch's rows")
            else:
                problems.append(f"{user.name} ({name}) reads the scores in a way autopar cannot split by rows")
    sa, sb = a.meta.get(SPEC), (src.meta.get(SPEC) if src is not None else None)
    nbytes = sum(s.numel * s.dtype.itemsize for s in (sa, sb) if isinstance(s, TensorSpec))
    details = {"rows": a.name, "columns": src.name if src is not None else None, "columns_path": b_path[::-1],
               "chain": chain, "transposes": transposes, "offset_targets": sorted(set(offsets))}
    why = "a product pairs every row of the batch with every row (a contrastive or retrieval score)"
    walk.found.append(Coupling(node.name, ops.op_name(node), "pairwise", walk.module(node),
                               f"{why}; {problems[0]}" if problems else why, remedy=None if problems else "gather",
                               nbytes=float(nbytes), details=details))


def pairwise_closure(walk: Walk) -> set:
    """The pairwise scores and what pointwise ops and transposes make of them."""
    values = set(walk.pairwise)
    stack = list(walk.pairwise)
    while stack:
        n = stack.pop()
        for user in n.users:
            name = bare_name(user)
            if user in values:
                continue
            if name in TRANSPOSES or name in ("transpose", "swapaxes", "permute") or name in _PAIRWISE_CHAIN \
                    or (is_pointwise_name(name) and user.op != "output"):
                values.add(user)
                stack.append(user)
    return values
