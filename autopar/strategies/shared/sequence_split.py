"""Where Megatron sequence parallelism splits the tokens (Korthikanti et al. 2022, §4.2.2):
the choices the tensor-parallel rewrite (:mod:`autopar.strategies.shared.tensor_rewrite`)
makes when its plan runs the values between the regions split over the tokens. The
collectives are Megatron's (:mod:`autopar.strategies.megatron.collectives`): the
Megatron family's rewriter (:class:`autopar.strategies.megatron.rewrite.MegatronRewriter`)
names them in :attr:`SequenceSplit.SEQUENCE_GATHER` and
:attr:`SequenceSplit.SEQUENCE_REDUCE_SCATTER`; a rewrite that never splits the tokens
(the 3D layers', the cube's, the planner's probe) calls neither."""
from __future__ import annotations

import torch.fx as fx

from autopar.ir import REGION_OF, tensor_spec
from autopar.passes.analysis import ops
from autopar.strategies.shared.propagation.state import LayoutState
from autopar.strategies.shared.sharding import Shard, normalize_dim


_SPLIT_KINDS = ("attention", "linear_chain", "vocab")   # the regions Megatron's rewrite splits


class SequenceSplit(LayoutState):
    """The token split of a rewrite whose ``sequence`` is on: which dimension a row
    linear's output is cut along, which values are token-split, their gather (g), and
    which gathers are the layout's designed end rather than a missing rule."""

    sequence: bool = False
    chosen: set = frozenset()   # the ids of the regions the plan splits Megatron-style
    # Megatron-SP's g (an all-gather of the tokens whose backward reduce-scatters) and ḡ
    # (the row linear's reduce-scatter), graph-callable: the Megatron family's rewriter
    # sets them as static methods (autopar.strategies.megatron.collectives)
    SEQUENCE_GATHER = None
    SEQUENCE_REDUCE_SCATTER = None

    def _sequence_dim(self, node: fx.Node) -> int | None:
        """The dimension a row linear's (or a vocabulary-parallel embedding's) output is
        split along under sequence parallelism: a token dimension (any but the features,
        the last) that the degree divides. Any token dimension gives the same values,
        since what runs split between the regions (norms, dropout, residual adds) treats
        each token alone; the one chosen must be the one the residual it is added to is
        already split along (:meth:`_residual_dim`), else the outermost the degree
        divides, which keeps one choice through the views a model takes between
        ``[batch, seq, hidden]`` and ``[batch·seq, hidden]`` (a Conv1D's): the batch
        where the degree divides the rows, else the sequence (Megatron's ``[seq, batch,
        hidden]`` splits the sequence, its first). None: none divides, the output stays
        replicated (an all-reduce)."""
        shape = tensor_spec(node).shape
        fits = [d for d in range(len(shape) - 1) if shape[d] % self.t == 0 and shape[d] >= self.t]
        aligned = self._residual_dim(node)
        return aligned if aligned in fits else (fits[0] if fits else None)

    def _residual_dim(self, node: fx.Node) -> int | None:
        """The dimension of ``node``'s output that lines up with the split of the value it
        is next added to (a residual stream already split over the tokens), found by
        following its only user through pointwise ops, dropout and transposes (None:
        no such value)."""
        value, ndim = node, len(tensor_spec(node).shape)
        dims = list(range(ndim))   # dims[i]: the output's dimension at position i of ``value``
        for _ in range(16):
            if len(value.users) != 1:
                return None
            user = next(iter(value.users))
            spec = tensor_spec(user)
            if spec is None or len(spec.shape) != ndim:
                return None
            if (user.op == "call_function" and user.target in ops.TRANSPOSE_FUNCTIONS) or \
                    (user.op == "call_method" and user.target in ("transpose", "permute")):
                order = _transposed(user, ndim)
                if order is None:
                    return None
                dims = [dims[d] for d in order]
            elif ops.is_pointwise(user, self.gm) or ops.is_dropout(user, self.gm):
                for other in user.all_input_nodes:
                    layout = self.layout.get(other) if other is not value else None
                    if isinstance(layout, Shard) and layout.blocks == 1 and layout.size is None and \
                            len(tensor_spec(other).shape) == ndim and layout.dim < ndim - 1:
                        return dims[layout.dim]
            else:
                return None
            value = user
        return None

    def _gather_at_other_regions(self, node: fx.Node) -> None:
        """Token-split values run between the Megatron regions only: a node of another
        region (a mixture of experts, which routes every token; a fork/join branch; a
        region kept whole), or one that such a region reads (a later pass builds the
        region from its input nodes), reads them gathered."""
        if not (self._other_region(node) or any(self._other_region(u) for u in node.users)):
            return
        for arg in self._sharded_inputs(node):
            if self._token_split(arg) is not None:
                node.replace_input_with(arg, self._gather(arg, self.layout[arg], node.name))

    def _other_region(self, node: fx.Node) -> bool:
        """Whether ``node`` belongs to a region this rewrite does not split Megatron-style."""
        kinds = {kind: rid for kind, rid in node.meta.get(REGION_OF, {}).items() if kind != "block"}
        return not all(rid in self.chosen and kind in _SPLIT_KINDS for kind, rid in kinds.items())

    def boundary(self, node: fx.Node) -> bool:
        # under sequence parallelism a layer outside the regions (a classifier head, a
        # pooler) reads the token-split values whole: where Megatron-SP gathers too
        return self.sequence and all(self._token_split(a) is not None for a in self._sharded_inputs(node))

    def _token_split(self, value: fx.Node) -> int | None:
        """The dimension ``value`` is split along when that is a token dimension (not its
        last: a column linear's input split so is gathered by g, not f), else None."""
        layout = self.layout.get(value)
        if not isinstance(layout, Shard) or layout.blocks != 1 or layout.size is not None:
            return None
        ndim = len(tensor_spec(value).shape)
        return layout.dim if layout.dim < ndim - 1 else None

    def _gather_tokens(self, value: fx.Node) -> fx.Node:
        """Megatron-SP's g on a token-split ``value`` (once per value: a fused or separate
        Q, K and V read one gather)."""
        dim = self._token_split(value)
        return self._cached(("g", value), lambda: self._call(self.SEQUENCE_GATHER,
                                                             (value, dim, self.group), after=value))


def _transposed(node: fx.Node, ndim: int) -> list[int] | None:
    """The input dimension at each output position of a transpose or permute (None: its
    dimensions are not literals)."""
    args = node.args[1:]
    if len(args) == 1 and isinstance(args[0], (list, tuple)):   # permute(x, [dims])
        args = tuple(args[0])
    if not all(isinstance(a, int) for a in args):
        return None
    if len(args) == ndim and sorted(normalize_dim(a, ndim) for a in args) == list(range(ndim)):
        return [normalize_dim(a, ndim) for a in args]
    if len(args) == 2:
        a, b = (normalize_dim(d, ndim) for d in args)
        order = list(range(ndim))
        order[a], order[b] = b, a
        return order
    if not args and ndim == 2:   # t(x)
        return [1, 0]
    return None
