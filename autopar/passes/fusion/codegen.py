"""Triton source for a :class:`~autopar.passes.fusion.chain.Chain`: a forward kernel and a
backward kernel generated from the chain itself.

The forward loads each input once, computes every op in fp32 registers and stores only
the chain's outputs: the intermediate tensors of the unfused graph are never written
(the memory traffic megatron §4.2 / §5.8 saves with its hand-written fused kernels).

The backward is reverse-mode differentiation of the chain, done here, at generation
time, op by op (``OPS``). It follows the *recompute rule*: the forward values are
recomputed from the saved inputs in registers instead of being saved, and dropout masks
are recomputed from their Philox seeds. Gradients of trailing (broadcast) inputs are
written at full size in fp32 and summed over the broadcast dimensions by the caller.

Row kernels (chains with a softmax or a layer norm) compute ``ROWS`` rows of ``n_cols``
per program in a [ROWS, BLOCK] tile; a row reduction yields a [ROWS, 1] value ("row"
class), and a gradient flowing from the tile into such a value is summed over the row.

``rotate_half(x)`` (rotary embeddings) loads its input at the rotated column,
``(col + n_cols/2) mod n_cols``, with the sign of ``cat(-x2, x1)``. Its input's gradient
at column ``j`` is ``-sign(j)`` times the gradient of its output at the rotated column:
the backward kernel computes the whole body (loads, forward, reverse sweep) a second time
at the rotated columns (names suffixed ``_r``) and reads that gradient from it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from autopar.passes.fusion.chain import Chain
from autopar.runtime.philox import threshold


def const(value) -> str:
    """A Python constant as Triton source."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isinf(value):
        return 'float("-inf")' if value < 0 else 'float("inf")'
    if math.isnan(value):
        return 'float("nan")'
    return repr(value)


def pow_expr(a: str, c: float) -> str | None:
    """``a ** c`` as products for the exponents generated kernels support, else None."""
    if c == 0:
        return "1.0"
    if c == int(c) and 1 <= c <= 8:
        return " * ".join([a] * int(c))
    if c == -1:
        return f"(1.0 / {a})"
    if c == -2:
        return f"(1.0 / ({a} * {a}))"
    if c == -1.5:
        return f"(tl.math.rsqrt({a}) / {a})"
    if c == 0.5:
        return f"tl.sqrt({a})"
    if c == -0.5:
        return f"tl.math.rsqrt({a})"
    if c == 1.5:
        return f"({a} * tl.sqrt({a}))"
    return None


@dataclass(frozen=True)
class Rule:
    """Forward expression from the args' expressions; reverse contributions
    ``[(arg index, expression)]`` from the output gradient ``g``, the args and the output."""
    forward: Callable
    backward: Callable | None     # None: no gradient flows through (masks, rowmax)
    reduces: bool = False         # a row reduction: its value is [ROWS, 1]


def _pow_forward(a, c):
    return pow_expr(a, c)


def _pow_backward(g, a, c, out):
    lower = pow_expr(a, c - 1)
    return [(0, f"{g} * {const(c)} * {lower}")]


ROWSUM = "tl.sum(tl.where(valid, {x}, 0.0), axis=1)[:, None]"

