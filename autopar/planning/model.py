"""What the planner knows of one analysed graph, and the pricing every family shares.

:class:`ModelFacts` reads a graph once: each node's work (``flops.graph_work``: a matmul
is 2mkn, megatron appendix), fused chains priced as one kernel (megatron §4.2), the
regions a tensor family can split with their split sizes and boundary bytes, parameters
by region, and a *class* per region so that identical repeated blocks are priced once.
Its :meth:`ModelFacts.seconds` is the step compute of a set of nodes (1 forward +
backward per kernel, backward twice a matmul's forward, one forward more recomputing),
memoised per work signature and scale; :meth:`ModelFacts.fact` and
:meth:`ModelFacts.memo` hold what a family computes once per model (its own caches,
named by the family).

:func:`exposed_data_comm` is the data-parallel gradient all-reduce every family pays
after the backward (axonn eq 3), minus what hides behind the backward pass.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.fx as fx

from autopar.passes.analysis.batch_rows import couplings
from autopar.passes.analysis.counted_targets import counts_targets
from autopar.passes.analysis.flops import graph_work
from autopar.passes.analysis.ops import (is_cross_entropy, is_dropout, is_embedding, is_pointwise, is_sdpa, is_softmax,
                                  match_linear)
from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.ir import REGION_OF, regions, tensor_spec
from autopar.runtime.layout import zero_unit
from autopar.passes.fusion.rewrite import fusible_chains

TENSOR_KINDS = ("vocab", "attention", "linear_chain")
GRADIENT_BUCKET_BYTES = 25 * 2**20


def region_sizes(region) -> list[tuple[str, int]]:
    """The sizes a tensor split of ``region`` must divide, named (heads, hidden width).
    A vocabulary need not divide: one the degree does not divide is padded
    (:func:`padded_vocab`), so a vocab region has none."""
    d = region.details
    if region.kind == "attention":
        return [("attention heads", d["heads"]), ("key/value heads", d["kv_heads"])]
    if region.kind == "linear_chain":
        return [("hidden width", d["hidden"])]
    return []


def padded_vocab(region, tensor: int) -> int | None:
    """The padded vocabulary of a vocab ``region`` split over ``tensor`` ranks when
    ``tensor`` does not divide it (Megatron-LM's ``--make-vocab-size-divisible-by``:
    ``ceil(V / t)`` rows per rank), None when it divides or the region is no vocabulary."""
    if region.kind != "vocab" or tensor <= 1 or region.details["vocab_size"] % tensor == 0:
        return None
    vocab = region.details["vocab_size"]
    return -(-vocab // tensor) * tensor


def split_factor(region, tensor: int) -> float:
    """How much more than ``1/tensor`` of its work and parameters each rank of a split
    of ``region`` holds: ``V'/V`` for a padded vocabulary (its padded rows are computed
    and stored), 1 otherwise."""
    padded = padded_vocab(region, tensor)
    return padded / region.details["vocab_size"] if padded is not None else 1.0


def padding_details(region, tensor: int) -> dict:
    """A split region's plan details about its padding (``{}`` when none): the vocabulary
    and its padded size, which :meth:`~autopar.planning.plan.Plan.explain` reports."""
    padded = padded_vocab(region, tensor)
    return {} if padded is None else {"vocab": region.details["vocab_size"], "padded_vocab": padded,
                                      "rows_per_rank": padded // tensor}


def _boundary_bytes(gm: fx.GraphModule, region) -> float:
    """Bytes of the activation entering the region's column linears (= its output size)."""
    table = {n.name: n for n in gm.graph.nodes}
    d = region.details
    first = {"attention": d.get("q_proj"), "linear_chain": (d.get("column") or [None])[0],
             "vocab": (d.get("embeddings") or [None])[0]}[region.kind]
    node = table[first]
    if region.kind == "vocab":
        spec = tensor_spec(node)  # the looked-up rows [.., hidden]
    else:
        arg = next(iter(node.all_input_nodes))
        spec = tensor_spec(arg)
    return float(spec.nbytes) if spec is not None else 0.0


