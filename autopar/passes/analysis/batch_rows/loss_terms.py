"""After the walk: what each reduction over the batch is. The loss's (a mean or a sum of
the parts', recorded as a loss term), a masked mean's numerator and denominator (a
``masked_mean`` coupling), or a batch statistic used inside the model (``batch_mean``,
``batch_sum``, or a ``reduce`` without a remedy)."""
from __future__ import annotations

import torch.fx as fx

from autopar.ir import CAPTURE, SPEC, TensorSpec
from autopar.passes.analysis import ops
from autopar.passes.analysis.batch_rows.op_tables import NO_VALUE, bare_name, shape_of
from autopar.passes.analysis.batch_rows.rows import Coupling
from autopar.passes.analysis.batch_rows.walk import Walk

_LINEAR_SCALAR = {"add", "sub", "neg", "mul", "div", "true_divide", "to", "_to_copy", "type_as", "float", "half",
                  "bfloat16", "double", "clone", "detach", "alias", "contiguous", "squeeze", "view", "reshape",
                  "unsqueeze", "global_mean", "positive", "add_", "sub_", "mul_", "div_"}


def _loss_path(walk: Walk, start: fx.Node) -> tuple[bool, list[fx.Node]]:
    """Whether ``start``'s value reaches the graph's outputs only through linear scalar ops
    (a loss's reduction, scaled, summed with other losses) and the divisions on the way
    whose divisor depends on the batch (a ratio of two reductions)."""
    ratios: list[fx.Node] = []
    seen, stack = set(), [start]
    while stack:
        n = stack.pop()
        for user in n.users:
            if user in seen:
                continue
            seen.add(user)
            if user.op == "output":
                spec = n.meta.get(SPEC)
                if not (isinstance(spec, TensorSpec) and spec.numel == 1):
                    return False, ratios   # an output holding more than a loss: a statistic the model returns
                continue
            name = bare_name(user)
            if name not in _LINEAR_SCALAR or (walk.rows(user) is not None and walk.rows(user).dims):
                return False, ratios   # combined with the rows again: used inside the model
            if name in ("mul", "div", "true_divide"):
                others = [a for a in user.all_input_nodes if a is not n]
                if name in ("div", "true_divide") and user.args and user.args[0] is not n:
                    if depends_on_batch(walk, n):
                        ratios.append(user)
                    else:
                        return False, ratios
                elif name == "mul" and any(depends_on_batch(walk, a) for a in others):
                    return False, ratios   # a product of two batch reductions is not a sum of the parts'
                elif any(depends_on_batch(walk, a) and not _is_reduction_of_batch(walk, a) for a in others):
                    return False, ratios
                elif name in ("div", "true_divide") and any(depends_on_batch(walk, a) for a in others):
                    ratios.append(user)
            stack.append(user)
    return True, ratios


def constant_division(node: fx.Node) -> fx.Node | None:
    """The first division the value ``node`` reaches the loss through (over casts, copies
    and scalings) where ``node``'s value is the dividend, or None."""
    for _ in range(8):
        users = [u for u in node.users if u.op != "output"]
        if len(users) != 1:
            return None
        user = users[0]
        name = bare_name(user)
        if name in ("div", "true_divide", "div_") and user.args and user.args[0] is node and len(user.args) > 1:
            return user
        if name not in ("to", "_to_copy", "float", "mul", "clone", "detach", "alias"):
            return None
        node = user
    return None


def constant_divisor(node: fx.Node) -> int | float | fx.Node | None:
    """The divisor of :func:`constant_division`, or None."""
    user = constant_division(node)
    if user is None:
        return None
    d = user.args[1]
    return d if isinstance(d, (int, float, fx.Node)) and not isinstance(d, bool) else None


