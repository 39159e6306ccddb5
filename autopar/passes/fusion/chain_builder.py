"""From a chain of fx nodes to the kernel IR: :class:`ChainBuilder` turns the nodes the
fusion pass grouped (:mod:`.fusible`) into a :class:`autopar.passes.fusion.chain.Chain`.

Each node becomes one or more ops (softmax: row max, exp, row sum, divide; layer norm:
row means and rsqrt; RMS norm: the row mean of squares and rsqrt; a mean or sum over
the last dimension: a row value, one per row, that the ops after it broadcast along the
row; dropout: a mask from its seed and a scale); each value read from
outside becomes an input, ``full`` (the reader's shape), ``trailing`` (broadcast over
leading dimensions) or ``scalar`` (a Python number the graph computes); each value read
outside the chain becomes an output, shaped like a full input (its shape rule). What a
generated kernel cannot do (a dtype, a broadcast, rows of two lengths) raises
:class:`autopar.passes.fusion.codegen.Unsupported` with the reason the pass reports.
"""
from __future__ import annotations

import dataclasses

import torch.fx as fx

from autopar.ir import TensorSpec, tensor_spec
from autopar.passes.fusion import codegen
from autopar.passes.fusion.chain import DTYPE_NAMES, Chain, Input, Op, Output, pattern_name
from autopar.passes.fusion.fusible import Rec, scalar_node


def _broadcasts(shape: tuple, reader: tuple) -> bool:
    """Whether ``shape`` broadcasts to ``reader`` (each dimension, aligned from the right,
    equal or 1), as PyTorch's arithmetic broadcasts it."""
    if len(shape) > len(reader):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(reader)))


def _trailing(shape: tuple, reader: tuple) -> bool:
    stripped = list(shape)
    while stripped and stripped[0] == 1:
        stripped.pop(0)
    return len(stripped) <= len(reader) and tuple(reader[len(reader) - len(stripped):]) == tuple(stripped)


