"""The tensor-parallel rewriter: Megatron's column and row linears on one rank's graph
(megatron §2.3), which Megatron's pass runs (:mod:`autopar.strategies.megatron.rewrite`),
AxoNN's 3D layers and Bian's cube build on (:mod:`autopar.strategies.shared.grid3d.rewrite`)
and the planner probes the split rules with (:func:`regions_without_rules`).

Reads the regions written by analysis and the strategy the plan chose for each; for
every region planned as ``megatron`` it

* splits the column linears' weights by output features (per block for a fused QKV
  projection: rank ``r`` keeps ``[q_r, k_r, v_r]``) and inserts
  ``copy_to_tensor_region`` (Megatron's *f*) on their input; parameters read beside
  them that belong to their columns or heads are cut alike (attention sinks, one
  logit per head; experts' biases added to the gated projection's columns);
* splits the row linear's weight by input features, removes its bias from the matmul
  and inserts ``reduce_from_tensor_region`` (*g*) followed by the bias add, so the
  bias is added once, after the reduction;
* turns token-embedding lookups into ``vocab_parallel_embedding``, the LM head into a
  column linear over the vocabulary and cross-entropy on vocab-split logits into
  ``vocab_parallel_cross_entropy``; a vocabulary ``V`` the degree ``t`` does not divide
  is padded (Megatron-LM's ``--make-vocab-size-divisible-by``, :func:`padded_vocab`):
  every rank holds ``ceil(V/t)`` rows (:class:`ParamShard` ``padded_to``, the last ranks'
  tails zero), the logits are a padded :class:`~autopar.strategies.shared.sharding.Shard`
  (``size=V``) gathered without the padding, and the cross-entropy gets
  ``vocab_size=V`` so the padded columns stay out of the softmax;

and carries the resulting layouts through every other node with
:class:`~autopar.strategies.shared.propagation.LayoutPropagator` (rewriting views that bake
the head count in). A node no
rule covers gets its split inputs all-gathered first (a logged fallback: correct, and
visible in the rank graph). Values reaching the graph output are gathered, so the rank
program returns full tensors.

Megatron's pass records the rewriter's :attr:`TensorRewriter.shards` in
``gm.meta[PARAM_SHARDS]``: parameter name → :class:`ParamShard`, from which the runtime
cuts each rank's shard out of the user's full weights. Under sequence parallelism
(:mod:`.sequence_split`) the rewriter inserts the collectives its class names
(Megatron's, :class:`autopar.strategies.megatron.rewrite.MegatronRewriter`).
"""
from __future__ import annotations

import logging
import operator
import weakref
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F

from autopar.grid import MeshAxis
from autopar.ir import REGION_OF, REGIONS, SPEC, tensor_spec
from autopar.passes.analysis import ops
from autopar.strategies.shared.propagation import LayoutPropagator, TensorParallelError
from autopar.strategies.shared.sharding import Shard
from autopar.runtime import collectives
from autopar.strategies.shared.sequence_split import SequenceSplit
from autopar.runtime.shards import gather_full, local_shard

log = logging.getLogger("autopar.strategies.megatron.rewrite")   # Megatron's pass's log, whoever rewrites

aten = torch.ops.aten