OPS: dict[str, Rule] = {
    "add": Rule(lambda a, b: f"{a} + {b}", lambda g, a, b, out: [(0, g), (1, g)]),
    "sub": Rule(lambda a, b: f"{a} - {b}", lambda g, a, b, out: [(0, g), (1, f"-{g}")]),
    "mul": Rule(lambda a, b: f"{a} * {b}", lambda g, a, b, out: [(0, f"{g} * {b}"), (1, f"{g} * {a}")]),
    "div": Rule(lambda a, b: f"{a} / {b}",
                lambda g, a, b, out: [(0, f"{g} / {b}"), (1, f"-{g} * {a} / ({b} * {b})")]),
    "neg": Rule(lambda a: f"-{a}", lambda g, a, out: [(0, f"-{g}")]),
    "pow": Rule(_pow_forward, _pow_backward),
    "exp": Rule(lambda a: f"tl.exp({a})", lambda g, a, out: [(0, f"{g} * {out}")]),
    "tanh": Rule(lambda a: f"th.tanh({a})", lambda g, a, out: [(0, f"{g} * (1.0 - {out} * {out})")]),
    "erf": Rule(lambda a: f"tl.math.erf({a})",
                lambda g, a, out: [(0, f"{g} * 1.1283791670955126 * tl.exp(-{a} * {a})")]),
    "sigmoid": Rule(lambda a: f"tl.sigmoid({a})", lambda g, a, out: [(0, f"{g} * {out} * (1.0 - {out})")]),
    "relu": Rule(lambda a: f"tl.where({a} > 0, {a}, 0.0)", lambda g, a, out: [(0, f"tl.where({a} > 0, {g}, 0.0)")]),
    "gelu": Rule(lambda a: f"th.gelu({a})", lambda g, a, out: [(0, f"{g} * th.gelu_grad({a})")]),
    "gelu_tanh": Rule(lambda a: f"th.gelu_tanh({a})", lambda g, a, out: [(0, f"{g} * th.gelu_tanh_grad({a})")]),
    "silu": Rule(lambda a: f"th.silu({a})", lambda g, a, out: [(0, f"{g} * th.silu_grad({a})")]),
    "sqrt": Rule(lambda a: f"tl.sqrt({a})", lambda g, a, out: [(0, f"{g} * 0.5 / {out}")]),
    "rsqrt": Rule(lambda a: f"tl.math.rsqrt({a})", lambda g, a, out: [(0, f"-0.5 * {g} * {out} * {out} * {out}")]),
    "where": Rule(lambda c, a, b: f"tl.where({c}, {a}, {b})",
                  lambda g, c, a, b, out: [(1, f"tl.where({c}, {g}, 0.0)"), (2, f"tl.where({c}, 0.0, {g})")]),
    "view": Rule(lambda a: a, lambda g, a, out: [(0, g)]),
    "cast": Rule(lambda a: a, lambda g, a, out: [(0, g)]),  # rounds to Op.dtype (see _Emitter.forward)
    "dropout_mask": Rule(lambda seed, p, ndim: f"th.dropout_keep({seed}, GIDX, {threshold(float(p))})", None),
    # forward and backward written by _Emitter (a load at the rotated column; see the module docstring)
    "rotate_half": Rule(lambda x: x, None),
    "rowsum": Rule(lambda a: ROWSUM.format(x=a), lambda g, a, out: [(0, g)], reduces=True),
    "rowmean": Rule(lambda a: f"{ROWSUM.format(x=a)} / n_cols", lambda g, a, out: [(0, f"{g} / n_cols")],
                    reduces=True),
    "rowmax": Rule(lambda a: f'tl.max(tl.where(valid, {a}, float("-inf")), axis=1)[:, None]', None, reduces=True),
}


class Unsupported(ValueError):
    """The chain has something the generated kernels do not handle; the message says what."""


MAX_ROW = 16384
"""The longest row a row kernel holds in registers."""

MAX_NUMEL = 2**31 - 2**16
"""Offsets are int32: the last program's block (up to 65536 wide) must not wrap."""


def check(chain: Chain) -> None:
    """Raise :class:`Unsupported` naming what a generated kernel cannot do for ``chain``."""
    for op in chain.ops:
        if op.op not in OPS:
            raise Unsupported(f"{op.source or op.out}: no generated-kernel rule for {op.op}")
        c = float(op.args[1]) if op.op == "pow" else 0.0
        if op.op == "pow" and (pow_expr("x", c) is None or pow_expr("x", c - 1) is None):
            raise Unsupported(f"{op.source}: exponent {op.args[1]} (generated kernels take integers 1-8, ±0.5, "
                              f"1.5, -1; the derivative needs the exponent minus one too)")
    if chain.numel >= MAX_NUMEL:
        raise Unsupported(f"{chain.numel} elements: generated kernels index with int32")
    if chain.rows and chain.n_cols > MAX_ROW:
        raise Unsupported(f"rows of {chain.n_cols} elements: a row kernel holds a row in registers (≤ {MAX_ROW})")


