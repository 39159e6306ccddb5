"""The batch-rows rules for ops that move data: permutes, views, selects and slices,
splits, concatenations, indexes, gathers and scatters. Each returns the rows of the node's
value (a tuple for a multi-output op) and records where rows of the batch meet."""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from autopar._torch_compat import is_aten_op
from autopar.ir import SPEC
from autopar.passes.analysis.batch_rows.op_tables import argument, bare_name, shape_of
from autopar.passes.analysis.batch_rows.rows import Rows
from autopar.passes.analysis.batch_rows.sources import bare_positions, held_table
from autopar.passes.analysis.batch_rows.state import WalkState


def _regroup(src: tuple, dst: tuple, r: "Rows", batch: int) -> "Rows | None":
    """``r`` (rows of a value of shape ``src``) on a view of it of shape ``dst``. Each batch
    dimension holds ``batch`` rows of ``factor`` elements, with more outside them when the
    batch is folded inside another dimension (``[T, B] -> [T·B]``); the view keeps that span
    of the flat elements, whichever output dimension holds it. A span that ends up across
    several output dimensions marks them all (and they meet rows if read apart)."""
    dims, inner, pos = set(), set(), set()

    def place(k: int, factor: int | None, out_dims: set, out_inner: set | None):
        stride_src = math.prod(src[k + 1:])
        lo, hi = stride_src * (factor if factor else 1), stride_src * src[k]
        if factor:
            hi = lo * batch if lo * batch <= stride_src * src[k] else hi
        # the flat span [lo, hi) of one batch index step .. the whole batch, in dst's strides
        for m in range(len(dst)):
            stride = math.prod(dst[m + 1:])
            top = stride * dst[m]
            if dst[m] == 1:
                continue
            if stride <= lo and hi <= top and lo % stride == 0 and factor:
                out_dims.add(m)
                if out_inner is not None:
                    f = lo // stride
                    if f * batch != dst[m]:
                        out_inner.add((m, f))
                return
        for m in range(len(dst)):   # across several dimensions: every one it covers
            stride = math.prod(dst[m + 1:])
            if dst[m] != 1 and stride < hi and stride * dst[m] > lo:
                out_dims.add(m)
                if out_inner is not None:
                    out_inner.add((m, -1))

    for k in r.dims:
        place(k, r.factor(k, src[k], batch), dims, inner)
    for k in r.pos:
        place(k, src[k] // batch if batch and src[k] % batch == 0 else None, pos, None)
    return Rows.of(dims, pos, inner, r.perm, r.inverse)


_ELEMENTWISE = ("mul", "add", "sub", "div", "to", "_to_copy", "type_as", "contiguous")
_VIEWS = ("view", "reshape", "_unsafe_view")


def _copies_viewed_apart(node: fx.Node, copies: int, rows: int) -> bool:
    """Whether every use of ``node`` (copies of ``rows`` rows laid along dimension 0), through
    elementwise ops, is a view to ``[copies, rows, ...]``."""
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        for user in current.users:
            if user in seen:
                continue
            seen.add(user)
            name = bare_name(user)
            shape = shape_of(user)
            if name in _VIEWS:
                if not shape or len(shape) < 2 or tuple(shape[:2]) != (copies, rows):
                    return False
            elif name in _ELEMENTWISE and shape is not None and shape_of(node) is not None and \
                    tuple(shape[:1]) == tuple(shape_of(node)[:1]):
                stack.append(user)
            else:
                return False
    return True


class ViewRules(WalkState):
    # ---- views
    def embedding(self, node: fx.Node):
        """A table read at ids: the ids' rows; ids that are the rows' own positions read
        another row of the table on each rank."""
        ids = node.args[1] if is_aten_op(node.target) else node.args[0]
        table = node.args[0] if is_aten_op(node.target) else node.args[1]
        if self.rows(table) is not None:
            self.couple(node, "positional", "a table made of the batch's rows is read at ids: each id reads a row at "
                                            "its position, another one on each part of the batch")
        r = self.rows(ids)
        if r is not None and r.pos and not r.dims and bare_positions(ids):
            self.couple(node, "positional", "a table is read at the rows' positions (arange over the batch), "
                                            "which differ on each rank")
        return Rows.of(r.dims, (), r.inner, r.perm) if r else None

    def positional_read(self, node: fx.Node, name: str):
        """``tril``, ``triu`` and the diagonals read their last two dimensions by position:
        rows of the batch there are read by their positions."""
        r = self.rows(node.args[0])
        shape = shape_of(node.args[0])
        if r is not None and shape and (r.dims | r.pos) & {len(shape) - 1, len(shape) - 2} and \
                node.args[0] not in self.pairwise_values:
            self.couple(node, "positional", f"{name} reads the batch's rows by their positions")
        elif r is not None and node.args[0] in self.pairwise_values:
            self.couple(node, "positional", f"{name} reads a pairwise score by its rows' positions")
        return self._fallback_rows(node)

    def permute(self, node: fx.Node, order, transpose=None):
        x = node.args[0]
        r, shape = self.rows(x), shape_of(x)
        if r is None or shape is None:
            return None
        n = len(shape)
        if transpose is not None:
            if n < 2 and transpose == (-2, -1):
                return r
            a, b = (d % n for d in transpose)
            order = list(range(n))
            order[a], order[b] = order[b], order[a]
        order = [d % n for d in order]
        return r.moved({old: new for new, old in enumerate(order)})

    def movedim(self, node: fx.Node):
        x = node.args[0]
        r, shape = self.rows(x), shape_of(x)
        if r is None or shape is None:
            return None
        n = len(shape)
        src = node.args[1] if isinstance(node.args[1], (list, tuple)) else [node.args[1]]
        dst = node.args[2] if isinstance(node.args[2], (list, tuple)) else [node.args[2]]
        src, dst = [d % n for d in src], [d % n for d in dst]
        rest = [d for d in range(n) if d not in src]
        order: list = [None] * n
        for s, d in zip(src, dst):
            order[d] = s
        it = iter(rest)
        order = [o if o is not None else next(it) for o in order]
        return r.moved({old: new for new, old in enumerate(order)})

    def regroup(self, node: fx.Node, name: str):
        x = node.args[0] if node.args else None
        r, src, dst = self.rows(x), shape_of(x), shape_of(node)
        if r is None:
            # a value free of the batch broadcast to a batch value's shape: the same on every
            # row, and each rank's program makes it at its own share's size (as rows)
            if name == "expand_as" and len(node.args) > 1:
                other = self.rows(node.args[1])
                return Rows.of(other.dims) if other is not None and other.dims else None
            if name in ("expand", "broadcast_to") and dst is not None:
                sizes = node.args[1:] if name == "expand" and len(node.args) > 2 else \
                    (node.args[1] if len(node.args) > 1 else ())
                dims = {i for i, size in enumerate(sizes if isinstance(sizes, (list, tuple)) else ())
                        if self.size_of_rows(size)}
                return Rows.of(dims) if dims else None
            return None
        if src is None or dst is None:
            return self._fallback_rows(node)
        if name in ("expand", "expand_as", "broadcast_to"):
            return r.shifted(len(dst) - len(src))
        if name in ("repeat", "tile"):
            return self.tile_rows(node, name, r, src, dst)
        out = _regroup(src, dst, r, self.batch)
        if out is not None and any(f == -1 for _, f in out.inner) and any(
                (r.factor(k, src[k], self.batch) or 0) * self.batch not in (0, src[k]) for k in r.dims):
            # groups of consecutive rows where copies of the batch sit outside them (tiled,
            # or folded inside another dimension): the single device's groups cross from one
            # copy into the next, a rank's groups only its own share's
            self.couple(node, "index", f"{name} regroups the batch's rows across dimensions {sorted(out.dims)} "
                                       f"while copies of them sit outside the rows: each rank would group its own "
                                       f"share differently")
        return out

    def tile_rows(self, node: fx.Node, name: str, r: "Rows", src: tuple, dst: tuple) -> "Rows | None":
        """``repeat``/``tile`` along the batch's dimension lays whole copies of the batch one
        after another (``x.repeat(E, 1)``: ``[E·B]``, Llama 4's routed input): each copy
        holds the rows in order, so the rows stay in that dimension with the copies outside
        them, as in a view of ``[E, B]`` flattened (:func:`_regroup`), and each rank's copies
        hold its own share. Only where every use, through elementwise ops, views the copies
        apart again (``.view(E, B, H)``: the copies outermost, the rows whole in the next
        dimension); a tiled value reduced or read as one dimension (a loss over the copies)
        is coupled, as are positions tiled (a position read in another copy)."""
        shift = len(dst) - len(src)
        out = r.shifted(shift)
        inner = set(out.inner) if out is not None else set()
        for d in r.dims | r.pos:
            if dst[d + shift] == src[d]:
                continue
            factor = r.factor(d, src[d], self.batch) if d in r.dims and d not in r.pos else None
            if not factor or factor < 0 or d + shift != 0 or not _copies_viewed_apart(node, dst[0] // src[d], src[d]):
                self.couple(node, "index", f"{name} repeats the batch's rows along dimension {d}")
                continue
            inner = {(e, f) for e, f in inner if e != d + shift} | {(d + shift, factor)}
        return Rows.of(out.dims, out.pos, inner, out.perm, out.inverse) if out is not None else None

    def size_of_rows(self, size) -> bool:
        """Whether ``size`` (an argument) reads the size of a batch value's rows dimension
        (``x.shape[0]``, ``x.size(0)``)."""
        if not isinstance(size, fx.Node):
            return False
        name = bare_name(size)
        if name in ("size", "sym_size") and len(size.args) > 1 and isinstance(size.args[1], int):
            r, shape = self.rows(size.args[0]), shape_of(size.args[0])
            return r is not None and shape is not None and size.args[1] % len(shape) in r.dims
        if name == "getitem" and isinstance(size.args[0], fx.Node) and bare_name(size.args[0]) == "getattr" \
                and isinstance(size.args[1], int):
            r = self.rows(size.args[0].args[0])
            return r is not None and size.args[1] in r.dims
        return False

    def repeat_rows(self, node: fx.Node):
        """``repeat_interleave``: each element repeated in place, so every row's copies stay
        together and in the batch's order (flattened first when no dimension is given)."""
        x = node.args[0]
        r, src, dst = self.rows(x), shape_of(x), shape_of(node)
        if r is None or src is None or dst is None:
            return None
        dim = argument(node, 2, "dim", None)
        if dim is None:
            return _regroup(src, (math.prod(src),), r, self.batch)   # flattened, then each element repeated
        return r

    def select(self, node: fx.Node, name: str):
        x = node.args[0]
        r, shape = self.rows(x), shape_of(x)
        if r is None or shape is None:
            index = node.args[2] if name == "index_select" and len(node.args) > 2 else None
            ri = self.rows(index)
            if name == "index_select" and ri is not None:
                dim = node.args[1] % len(shape) if shape else 0
                return Rows.of({dim} if ri.dims else set())
            return None
        n = len(shape)
        dim = argument(node, 1, "dim", 0)
        dim = dim % n if isinstance(dim, int) else 0
        if dim in r.dims:
            full = False
            if name == "slice":
                start, end, step = (argument(node, 2, "start", 0), argument(node, 3, "end", None),
                                    argument(node, 4, "step", 1))
                full = (start in (0, None)) and (end is None or (isinstance(end, int) and end >= shape[dim])) \
                    and step in (1, None)
            elif name == "narrow":
                full = node.args[2] == 0 and node.args[3] == shape[dim]
            elif name == "index_select":
                ri = self.rows(node.args[2])
                full = ri is not None and 0 in ri.pos
            if not full:
                self.couple(node, "index", f"{name} takes some rows of the batch (dimension {dim}): each rank "
                                           f"would take them from its own share")
            if name == "select":
                return r.moved({d: d - (d > dim) for d in range(n) if d != dim})
            return r
        if name == "select":
            return r.moved({d: d - (d > dim) for d in range(n) if d != dim})
        return r

    def split(self, node: fx.Node, name: str):
        x = node.args[0]
        r, shape, out = self.rows(x), shape_of(x), node.meta.get(SPEC)
        count = len(out) if isinstance(out, (tuple, list)) else 1
        if r is None or shape is None:
            return tuple([None] * count)
        dim = argument(node, 2 if name != "unbind" else 1, "dim", 0)
        dim = dim % len(shape) if isinstance(dim, int) else 0
        if dim in r.dims and count > 1:
            self.couple(node, "index", f"{name} cuts the batch (dimension {dim}) into parts, which each rank "
                                       f"would cut from its own share")
        if name == "unbind":
            item = r.moved({d: d - (d > dim) for d in range(len(shape)) if d != dim})
            return tuple([item] * count)
        return tuple([r] * count)

    def cat(self, node: fx.Node, name: str):
        tensors = node.args[0] if node.args else node.kwargs.get("tensors", ())
        tensors = [t for t in tensors if isinstance(t, fx.Node)]
        out_shape = shape_of(node)
        if out_shape is None:
            return None
        n = len(out_shape)
        dim = argument(node, 1, "dim", 0)
        dim = dim % (n if name not in ("stack",) else n) if isinstance(dim, int) else 0
        dims, pos = set(), set()
        for t in tensors:
            r = self.rows(t)
            if r is None:
                continue
            if name in ("stack",):
                dims |= {d + (d >= dim) for d in r.dims}
                pos |= {d + (d >= dim) for d in r.pos}
            else:
                if dim in r.dims and len(tensors) > 1:
                    self.couple(node, "concat", f"{name} joins tensors along the batch (dimension {dim}): each "
                                                f"rank would join its own shares, in another order than the "
                                                f"single device")
                dims |= r.dims
                pos |= r.pos
        return Rows.of(dims, pos)

    def getitem(self, node: fx.Node):
        x, index = node.args[0], node.args[1]
        r, shape = self.rows(x), shape_of(x)
        out = shape_of(node)
        if r is None or shape is None:
            return None
        index = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, fx.Node) for i in index) or any(isinstance(i, (list, torch.Tensor)) for i in index):
            # advanced indexing: rows kept only when the batch dim is not indexed
            return self._advanced(node, x, list(index), shape)
        d_in = d_out = 0
        mapping, ell = {}, False
        rest = [i for i in index if i is not None and i is not Ellipsis]
        for i in index:
            if i is Ellipsis:
                skip = len(shape) - len(rest)
                for _ in range(skip):
                    mapping[d_in] = d_out
                    d_in += 1
                    d_out += 1
                ell = True
                continue
            if i is None:
                d_out += 1
                continue
            if isinstance(i, int):
                if d_in in r.dims:
                    self.couple(node, "index", f"x[...] takes row {i} of the batch (dimension {d_in})")
                d_in += 1
                continue
            if isinstance(i, slice):
                if d_in in r.dims and not (i.start in (None, 0) and i.stop in (None,) and i.step in (None, 1)):
                    if not (isinstance(i.stop, int) and i.stop >= shape[d_in] and i.start in (None, 0)):
                        self.couple(node, "index", f"x[...] takes a slice of the batch's rows (dimension {d_in})")
                mapping[d_in] = d_out
                d_in += 1
                d_out += 1
                continue
            return self._fallback_rows(node)
        while d_in < len(shape):
            mapping[d_in] = d_out
            d_in += 1
            d_out += 1
        del ell, out
        return r.moved(mapping)

    def index(self, node: fx.Node):
        x, indices = node.args[0], list(node.args[1])
        shape = shape_of(x)
        if shape is None:
            return None
        return self._advanced(node, x, indices, shape)

    def _advanced(self, node: fx.Node, x, indices: list, shape: tuple):
        """``x[indices]`` with index tensors (``aten.index``): rows meet unless the batch
        dimension is indexed by its own positions with every index tensor's batch rows
        aligned (``x[arange(B), y]``, a pick per row), or not indexed at all."""
        r = self.rows(x) or Rows()
        if not r.dims and not r.pos and not any(self.rows(i) is not None and self.rows(i).dims
                                                for i in indices if isinstance(i, fx.Node)):
            # a batch-free tensor (a mask expanded to the batch size) read at row positions:
            # every row reads the same values, unless it is a table held per position
            if held_table(x):
                self.couple(node, "positional", "a parameter or buffer is read at the rows' positions "
                                                "(arange over the batch), which differ on each rank")
            return None
        out = shape_of(node)
        indexed = [d for d, i in enumerate(indices) if i is not None and not (isinstance(i, slice)
                                                                              and i == slice(None))]
        tensors = [i for i in indices if isinstance(i, fx.Node)]
        idx_rows = [self.rows(i) for i in tensors]
        b_rank = max((len(shape_of(i) or ()) for i in tensors), default=0)
        hit = [d for d in indexed if d in r.dims]   # the batch's rows indexed (positions indexed: positions)
        # index tensors' batch dims, right-aligned to their broadcast; their positions count
        # as rows only where they index the batch (elsewhere they are plain indexes of another
        # dimension, perhaps one as long as the batch)
        aligned_dims, aligned_pos = set(), set()
        for d, i in enumerate(indices):
            ri = self.rows(i) if isinstance(i, fx.Node) else None
            if ri is None:
                continue
            shift = b_rank - len(shape_of(i) or ())
            aligned_dims |= {e + shift for e in ri.dims}
            if d in hit or not r.dims:
                aligned_pos |= {e + shift for e in ri.pos}
        perm = r.perm
        if hit:
            by = [self.rows(indices[d]) if isinstance(indices[d], fx.Node) else None for d in hit]
            picks = all(b is not None and b.pos and bare_positions(indices[d]) for b, d in zip(by, hit))
            reorder = all(b is not None and b.pos and b.perm for b in by)
            if reorder:   # rows gathered in the rank's own order, or that order undone
                perm = not (r.perm and all(b.inverse for b in by))
            elif not picks or (aligned_dims and aligned_dims != aligned_pos):
                self.couple(node, "index", f"an index reads rows of the batch (dimension {hit[0]}) at positions "
                                           f"it computes: each rank would read its own share")
        first = indexed[0] if indexed else 0
        adjacent = indexed == list(range(first, first + len(indexed)))
        start = first if adjacent else 0
        # a pick of the batch's rows by their positions gives rows; positions read at positions, positions
        batch_part = {start + d for d in aligned_dims | (aligned_pos if hit else set())}
        mapping = {}
        if out is not None:
            after = [d for d in range(len(shape)) if d not in indexed]
            for d in after:
                mapping[d] = d if d < start else d - len(indexed) + b_rank
        dims = {mapping[d] for d in r.dims if d in mapping} | batch_part
        pos = {mapping[d] for d in r.pos if d in mapping} | ({start + d for d in aligned_pos} if not hit else set())
        if hit and perm is not None and any((self.rows(i) or Rows()).perm for i in tensors):
            return Rows.of(dims, (), perm=perm)
        return Rows.of(dims, pos, perm=r.perm)

    def gather(self, node: fx.Node, name: str):
        x = node.args[0]
        shape = shape_of(x)
        r = self.rows(x)
        dim = argument(node, 1, "dim", 0)
        if shape is None:
            return None
        n = max(len(shape), 1)
        dim = dim % n if isinstance(dim, int) else 0
        others = [self.rows(a) for a in node.all_input_nodes if a is not x]
        if name in ("index_put", "index_put_"):
            idx = node.args[1] if len(node.args) > 1 else []
            by = [self.rows(i) for i in idx if isinstance(i, fx.Node)]
            if by and all(b is not None and b.perm and b.pos for b in by):
                # out[perm] = arange(n): the positions that undo the rank's own order
                return Rows.of((), {0}, perm=True, inverse=True)
            hit = r is not None and any(i is not None for d, i in enumerate(idx) if d in r.dims)
            if hit:
                self.couple(node, "index", "an index_put writes rows of the batch at positions it computes")
            return r
        base = name.rstrip("_")
        if r is not None and dim in r.dims:
            self.couple(node, "index", f"{name} reads or writes the batch (dimension {dim}) at positions it computes")
        elif r is not None and r.dims:   # an index or source held as long as the batch, read along its rows
            self._tables_on_rows(node, tuple(shape), r.dims, [a for a in node.all_input_nodes if a is not x],
                                 leading=True)
        if base in ("scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_reduce",
                    "index_fill", "masked_scatter"):
            # values of the batch's rows written into slots that are not rows (a count per
            # expert: scatter_add of ones at the experts' ids): a reduction over the batch
            if any(o is not None and o.dims for o in others):
                if r is None or not r.dims:
                    self.reductions.append((node, "sum" if base in ("scatter_add", "index_add") else "other"))
                elif any(o is not None and not o.dims <= r.dims for o in others):
                    self.couple(node, "index", f"{name} writes values of the batch's rows (dimension "
                                               f"{sorted(set().union(*(o.dims for o in others if o)) - r.dims)}) "
                                               f"into other rows of the value")
            # else each row writes into its own row (along another dimension): kept apart
            return r
        dims = set(r.dims) if r else set()
        for o in others:
            if o is not None:
                dims |= o.dims
        return Rows.of(dims)