@dataclass(frozen=True)
class ParamShard:
    """Parameter split along ``dim`` over the ``group`` mesh dimension, per block.

    ``padded_to``: a vocabulary the degree does not divide (Megatron-LM's
    ``--make-vocab-size-divisible-by``): ``dim`` is padded at its end to this length, a
    multiple of the degree, before it is cut, so every rank holds ``padded_to / t`` rows,
    rank ``r`` rows ``[r·V', (r+1)·V')`` of the padded table; the last ranks' tails are
    the padding (zeros; ``-1`` when cutting an integer tensor, so that a checkpoint's
    index arithmetic, :mod:`autopar.engine.checkpoint_chunks`, sees them held by no
    element). The padding never leaves the rank: :meth:`gather` drops it, so state
    dicts, gradients, norms and checkpoints see the original ``V`` rows. It gets no
    gradient (no id looks it up, the loss masks its logits), so it stays zero."""

    dim: int
    blocks: int = 1
    group: str = MeshAxis.TENSOR
    padded_to: int | None = None

    # the cut of :class:`autopar.runtime.layout.ParamLayout`
    def local(self, full: torch.Tensor, seat) -> torch.Tensor:
        """Rank's part of ``full``: part ``r`` of every block over the group (a view when possible)."""
        return local_shard(self.pad(full), self, seat.size(self.group), seat.coords.get(self.group, 0))

    def gather(self, local: torch.Tensor, seat, full_shape) -> torch.Tensor:
        """The full tensor, all-gathered over the group (a collective); a padded one
        loses its padding."""
        full = gather_full(local, self, seat.size(self.group))
        if self.padded_to is not None:
            full = full.narrow(self.dim, 0, full_shape[self.dim]).contiguous()
        return full

    def pad(self, full: torch.Tensor) -> torch.Tensor:
        """``full`` with its ``dim`` padded to ``padded_to`` (itself when not padded)."""
        if self.padded_to is None or full.shape[self.dim] == self.padded_to:
            return full
        if full.shape[self.dim] > self.padded_to:
            raise ValueError(f"a {list(full.shape)} tensor is longer along dim {self.dim} than its padded length "
                             f"{self.padded_to}")
        shape = list(full.shape)
        shape[self.dim] = self.padded_to - full.shape[self.dim]
        fill = 0 if full.is_floating_point() or full.is_complex() else -1
        return torch.cat([full, full.new_full(shape, fill)], self.dim)

    def norm_groups(self) -> tuple[str, ...]:
        return (self.group,)