def _rounded(expr: str, dtype: str) -> str:
    """``expr`` (fp32) rounded to ``dtype`` as a tensor of that dtype would hold it."""
    if dtype == "bfloat16":
        return f"th.round_bf16({expr})"
    if dtype == "float16":
        return f"{expr}.to(tl.float16).to(tl.float32)"
    return expr


def _cls(value: str, classes: dict[str, str]) -> str:
    return classes.get(value, "scalar")


def index_expr(i, offs: str) -> str:
    """Where tensor input ``i`` is read for the element at flat offset ``offs`` of the
    iteration space: there (full), ``offs mod numel`` (trailing), or by its strides over
    the reader's dimensions, 0 on the broadcast ones (broadcast; sizes given at run time)."""
    if i.kind == "full":
        return offs
    if i.kind == "trailing":
        return f"{offs} % {i.name}_numel"
    return " + ".join(f"(({offs} // {i.name}_d{d}) % {i.name}_z{d}) * {i.name}_t{d}" for d in range(i.ndim))


class _Emitter:
    """Writes the kernel body: loads, the forward ops, and (backward) the reverse sweep.
    ``offs``: the iteration space's offsets the body computes at; ``suffix``: appended to
    its names; ``rotated``: the offsets and sign ``rotate_half`` reads with there (the
    body at the rotated columns reads the unrotated ones, with the opposite sign)."""

    def __init__(self, chain: Chain, offs: str = "offs", suffix: str = "",
                 rotated: tuple[str, str] = ("offs_rot", "sign_rot")):
        self.chain = chain
        self.lines: list[str] = []
        self.classes: dict[str, str] = {}   # value -> "tile" | "row" (constants: "scalar")
        self.offs, self.suffix, self.rotated = offs, suffix, rotated
        self.params = {i.name for i in chain.scalars + chain.seeds}

    def arg(self, a) -> str:
        if not isinstance(a, str):
            return const(a)
        return a if a in self.params else a + self.suffix

    def _global_index(self, seed: str, ndim: int) -> str:
        """Each element's index in the whole value a dropout site draws over (the rule of
        :func:`autopar.runtime.rng.global_index`): its local index split into the value's
        dimensions, each offset by where the rank's part sits and weighed by the whole's
        stride (the site's ``seed{k}_n/o/s{i}`` arguments)."""
        rem, out = f"{seed}_rem{self.suffix}", f"{seed}_gidx{self.suffix}"
        self.lines.append(f"{rem} = ({self.offs}).to(tl.int64)")
        self.lines.append(f"{out} = {rem} * 0")
        for i in reversed(range(ndim)):
            self.lines.append(f"{out} = {out} + ({rem} % {seed}_n{i} + {seed}_o{i}) * {seed}_s{i}")
            self.lines.append(f"{rem} = {rem} // {seed}_n{i}")
        return out

    def load_inputs(self) -> None:
        for i in self.chain.tensors:
            index = index_expr(i, self.offs)
            name = i.name + self.suffix
            if i.dtype == "bool":
                self.lines.append(f"{name} = tl.load({i.name}_ptr + {index}, mask=valid, other=0) != 0")
            else:
                self.lines.append(f"{name} = tl.load({i.name}_ptr + {index}, mask=valid, other=0.0)"
                                  f".to(tl.float32)")
            self.classes[i.name] = "tile"

    def forward(self) -> None:
        for op in self.chain.ops:
            rule = OPS[op.op]
            args = [self.arg(a) for a in op.args]
            if op.op == "rotate_half":   # its input at the rotated column of the row, signed as cat(-x2, x1)
                offs, sign = self.rotated
                source = op.args[0]
                expr = f"tl.load({source}_ptr + {offs}, mask=valid, other=0.0).to(tl.float32) * {sign}"
            elif op.op == "dropout_mask":
                expr = rule.forward(*args).replace("GIDX", self._global_index(args[0], int(op.args[2])))
            elif op.op == "cast":
                expr = args[0]
                # the unfused input holds its dtype's value; the cast then rounds to its own
                expr = _rounded(_rounded(args[0], self._dtype(op.args[0])), op.dtype)
            elif op.op == "pow":
                expr = rule.forward(args[0], float(op.args[1]))
            else:
                expr = rule.forward(*args)
            if rule.reduces:
                self.classes[op.out] = "row"
            elif op.op == "dropout_mask":
                self.classes[op.out] = "tile"
            else:
                arg_classes = {_cls(a, self.classes) for a in op.args if isinstance(a, str)}
                self.classes[op.out] = "tile" if "tile" in arg_classes else ("row" if "row" in arg_classes
                                                                              else "scalar")
            comment = f"  # {op.what}" if op.what else ""
            self.lines.append(f"{op.out}{self.suffix} = {expr}{comment}")

    def backward(self, rotated_grads: dict[str, str] | None = None) -> dict[str, str]:
        """Emit the reverse sweep; returns the gradient variable of each input (when any
        flows). ``rotated_grads``: the gradients of the same sweep at the rotated columns,
        which ``rotate_half`` passes on to its input (None in that sweep itself)."""
        grads: dict[str, str] = {}

        def accumulate(target: str, expr: str, expr_class: str) -> None:
            target_class = _cls(target, self.classes)
            if target_class == "row" and expr_class == "tile":
                expr = ROWSUM.format(x=expr)
            name = f"g_{target}{self.suffix}"
            if target in grads:
                self.lines.append(f"{name} = {name} + {expr}")
            else:
                if target_class == "tile" and expr_class != "tile":
                    expr = f"tl.broadcast_to({expr}, (ROWS, BLOCK))" if self.chain.rows else expr
                self.lines.append(f"{name} = {expr}")
                grads[target] = name

        for k, out in enumerate(self.chain.outputs):
            self.lines.append(f"gout{k}{self.suffix} = tl.load(gout{k}_ptr + {self.offs}, mask=valid, other=0.0)"
                              f".to(tl.float32)")
            accumulate(out.value, f"gout{k}{self.suffix}", "tile")
        for op in reversed(self.chain.ops):
            rule = OPS[op.op]
            if op.op == "rotate_half" and rotated_grads is not None and op.out in rotated_grads:
                accumulate(op.args[0], f"-sign_rot * {rotated_grads[op.out]}", "tile")
                continue
            if op.out not in grads or rule.backward is None:
                continue
            args = [self.arg(a) for a in op.args]
            if op.op == "pow":
                contributions = rule.backward(grads[op.out], args[0], float(op.args[1]), op.out + self.suffix)
            elif op.op == "cast":   # the gradient reaches the cast's input in that input's dtype
                contributions = [(0, _rounded(grads[op.out], self._dtype(op.args[0])))]
            else:
                contributions = rule.backward(grads[op.out], *args, op.out + self.suffix)
            for index, expr in contributions:
                target = op.args[index]
                if not isinstance(target, str) or not self._differentiable(target):
                    continue
                accumulate(target, expr, self.classes[op.out])
        return grads

    def _dtype(self, value: str) -> str:
        for i in self.chain.inputs:
            if i.name == value:
                return i.dtype
        return next(o.dtype for o in self.chain.ops if o.out == value)

    def _differentiable(self, value: str) -> bool:
        for i in self.chain.inputs:
            if i.name == value:
                return i.differentiable
        producer = next(o for o in self.chain.ops if o.out == value)
        return producer.op not in ("dropout_mask", "rowmax")


