"""Batch norms that normalise over the batch: a fact of the model every family reads.

A batch norm in training mode normalises over the rows it sees, so it is exact only
when the whole batch is synchronised at once: data parallelism (and Megatron's data
ranks) with ``sync_batch_norm`` (:func:`autopar.strategies.data.batch_norms.sync_batch_norms`).
D&SP (branches on other rows), pipelines and gradient accumulation (microbatches) do not
plan them: under ``"auto"`` they are not weighed, and forced they raise (:func:`check_batch_norms`).
"""
from __future__ import annotations

from autopar.planning.model import ModelFacts
from autopar.planning.strategy import PlanError
from autopar.passes.analysis.ops import batch_norm_arguments


def batch_norms(model: ModelFacts) -> list[str]:
    """The nodes of batch norms that normalise over the batch (training mode)."""
    return model.fact("data.batch_norms",
                      lambda: [n.name for n in model.gm.graph.nodes if batch_norm_arguments(n) is not None])


def check_batch_norms(model: ModelFacts, how: str) -> None:
    """Raise for a forced strategy that runs batch norms on part of the batch (``how``
    it does)."""
    if batch_norms(model):
        raise PlanError(f"strategy: {how}, and batch norm {batch_norms(model)[0]} normalises over the rows it sees "
                        f"in training mode, so the result would differ from single-device training; use data and "
                        f"tensor parallelism (autopar synchronises batch norm over the data ranks), or "
                        f"GroupNorm/LayerNorm")
