"""What context parallelism costs: the ring's exchanges against the attention they hide behind.

A ``data × context × tensor`` configuration computes what ``(data·c) × tensor`` would on
the same tokens per rank (each rank runs ``1/(d·c·t)`` of the batch's tokens through
every layer; the gradients are averaged over the ``d·c`` ranks), so its compute,
activations and data-parallel traffic are Megatron's table at data degree ``d·c``
(:func:`autopar.strategies.shared.mesh.price_mesh`). What it adds is attention over
the whole sequence (:mod:`.ring`): per attention layer and step,

* ring: ``c−1`` exchanges forward of the rank's keys and values (``2·b·s/c·h_kv·d``
  elements), and backward ``c−1`` of them again plus ``c`` of their float32 gradients;
  each exchange overlaps the attention of one block (``1/c`` of the layer's attention
  core), so only what exceeds it is exposed;
* all-gather: one all-gather of the keys and values forward, one forward again in
  backward and one reduce-scatter of their gradients, not overlapped.

The planner takes the cheaper per configuration (:func:`ring_cost`). Attention written
out in the graph (:mod:`.written`) always runs in the all-gather form, its gathered keys
and values kept for backward: one all-gather of each forward and one reduce-scatter of
their gradients backward (in their own dtype): ``2·(T_ag(c, kv/2n) + T_rs(c, c·kv/2n))``
per core with ``kv`` the keys' and values' bytes as gathered (before a grouped-query
repeat in the graph) and ``n`` the ranks (AxoNN eqs 1-2 for the ring
collectives' times), added whichever form the ``scaled_dot_product_attention`` cores take.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from autopar.cost import model as cost_model
from autopar.cost.hardware import Hardware
from autopar.ir import SPEC, TensorSpec
from autopar.passes.analysis.batch_rows.op_tables import SDPA, argument, bare_name
from autopar.planning.model import ModelFacts
from autopar.strategies.context.meeting import learned
from autopar.strategies.context.written import WrittenCore, written_cores


@dataclass(frozen=True)
class AttentionCore:
    """One attention core of the captured graph: its node, the global element counts of
    its keys and values, its sequence length and key/value element size, and whether the
    rewrite can run it as a ring (no dropout, no mask computed from parameters); ``written``:
    attention written out (matmul, softmax, matmul: :mod:`.written`), run with its keys
    and values all-gathered (``rings``: on the rank's rows; else on the whole sequence)."""

    node: str
    kv_elems: int
    seq: int
    itemsize: int
    rings: bool = True
    written: bool = False


def attention_cores(model: ModelFacts) -> list[AttentionCore]:
    """The graph's ``scaled_dot_product_attention`` nodes and written-out cores (:mod:`.written`)
    with their shapes (found once), in graph order; a written-out core context parallelism
    cannot run is not among them (:func:`refused_cores`)."""
    def find():
        written = {core.softmax: core for core in refused_cores(model, every=True) if core.problem is None}
        out = []
        for node in model.gm.graph.nodes:
            if node in written:
                out.append(_written(written[node]))
                continue
            if node.op != "call_function" or bare_name(node) not in SDPA or len(node.args) < 3:
                continue
            q, k, v = node.args[:3]
            specs = [a.meta.get(SPEC) if isinstance(a, fx.Node) else None for a in (q, k, v)]
            if not all(isinstance(s, TensorSpec) and len(s.shape) >= 2 for s in specs):
                continue
            mask = argument(node, 3, "attn_mask", None)
            rings = (bare_name(node) == "scaled_dot_product_attention" and not argument(node, 4, "dropout_p", 0.0)
                     and specs[1].shape[-1] == specs[2].shape[-1]
                     and specs[0].shape[-2] == specs[1].shape[-2] == specs[2].shape[-2]
                     and not (isinstance(mask, fx.Node) and learned(model.gm, mask)))
            out.append(AttentionCore(node.name, specs[1].numel + specs[2].numel, specs[0].shape[-2],
                                     specs[1].dtype.itemsize, rings))
        return out
    return model.fact("context.attention_cores", find)


def refused_cores(model: ModelFacts, every: bool = False) -> list[WrittenCore]:
    """The written-out attention cores context parallelism cannot run on a rank's rows
    (each with its ``problem``); ``every``: all written-out cores."""
    cores = model.fact("context.written_cores", lambda: written_cores(model.gm))
    return cores if every else [core for core in cores if core.problem is not None]


def _written(core: WrittenCore) -> AttentionCore:
    k, v = core.keys.meta.get(SPEC), core.values.meta.get(SPEC)
    elems = (k.numel if isinstance(k, TensorSpec) else 0) + (v.numel if isinstance(v, TensorSpec) else 0)
    itemsize = k.dtype.itemsize if isinstance(k, TensorSpec) else 4
    return AttentionCore(core.softmax.name, elems, core.seq, itemsize, rings=core.whole is None, written=True)


def every_core_rings(model: ModelFacts) -> bool:
    """Whether every attention core can run as a ring (the pricing assumes it: a core
    that cannot runs on the whole sequence on every rank of the group)."""
    cores = attention_cores(model)
    return bool(cores) and all(core.rings and core.seq == cores[0].seq for core in cores)


def sequence_length(model: ModelFacts) -> int | None:
    """The sequence the model's attention runs over (its first core's queries), or None
    without attention the rewrite can ring."""
    cores = attention_cores(model)
    return cores[0].seq if cores else None


def ring_cost(model: ModelFacts, hw: Hardware, data: int, context: int, tensor: int) -> tuple[float, str]:
    """Seconds per step the attention over the split sequence adds on a rank, and the
    mode that costs least (``"ring"`` or ``"allgather"``)."""
    ring = gather = written = 0.0
    ranks = data * context * tensor
    cores = attention_cores(model)
    for core in cores:
        share = core.kv_elems * core.itemsize / ranks     # this rank's keys and values (bytes)
        if core.written:   # always gathered: keys and values once forward, their gradients reduce-scattered
            written += 2 * (cost_model.all_gather_time(context, share / 2, hw) +
                            cost_model.reduce_scatter_time(context, share / 2 * context, hw))
            continue
        step = cost_model.point_to_point_time(share, hw, inter_node=False)
        step_grad = cost_model.point_to_point_time(share * max(4, core.itemsize) / core.itemsize, hw, inter_node=False)
        block = model.seconds([core.node], hw, 1 / ranks) / context   # one step's share of the attention
        forward = (context - 1) * max(0.0, step - block / 3)          # a step's forward is a third of its work
        backward = (context - 1) * max(0.0, step - 2 * block / 3) + context * max(0.0, step_grad - 2 * block / 3)
        ring += forward + backward
        gather += 2 * cost_model.all_gather_time(context, share, hw) + \
            cost_model.reduce_scatter_time(context, share * context * max(4, core.itemsize) / core.itemsize, hw)
    if all(core.written for core in cores):
        return written, "allgather"
    return (ring + written, "ring") if ring <= gather else (gather + written, "allgather")