def _rotates(chain: Chain) -> bool:
    return any(o.op == "rotate_half" for o in chain.ops)


def _prologue(chain: Chain) -> list[str]:
    if chain.rows:
        lines = ["rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]",
                 "cols = tl.arange(0, BLOCK)[None, :]",
                 "valid = (rows < n_rows) & (cols < n_cols)",
                 "offs = rows * n_cols + cols"]
        if _rotates(chain):
            lines += ["offs_rot = rows * n_cols + (cols + n_cols // 2) % n_cols",
                      "sign_rot = tl.where(cols < n_cols // 2, -1.0, 1.0)"]
        return lines
    return ["offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
            "valid = offs < numel"]


def _sizes(chain: Chain) -> list[str]:
    trailing = [f"{i.name}_numel" for i in chain.tensors if i.kind == "trailing"]
    for i in chain.tensors:   # a broadcast input's index: per reader dimension its divisor, size and stride
        if i.kind == "broadcast":
            trailing += [f"{i.name}_{c}{d}" for d in range(i.ndim) for c in "dzt"]
    space = ["n_rows", "n_cols"] if chain.rows else ["numel"]
    consts = ["ROWS: tl.constexpr", "BLOCK: tl.constexpr"] if chain.rows else ["BLOCK: tl.constexpr"]
    return [*space, *trailing, *consts]


