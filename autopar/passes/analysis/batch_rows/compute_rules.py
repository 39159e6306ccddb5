"""The batch-rows rules for ops that compute: matmuls and einsum, attention, losses,
reductions, ops along one dimension, normalisations, ops of the leading dimension,
pointwise ops, and ops without a rule. Each returns the rows of the node's value (a tuple
for a multi-output op) and records where rows of the batch meet."""
from __future__ import annotations

import torch.fx as fx

from autopar._torch_compat import argument_names, is_aten_op
from autopar.ir import SPEC, TensorSpec
from autopar.passes.analysis import ops
from autopar.passes.analysis.batch_rows.op_tables import (ALONG, CLASS_LOSSES, REDUCTIONS, argument, bare_name,
                                                          norm_dims, shape_of)
from autopar.passes.analysis.batch_rows.dtensor_rules import rule_of
from autopar.passes.analysis.batch_rows.rows import Rows
from autopar.passes.analysis.batch_rows.sources import held_table, sorted_at
from autopar.passes.analysis.batch_rows.state import WalkState


# ops of the leading (batch) dimension that also take an input without one: their rank with it
_BATCHED_NDIM = {"conv1d": 3, "conv2d": 4, "conv3d": 5, "conv_transpose1d": 3, "conv_transpose2d": 4,
                 "conv_transpose3d": 5, "max_pool1d": 3, "max_pool2d": 4, "max_pool3d": 5, "avg_pool1d": 3,
                 "avg_pool2d": 4, "avg_pool3d": 5, "adaptive_avg_pool1d": 3, "adaptive_avg_pool2d": 4,
                 "adaptive_avg_pool3d": 5, "adaptive_max_pool1d": 3, "adaptive_max_pool2d": 4,
                 "adaptive_max_pool3d": 5, "max_pool2d_with_indices": 4, "max_pool3d_with_indices": 5,
                 "pixel_shuffle": 4, "pixel_unshuffle": 4, "channel_shuffle": 4, "im2col": 4, "col2im": 4,
                 "reflection_pad1d": 3, "reflection_pad2d": 4, "replication_pad1d": 3, "replication_pad2d": 4,
                 "upsample_nearest1d": 3, "upsample_nearest2d": 4, "upsample_nearest3d": 5,
                 "upsample_bilinear2d": 4, "upsample_bicubic2d": 4, "upsample_linear1d": 3,
                 "upsample_trilinear3d": 5, "grid_sampler": 4, "grid_sample": 4}