def _divided_by_rows(walk: Walk, node: fx.Node) -> str | None:
    """How the sum ``node`` reaches the loss divided by the batch's row count: ``"rows"``
    for a size read off a batch tensor's batch dimension (``x.shape[0]``, ``x.size(0)``,
    ``len(x)``: the rank program reads its own share's), ``"constant"`` for a constant
    equal to the batch, else None. A constant is a literal of the source where symbolic
    tracing recorded the size reads (a sum scaled by it), but may be a size read
    torch.export baked in: :data:`BATCH_CONSTANT`, settled on each rank's program."""
    d = constant_divisor(node)
    if isinstance(d, fx.Node):
        return "rows" if _reads_rows(walk, d) else None
    if d is not None and d == walk.batch:
        return "constant"
    return None


BATCH_CONSTANT = "batch_constant"
"""The loss term kind of a sum over the batch divided by a constant equal to the batch in an
exported capture: a mean where the rank's program divides by its own share's rows (a size
read torch.export baked), a sum scaled by a literal where it still divides by the whole
batch's (:func:`settle_batch_constants`)."""


def settle_batch_constants(gm: fx.GraphModule, terms: list | None, local_batch: int) -> list | None:
    """``terms`` with each :data:`BATCH_CONSTANT` term read off the rank's program ``gm``
    (its batch ``local_batch``): ``"mean"`` where it divides by ``local_batch``, else
    ``"sum"``."""
    if not terms or not any(kind == BATCH_CONSTANT for _, kind in terms):
        return terms
    table = {n.name: n for n in gm.graph.nodes}
    out = []
    for name, kind in terms:
        if kind == BATCH_CONSTANT:
            node = table.get(name)
            d = constant_divisor(node) if node is not None else None
            kind = "mean" if isinstance(d, (int, float)) and d == local_batch else "sum"
        out.append([name, kind])
    return out


def _reads_rows(walk: Walk, d: fx.Node) -> bool:
    """Whether ``d`` is the row count of a batch tensor: its size along a batch dimension."""
    for _ in range(4):
        name = bare_name(d)
        if name in ("float", "to", "_to_copy", "int", "long", "scalar_tensor", "tensor") and d.args and \
                isinstance(d.args[0], fx.Node):
            d = d.args[0]
            continue
        if name in ("size", "sym_size") and d.args:
            r = walk.rows(d.args[0])
            dim = d.args[1] if len(d.args) > 1 else None
            return r is not None and isinstance(dim, int) and dim % max(len(shape_of(d.args[0]) or (1,)), 1) in r.dims
        if name == "len" and d.args:
            r = walk.rows(d.args[0])
            return r is not None and 0 in r.dims
        if name in ("numel", "sym_numel") and d.args:   # the rows times the other dimensions
            r = walk.rows(d.args[0])
            return r is not None and bool(r.dims)
        if name == "getitem" and d.args and isinstance(d.args[0], fx.Node) and bare_name(d.args[0]) == "getattr":
            src = d.args[0].args[0]
            r = walk.rows(src)
            return r is not None and isinstance(d.args[1], int) and d.args[1] in r.dims
        return False
    return False


def _is_reduction_of_batch(walk: Walk, node: fx.Node) -> bool:
    return any(n is node for n, _ in walk.reductions)


def depends_on_batch(walk: Walk, node: fx.Node) -> bool:
    memo = walk.depends
    if node in memo:
        return memo[node]
    stack, seen, found = [node], set(), False
    while stack and not found:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if walk.state.get(n) is not None or _is_reduction_of_batch(walk, n):
            found = True
            break
        if bare_name(n) in NO_VALUE or (bare_name(n) == "getitem" and n.args and bare_name(n.args[0]) == "getattr"):
            continue   # a size read off a tensor carries none of its values
        stack.extend(n.all_input_nodes)
    memo[node] = found
    return found


