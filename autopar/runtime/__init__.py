"""The runtime primitives every rank's program runs on, below the families
(docs/architecture.md, "Layers"): launching ranks, named process groups, autograd-aware
collectives, data-parallel gradient synchronisation, the one parameter layout
(:mod:`.layout`), plan-independent random draws, devices, health and the failure board,
and the run-time side of the family interface (:mod:`.family_runtime`). Running a rank
on them (``ParallelModule``, its runner, its checkpoints) is :mod:`autopar.engine`, above
the families.

Rewritten graphs call the collectives by their full path
(``autopar.runtime.collectives.reduce_from_tensor_region``); everything public is
re-exported here for users and other stages.
"""
from autopar.runtime.collectives import (
    GRAPH_FUNCTIONS,
    all_gather_batch,
    copy_to_tensor_region,
    gather_from_tensor_region,
    reduce_from_tensor_region,
    scatter_to_tensor_region,
    vocab_parallel_cross_entropy,
    vocab_parallel_embedding,
)
from autopar.runtime.grad_sync import GradientBuckets, sync_gradients
from autopar.runtime.groups import (
    clear_groups,
    get_group,
    group_rank,
    group_size,
    groups_from_mesh,
    registered_groups,
    set_groups,
    use_groups,
)
from autopar.runtime.health import RankFailureError, report_failure
from autopar.runtime.launcher import LaunchError, RankFailure, init_from_env, launch
from autopar.runtime.rng import (
    RandomStates,
    get_random_states,
    seed_everything,
)

__all__ = [
    "GRAPH_FUNCTIONS",
    "GradientBuckets",
    "LaunchError",
    "RandomStates",
    "RankFailure",
    "RankFailureError",
    "all_gather_batch",
    "clear_groups",
    "copy_to_tensor_region",
    "gather_from_tensor_region",
    "get_group",
    "get_random_states",
    "group_rank",
    "group_size",
    "groups_from_mesh",
    "init_from_env",
    "launch",
    "reduce_from_tensor_region",
    "registered_groups",
    "report_failure",
    "scatter_to_tensor_region",
    "seed_everything",
    "set_groups",
    "sync_gradients",
    "use_groups",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_embedding",
]