class ComputeRules(WalkState):
    # ---- compute
    def _contract_last(self, node: fx.Node, r: Rows | None, shape) -> Rows | None:
        if r is None or shape is None:
            return None
        if len(shape) - 1 in r.dims:
            self.couple(node, "contract", "a linear layer sums over the batch dimension")
            return Rows.of(r.dims - {len(shape) - 1}, r.pos, r.inner, r.perm)
        return r

    def matmul(self, node: fx.Node, name: str):
        if node.op == "call_function" and node.target in ops.LINEAR_FUNCTIONS or name == "linear":
            x, w = node.args[0], node.args[1]
            if self.rows(w) is not None:
                self.couple(node, "contract", "a linear layer's weight is computed from the batch")
            return self._contract_last(node, self.rows(x), shape_of(x))
        if name == "einsum":
            return self.einsum(node)
        if name == "bilinear":
            return self.unknown_op(node, name, self.tensor_args(node))
        if name in ("addmm", "baddbmm", "addbmm"):
            # the product of args 1 and 2, added to arg 0 (broadcast): the product's rule, then
            # the sum's
            product = self._product(node, name, node.args[1], node.args[2])
            added = node.args[0]
            if self.rows(added) is None and product is None:
                return None
            return self._combine(node, added, product)
        return self._product(node, name, node.args[0], node.args[1])

    def _combine(self, node: fx.Node, added, product: Rows | None):
        """The rows of ``added + product`` (an addmm's), broadcast as a pointwise op would."""
        out = shape_of(node)
        r = self.rows(added)
        if out is None:
            return self._fallback_rows(node)
        shift = len(out) - len(shape_of(added) or ())
        moved = r.shifted(shift) if r is not None else None
        if moved is not None and product is not None and moved.dims and product.dims and moved.dims != product.dims:
            self.couple(node, "outer", f"{ops.op_name(node)} adds rows of the batch to other rows of the batch")
        if product is None:
            if moved is not None and moved.dims:
                self._tables_on_rows(node, out, moved.dims, node.args[1:3])
            return moved
        if moved is None:
            self._tables_on_rows(node, out, product.dims, [added])
            return product
        return Rows.of(moved.dims | product.dims, moved.pos | product.pos, moved.inner | product.inner,
                       moved.perm or product.perm)

    def _product(self, node: fx.Node, name: str, a, b):
        """The rows of the matrix product ``a @ b`` (``node``'s, or an addmm's product)."""
        sa, sb, so = shape_of(a), shape_of(b), shape_of(node)
        ra, rb = self.rows(a) or Rows(), self.rows(b) or Rows()
        if sa is None or sb is None or so is None:
            return self._fallback_rows(node)
        na, nb, no = len(sa), len(sb), len(so)
        # a: [..., n, k] (1-D: [k]); b: [..., k, m] (1-D: [k]); out: [..., n, m]
        contracted_a = na - 1
        contracted_b = nb - 2 if nb >= 2 else 0
        if contracted_a in ra.dims | ra.pos or contracted_b in rb.dims | rb.pos:
            if contracted_a in ra.dims and contracted_b in rb.dims and not (ra.pos or rb.pos or ra.perm or rb.perm) \
                    and ra.factor(contracted_a, sa[contracted_a], self.batch) == \
                    rb.factor(contracted_b, sb[contracted_b], self.batch) and not (ra.dims - {contracted_a}) \
                    and not (rb.dims - {contracted_b}):
                # both sides' rows summed together (x.T @ y, a Gram over the batch): each part's
                # product is its rows' share of the sum (DTensor: mm(Shard(1), Shard(0)) -> Partial)
                self.reductions.append((node, "sum"))
                return None
            self.couple(node, "contract", "a matrix product sums over the batch dimension")
            return self._fallback_rows(node)
        out_a, out_b = {}, {}
        if na >= 2:
            out_a[na - 2] = no - 2 if nb >= 2 else no - 1
            for d in range(na - 2):
                out_a[d] = d + (no - na) if nb >= 2 else d
        if nb >= 2:
            out_b[nb - 1] = no - 1
            for d in range(nb - 2):
                out_b[d] = d + (no - nb)
        da = {out_a[d] for d in ra.dims if d in out_a}
        db = {out_b[d] for d in rb.dims if d in out_b}
        layout = {(out_a[d], f) for d, f in ra.inner if d in out_a} | {(out_b[d], f) for d, f in rb.inner if d in out_b}
        if da and db and da != db:
            if na == 2 and nb == 2 and da == {0} and db == {1} and name in ("matmul", "mm"):
                self.pairwise.append(node)
                return Rows.of(da | db)
            self.couple(node, "outer", "a matrix product pairs rows of the batch with rows of the batch")
        pa, pb = {out_a[d] for d in ra.pos if d in out_a}, {out_b[d] for d in rb.pos if d in out_b}
        if (pa & db) or (pb & da):
            self.couple(node, "positional", "row positions are multiplied with the batch's rows")
        for operand, mapping, n in ((a, out_a, na), (b, out_b, nb)):   # a batched product's table as long as the batch
            shape = shape_of(operand)
            if self.rows(operand) is None and held_table(operand) and shape is not None and any(
                    mapping.get(d) in (da | db) and shape[d] > 1 for d in range(n - 2)):
                self.couple(node, "positional", f"{ops.op_name(node)} multiplies the batch's rows with "
                                                f"{operand.name}, a parameter or buffer as long as the batch: each row "
                                                f"takes the entry at its position")
        return Rows.of(da | db, () if da or db else pa | pb, layout, ra.perm or rb.perm)

    def einsum(self, node: fx.Node):
        equation, operands = node.args[0], node.args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = operands[0]
        equation = equation.replace(" ", "")
        if "->" not in equation or "." in equation:
            return self.unknown_op(node, "einsum", self.tensor_args(node))
        lhs, out = equation.split("->")
        terms = lhs.split(",")
        letters: dict[str, set] = {}   # an index of the batch's rows -> the operands (positions) holding them there
        holding = set()
        for k, (term, operand) in enumerate(zip(terms, operands)):
            r = self.rows(operand)
            if r is None or not r.dims:
                continue
            holding.add(k)
            for d in r.dims:
                letters.setdefault(term[d], set()).add(k)
        summed = [letter for letter in letters if letter not in out]
        if len(summed) == 1 and len(letters) == 1 and letters[summed[0]] == holding and \
                all(summed[0] not in term for k, term in enumerate(terms) if k not in holding):
            # every operand holding rows holds them at the one summed index, which no other
            # operand reads: a sum over the batch's rows (each part's is its rows' share)
            self.reductions.append((node, "sum"))
            return None
        for letter in summed:
            self.couple(node, "contract", f"einsum sums over the batch (index {letter!r})")
        dims = {out.index(letter) for letter in letters if letter in out}
        if len(dims) > 1:
            self.couple(node, "outer", "einsum pairs rows of the batch with rows of the batch")
        return Rows.of(dims)

    def attention(self, node: fx.Node):
        q, k, v = node.args[:3]
        sq = shape_of(q)
        if sq is None:
            return None
        n = len(sq)
        for t in (q, k, v):
            r = self.rows(t)
            if r is not None and r.dims & {n - 1, n - 2}:
                self.couple(node, "attention", "attention runs over the batch dimension (its sequence is the batch)")
        rq = self.rows(q) or Rows()
        dims = set(rq.dims)
        for t in (k, v):
            rt = self.rows(t)
            if rt is not None:
                dims |= rt.dims
        out = Rows.of(dims - {n - 1, n - 2})
        if out is not None:   # keys, values or a mask held as long as the batch, read along the rows
            lead = tuple((shape_of(node) or sq)[:n - 2])
            self._tables_on_rows(node, lead, out.dims, [a for a in node.args[:4] if isinstance(a, fx.Node)],
                                 leading=True)
        spec = node.meta.get(SPEC)
        if isinstance(spec, (tuple, list)):
            return tuple(out for _ in spec)
        return out

    def loss(self, node: fx.Node, name: str, reduction=None):
        x = node.args[0]
        if reduction is None:
            reduction = argument(node, 3 if name in ("nll_loss", "nll_loss_nd", "nll_loss2d") else 4, "reduction", None)
            if reduction is None:
                reduction = "mean" if not is_aten_op(node.target) else 1
        reduction = {0: "none", 1: "mean", 2: "sum"}.get(reduction, reduction)
        if reduction == "batchmean":   # kl_div: the sum over the rows' elements over the rows: a mean per row
            reduction = "mean"
        r = self.rows(x) or Rows()
        shape = shape_of(x)
        operands = [self.rows(a) for a in node.all_input_nodes if self.rows(a) is not None and self.rows(a).dims]
        ranks = [len(shape_of(a) or ()) for a in node.all_input_nodes if self.rows(a) is not None and self.rows(a).dims]
        if len(operands) > 1 and name not in CLASS_LOSSES:
            top = max(ranks)
            if len({frozenset(o.shifted(top - k).dims) for o, k in zip(operands, ranks)}) > 1:
                self.couple(node, "outer", f"{name} broadcasts rows of the batch against rows of the batch")
        if name in CLASS_LOSSES and shape is not None:
            cls = 1 if len(shape) > 1 else 0
            if cls in r.dims and node.args[0] not in self.pairwise_values:
                self.couple(node, "outer", "the classes of a loss are rows of the batch")
        batch_operands = [self.rows(a) for a in node.all_input_nodes if self.rows(a) is not None and self.rows(a).dims]
        if r.dims and shape is not None:   # a target or weight held as long as the batch
            self._tables_on_rows(node, tuple(shape), r.dims, [a for a in node.all_input_nodes if a is not x])
        if len({b.perm for b in batch_operands}) > 1:
            self.couple(sorted_at(node), "scan", "a sort along the batch reorders rows that then meet rows in the "
                                                 "batch's order: each rank would sort its own rows only")
        if reduction == "none":
            if name in CLASS_LOSSES and shape is not None and len(shape) > 1:
                return Rows.of({d - (d > 1) for d in r.dims if d != 1})
            return Rows.of(r.dims)
        if any(self.rows(a) is not None for a in node.all_input_nodes):
            self.reductions.append((node, "mean" if reduction == "mean" else "sum"))
        return None

    def reduction(self, node: fx.Node, name: str):
        x = node.args[0]
        r, shape = self.rows(x), shape_of(x)
        if r is None or shape is None:
            return None
        n = len(shape)
        if name == "norm" and not is_aten_op(node.target):
            dims = norm_dims(argument(node, 2, "dim", None), n)
        elif name in ("linalg_vector_norm", "vector_norm"):
            dims = norm_dims(argument(node, 2, "dim", None), n)
        else:
            dim = argument(node, 1, "dim", -1 if name in ("mode",) else None)
            if isinstance(dim, bool):   # var(x, True) / std(x, False): the unbiased flag, over every dimension
                dim = None
            dims = norm_dims(dim, n)
        if dims is None and is_aten_op(node.target) and "dim" not in argument_names(node.target):
            dims = None
        keep = bool(argument(node, 2, "keepdim", False)) if name not in ("norm", "linalg_vector_norm") else \
            bool(argument(node, 3, "keepdim", False))
        reduced = set(range(n)) if dims is None else set(dims)
        hit = reduced & r.dims
        if node.args[0] in self.pairwise_values and reduced == {n - 1}:
            hit = set()   # within each row of a pairwise score (gathered whole): the row's own
        spans = {d for d, f in r.inner if f == -1}   # the batch's rows folded across these dimensions
        kept = r.dims - reduced
        if hit and hit <= spans and kept and min(kept) < min(hit):
            # an inner part of the rows' span (view(B // 2, 2, H).sum(1)): a reduction within
            # groups of consecutive rows, each group on one part (a part's rows that split a
            # group fail its view at its own shapes)
            hit = set()
        if hit:
            self.reductions.append((node, REDUCTIONS[name]))
        if keep:
            out = r.without(reduced)
        else:
            out = r.moved({d: d - sum(1 for e in reduced if e < d) for d in range(n) if d not in reduced})
        spec = node.meta.get(SPEC)
        if isinstance(spec, (tuple, list)):
            return tuple(out for _ in spec)
        return out

    def _along_dim(self, node: fx.Node, r: Rows | None, shape, dim, name: str):
        if r is None or shape is None:
            return None
        n = max(len(shape), 1)
        dims = norm_dims(dim, n)
        if dims is None:
            dims = list(range(n))
        if set(dims) & r.dims:
            if node.args[0] in self.pairwise_values and set(dims) <= {1}:
                pass   # along a pairwise score's columns: each row's own (checked with the scores)
            else:
                self.couple(node, "scan", f"{name} runs along the batch (dimension {dims[0]}): each rank would "
                                          f"see only its own rows")
        spec = node.meta.get(SPEC)
        if isinstance(spec, (tuple, list)):
            return tuple(Rows.of(r.dims, (), r.inner, r.perm) for _ in spec)
        return r

    def along(self, node: fx.Node, name: str):
        x = node.args[0]
        index, default = ALONG[name]
        dim = argument(node, index + 1, "dim", default)
        r, shape = self.rows(x), shape_of(x)
        if name in ("sort", "argsort") and r is not None and shape:
            dims = norm_dims(dim, max(len(shape), 1)) or []
            if set(dims) & r.dims and len(dims) == 1:
                # the rows in an order of the rank's own: each row's values stay its own, and
                # the positions (indices) say where each went; the order must be undone later
                values = Rows.of(r.dims, r.pos, r.inner, perm=True)
                indices = Rows.of((), set(dims), perm=True)
                return indices if name == "argsort" else (values, indices)
        if name in ("roll", "flip"):
            dim = argument(node, 2 if name == "roll" else 1, "dims", None)
            if name == "roll" and dim is None:
                dim = list(range(len(shape_of(x) or ())))   # rolled flat: every dimension
            dims = set(norm_dims(dim, max(len(shape or ()), 1)) or []) if dim is not None else set(range(len(shape or ())))
            if r is not None and not r.dims and r.pos & dims:
                # the batch's positions reordered (arange(B).flip(0)): each rank would reorder
                # its own share's
                self.couple(node, "scan", f"{name} reorders the positions of the batch's rows (dimension "
                                          f"{sorted(r.pos & dims)}): each rank would reorder its own rows only")
                return Rows.of((), r.pos, r.inner, perm=True)
        return self._along_dim(node, self.rows(x), shape_of(x), dim, name)

    def _normalize_last(self, node: fx.Node, r: Rows | None, shape, k: int):
        if r is None or shape is None:
            return None
        n = len(shape)
        if r.dims & set(range(n - k, n)):
            self.couple(node, "reduce", "a normalisation reduces over the batch dimension")
        spec = node.meta.get(SPEC)
        out = Rows.of(r.dims, (), r.inner, r.perm)
        if isinstance(spec, (tuple, list)):
            return tuple(out for _ in spec)
        return out

    def layer_norm(self, node: fx.Node):
        x = node.args[0]
        shape_arg = argument(node, 1, "normalized_shape", None)
        k = len(shape_arg) if isinstance(shape_arg, (list, tuple)) else 1
        return self._normalize_last(node, self.rows(x), shape_of(x), k)

    def leading(self, node: fx.Node, x, batched_ndim: int | None = None):
        """An op computed per element of its input's first dimension (convolutions, pooling,
        group and instance norms, padding, resampling): the rows where they are there.
        ``batched_ndim``: its input's rank with a batch dimension (a ``conv2d`` takes 4); an
        input without it (an unbatched ``[C, H, W]``) has channels first, which the op mixes."""
        r = self.rows(x)
        if r is None:
            spec = node.meta.get(SPEC)
            return tuple(None for _ in spec) if isinstance(spec, (tuple, list)) else None
        shape = shape_of(x)
        batched_ndim = batched_ndim or _BATCHED_NDIM.get(bare_name(node))
        if bare_name(node) in ("grid_sampler", "grid_sample") and len(node.args) > 1 and shape is not None:
            self._tables_on_rows(node, tuple(shape), r.dims, [node.args[1]], leading=True)   # a grid per sample
        if batched_ndim is not None and shape is not None and len(shape) != batched_ndim:
            self.couple(node, "reduce", f"{ops.op_name(node)} takes an input without a batch dimension "
                                        f"({len(shape)} dimensions): it mixes what its first dimension holds")
        elif r.dims - {0} or r.pos:
            self.couple(node, "reduce", f"{ops.op_name(node)} works across its first dimension, and the batch is "
                                        f"not there")
        spec = node.meta.get(SPEC)
        out = Rows.of({0})
        if isinstance(spec, (tuple, list)):
            return tuple(out for _ in spec)
        return out

    def binary_rows(self, node: fx.Node, name: str):
        """Ops of two tensors that broadcast them against each other (``cosine_similarity``,
        ``pairwise_distance``) or pair every row of one with every row of the other
        (``cdist``, ``inner``, ``tensordot``, ``outer``): rows meet unless only one operand
        holds the batch, or both hold it in the same broadcast place of a row-wise op."""
        operands = [a for a in node.all_input_nodes if self.rows(a) is not None and self.rows(a).dims]
        if len(operands) > 1:
            if name in ("cosine_similarity", "pairwise_distance"):
                ranks = [len(shape_of(a) or ()) for a in operands]
                top = max(ranks)
                if len({frozenset(self.rows(a).shifted(top - k).dims) for a, k in zip(operands, ranks)}) == 1:
                    return self._fallback_rows(node) or Rows.of(self.rows(operands[0]).dims - {top - 1})
            self.couple(node, "outer", f"{name} pairs rows of the batch with rows of the batch")
            return self._fallback_rows(node)
        if name in ("cosine_similarity", "pairwise_distance"):
            x = operands[0] if operands else node.args[0]
            r = self.rows(x)
            if r is not None and r.dims and shape_of(x):
                self._tables_on_rows(node, tuple(shape_of(x)), r.dims, [a for a in node.all_input_nodes if a is not x])
            dim = argument(node, 2, "dim", 1) if name == "cosine_similarity" else -1
            if r is not None and shape_of(x) and (dim % len(shape_of(x))) in r.dims:
                self.couple(node, "reduce", f"{name} reduces over the batch dimension")
            return self._fallback_rows(node) or (r.without({dim % len(shape_of(x))}) if r and shape_of(x) else None)
        return self.unknown_op(node, name, self.tensor_args(node))

    def _tables_on_rows(self, node: fx.Node, out: tuple, dims: set, operands, leading: bool = False) -> None:
        """A parameter or buffer as long as the batch along a dimension the output holds rows
        in, broadcast element by element against them: each row reads the entry at its own
        position, another one on each part of the batch (DTensor would slice it: Replicate
        to Shard). Recorded as a ``positional`` coupling."""
        n = len(out)
        for a in operands:
            sa = shape_of(a) if isinstance(a, fx.Node) else None
            if sa is None or self.rows(a) is not None or not held_table(a):
                continue
            shift = 0 if leading else n - len(sa)   # leading: the operand's first dimensions are the output's
            if any(0 <= d - shift < len(sa) and d < n and sa[d - shift] > 1 and sa[d - shift] == out[d]
                   for d in dims):
                self.couple(node, "positional", f"{ops.op_name(node)} reads {a.name}, a parameter or buffer as long as "
                                                f"the batch, along the batch's rows: each row reads the entry at its "
                                                f"position, another one on each part of the batch")
                return

    def pointwise(self, node: fx.Node, name: str, shape: tuple | None = None):
        out = shape or shape_of(node)
        if out is None:
            spec = node.meta.get(SPEC)
            if isinstance(spec, (tuple, list)) and spec and all(isinstance(t, TensorSpec) for t in spec):
                # several outputs of the inputs' shape (frexp): each takes the rule of one
                first = self.pointwise(node, name, tuple(spec[0].shape))
                return tuple(first for _ in spec)
            return self._fallback_rows(node)
        n = len(out)
        dims, pos, inner, per_operand = set(), set(), {}, []
        for a in node.all_input_nodes:
            r = self.rows(a)
            if r is None:
                continue
            sa = shape_of(a)
            moved = r.shifted(n - len(sa) if sa is not None else 0)
            d, p = set(moved.dims), set(moved.pos)
            per_operand.append((a, d, p))
            dims |= d
            pos |= p
            for dim, f in moved.inner:
                inner.setdefault(dim, set()).add(f)
        if any(len(fs) > 1 or (-1 in fs) for fs in inner.values()) and len(per_operand) > 1 and \
                not all(a in self.pairwise_values for a, d, _ in per_operand if d):
            self.couple(node, "outer", f"{name} meets rows of the batch laid out in another order")
        perm = any(self.rows(a).perm for a, _, _ in per_operand)
        inverse = any(self.rows(a).inverse for a, _, _ in per_operand)
        if len({self.rows(a).perm for a, d, _ in per_operand if d}) > 1:
            self.couple(sorted_at(node), "scan", "a sort along the batch reorders rows that then meet rows in the "
                                                 "batch's order: each rank would sort its own rows only")
        with_dims = [d for _, d, _ in per_operand if d]
        if len({frozenset(d) for d in with_dims}) > 1:
            if not all(a in self.pairwise_values for a, d, _ in per_operand if d):
                self.couple(node, "outer", f"{name} broadcasts rows of the batch against rows of the batch")
        if pos & dims and not perm:
            self.couple(node, "positional", f"{name} combines the batch's rows with their positions "
                                            f"(arange over the batch), which differ on each rank")
        if dims:
            self._tables_on_rows(node, out, dims, node.all_input_nodes)
        layout = {(d, min(fs)) for d, fs in inner.items()}
        if perm and dims and pos:
            return Rows.of(dims, (), layout, perm=True)
        # positions combined with data are data (a rotary table applied to keys), not positions
        return Rows.of(dims, () if dims else pos, layout, perm=perm, inverse=inverse)

    def broadcast(self, node: fx.Node, name: str):
        """``broadcast_tensors``: each output holds what the pointwise rule gives the inputs."""
        spec = node.meta.get(SPEC)
        first = spec[0] if isinstance(spec, (tuple, list)) and spec else None
        out = self.pointwise(node, name, shape=tuple(first.shape) if isinstance(first, TensorSpec) else None)
        return tuple(out for _ in (node.args[0] if node.args else ()))

    def count(self, node: fx.Node):
        """``histc``, ``bincount``: a count of the batch's rows per value (checked after the
        walk: a grouped matmul's offsets are the rank's own rows' business)."""
        r = self.rows(node.args[0])
        if r is not None and r.dims:
            self.counts.append(node)
        return None

    def unknown_op(self, node: fx.Node, name: str, inputs: list[fx.Node]):
        """An op autopar's tables have no rule for: PyTorch's rule (DTensor's sharding
        propagation, :mod:`.dtensor_rules`) where it has one, else a coupling of kind
        ``unknown`` (refused) when the op reads rows of the batch."""
        kinds = {}
        for a in node.all_input_nodes:
            r = self.rows(a)
            if r is None or not (r.dims or r.pos):
                continue
            if len(r.dims) != 1 or r.pos or r.inner or r.perm:
                self.couple(node, "unknown", f"{name} has no batch rule in autopar and reads the batch's rows laid "
                                             f"out as no split DTensor has a rule for")
                return self._fallback_rows(node)
            kinds[a] = ("rows", next(iter(r.dims)))
        if not kinds:
            return None
        verdict = rule_of(node, self.gm, kinds)
        if verdict.meets or verdict.none:
            self.couple(node, "unknown", f"{name} has no batch rule in autopar, and "
                                         + (verdict.meets or verdict.none))
            return self._fallback_rows(node)
        self.unknown.append(f"{node.name} ({name})")
        out = []
        for kind in verdict.outputs:
            if kind[0] == "rows":
                out.append(Rows.of({kind[1]}))
            else:
                if kind[0] == "partial":
                    self.reductions.append((node, kind[1]))
                out.append(None)
        spec = node.meta.get(SPEC)
        if isinstance(spec, (tuple, list)):
            return tuple(out) + tuple(None for _ in range(len(spec) - len(out)))
        return out[0] if out else None