def classify_reductions(walk: Walk) -> None:
    """A reduction over the batch is the loss's (the data pass reduces it over the parts), a
    masked mean's numerator or denominator, or a batch statistic used inside the model."""
    handled: set = set()
    for node, kind in walk.reductions:
        if node in handled:
            continue
        is_loss, ratios = _loss_path(walk, node)
        if is_loss and not ratios:
            if kind == "other":
                walk.couple(node, "reduce", f"the loss reduces over the batch with {ops.op_name(node)}, which is "
                                            f"not a mean or a sum of its parts'")
            else:   # a sum over the rows divided by their number is a mean
                rows = _divided_by_rows(walk, node) if kind == "sum" else None
                if rows == "constant":
                    exported = getattr(walk.gm.meta.get(CAPTURE), "tracer", "") == "export"
                    kind = BATCH_CONSTANT if exported else "sum"
                elif rows == "rows":
                    kind = "mean"
                walk.loss_terms.append((node.name, kind))
            continue
        if is_loss and ratios:
            ratio = ratios[0]
            num, den = ratio.args[0], ratio.args[1]
            parts = {n: k for n, k in walk.reductions}
            base_num, base_den = _base_reduction(num, parts), _base_reduction(den, parts)
            if base_num is None or base_den is None:
                walk.couple(ratio, "reduce", "the loss divides by a value computed from the batch that autopar "
                                             "cannot read as a sum or mean over it")
                continue
            handled |= {base_num[0], base_den[0]}
            same = base_num[1] == base_den[1]
            walk.found.append(Coupling(
                ratio.name, ops.op_name(ratio), "masked_mean", walk.module(ratio),
                f"the loss is a ratio of two {base_num[1]}s over the batch (a masked mean): each part's ratio would "
                f"weigh its rows by its own denominator" + ("" if same else f" (a {base_num[1]} over a "
                                                            f"{base_den[1]}, which autopar does not rescale)"),
                remedy="all_reduce" if same else None, nbytes=16.0,
                details={"numerator": base_num[0].name, "denominator": base_den[0].name,
                         "numerator_kind": base_num[1], "denominator_kind": base_den[1]}))
            continue
        if kind == "sum":
            rows = _divided_by_rows(walk, node)
            if rows == "rows":   # each rank divides by its own share's rows: the mean of the parts' means
                kind = "mean"
            elif rows == "constant" and getattr(walk.gm.meta.get(CAPTURE), "tracer", "") == "export":
                walk.couple(node, "reduce", f"a sum over the batch inside the model is divided by {walk.batch}, the "
                                            f"batch's size, which torch.export may have baked in from a size read: "
                                            f"autopar cannot tell a literal from the rank's own share's size. "
                                            f"Write a mean (h.mean(0))")
                continue
        if kind in ("mean", "sum"):
            spec = node.meta.get(SPEC)
            nbytes = spec.numel * spec.dtype.itemsize if isinstance(spec, TensorSpec) else 8
            walk.found.append(Coupling(node.name, ops.op_name(node), f"batch_{kind}", walk.module(node),
                                       f"a {kind} over the batch is used inside the model: each rank would use its "
                                       f"own rows' {kind}", remedy="all_reduce", nbytes=float(nbytes)))
        else:
            walk.couple(node, "reduce", f"{ops.op_name(node)} reduces over the batch inside the model: each rank "
                                        f"would reduce its own rows only")


def _base_reduction(node: fx.Node, parts: dict) -> tuple[fx.Node, str] | None:
    for _ in range(8):
        if node in parts and parts[node] in ("sum", "mean"):
            return node, parts[node]
        if node.op != "call_function" and node.op != "call_method":
            return None
        if bare_name(node) not in ("to", "_to_copy", "float", "type_as", "clone", "double", "clamp", "clamp_min",
                                   "detach", "alias"):
            return None
        node = node.args[0]
    return None


# where the batch's size may go: shapes of views and factories (each rank's program makes
# them at its own share, consistently), and the divisor of a sum over the batch (a mean)
_SHAPE_USES = {"view", "reshape", "_unsafe_view", "unflatten", "expand", "repeat", "tile", "broadcast_to",
               "new_zeros", "new_ones", "new_empty", "empty", "zeros", "ones", "arange", "eye", "rand", "randn",
               "randint", "empty_strided", "split", "split_with_sizes", "chunk", "tensor_split", "narrow", "slice",
               "getitem", "unsqueeze", "squeeze", "sym_size", "size", "full", "new_full", "zeros_like", "ones_like",
               "_assert_scalar", "_assert_async", "sym_constrain_range_for_size", "eq", "ne", "lt", "le", "gt", "ge",
               "_check", "_check_is_size"}