def _fuse_work(gm: fx.GraphModule, work: dict) -> int:
    """Price each chain the fusion pass would generate a kernel for as one kernel
    (megatron §4.2): it reads the chain's inputs and writes the values read outside it
    once, instead of every op reading and writing its own. The first kernel of the chain
    carries the chain's FLOPs and bytes; the others become free (no launch, no bytes,
    nothing saved for backward: the kernel's backward recomputes from its inputs).
    Returns the number of chains."""
    chains = fusible_chains(gm)
    for nodes in chains:
        inside = set(nodes)
        kernels = [n for n in nodes if work.get(n.name) is not None and work[n.name].is_kernel]
        if not kernels:
            continue
        read = {a for n in nodes for a in n.all_input_nodes if a not in inside}
        written = [n for n in nodes if any(u not in inside for u in n.users)]
        moved = sum(s.nbytes for a in read if (s := tensor_spec(a)) is not None) + \
            sum(s.nbytes for n in written if (s := tensor_spec(n)) is not None)
        flops = sum(work[n.name].flops for n in kernels)
        special = sum(work[n.name].special for n in kernels)  # the chain's functions still evaluate
        work[kernels[0].name] = dataclasses.replace(work[kernels[0].name], flops=flops, bytes_moved=moved,
                                                    special=special)
        for n in kernels[1:]:
            work[n.name] = dataclasses.replace(work[n.name], flops=0, bytes_moved=0, is_kernel=False, special=0)
    return len(chains)


# ops whose backward keeps none of their tensors (a sum's, a copy's, a layout change's,
# a mask's comparisons): spelled as torch, method and aten names
_KEEPS_NOTHING = {"add", "add_", "iadd", "sub", "rsub", "neg", "cat", "concat", "stack", "split", "chunk", "clone",
                  "contiguous", "expand", "expand_as", "repeat", "to", "type", "type_as", "float", "half", "bfloat16",
                  "double", "_to_copy", "copy", "copy_", "flatten", "unflatten", "transpose", "permute", "view",
                  "reshape", "t", "squeeze", "unsqueeze", "masked_fill", "where", "embedding", "new_ones", "new_zeros",
                  "zeros", "ones", "zeros_like", "ones_like", "full", "arange", "tril", "triu", "eq", "ne", "lt", "le",
                  "gt", "ge", "invert", "bitwise_not", "logical_not", "scalar_tensor", "sum", "mean", "slice",
                  "select", "index_select", "alias", "detach", "lift_fresh_copy", "_unsafe_view", "clamp"}
_NORMS = ("layer_norm", "group_norm", "rms_norm", "batch_norm", "LayerNorm", "GroupNorm", "RMSNorm", "BatchNorm")


def _base_name(node: fx.Node, gm: fx.GraphModule) -> str:
    """The op's name without namespace and overload: ``add`` for ``aten.add.Tensor``,
    ``operator.add`` and ``x.add(y)``; a module's class name."""
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)).__name__
    if node.op == "call_method":
        return str(node.target)
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.name.split("::")[-1]
    return getattr(target, "__name__", str(target))


_CONSTANT_MAKERS = {"full", "full_like", "scalar_tensor", "lift_fresh_copy", "tensor", "ones", "zeros", "ones_like",
                   "zeros_like", "arange"}


