"""From a chain of fx nodes to the kernel IR: :class:`ChainBuilder` turns the nodes the
fusion pass grouped (:mod:`.fusible`) into a :class:`autopar.kernels.chain.Chain`.

Each node becomes one or more ops (softmax: row max, exp, row sum, divide; layer norm:
row means and rsqrt; dropout: a mask from its seed and a scale); each value read from
outside becomes an input, ``full`` (the reader's shape), ``trailing`` (broadcast over
leading dimensions) or ``scalar`` (a Python number the graph computes); each value read
outside the chain becomes an output, shaped like a full input (its shape rule). What a
generated kernel cannot do (a dtype, a broadcast, rows of two lengths) raises
:class:`autopar.kernels.codegen.Unsupported` with the reason the pass reports.
"""
from __future__ import annotations

import torch.fx as fx

from autopar.ir import TensorSpec, tensor_spec
from autopar.kernels import codegen
from autopar.kernels.chain import DTYPE_NAMES, Chain, Input, Op, Output, pattern_name
from autopar.transforms.fusible import Rec, scalar_node


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
        self.dropouts: list[tuple[fx.Node, str, str]] = []   # (node, stream, group)
        self.scalars: list[Input] = []
        self.scalar_nodes: list[fx.Node] = []
        self.n_cols: int | None = None

    def fresh(self) -> str:
        return f"v{len(self.ops)}"

    def emit(self, kind: str, args: tuple, node: fx.Node, dtype: str = "float32", rule: tuple | None = None) -> str:
        out = self.fresh()
        self.ops.append(Op(out, kind, tuple(args), dtype, node.name, self.recs[node].kind))
        if rule is None:
            rule = next((r for a in args if isinstance(a, str) and (r := self.shape_rule.get(a))), None)
        if rule:
            self.shape_rule[out] = rule
        return out

    def tensor_input(self, source, reader: fx.Node) -> str:
        """The input name of external value ``source`` (an fx node or a parameter name) read by ``reader``."""
        if isinstance(source, str):
            shape, dtype = tuple(self.gm.get_parameter(source).shape), self.gm.get_parameter(source).dtype
        else:
            spec = tensor_spec(source)
            shape, dtype = spec.shape, spec.dtype
        if dtype not in DTYPE_NAMES:
            raise codegen.Unsupported(f"{reader.name} reads {getattr(source, 'name', source)} of dtype {dtype}; "
                                      f"generated kernels take float32, float16, bfloat16 and bool")
        reader_shape = tensor_spec(reader).shape
        if shape == reader_shape:
            kind = "full"
        elif _trailing(shape, reader_shape):
            kind = "trailing"
        else:
            raise codegen.Unsupported(f"{reader.name} broadcasts {getattr(source, 'name', source)} of shape "
                                      f"{list(shape)} against {list(reader_shape)}; generated kernels take inputs "
                                      f"of the full shape or broadcast over leading dimensions only")
        for k, known in enumerate(self.input_nodes):
            if known == source:   # the same node (fx compares nodes by identity) or parameter name
                if self.inputs[k].kind != kind:
                    raise codegen.Unsupported(f"{getattr(source, 'name', source)} is read both whole and broadcast")
                return self.inputs[k].name
        name = f"in{len(self.input_nodes)}"
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

    def arg(self, a, reader: fx.Node):
        if a is None:
            return None
        if isinstance(a, fx.Node) and a not in self.inside and scalar_node(a):
            return self.scalar_input(a)
        if isinstance(a, fx.Node):
            return self.value[a] if a in self.inside else self.tensor_input(a, reader)
        if isinstance(a, str):
            return self.tensor_input(a, reader)
        return float(a) if not isinstance(a, bool) else a

    def build(self) -> tuple[Chain, list]:
        """The chain's IR, checked by codegen, and the nodes whose values its outputs are."""
        for node in self.nodes:
            self.value[node] = self.node(node, self.recs[node])
        outputs = []
        for node in self.nodes:
            if any(u not in self.inside for u in node.users):
                value = self.value[node]
                rule = self.shape_rule.get(value)
                if rule is None:
                    raise codegen.Unsupported(f"{node.name} has no full-shaped input to take its shape from")
                outputs.append((node, Output(value, DTYPE_NAMES[tensor_spec(node).dtype], rule)))
        if not any(i.kind == "full" for i in self.inputs):
            raise codegen.Unsupported("no input of the full shape (the chain only broadcasts)")
        seeds = [Input(f"seed{k}", "seed", "int64") for k in range(len(self.dropouts))]
        chain = Chain(self.inputs + self.scalars + seeds, self.ops, [o for _, o in outputs],
                      tensor_spec(self.nodes[0]).numel, self.n_cols, pattern_name(self.ops, self.inputs + self.scalars),
                      [n.name for n in self.nodes])
        codegen.check(chain)
        _rows_consistent(chain, self.nodes)
        return chain, [n for n, _ in outputs]

    def node(self, node: fx.Node, rec: Rec) -> str:
        spec = tensor_spec(node)
        dtype = DTYPE_NAMES.get(spec.dtype)
        if dtype is None or dtype == "bool":
            raise codegen.Unsupported(f"{node.name} computes {spec.dtype}; generated kernels compute float32, "
                                      f"float16 and bfloat16")
        args = [self.arg(a, node) for a in rec.args]
        k = rec.kind
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
            self.dropouts.append((node, rec.attrs["stream"], rec.attrs["group"]))
            p = rec.attrs["p"]
            mask = self.emit("dropout_mask", (seed, p), node, "bool", ())
            scaled = self.emit("mul", (args[0], 1.0 / (1.0 - p)), node, dtype)
            return self.emit("where", (mask, scaled, 0.0), node, dtype, self.shape_rule.get(args[0]))
        if k in ("softmax", "layer_norm"):
            self.row(node, spec)
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
        return self.emit(k, args, node, dtype)

    def row(self, node: fx.Node, spec: TensorSpec) -> None:
        n = spec.shape[-1]
        if self.n_cols not in (None, n):
            raise codegen.Unsupported(f"{node.name} reduces rows of {n}, another op of the chain rows of {self.n_cols}")
        self.n_cols = n


def _rows_consistent(chain: Chain, nodes: list[fx.Node]) -> None:
    """Every node of a chain with row reductions has rows of the reductions' length."""
    if chain.rows:
        for n in nodes:
            if tensor_spec(n).shape[-1] != chain.n_cols:
                raise codegen.Unsupported(f"{n.name} has rows of {tensor_spec(n).shape[-1]}, the chain's reductions "
                                          f"rows of {chain.n_cols}")


__all__ = ["ChainBuilder"]
