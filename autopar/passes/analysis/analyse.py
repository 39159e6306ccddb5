"""The analysis pipeline: every analysis pass, in the order their results depend on.

``work`` counts every node's FLOPs and bytes into ``node.meta`` first (the fork/join and
repeated-block passes and the planner read them). ``vocab`` and ``attention`` claim their linears before ``linear_chains`` looks for MLPs;
``experts`` reads the router, dispatch and combine around the expert chains ``linear_chains`` found;
``fork_join`` and ``repeated_blocks`` are independent of the others; ``random_sites``
finds the random ops (:mod:`autopar.passes.analysis.random_sites`); ``batch_rows`` finds
where rows of the batch meet (:mod:`autopar.passes.analysis.batch_rows`) and which
dimensions of each random op's value hold them. All of them only
write metadata (see :mod:`autopar.ir`); the graph is unchanged.

Analysis never stops a compile: the runner degrades (``PassRunner(degrade=True)``), so a
pass that raises loses its regions with a warning, and each pass skips a candidate it
cannot read with a warning naming the pass and the node
(:func:`autopar.passes.manager.examining`). What is not in a region is replicated, which
is always correct; the rest of the model is still planned.
"""
from __future__ import annotations

import torch.fx as fx

from autopar.passes.analysis.attention import find_attention_regions_pass
from autopar.passes.analysis.batch_rows import find_batch_couplings_pass
from autopar.passes.analysis.experts import find_routed_experts_pass
from autopar.passes.analysis.flops import count_work_pass
from autopar.passes.analysis.fork_join import find_fork_join_regions_pass
from autopar.passes.analysis.linear_chains import find_linear_chains_pass
from autopar.passes.analysis.random_sites import find_random_sites_pass
from autopar.passes.manager import PassRunner
from autopar.timing import phase
from autopar.passes.analysis.repeated_blocks import find_repeated_blocks_pass
from autopar.passes.analysis.vocab import find_vocab_region_pass

ANALYSIS_PASSES = [
    ("work", count_work_pass, {}),
    ("vocab", find_vocab_region_pass, {}),
    ("attention", find_attention_regions_pass, {}),
    ("linear_chains", find_linear_chains_pass, {}),
    ("experts", find_routed_experts_pass, {}),
    ("fork_join", find_fork_join_regions_pass, {}),
    ("repeated_blocks", find_repeated_blocks_pass, {}),
    ("random_sites", find_random_sites_pass, {}),
    ("batch_rows", find_batch_couplings_pass, {}),
]


def analyse(gm: fx.GraphModule, *, label: str = "analysis", vocab: list | None = None) -> fx.GraphModule:
    """Run every analysis pass on ``gm`` and return it (with regions in ``gm.meta``);
    ``label`` names the run in logs and dumps. ``vocab``: a pipeline stage's graph takes
    its part of the whole graph's vocab regions (``find_vocab_region_pass(given=)``)."""
    passes = [(name, fn, {"given": vocab} if name == "vocab" and vocab is not None else options)
              for name, fn, options in ANALYSIS_PASSES]
    with phase("analysis"):
        return PassRunner(passes, degrade=True).run(gm, label=label)