def _constant(node: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether ``node`` is a tensor no gradient flows to: a buffer or constant read
    (not a parameter), or one made by a factory (``full``, ``ones``...)."""
    if node.op == "get_attr":
        try:
            return not isinstance(gm.get_parameter(node.target), torch.nn.Parameter)
        except AttributeError:
            return True
    if node.op == "placeholder":
        return False
    return _base_name(node, gm).lstrip("_") in _CONSTANT_MAKERS


def saved_for_backward(gm: fx.GraphModule, work: dict) -> dict[str, float]:
    """Bytes autograd keeps for backward, by the node whose value is kept (each value
    once, parameters and graph inputs left out): a linear or matmul keeps its
    activation inputs, a softmax its output, a norm its input, a dropout its mask (one
    byte an element), a cross-entropy its logits' log-softmax, attention (SDPA) its
    inputs and output, a product or quotient of tensors its factors (by a number or a
    constant tensor nothing), any other pointwise op its input; sums, copies, casts and
    layout changes keep nothing; an op not known here keeps its output. Kernels fused into a chain keep nothing of their own (their
    backward recomputes from the chain's inputs)."""
    kept: dict[str, float] = {}

    def keep(value, fraction: float = 1.0) -> None:
        if not isinstance(value, fx.Node) or value.op in ("get_attr", "placeholder"):
            return
        spec = tensor_spec(value)
        if spec is not None:
            kept[value.name] = max(kept.get(value.name, 0.0), float(spec.nbytes) * fraction)

    for node in gm.graph.nodes:
        w = work.get(node.name)
        if w is None or not w.is_kernel:
            continue
        tensors = [a for a in node.all_input_nodes if tensor_spec(a) is not None]
        name = _base_name(node, gm)
        linear = match_linear(node, gm)
        if linear is not None:
            keep(linear.input)
        elif is_sdpa(node):
            for a in tensors:
                keep(a)
            keep(node)
        elif w.is_matmul:
            for a in tensors:
                keep(a)
        elif is_softmax(node) or "softmax" in name:
            keep(node)
        elif is_dropout(node, gm):
            spec = tensor_spec(node)
            keep(node, 1.0 / spec.dtype.itemsize if spec is not None and spec.dtype.itemsize else 1.0)
        elif is_cross_entropy(node, gm):
            keep(tensors[0] if tensors else None)
        elif any(n in name for n in _NORMS):
            keep(tensors[0] if tensors else None)
        elif name.lstrip("_") in _KEEPS_NOTHING or name in _KEEPS_NOTHING:
            continue
        elif name in ("mul", "mul_", "div", "div_", "truediv"):
            # a product keeps each factor for the other's gradient; by a number or a
            # constant tensor (GPT-2's 0-d attention scale, a buffer) it keeps nothing
            learned = [a for a in tensors if not _constant(a, gm)]
            if len(tensors) > 1 and learned:
                for a in tensors:
                    keep(a)
        elif name in ("matmul", "bmm", "mm"):
            for a in tensors:
                keep(a)
        elif is_pointwise(node, gm):
            keep(tensors[0] if tensors else node)
        else:
            keep(node)
    return kept


class ModelFacts:
    """Per-node work and per-region facts of one analysed graph, computed once."""

    def __init__(self, gm: fx.GraphModule, fusion: bool = False):
        self.gm = gm
        self.work = graph_work(gm)
        self.fused_chains = _fuse_work(gm, self.work) if fusion else 0
        self.regions = [r for r in regions(gm) if r.kind in TENSOR_KINDS]
        self.params = {name: p for name, p in gm.named_parameters(remove_duplicate=True)}
        self.param_region: dict[str, str] = {}
        for node in gm.graph.nodes:
            rid = next((node.meta.get(REGION_OF, {}).get(k) for k in TENSOR_KINDS
                        if node.meta.get(REGION_OF, {}).get(k)), None)
            if rid is None:
                continue
            match = match_linear(node, gm)
            names = [match.weight, match.bias] if match else []
            emb = is_embedding(node, gm)
            if emb:
                names.append(emb[1])
            for name in names:
                if name:
                    self.param_region.setdefault(name, rid)
        self.node_region = {}
        for r in self.regions:
            for name in r.nodes:
                self.node_region.setdefault(name, r.id)
        self.boundary = {r.id: _boundary_bytes(gm, r) for r in self.regions}
        spec0 = next((tensor_spec(n) for n in gm.graph.nodes if n.op == "placeholder"), None)
        self.batch = spec0.shape[0] if spec0 is not None and spec0.shape else 1
        self.table = {n.name: n for n in gm.graph.nodes}
        # the search prices thousands of layouts: what depends only on a set of nodes is
        # computed once per set and per scale (see ModelFacts.seconds)
        self._node_bytes = saved_for_backward(gm, self.work)
        self._sigs: dict[tuple, int] = {}      # interned keys (region classes, work signatures) -> ids
        self._sig_of: dict[tuple, int] = {}    # tuple of node names -> signature id
        self._seconds: dict[Hardware, dict[tuple, float]] = {}
        self._last_hw, self._last_seconds = None, {}
        self._bytes: dict[tuple, float] = {}
        self._region_params = self._param_elems_by_region()
        self.region_class = {r.id: self._class_of(r) for r in self.regions}
        # what the families compute once per model (see fact and memo)
        self._facts: dict[str, Any] = {}

    def fact(self, name: str, compute: Callable[[], Any]) -> Any:
        """A fact of this model a family computes once (``compute()``) and reads for every
        configuration it prices, e.g. ``"megatron.rule_gaps"``; ``name`` starts with the
        family's name."""
        if name not in self._facts:
            self._facts[name] = compute()
        return self._facts[name]

    @property
    def largest_params(self) -> float:
        """The elements of the two largest ZeRO-3 units (:func:`~autopar.runtime.layout.zero_unit`:
        a layer, or a module outside the stacks): ZeRO-3 holds the one in use and the one
        prefetched gathered whole."""
        def largest() -> float:
            units: dict[str, int] = {}
            for name, p in self.params.items():
                unit = zero_unit(name)
                units[unit] = units.get(unit, 0) + p.numel()
            return float(sum(sorted(units.values(), reverse=True)[:2]))
        return self.fact("largest_params", largest)

    def memo(self, name: str) -> dict:
        """A family's memo of this model (a dict it fills as it prices), e.g. ``"grid3d.regions"``."""
        return self.fact(name, dict)

    def _param_elems_by_region(self) -> dict[str, int]:
        seen, total = set(), {}
        for name, rid in self.param_region.items():
            p = self.params.get(name)
            if p is not None and (rid, id(p)) not in seen:
                seen.add((rid, id(p)))
                total[rid] = total.get(rid, 0) + p.numel()
        return total

    def _class_of(self, region) -> int:
        """Regions of identical repeated blocks get the same class: same kind, sizes, work,
        node shapes and parameter count; the search prices one region per class."""
        shapes = []
        for name in region.nodes:
            n = self.table[name]
            what = type(self.gm.get_submodule(n.target)).__name__ if n.op == "call_module" else str(n.target)
            spec = tensor_spec(n)
            shapes.append((n.op, what, None if spec is None else tuple(spec.shape)))
        key = (region.kind, tuple(region_sizes(region)), self.boundary[region.id],
               self.region_param_elems(region.id), tuple(shapes))
        return self._sigs.setdefault(("class", key), len(self._sigs))

    def signature(self, names) -> int:
        """An id shared by node sets with the same kernels (same work, same bytes)."""
        key = tuple(names)
        sig = self._sig_of.get(key)
        if sig is None:
            works = sorted((w.is_matmul, w.is_view, w.flops, w.bytes_moved, w.special, cost_model.passes_per_step(w),
                            self._node_bytes.get(n, 0.0))
                           for n in key if (w := self.work.get(n)) is not None and (w.is_kernel or w.is_view))
            sig = self._sigs.setdefault(("works", tuple(works)), len(self._sigs))
            self._sig_of[key] = sig
        return sig

    @property
    def counts_targets(self) -> bool:
        """Whether the loss averages over counted targets, which a plan splitting the
        batch counts over its ranks with an all-reduce per step
        (:func:`autopar.passes.analysis.counted_targets.counts_targets`)."""
        memo = self.memo("counts_targets")
        if "value" not in memo:
            memo["value"] = counts_targets(self.gm)
        return memo["value"]

    @property
    def batch_couplings(self) -> list:
        """Where rows of the batch meet (:mod:`autopar.passes.analysis.batch_rows`): what a plan
        that splits the batch must make exact, or cannot run."""
        return couplings(self.gm)

    def seconds(self, names, hw: Hardware, scale: float, recompute: bool = False) -> float:
        """Step compute seconds of the nodes ``names`` with their work scaled by ``scale``
        (1 forward + backward per kernel, one forward more when ``recompute``; a view
        costs the host's per-op overhead per pass, unscaled), memoised
        per work signature and scale."""
        memo = self._seconds_on(hw)
        key = (self.signature(names), scale, recompute)
        t = memo.get(key)
        if t is None:
            works = (w for name in names if (w := self.work.get(name)) is not None)
            t = memo[key] = cost_model.scaled_step_compute_time(works, scale, hw, recompute=recompute)
        return t

    def _seconds_on(self, hw: Hardware) -> dict:
        """The memo of :meth:`seconds` on ``hw`` (equal hardware shares one); the last one
        asked is found by identity, so the search does not hash the hardware per call."""
        if hw is not self._last_hw:
            self._last_hw, self._last_seconds = hw, self._seconds.setdefault(hw, {})
        return self._last_seconds

    def region_param_elems(self, rid: str) -> int:
        return self._region_params.get(rid, 0)

    def activation_bytes(self, names, scale: float) -> float:
        """Bytes the kernels among ``names`` save for backward, times ``scale``."""
        key = tuple(names)
        total = self._bytes.get(key)
        if total is None:
            total = self._bytes[key] = sum(self._node_bytes.get(n, 0.0) for n in key)
        return total * scale


def exposed_data_comm(data: int, stride: int, grad_bytes: float, compute: float, hw: Hardware) -> float:
    """The data-parallel gradient all-reduce (axonn eq 3 over the data group; ``stride``
    between its ranks: the tensor degree, or g for a topology-aware sub-grid) left after
    overlapping the backward pass bucket by bucket: what exceeds the backward compute
    (about 2/3 of a step's), and at least the last bucket; plus the buckets' copies
    (:func:`bucket_copy_s`)."""
    if data == 1:
        return 0.0
    data_comm = cost_model.all_reduce_time(data, grad_bytes, hw, stride=stride)
    last_bucket = cost_model.all_reduce_time(data, min(grad_bytes, GRADIENT_BUCKET_BYTES), hw, stride=stride)
    return max(data_comm - compute * 2 / 3, last_bucket) + bucket_copy_s(grad_bytes, hw)


def bucket_copy_s(grad_bytes: float, hw: Hardware) -> float:
    """The gradient buckets' copies (each gradient into its bucket, the average back):
    two memory-bound passes over ``grad_bytes``, on the rank's own time (the host runs
    them between backward kernels)."""
    return 2 * grad_bytes / hw.memory_bandwidth if grad_bytes > 0 else 0.0