def padded_vocab(vocab: int, degree: int) -> int:
    """The vocabulary ``vocab`` padded to a multiple of ``degree`` (itself when it divides):
    Megatron-LM's ``_vocab_size_with_padding`` with ``make_vocab_size_divisible_by = 1``,
    the least padding that lets every rank hold the same number of rows."""
    return -(-vocab // degree) * degree


# each graph's nodes by name, kept between rewriters of one graph (the planner makes
# thousands on the global graph, which it never changes); checked at every lookup
_NAMES: "weakref.WeakKeyDictionary[fx.Graph, dict[str, fx.Node]]" = weakref.WeakKeyDictionary()


def _named(graph: fx.Graph, name: str) -> fx.Node | None:
    """The node of ``graph`` called ``name`` (None: none): from the graph's kept index
    where the node found there is still that graph's and so named, else from a new one."""
    node = _NAMES.get(graph, {}).get(name)
    if node is None or node.graph is not graph or node.name != name or getattr(node, "_erased", False):
        _NAMES[graph] = index = {n.name: n for n in graph.nodes}
        node = index.get(name)
    return node


class TensorRewriter(SequenceSplit, LayoutPropagator):
    """The regions ``chosen`` split over a tensor group of ``degree`` ranks (the module
    docstring): Megatron's rewriter (:class:`autopar.strategies.megatron.rewrite.MegatronRewriter`)
    and the 3D layers' (:class:`autopar.strategies.shared.grid3d.rewrite.Grid3DRewriter`)
    are this one with their collectives and layers."""

    def __init__(self, gm: fx.GraphModule, chosen: set[str], degree: int, rank: int, group: str,
                 sequence: bool = False):
        super().__init__(gm, degree, group)
        self.rank, self.sequence, self.chosen = rank, sequence, set(chosen)
        self.shards: dict[str, ParamShard] = {}
        self.columns: dict[str, int] = {}      # node name -> blocks
        self.padded: dict[str, int] = {}       # column node name -> its vocabulary, when padded
        self.rows: set[str] = set()
        self.embeddings: dict[str, int] = {}   # node name -> vocab size
        known = gm.meta.get(REGIONS, {})  # every region by id, in discovery order
        missing = sorted(chosen - set(known))
        if missing:
            raise TensorParallelError(f"the plan names regions {missing} that analysis did not find in this graph")
        for rid, region in known.items():
            if rid in chosen:
                self._claim(region)

    # ------------------------------------------------------------------ planning of shards
    def _check(self, region, what: str, size: int) -> None:
        if size % self.t:
            raise TensorParallelError(
                f"region {region.id}: {what} = {size} is not divisible by the tensor degree {self.t}; "
                f"choose a tensor degree that divides it, or let the planner choose (strategy='auto')")

    def _column(self, node_name: str, blocks: int = 1, vocab: int | None = None) -> None:
        """A column linear; ``vocab``: an LM head over a vocabulary the degree does not
        divide, padded (its weight and bias cut with ``padded_to``, its logits a padded
        :class:`Shard`)."""
        match = ops.match_linear(self._node(node_name), self.gm)
        self.columns[node_name] = blocks
        padded_to = None
        if vocab is not None:
            self.padded[node_name] = vocab
            padded_to = padded_vocab(vocab, self.t)
        self.shards[match.weight] = ParamShard(match.out_dim_of_weight, blocks, self.group, padded_to)
        if match.bias:
            self.shards[match.bias] = ParamShard(0, blocks, self.group, padded_to)

    def _split_parameter(self, name: str, dim: int, blocks: int = 1) -> None:
        """A parameter the graph reads directly, not through a linear (attention sinks, the
        experts' column bias), cut along ``dim`` like the columns or heads it goes with:
        the rank program reads it already split (:attr:`param_layouts`)."""
        self.shards[name] = ParamShard(dim, blocks, self.group)
        self.param_layouts[name] = Shard(dim, blocks)

    def _row(self, node_name: str) -> None:
        match = ops.match_linear(self._node(node_name), self.gm)
        self.rows.add(node_name)
        self.shards[match.weight] = ParamShard(match.in_dim_of_weight, 1, self.group)

    def _claim(self, region) -> None:
        d = region.details
        if region.kind == "linear_chain":
            self._check(region, "hidden width", d["hidden"])
            # gate and up columns that alternate (GPT-OSS) are cut contiguously: each gate beside its up
            blocks = 1 if d.get("interleaved") else d.get("blocks", 1)
            for name in d["column"]:
                self._column(name, blocks)
            if d.get("column_bias"):   # experts' bias [E, out], added to each row's expert's columns
                self._split_parameter(d["column_bias"], 1, blocks)
            self._row(d["row"])
        elif region.kind == "attention":
            self._check(region, "attention heads", d["heads"])
            self._check(region, "key/value heads", d["kv_heads"])
            for name in dict.fromkeys((d["q_proj"], d["k_proj"], d["v_proj"])):
                self._column(name, d["qkv_blocks"])
            self._row(d["out_proj"])
            if d.get("sinks"):   # a logit per head: each rank holds its heads'
                self._split_parameter(d["sinks"], 0)
        elif region.kind == "vocab":
            # a vocabulary the degree does not divide is padded (Megatron-LM's
            # --make-vocab-size-divisible-by): each rank holds ceil(V/t) rows
            vocab = d["vocab_size"]
            padded = vocab % self.t != 0
            if padded:
                log.debug("region %s: vocabulary %d padded to %d (%d rows per rank of %d)", region.id, vocab,
                         padded_vocab(vocab, self.t), padded_vocab(vocab, self.t) // self.t, self.t)
            for name in d["embeddings"]:
                self.embeddings[name] = vocab
            self.shards[d["weight"]] = ParamShard(0, 1, self.group, padded_vocab(vocab, self.t) if padded else None)
            if d["head"]:
                self._column(d["head"], vocab=vocab if padded else None)
        else:
            raise TensorParallelError(f"region {region.id}: Megatron tensor parallelism does not apply to "
                                      f"{region.kind} regions")

    def _node(self, name: str) -> fx.Node:
        node = _named(self.graph, name)
        if node is None:
            raise TensorParallelError(f"node {name} named by a region is missing from the graph")
        return node

    # ------------------------------------------------------------------ graph helpers
    def rewrite(self, node: fx.Node) -> bool:
        if self.sequence:
            self._gather_at_other_regions(node)
        if node.name in self.columns:
            self._rewrite_column(node)
        elif node.name in self.rows:
            self._rewrite_row(node)
        elif node.name in self.embeddings:
            self._rewrite_embedding(node)
        elif ops.is_dropout(node, self.gm):
            self._rewrite_dropout(node)
        elif ops.is_cross_entropy(node, self.gm) and self._sharded_inputs(node):
            self._rewrite_cross_entropy(node)
        else:
            return False
        return True

    def _rewrite_column(self, node: fx.Node) -> None:
        match = ops.match_linear(node, self.gm)
        if self._token_split(match.input) is not None:
            # split over the tokens (Megatron-SP): g, an all-gather whose backward
            # reduce-scatters the columns' partial gradients (Korthikanti et al. §4.2.2)
            node.replace_input_with(match.input, self._gather_tokens(match.input))
        else:
            x = self._replicated(match.input, node.name)
            node.replace_input_with(match.input, self._copy_to(x))
        spec = tensor_spec(node)
        self.layout[node] = Shard(len(spec.shape) - 1, self.columns[node.name], self.padded.get(node.name))

    def _rewrite_row(self, node: fx.Node) -> None:
        match = ops.match_linear(node, self.gm)
        x_layout = self.layout.get(match.input)
        x = match.input
        if x_layout != Shard(len(tensor_spec(x).shape) - 1):
            x = self._scatter(self._replicated(x, node.name), len(tensor_spec(x).shape) - 1)
        with self.graph.inserting_before(node):
            if node.op == "call_module":
                weight = self.graph.get_attr(match.weight)
                product = self.graph.call_function(F.linear, (x, weight))
            elif node.target in ops.ADDMM_FUNCTIONS:
                product = self.graph.call_function(aten.mm.default, (x, node.args[2]))
            elif match.spelling == "grouped_mm":  # the experts' row offsets stay
                product = self.graph.call_function(node.target, (x,) + tuple(node.args[1:]), dict(node.kwargs))
            else:  # F.linear / aten.linear without the bias, or a plain matmul
                product = self.graph.call_function(node.target, (x, node.args[1]))
            tokens = self._sequence_dim(node) if self.sequence else None
            if tokens is None:
                reduced = self.graph.call_function(collectives.reduce_from_tensor_region, (product, self.group))
            else:  # Megatron-SP's ḡ: the sum, each rank keeping its chunk of the tokens
                reduced = self.graph.call_function(self.SEQUENCE_REDUCE_SCATTER,
                                                   (product, tokens, self.group))
            result = reduced
            if match.bias is not None:
                bias = self.graph.get_attr(match.bias)
                if tokens is not None:  # each rank's bias gradient sums its tokens only: f sums them
                    bias = self.graph.call_function(collectives.copy_to_tensor_region, (bias, self.group))
                    bias.meta[SPEC] = self._spec(bias.args[0])
                result = self.graph.call_function(operator.add, (reduced, bias))
        for new in (product, reduced, result):
            new.meta.update(node.meta)
        node.replace_all_uses_with(result)
        self.graph.erase_node(node)
        self.layout[product] = None
        for n in (reduced, result):
            self.layout[n] = None if tokens is None else Shard(tokens)

    def _rewrite_embedding(self, node: fx.Node) -> None:
        ids, weight_name = ops.is_embedding(node, self.gm)
        vocab = self.embeddings[node.name]
        local = padded_vocab(vocab, self.t) // self.t  # rows per rank (the last ranks' tails padding)
        padding_idx = None
        if node.op == "call_module":
            padding_idx = self.gm.get_submodule(node.target).padding_idx
        elif node.target is F.embedding:
            padding_idx = node.kwargs.get("padding_idx", node.args[2] if len(node.args) > 2 else None)
        elif len(node.args) > 2 and node.args[2] != -1:
            padding_idx = node.args[2]
        with self.graph.inserting_before(node):
            weight = self.graph.get_attr(weight_name)
            tokens = self._sequence_dim(node) if self.sequence else None
            lookup = self.graph.call_function(collectives.vocab_parallel_embedding,
                                              (ids, weight, self.rank * local, self.group, padding_idx),
                                              {} if tokens is None else {"reduce": False})
            result = lookup
            if tokens is not None:  # the ranks' partial lookups summed, each keeping its tokens (ḡ)
                result = self.graph.call_function(self.SEQUENCE_REDUCE_SCATTER,
                                                  (lookup, tokens, self.group))
        for new in (lookup, result):
            new.meta.update(node.meta)
        node.replace_all_uses_with(result)
        self.graph.erase_node(node)
        self.layout[lookup] = None
        self.layout[result] = None if tokens is None else Shard(tokens)

    def _rewrite_dropout(self, node: fx.Node) -> None:
        """Dropout acts element by element: its output keeps its input's layout. Its mask is
        drawn by :mod:`autopar.passes.random_draws` over the value's global indices (the
        split recorded on the node by :meth:`LayoutPropagator.run`), so a replicated
        activation draws the same mask on every tensor rank and a split one its part of
        the single device's."""
        layout = self.layout.get(node.args[0])
        self.layout[node] = None if layout is None else self._only_first_split(node, layout)

    def _rewrite_cross_entropy(self, node: fx.Node) -> None:
        logits, target = node.args[0], node.args[1]
        layout = self.layout.get(logits)
        spec = tensor_spec(logits)
        if node.op == "call_module":
            mod = self.gm.get_submodule(node.target)
            weight, ignore_index, reduction, smoothing = mod.weight, mod.ignore_index, mod.reduction, mod.label_smoothing
        elif node.target is F.cross_entropy:
            kw = node.kwargs
            weight, ignore_index = kw.get("weight"), kw.get("ignore_index", -100)
            reduction, smoothing = kw.get("reduction", "mean"), kw.get("label_smoothing", 0.0)
            if kw.get("size_average") is not None or kw.get("reduce") is not None:
                reduction = None
        else:
            args = list(node.args) + [None] * 6
            weight = args[2]
            reduction = {0: "none", 1: "mean", 2: "sum"}[args[3] if args[3] is not None else 1]
            ignore_index = args[4] if args[4] is not None else -100
            smoothing = args[5] or 0.0
        usable = (isinstance(layout, Shard) and layout.blocks == 1 and len(spec.shape) == 2 and layout.dim == 1
                  and weight is None and not smoothing and reduction in ("mean", "sum", "none"))
        if not usable:
            self._fallback(node, "cross-entropy form without a vocab-parallel rule")
            return
        local = layout.local_size(self.t) or spec.shape[1] // self.t
        with self.graph.inserting_before(node):
            # a padded vocabulary's columns past ``vocab_size`` are left out of the softmax
            loss = self.graph.call_function(
                collectives.vocab_parallel_cross_entropy,
                (logits, target, self.rank * local, self.group, ignore_index, reduction),
                {} if layout.size is None else {"vocab_size": layout.size})
        loss.meta.update(node.meta)
        node.replace_all_uses_with(loss)
        self.graph.erase_node(node)
        self.layout[loss] = None

    # ------------------------------------------------------------------ propagation rules


def regions_without_rules(gm: fx.GraphModule, region_ids: list[str], degree: int) -> dict[str, str]:
    """The regions among ``region_ids`` that hold an op no split rule covers when they
    are split ``degree`` ways, each with a reason naming the op and node: the planner
    keeps them replicated (a region needs no rule then) rather than split with
    all-gathers it did not price. Found by rewriting a copy of the graph (the modules are
    shared, not copied) with all of them split, dropping the regions that fell back, and
    again until none does."""
    left, found = list(region_ids), {}
    while left and degree > 1:
        graph = fx.Graph()
        values: dict = {}
        out = graph.graph_copy(gm.graph, values)
        graph.output(out)
        probe = _Probe(gm, graph)
        probe.meta.update(gm.meta)
        rewriter = TensorRewriter(probe, set(left), degree, 0, MeshAxis.TENSOR)
        rewriter.quiet = True  # the planner reports what it decides
        try:
            rewriter.run()
        except TensorParallelError as e:  # a rule that refuses outright: find its region alone
            if len(left) == 1:
                found[left[0]] = str(e)
                break
            culprits = {rid: why for rid in left for why in [_refusal(gm, rid, degree)] if why}
            if not culprits:  # refused only together: keep them all whole rather than guess
                culprits = {rid: f"{e}; the region stays replicated within the tensor group" for rid in left}
            found.update(culprits)
            left = [rid for rid in left if rid not in culprits]
            continue
        new = {}
        by_name = {n.name: n for n in probe.graph.nodes}
        for name, op, why in rewriter.fallbacks:
            for rid in by_name[name].meta.get(REGION_OF, {}).values():
                if rid in left and rid not in new:
                    what = f"node {name} ({op}) has no split rule" if why == "no split rule for this op" \
                        else f"node {name} ({op}): {why}"
                    new[rid] = f"{what}; the region stays replicated within the tensor group"
        if not new:
            break
        found.update(new)
        left = [rid for rid in left if rid not in new]
    return found


class _Probe(fx.GraphModule):
    """A copy of the graph over the model's modules that is rewritten to see which regions
    fall back, and never run: no code is generated for it (the whole graph's, a third of
    what probing a deep model costs)."""

    def recompile(self):
        return None


def _refusal(gm: fx.GraphModule, rid: str, degree: int) -> str | None:
    return regions_without_rules(gm, [rid], degree).get(rid)