_NUMBER_OPS = {"add", "sub", "mul", "truediv", "floordiv", "mod", "neg", "pow", "int", "float", "sym_float", "sym_int",
               "ceil", "floor", "sym_max", "sym_min", "max", "min", "radd", "rmul", "rsub", "rtruediv", "abs"}


def _size_read(walk: Walk, node: fx.Node) -> bool:
    """Whether ``node`` reads a batch dimension's size directly (``x.shape[0]``,
    ``x.size(0)``, ``len(x)``, ``x.numel()``)."""
    name = bare_name(node)
    return name in ("size", "sym_size", "len", "numel", "sym_numel") or (
        name == "getitem" and node.args and isinstance(node.args[0], fx.Node)
        and bare_name(node.args[0]) == "getattr") if _reads_rows(walk, node) else False


def check_size_reads(walk: Walk) -> None:
    """The batch's size read as a number (``h * x.shape[0]``, ``torch.full((n,), len(x))``):
    each rank's program reads its own share's size, so the value differs from the single
    device's. Allowed: a size that only shapes views and factories, or divides a sum over
    the batch (a mean, read as such above); any other use is a ``positional`` coupling."""
    sums = {n: "sum" for n, kind in walk.reductions if kind == "sum"}
    for node in list(walk.gm.graph.nodes):
        if node.op not in ("call_function", "call_method") or not _size_read(walk, node):
            continue
        count = bare_name(node) not in ("numel", "sym_numel")   # the rows' count itself, not times others
        seen, stack = set(), [(node, True)]   # (value, still the bare count: only cast on the way)
        while stack:
            value, bare = stack.pop()
            for user in value.users:
                if user in seen:
                    continue
                seen.add(user)
                name = bare_name(user)
                if name in ("int", "float", "sym_float", "sym_int") and user.op == "call_function":
                    stack.append((user, bare))
                    continue
                if _shape_only(user, name, value, bare and count):
                    continue
                if bare and name in ("div", "true_divide", "truediv", "div_") and len(user.args) > 1 and \
                        user.args[1] is value and isinstance(user.args[0], fx.Node) and \
                        _base_reduction(user.args[0], sums) is not None:
                    continue   # a sum over the batch divided by its rows: the mean (loss term or statistic)
                if user.op == "call_function" and name in _NUMBER_OPS and walk.rows(user) is None and \
                        not any(_is_tensor(a) for a in user.all_input_nodes):
                    stack.append((user, False))   # still a number made from the size
                    continue
                if user.op == "output":
                    continue
                walk.couple(user, "positional", f"{ops.op_name(user)} uses the batch's size "
                                                f"({ops.op_name(node)} {node.name}) as a number: each rank's program "
                                                f"reads its own share's size")
                break


def _is_tensor(node: fx.Node) -> bool:
    return isinstance(node.meta.get(SPEC), TensorSpec)


def _shape_only(user: fx.Node, name: str, value: fx.Node, bare_count: bool) -> bool:
    """Whether ``user`` takes ``value`` (a number made from the batch's size) as a size: of
    a view or a factory (not a fill value), a comparison of numbers (a shape check), or
    the length of ``arange``/``eye`` when it is the rows' count itself (positions the walk
    reads)."""
    if name not in _SHAPE_USES:
        return False
    if name in ("full", "new_full"):
        fill = user.args[2:3] if name == "new_full" else user.args[1:2]
        return value not in fill and value is not user.kwargs.get("fill_value")
    if name in ("eq", "ne", "lt", "le", "gt", "ge"):
        return not any(_is_tensor(a) for a in user.all_input_nodes)
    if name in ("arange", "eye"):
        return bare_count
    return True
