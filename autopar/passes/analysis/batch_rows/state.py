"""The batch-rows walk's state: the rows of every value so far, the couplings and
reductions found, and the helpers every rule uses."""
from __future__ import annotations

from typing import Any

import torch.fx as fx

from autopar.passes.analysis import ops
from autopar.passes.analysis.naming import module_paths, user_path
from autopar.passes.analysis.batch_rows.op_tables import shape_of
from autopar.passes.analysis.batch_rows.rows import EXACT, Coupling, Rows


class WalkState:
    """What the walk over ``gm`` (whose batch has ``batch`` rows) has found so far;
    ``pairwise_values``: the pairwise scores and what pointwise ops and transposes make of
    them, found by an earlier walk (their columns are rows of the batch too)."""

    def __init__(self, gm: fx.GraphModule, batch: int, pairwise_values: set | None = None):
        self.gm, self.batch = gm, batch
        self.pairwise_values: set = pairwise_values if pairwise_values is not None else set()
        self.state: dict[fx.Node, Any] = {}
        self.found: list[Coupling] = []
        self.unknown: list[str] = []
        self.reductions: list[tuple[fx.Node, str]] = []   # reductions over the batch: (node, sum|mean|other)
        self.loss_terms: list[tuple[str, str]] = []       # of those, the loss's: (node name, sum|mean)
        self.pairwise: list[fx.Node] = []
        self.counts: list[fx.Node] = []   # counts of rows per value (histc, bincount)
        self.statistics: set[str] = set()
        self.depends: dict[fx.Node, bool] = {}   # whether a value depends on the batch (loss_terms.depends_on_batch)

    # ------------------------------------------------------------ helpers
    def rows(self, value) -> Rows | None:
        if isinstance(value, fx.Node):
            s = self.state.get(value)
            return s if isinstance(s, Rows) else None
        return None

    def module(self, node: fx.Node) -> str:
        paths = module_paths(node)
        return user_path(self.gm, paths[-1]) if paths else ""

    def couple(self, node: fx.Node, kind: str, why: str, **details) -> None:
        if any(c.node == node.name for c in self.found):
            return
        self.found.append(Coupling(node.name, ops.op_name(node), kind, self.module(node), why,
                                   EXACT.get(kind) if kind not in ("pairwise", "masked_mean") else None,
                                   details=details))

    def tensor_args(self, node: fx.Node) -> list[fx.Node]:
        return [a for a in node.all_input_nodes if self.rows(a) is not None]

    def _fallback_rows(self, node: fx.Node):
        for a in node.all_input_nodes:
            r = self.rows(a)
            if r is not None and shape_of(a) == shape_of(node):
                return Rows.of(r.dims, (), r.inner, r.perm)
        return None
