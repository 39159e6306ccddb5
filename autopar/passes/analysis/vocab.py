"""Analysis pass: the vocabulary region (token embedding, LM head and the loss after it).

Megatron splits the vocabulary across tensor ranks (megatron §2.3): the embedding
becomes a vocab-parallel lookup (each rank holds rows ``[v0, v1)``, looks up the ids it
owns, and an all-reduce sums the rows), the LM head a column-parallel linear over the
vocabulary, and cross-entropy is computed on the vocab-sharded logits without gathering
them. When the head's weight is the embedding's (tied weights, as in GPT-2) both use
the same row shard, so the region holds both. Its ``vocab_size`` need not divide the
tensor degree: the rewrite pads it (:mod:`autopar.strategies.shared.tensor_rewrite`).

Example (GPT-2, export graph; the region is named after the token embedding's module)::

    vocab:transformer.wte  vocab=128 tied embeddings=[embedding] head=linear_24
"""
from __future__ import annotations

import logging

import torch.fx as fx

from autopar.ir import Region, add_region, clear_regions, tensor_spec
from autopar.passes.analysis.naming import region_path
from autopar.passes.analysis.ops import is_embedding, match_linear

log = logging.getLogger("autopar.analysis.vocab")


def _from_input(node: fx.Node, limit: int = 8) -> bool:
    """Whether ``node`` is (a view of) a graph input: token ids rather than positions."""
    for _ in range(limit):
        if node.op == "placeholder":
            return True
        inputs = node.all_input_nodes
        if len(inputs) != 1:
            return False
        node = inputs[0]
    return False


def _param(gm: fx.GraphModule, name: str):
    try:
        return gm.get_parameter(name)
    except AttributeError:
        return None


def find_vocab_region_pass(gm: fx.GraphModule, *, given: list[Region] | None = None) -> fx.GraphModule:
    """Record the ``vocab`` region: token-embedding lookups and the LM head.

    ``details``: ``embeddings`` (lookup node names), ``head`` (linear node name or None),
    ``weight`` (embedding weight name), ``head_weight``, ``tied``, ``vocab_size``.
    An untied head counts when its output width equals the vocabulary size. The id names
    the token embedding's module (``vocab:transformer.wte``), see
    :mod:`autopar.passes.analysis.naming`.

    ``given``: the whole graph's vocab regions, for a pipeline stage's graph (a cut of
    it): the stage's part of each (:func:`stage_part`) instead of a guess, which on a
    stage without the head could take the stage's last linear for it.
    """
    clear_regions(gm, "vocab")
    if given is not None:
        names = {n.name for n in gm.graph.nodes}
        for region in given:
            part = stage_part(region, names)
            if part is not None:
                add_region(gm, part)
        return gm
    lookups, of_inputs = [], []
    for node in gm.graph.nodes:
        hit = is_embedding(node, gm)
        if hit is not None:
            lookups.append((node, hit[1]))
            if _from_input(hit[0]):
                of_inputs.append((node, hit[1]))
    if not of_inputs:
        return gm
    weight_name = of_inputs[0][1]
    weight = _param(gm, weight_name)
    spec = tensor_spec(of_inputs[0][0])
    vocab_size = weight.shape[0] if weight is not None else None
    if vocab_size is None or spec is None:
        return gm
    # every lookup of the token table, also of ids computed from the inputs (T5's decoder
    # looks up its labels shifted right): split rows serve all of them or none
    embeddings = [n for n, w in lookups if w == weight_name or _param(gm, w) is weight]
    head = None
    for node in reversed(list(gm.graph.nodes)):
        match = match_linear(node, gm)
        if match is None:
            continue
        if match.weight_layout == "out_in" and (_param(gm, match.weight) is weight or match.out_features == vocab_size):
            head = match
        break  # only the last linear of the model can be the LM head
    tied = head is not None and _param(gm, head.weight) is weight
    add_region(gm, Region(
        id=f"vocab:{region_path(gm, embeddings)}",
        kind="vocab",
        nodes=[n.name for n in embeddings] + ([head.node.name] if head else []),
        details={"embeddings": [n.name for n in embeddings], "head": head.node.name if head else None,
                 "weight": weight_name, "head_weight": head.weight if head else None,
                 "tied": tied, "vocab_size": int(vocab_size), "hidden": int(weight.shape[1])},
    ))
    return gm


def stage_part(region: Region, names: set[str]) -> Region | None:
    """The part of the whole graph's vocab ``region`` in a stage whose nodes are
    ``names`` (None: none of it): its lookups there, or its head there with the weight
    as that graph reads it. A tied embedding and head on the first and last stages are
    one region cut in two, each end split over the vocabulary with the same rows."""
    here = [n for n in region.nodes if n in names]
    if not here:
        return None
    d = dict(region.details)
    d["embeddings"] = [n for n in d["embeddings"] if n in names]
    if d["head"] not in names:
        d["head"], d["head_weight"] = None, None
    if not d["embeddings"] and d["head"] is not None:
        d["weight"] = d["head_weight"]
    return Region(region.id, "vocab", here, d)