class ChainBuilder:
    """Turns a list of fx nodes into a :class:`Chain` (raises codegen.Unsupported).

    After :meth:`build` it also holds what the rewrite needs: ``input_nodes`` (an fx node
    or parameter name per tensor input), ``scalar_nodes`` and ``dropouts``."""

    def __init__(self, gm: fx.GraphModule, nodes: list[fx.Node], recs: dict[fx.Node, Rec]):
        self.gm, self.nodes, self.recs = gm, nodes, recs
        self.inside = set(nodes)
        self.ops: list[Op] = []
        self.inputs: list[Input] = []
        self.input_nodes: list = []        # fx.Node or parameter name (str), per tensor input
        self.value: dict[fx.Node, str] = {}
        self.shape_rule: dict[str, tuple] = {}
        # (node, site, layout, a full input, the view of it the dropped value is (None: it
        # itself), the value's dimensions)
        self.dropouts: list[tuple[fx.Node, int, tuple, fx.Node, tuple | None, int]] = []
        self.scalars: list[Input] = []
        self.scalar_nodes: list[fx.Node] = []
        self.n_cols: int | None = None
        self.row_values: set[str] = set()   # values holding one element per row ([..., 1])
        self.read_by: list[tuple[str, fx.Node]] = []   # (input name, reader), for the rows check
        self.broadcast_read: list[str] = []   # broadcast inputs the node being built reads

    def fresh(self) -> str:
        return f"v{len(self.ops)}"

    def emit(self, kind: str, args: tuple, node: fx.Node, dtype: str = "float32", rule: tuple | None = None) -> str:
        out = self.fresh()
        self.ops.append(Op(out, kind, tuple(args), dtype, node.name, self.recs[node].kind))
        values = [a for a in args if isinstance(a, str) and not a.startswith(("s", "seed"))]
        if kind in ("rowmean", "rowsum", "rowmax") or (values and all(a in self.row_values for a in values)):
            self.row_values.add(out)
        if rule is None:
            rule = next((r for a in args if isinstance(a, str) and (r := self.shape_rule.get(a))), None)
        if rule:
            self.shape_rule[out] = rule
        return out

    def tensor_input(self, source, reader: fx.Node, reader_shape: tuple | None = None) -> str:
        """The input name of external value ``source`` (an fx node or a parameter name) read by
        ``reader`` (whose shape is ``reader_shape``: a row reduction reads whole rows)."""
        if isinstance(source, str):
            shape, dtype = tuple(self.gm.get_parameter(source).shape), self.gm.get_parameter(source).dtype
        else:
            spec = tensor_spec(source)
            shape, dtype = spec.shape, spec.dtype
        if dtype not in DTYPE_NAMES:
            raise codegen.Unsupported(f"{reader.name} reads {getattr(source, 'name', source)} of dtype {dtype}; "
                                      f"generated kernels take float32, float16, bfloat16 and bool")
        reader_shape = tensor_spec(reader).shape if reader_shape is None else reader_shape
        if shape == reader_shape:
            kind = "full"
        elif _trailing(shape, reader_shape):
            kind = "trailing"
        elif _broadcasts(shape, reader_shape):
            kind = "broadcast"   # over inner dimensions too: rotary's cos [B, 1, T, D] against [B, H, T, D]
        else:
            raise codegen.Unsupported(f"{reader.name} broadcasts {getattr(source, 'name', source)} of shape "
                                      f"{list(shape)} against {list(reader_shape)}; generated kernels take inputs "
                                      f"that broadcast to the reader's shape")
        for k, known in enumerate(self.input_nodes):
            if known == source:   # the same node (fx compares nodes by identity) or parameter name
                if self.inputs[k].kind != kind:
                    raise codegen.Unsupported(f"{getattr(source, 'name', source)} is read both whole and broadcast")
                self.read_by.append((self.inputs[k].name, tuple(reader_shape)))
                if kind == "broadcast":
                    self.broadcast_read.append(self.inputs[k].name)
                return self.inputs[k].name
        name = f"in{len(self.input_nodes)}"
        self.read_by.append((name, tuple(reader_shape)))
        if kind == "broadcast":
            self.broadcast_read.append(name)
        self.inputs.append(Input(name, kind, DTYPE_NAMES[dtype], tuple(shape)))
        self.input_nodes.append(source)
        if kind == "full":
            self.shape_rule[name] = ("input", len(self.input_nodes) - 1)
        return name

    def scalar_input(self, node: fx.Node) -> str:
        if node in self.scalar_nodes:
            return self.scalars[self.scalar_nodes.index(node)].name
        self.scalar_nodes.append(node)
        self.scalars.append(Input(f"s{len(self.scalars)}", "scalar", "float32"))
        return self.scalars[-1].name

    def arg(self, a, reader: fx.Node, reader_shape: tuple | None = None):
        if a is None:
            return None
        if isinstance(a, fx.Node) and a not in self.inside and scalar_node(a):
            return self.scalar_input(a)
        if isinstance(a, fx.Node):
            return self.value[a] if a in self.inside else self.tensor_input(a, reader, reader_shape)
        if isinstance(a, str):
            return self.tensor_input(a, reader, reader_shape)
        return float(a) if not isinstance(a, bool) else a

    def build(self) -> tuple[Chain, list]:
        """The chain's IR, checked by codegen, and the nodes whose values its outputs are."""
        for node in self.nodes:
            self.value[node] = self.node(node, self.recs[node])
        outputs = []
        for node in self.nodes:
            if any(u not in self.inside for u in node.users):
                value = self.value[node]
                if value in self.row_values:
                    raise codegen.Unsupported(f"{node.name} (one value per row) is read outside the chain; generated "
                                              f"kernels write values of the chain's full shape only")
                rule = self.shape_rule.get(value)
                if rule is None:
                    raise codegen.Unsupported(f"{node.name} has no full-shaped input to take its shape from")
                outputs.append((node, Output(value, DTYPE_NAMES[tensor_spec(node).dtype], rule)))
        if not any(i.kind == "full" for i in self.inputs):
            raise codegen.Unsupported("no input of the full shape (the chain only broadcasts)")
        # each dropout site: its Philox key, then per dimension of its value the local size,
        # the offset of the rank's part and the stride in the whole (rng.dropout_index)
        seeds = [Input(name, "seed", "int64") for k, (*_, ndim) in enumerate(self.dropouts)
                 for name in [f"seed{k}"] + [f"seed{k}_{c}{i}" for i in range(ndim) for c in "nos"]]
        chain = Chain(self.inputs + self.scalars + seeds, self.ops, [o for _, o in outputs],
                      max(tensor_spec(n).numel for n in self.nodes), self.n_cols,
                      pattern_name(self.ops, self.inputs + self.scalars),
                      [n.name for n in self.nodes])
        codegen.check(chain)
        _rows_consistent(chain, self.nodes, {n for n in self.nodes if self.value[n] in self.row_values},
                         self.read_by)
        return chain, [n for n, _ in outputs]

    def node(self, node: fx.Node, rec: Rec) -> str:
        """The value ``node`` computes (its ops emitted); the broadcast inputs it reads learn
        the shape rule of their reader (their index is computed against it at run time)."""
        self.broadcast_read = []
        value = self._node(node, rec)
        rule = self.shape_rule.get(value)
        for name in self.broadcast_read:
            k = next(k for k, i in enumerate(self.inputs) if i.name == name)
            if not rule:
                raise codegen.Unsupported(f"{node.name} reads {name} broadcast but has no full-shaped input to take "
                                          f"its shape from")
            if self.inputs[k].reader not in ((), rule):
                raise codegen.Unsupported(f"{name} is broadcast against values of two shapes")
            self.inputs[k] = dataclasses.replace(self.inputs[k], reader=rule, ndim=len(tensor_spec(node).shape))
        return value

    def _node(self, node: fx.Node, rec: Rec) -> str:
        spec = tensor_spec(node)
        dtype = DTYPE_NAMES.get(spec.dtype)
        if dtype is None or dtype == "bool":
            raise codegen.Unsupported(f"{node.name} computes {spec.dtype}; generated kernels compute float32, "
                                      f"float16 and bfloat16")
        k = rec.kind
        reads_rows = tensor_spec(rec.args[0]).shape if k in ("rowmean", "rowsum") else None
        args = [self.arg(a, node, reads_rows) for a in rec.args]
        if k == "view":
            rule = ("view", rec.attrs["target"]) if rec.attrs.get("target") is not None else None
            return self.emit("view", args, node, dtype, rule)
        if k == "pow":
            return self.emit("pow", (args[0], rec.attrs["exponent"]), node, dtype)
        if k == "cast":
            return self.emit("cast", args, node, DTYPE_NAMES[rec.attrs["dtype"]])
        if k == "masked_fill":
            return self.emit("where", (args[1], float(args[2]), args[0]), node, dtype,
                             self.shape_rule.get(args[0]) if isinstance(args[0], str) else None)
        if k == "where":
            return self.emit("where", args, node, dtype)
        if k == "dropout":
            seed = f"seed{len(self.dropouts)}"
            ndim = len(tensor_spec(node).shape)
            # the dropped value's shape at run time: a full input's, or a view of one's
            rule = self.shape_rule.get(args[0]) if isinstance(args[0], str) else None
            source = next((i for i, n in enumerate(self.input_nodes) if isinstance(n, fx.Node)
                           and self.inputs[i].kind == "full"), None)
            if rule is None or source is None or (rule[0] == "input" and not isinstance(self.input_nodes[rule[1]],
                                                                                       fx.Node)):
                raise codegen.Unsupported(f"{node.name} drops out a value whose shape the kernel cannot take from an "
                                          f"input; its mask is drawn over that shape")
            like, view = (self.input_nodes[rule[1]], None) if rule[0] == "input" else \
                (self.input_nodes[source], tuple(rule[1]))
            self.dropouts.append((node, rec.attrs["site"], rec.attrs["at"], like, view, ndim))
            p = rec.attrs["p"]
            mask = self.emit("dropout_mask", (seed, p, ndim), node, "bool", ())
            scaled = self.emit("mul", (args[0], 1.0 / (1.0 - p)), node, dtype)
            return self.emit("where", (mask, scaled, 0.0), node, dtype, self.shape_rule.get(args[0]))
        if k in ("softmax", "layer_norm", "rms_norm"):
            self.row(node, spec)
        if k == "rotate_half":   # loads its input at the rotated column: the input must be one the kernel reads
            x = args[0]
            if not any(i.name == x and i.kind == "full" for i in self.inputs):
                raise codegen.Unsupported(f"{node.name} rotates a value the chain computes; generated kernels rotate "
                                          f"an input they load")
            self.row(node, spec)
            return self.emit("rotate_half", (x,), node, dtype)
        if k in ("rowmean", "rowsum"):   # one value per row of its input, broadcast along the row by its readers
            self.row(node, tensor_spec(rec.args[0]))
            return self.emit(k, (args[0],), node, dtype, ())
        if k == "softmax":
            x = args[0]
            m = self.emit("rowmax", (x,), node, dtype, ())
            e = self.emit("exp", (self.emit("sub", (x, m), node, dtype),), node, dtype)
            return self.emit("div", (e, self.emit("rowsum", (e,), node, dtype, ())), node, dtype)
        if k == "layer_norm":
            x, w, b = args
            d = self.emit("sub", (x, self.emit("rowmean", (x,), node, dtype, ())), node, dtype)
            var = self.emit("rowmean", (self.emit("mul", (d, d), node, dtype),), node, dtype, ())
            rstd = self.emit("rsqrt", (self.emit("add", (var, rec.attrs["eps"]), node, dtype, ()),), node, dtype, ())
            y = self.emit("mul", (d, rstd), node, dtype)
            if w is not None:
                y = self.emit("mul", (y, w), node, dtype)
            if b is not None:
                y = self.emit("add", (y, b), node, dtype)
            return y
        if k == "rms_norm":   # x * rsqrt(mean(x²) + eps) * w
            x, w = args
            ms = self.emit("rowmean", (self.emit("mul", (x, x), node, dtype),), node, dtype, ())
            rstd = self.emit("rsqrt", (self.emit("add", (ms, rec.attrs["eps"]), node, dtype, ()),), node, dtype, ())
            y = self.emit("mul", (x, rstd), node, dtype)
            return self.emit("mul", (y, w), node, dtype) if w is not None else y
        return self.emit(k, args, node, dtype)

    def row(self, node: fx.Node, spec: TensorSpec) -> None:
        n = spec.shape[-1]
        if self.n_cols not in (None, n):
            raise codegen.Unsupported(f"{node.name} reduces rows of {n}, another op of the chain rows of {self.n_cols}")
        self.n_cols = n


def _rows_consistent(chain: Chain, nodes: list[fx.Node], row_nodes: set, read_by: list) -> None:
    """Every node of a chain with row reductions has rows of the reductions' length, but
    the row values (one per row, ``[..., 1]``), and no input is read by a row value (an
    input is loaded a whole tile at a time); a chain without row reductions has no row
    values."""
    if chain.rows:
        for n in nodes:
            width = tensor_spec(n).shape[-1]
            if (n in row_nodes and width != 1) or (n not in row_nodes and width != chain.n_cols):
                raise codegen.Unsupported(f"{n.name} has rows of {width}, the chain's reductions rows of "
                                          f"{chain.n_cols}")
        for name, shape in read_by:
            if shape and shape[-1] != chain.n_cols:
                raise codegen.Unsupported(f"input {name} is read by a value with rows of {shape[-1]}; generated row "
                                          f"kernels load inputs a whole row at a time")
    elif row_nodes or len({tensor_spec(n).numel for n in nodes}) > 1:
        raise codegen.Unsupported("values of different sizes, but no row reduction in the chain")


__all__ = ["ChainBuilder"]