def _header(name: str, params: list[str], values: list[str]) -> list[str]:
    # seeds and scalars change from call to call: specialising on them (e.g. on a value
    # divisible by 16) would compile the kernel again
    jit = f"@triton.jit(do_not_specialize={values!r})" if values else "@triton.jit"
    return [jit, f"def {name}({', '.join(params)}):"]


def forward_source(chain: Chain, name: str) -> str:
    e = _Emitter(chain)
    e.load_inputs()
    e.forward()
    seeds = [s.name for s in chain.scalars + chain.seeds]
    params = ([f"{i.name}_ptr" for i in chain.tensors] + [f"out{k}_ptr" for k in range(len(chain.outputs))]
              + seeds + _sizes(chain))
    body = _prologue(chain) + e.lines
    for k, out in enumerate(chain.outputs):
        value = f"th.round_bf16({out.value})" if out.dtype == "bfloat16" else out.value
        body.append(f"tl.store(out{k}_ptr + offs, {value}.to(out{k}_ptr.dtype.element_ty), mask=valid)")
    return "\n".join(_header(f"{name}_fwd", params, seeds) + ["    " + line for line in body])


def backward_source(chain: Chain, name: str) -> str:
    body = _prologue(chain)
    rotated_grads = None
    if _rotates(chain):   # the same sweep at the rotated columns first: rotate_half's gradient reads it
        r = _Emitter(chain, offs="offs_rot", suffix="_r", rotated=("offs", "-sign_rot"))
        r.load_inputs()
        r.forward()
        rotated_grads = r.backward()
        body += r.lines
    e = _Emitter(chain)
    e.load_inputs()
    e.forward()
    grads = e.backward(rotated_grads)
    seeds = [s.name for s in chain.scalars + chain.seeds]
    diff = [i for i in chain.tensors if i.differentiable]
    params = ([f"{i.name}_ptr" for i in chain.tensors] + [f"gout{k}_ptr" for k in range(len(chain.outputs))]
              + [f"g{i.name}_ptr" for i in diff] + seeds + _sizes(chain))
    body += e.lines
    for i in diff:
        value = grads.get(i.name, "0.0")
        if chain.rows and _cls(i.name, e.classes) == "tile" and value != "0.0":
            value = f"tl.broadcast_to({value}, (ROWS, BLOCK))"
        if i.kind == "full" and i.dtype == "bfloat16":
            value = f"th.round_bf16({value})"
        body.append(f"tl.store(g{i.name}_ptr + offs, ({value}).to(g{i.name}_ptr.dtype.element_ty), mask=valid)")
    return "\n".join(_header(f"{name}_bwd", params, seeds) + ["    " + line for line in body])


def describe(chain: Chain) -> list[str]:
    """The chain as comment lines: what each input is and which fx nodes it replaces."""
    lines = [f"{chain.pattern}: " + " -> ".join(dict.fromkeys(o.what for o in chain.ops if o.what))]
    for i in chain.inputs:
        lines.append(f"  {i.name}: {i.kind} {i.dtype}")
    for k, out in enumerate(chain.outputs):
        lines.append(f"  out{k} = {out.value}: {out.dtype}")
    lines.append("  iteration space: " + ("rows of n_cols, ROWS rows per program" if chain.rows
                                           else "numel elements, BLOCK per program"))
    return lines


def module_source(chain: Chain, name: str) -> str:
    """The whole generated module: imports, a comment saying what it fuses, both kernels."""
    head = ["# generated by autopar.passes.fusion.codegen: do not edit", *[f"# {line}" for line in describe(chain)],
            "import triton", "import triton.language as tl", "", "from autopar.passes.fusion import triton_helpers as th",
            "", ""]
    return "\n".join(head) + forward_source(chain, name) + "\n\n\n" + backward_source(chain, name) + "\n"
