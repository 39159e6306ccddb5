"""The cost model's formulas: sympy expressions built once, lambdified, evaluated on numbers.

Communication follows the ring α-β model of AxoNN (Singh et al., "A 4D hybrid algorithm
to scale parallel training to thousands of GPUs", §V-A eqs 1-3, after Thakur et al. and
Rabenseifner) with a latency α per ring step added back, and the placement-aware
bandwidth of its eq 10 (§V-B). Compute follows Megatron PTD-P (Narayanan et al., SC'21,
appendix): a matmul ``A[m×k] @ X[k×n]`` costs 2mkn FLOPs and its backward twice that.

Message-size conventions (bytes, per rank, as in the paper's ``m``):

* all-gather: ``m`` is the buffer each rank *contributes* (its shard); the result is G·m.
* reduce-scatter and all-reduce: ``m`` is the *full* buffer each rank holds before the
  collective; reduce-scatter leaves m/G on each rank.

The expressions print readably for explanations::

    >>> str(FORMULAS["all_reduce"])
    '2*alpha*(G - 1) + 2*m*(G - 1)/(G*beta)'

Where ``autopar calibrate`` measured a collective at several message sizes
(``Hardware.measured["table"]``), its time is interpolated between the measured points
(:func:`measured_table`): a backend switches algorithms with the size (gloo's all-reduce
over 4 ranks takes 0.7 ms for 4 bytes and 3.5 ms from 64 bytes to 256 KiB), which no
single α-β line follows; the fitted formula prices sizes past the largest point.

Besides FLOPs and bytes, each kernel pass (and each pass of a view) pays the host's
``host_op_s`` and each collective call :func:`call_overhead` (the hardware's overhead
terms, docs/planner.md "Overheads"; 0 in the presets, measured by ``autopar calibrate``).

The functions below take and return plain numbers and never call sympy; the search
evaluates them millions of times.
"""
from __future__ import annotations

from typing import Iterable

import sympy

from autopar.cost.hardware import Hardware

# --------------------------------------------------------------------- symbols

G, m, beta, alpha = sympy.symbols("G m beta alpha", positive=True)
"""Group size, message bytes (see the module docstring), link bandwidth (bytes/s), α (s)."""
beta_inter, G_node, G_inner = sympy.symbols("beta_inter G_node G_inner", positive=True)
flops, peak, efficiency, saturation, launch = sympy.symbols(
    "flops peak efficiency saturation launch", positive=True)
bytes_moved, memory_bandwidth = sympy.symbols("bytes_moved memory_bandwidth", positive=True)
stages, microbatches, interleave = sympy.symbols("p m_b v", positive=True)
params, activations, param_bytes, grad_bytes, optimizer_bytes = sympy.symbols(
    "P A b_param b_grad b_optimizer", positive=True)

# --------------------------------------------------------------------- formulas

ALL_GATHER: sympy.Expr = (G - 1) * m / beta + (G - 1) * alpha
"""Ring all-gather: AxoNN eq 1, t_AG = (G−1)·m/β, plus α for each of the G−1 steps."""

REDUCE_SCATTER: sympy.Expr = (G - 1) / G * m / beta + (G - 1) * alpha
"""Ring reduce-scatter: AxoNN eq 2, t_RS = (G−1)/G·m/β, plus α for each of the G−1 steps."""

# unevaluated 2·(...) keeps the printed form the paper's (sympy would expand 2(G−1) to 2G−2)
ALL_REDUCE: sympy.Expr = (sympy.Mul(2, (G - 1) / G * m / beta, evaluate=False)
                          + sympy.Mul(2, G - 1, alpha, evaluate=False))
"""Ring all-reduce (reduce-scatter then all-gather): AxoNN eq 3, t_AR = 2(G−1)/G·m/β, plus 2(G−1)α."""

ALL_TO_ALL: sympy.Expr = (G - 1) / G * m / beta + (G - 1) * alpha
"""Pairwise-exchange all-to-all of an ``m``-byte buffer per rank: each rank sends the
(G−1)/G of it that belongs to the others, one peer per step (the segmented slice/concat
of SUPER §IV-C). Same volume term as the reduce-scatter of AxoNN eq 2, plus α per step."""

BROADCAST: sympy.Expr = m / beta + sympy.ceiling(sympy.log(G, 2)) * alpha
"""Broadcast of an ``m``-byte buffer from one root (D&SP-cSub's split, SUPER §III-C):
pipelined, so the volume crosses each link once (m/β), with a binomial tree's ⌈log2 G⌉
latency steps. A reduce to one root costs the same."""

SCATTER: sympy.Expr = (G - 1) / G * m / beta + (G - 1) * alpha
"""Scatter from (or gather to) one root of an ``m``-byte buffer it holds in full: the
root's link carries the (G−1)/G of it the others own, one peer per step (D&SP-cSub's
slice and concat, SUPER §IV-C)."""

POINT_TO_POINT: sympy.Expr = m / beta + alpha
"""One send of m bytes over one link (pipeline activations, Megatron PTD-P §4.1)."""

PLACEMENT_BANDWIDTH: sympy.Expr = beta_inter / sympy.Min(G_node, G_inner)
"""AxoNN eq 10: β_i = β_inter / min(G_node, ∏_{j<i} G_j), β_inter the node-pair bandwidth and
∏_{j<i} G_j (here ``G_inner``, the stride of the group) the rings sharing it."""

MATMUL_TIME: sympy.Expr = flops / (peak * efficiency * flops / (flops + saturation)) + launch
"""flops / achieved rate + launch; the rate saturates as flops/(flops+saturation) (half at
``saturation``). FLOPs are 2mkn per Megatron PTD-P appendix."""

MEMORY_BOUND_TIME: sympy.Expr = bytes_moved / memory_bandwidth + launch
"""A pointwise / normalisation / copy kernel: bytes read and written over memory bandwidth."""

PIPELINE_BUBBLE: sympy.Expr = (stages - 1) / (interleave * microbatches)
"""Megatron PTD-P §2.2: bubble fraction (p−1)/m (1F1B), (p−1)/(v·m) with v interleaved chunks."""

TRAINING_MEMORY: sympy.Expr = params * (param_bytes + grad_bytes + optimizer_bytes) + activations
"""Parameters, gradients and optimizer state (AdamW: two fp32 moments) per element, plus activations."""

FORMULAS: dict[str, sympy.Expr] = {
    "all_gather": ALL_GATHER,
    "reduce_scatter": REDUCE_SCATTER,
    "all_reduce": ALL_REDUCE,
    "all_to_all": ALL_TO_ALL,
    "broadcast": BROADCAST,
    "scatter": SCATTER,
    "point_to_point": POINT_TO_POINT,
    "placement_bandwidth": PLACEMENT_BANDWIDTH,
    "matmul_time": MATMUL_TIME,
    "memory_bound_time": MEMORY_BOUND_TIME,
    "pipeline_bubble": PIPELINE_BUBBLE,
    "training_memory": TRAINING_MEMORY,
}

_ring = (G, m, beta, alpha)
_all_gather = sympy.lambdify(_ring, ALL_GATHER, "math")
_reduce_scatter = sympy.lambdify(_ring, REDUCE_SCATTER, "math")
_all_reduce = sympy.lambdify(_ring, ALL_REDUCE, "math")
_all_to_all = sympy.lambdify(_ring, ALL_TO_ALL, "math")
_broadcast = sympy.lambdify(_ring, BROADCAST, "math")
_scatter = sympy.lambdify(_ring, SCATTER, "math")
_point_to_point = sympy.lambdify((m, beta, alpha), POINT_TO_POINT, "math")
_matmul_time = sympy.lambdify((flops, peak, efficiency, saturation, launch), MATMUL_TIME, "math")
_memory_bound_time = sympy.lambdify((bytes_moved, memory_bandwidth, launch), MEMORY_BOUND_TIME, "math")
_pipeline_bubble = sympy.lambdify((stages, microbatches, interleave), PIPELINE_BUBBLE, "math")
_training_memory = sympy.lambdify(
    (params, activations, param_bytes, grad_bytes, optimizer_bytes), TRAINING_MEMORY, "math")

# --------------------------------------------------------------------- communication


def group_link(group_size: int, stride: int, hw: Hardware) -> tuple[float, float]:
    """(β, α) seen by a ring over ranks {r, r+stride, ..., r+(group_size-1)*stride}.

    Placement is rank-major: node k holds ranks [k·D, (k+1)·D), D = ``devices_per_node``,
    and the ``stride`` groups interleaved in a block of ``stride·group_size`` consecutive
    ranks are the groups of one grid dimension (AxoNN §V-B's hierarchy: the product of
    the inner dimensions is the stride). All of them lie inside nodes exactly when such a
    block tiles a node (``D % (stride·group_size) == 0``); then the link is
    (``intra_node_bandwidth``, ``intra_node_latency_s``).

    Otherwise the rings cross node boundaries and, by AxoNN eq 10, the node-pair
    bandwidth β_inter = D·``inter_node_bandwidth`` is shared by the min(D, stride)
    rings crossing it: β = D·inter_node_bandwidth / min(D, stride), capped by the
    intra-node links the ring also uses when stride < D; α is ``inter_node_latency_s``.
    """
    if group_size < 1 or stride < 1:
        raise ValueError(f"group_link: group_size ({group_size}) and stride ({stride}) must be >= 1")
    per_node = hw.devices_per_node
    block = stride * group_size
    if group_size == 1 or (block <= per_node and per_node % block == 0):
        return float(hw.intra_node_bandwidth), float(hw.intra_node_latency_s)
    shared = per_node * hw.inter_node_bandwidth / min(per_node, stride)
    if stride < per_node:
        shared = min(shared, hw.intra_node_bandwidth)
    return float(shared), float(hw.inter_node_latency_s)


def _collective_time(formula, group_size: int, nbytes: float, hw: Hardware, stride: int,
                     name: str = "") -> float:
    """A lambdified collective formula on the link a group of ``group_size`` at ``stride``
    sees: the calibrated (β, α) of collective ``name`` at that group size where the
    hardware has one (``autopar calibrate``), else :func:`group_link`, plus the host's
    ``collective_call_s`` per call (autopar's autograd function and hooks around it);
    0.0 for a group of one."""
    if group_size == 1:
        return 0.0
    key = (formula, name, group_size, nbytes, stride, hw)  # the search asks the same ones many times
    found = _COLLECTIVES.get(key)
    if found is None:
        if len(_COLLECTIVES) > 1 << 18:
            _COLLECTIVES.clear()
        found = _COLLECTIVES[key] = _collective_time_of(formula, group_size, nbytes, hw, stride, name)
    return found


_COLLECTIVES: dict = {}  # _collective_time's memo (the formulas are pure; hardware hashes once)


def _collective_time_of(formula, group_size: int, nbytes: float, hw: Hardware, stride: int, name: str) -> float:
    """:func:`_collective_time`, computed."""
    b, a = hw.link(name, group_size) or group_link(group_size, stride, hw)
    table = measured_table(name, group_size, hw)
    if table is not None:
        return _interpolated(table, nbytes, lambda m: float(formula(group_size, m, b, a))) \
            + call_overhead(group_size, hw)
    return float(formula(group_size, nbytes, b, a)) + call_overhead(group_size, hw)


def measured_table(name: str, group_size: int, hw: Hardware) -> "list | None":
    """The measured ``[[m bytes, seconds], ...]`` of collective ``name`` over ``group_size``
    ranks (``Hardware.measured["table"]``, written by ``autopar calibrate``), or None."""
    table = hw.measured.get("table")
    if not table:
        return None
    return table.get(name, {}).get(str(group_size))


def _interpolated(table: list, nbytes: float, formula) -> float:
    """Seconds at ``nbytes`` from measured points: linear between the two points around it
    (a backend switches algorithms with the message size, e.g. gloo's all-reduce at 4
    ranks takes 0.7 ms for 4 bytes and 3.5 ms from 64 bytes to 256 KiB, which no single
    α-β line follows), the smallest point's time below them, and past the largest the
    largest's time plus the α-β ``formula``'s growth from there."""
    import bisect
    sizes = [m for m, _ in table]
    i = bisect.bisect_left(sizes, nbytes)
    if i == 0:
        return float(table[0][1])
    if i == len(table):
        m, t = table[-1]
        return float(t) + max(0.0, formula(nbytes) - formula(m))
    (m0, t0), (m1, t1) = table[i - 1], table[i]
    return float(t0 + (t1 - t0) * (nbytes - m0) / (m1 - m0))


def call_overhead(group_size: int, hw: Hardware) -> float:
    """What a collective call over ``group_size`` ranks costs in training beyond its
    formula: the host's ``collective_call_s`` (autopar's autograd functions around it)
    and, where ``autopar calibrate`` measured it, the wait a call adds to a loop of
    compute (``measured["call"]``: ranks arriving at different times, or descheduled
    where they share cores), which a call timed alone after a barrier does not see."""
    measured = hw.link("call", group_size)
    return hw.collective_call_s + (measured[1] if measured is not None else 0.0)


def all_gather_time(group_size: int, bytes_per_rank: float, hw: Hardware, stride: int = 1) -> float:
    """Seconds for a ring all-gather where each rank contributes ``bytes_per_rank`` (AxoNN eq 1 + α)."""
    return _collective_time(_all_gather, group_size, bytes_per_rank, hw, stride, "all_gather")


def reduce_scatter_time(group_size: int, total_bytes: float, hw: Hardware, stride: int = 1) -> float:
    """Seconds for a ring reduce-scatter of a ``total_bytes`` buffer held by each rank (AxoNN eq 2 + α)."""
    return _collective_time(_reduce_scatter, group_size, total_bytes, hw, stride, "reduce_scatter")


def all_to_all_time(group_size: int, total_bytes: float, hw: Hardware, stride: int = 1) -> float:
    """Seconds for an all-to-all of a ``total_bytes`` buffer held by each rank (``ALL_TO_ALL``)."""
    return _collective_time(_all_to_all, group_size, total_bytes, hw, stride, "all_to_all")


def all_reduce_time(group_size: int, total_bytes: float, hw: Hardware, stride: int = 1) -> float:
    """Seconds for a ring all-reduce of a ``total_bytes`` buffer held by each rank (AxoNN eq 3 + 2(G−1)α);
    0.0 for a group of one."""
    return _collective_time(_all_reduce, group_size, total_bytes, hw, stride, "all_reduce")


def broadcast_time(group_size: int, total_bytes: float, hw: Hardware, stride: int = 1) -> float:
    """Seconds to broadcast (or reduce) ``total_bytes`` from one root over the group (``BROADCAST``)."""
    return _collective_time(_broadcast, group_size, total_bytes, hw, stride, "broadcast")


def scatter_time(group_size: int, total_bytes: float, hw: Hardware, stride: int = 1) -> float:
    """Seconds to scatter (or gather) a ``total_bytes`` buffer from (to) one root (``SCATTER``)."""
    return _collective_time(_scatter, group_size, total_bytes, hw, stride, "scatter")


def point_to_point_time(nbytes: float, hw: Hardware, *, inter_node: bool = True) -> float:
    """Seconds to send ``nbytes`` between two ranks: m/β + α over one link (pipeline stages,
    Megatron PTD-P §4.1; a cross-node send uses one GPU's NIC, ``inter_node_bandwidth``)."""
    if nbytes <= 0:
        return 0.0
    fit = hw.link("send", 2)
    table = measured_table("send", 2, hw)
    if fit is not None and table is not None:
        return _interpolated(table, nbytes, lambda m: float(_point_to_point(m, *fit))) + call_overhead(2, hw)
    if fit is not None:
        return float(_point_to_point(nbytes, *fit)) + call_overhead(2, hw)
    if inter_node:
        return float(_point_to_point(nbytes, hw.inter_node_bandwidth, hw.inter_node_latency_s)) + call_overhead(2, hw)
    return float(_point_to_point(nbytes, hw.intra_node_bandwidth, hw.intra_node_latency_s)) + call_overhead(2, hw)


def pipeline_bubble_fraction(num_stages: int, num_microbatches: int, interleave_chunks: int = 1) -> float:
    """Pipeline bubble time over ideal time: (p−1)/(v·m) (Megatron PTD-P §2.2.1-2.2.2)."""
    return float(_pipeline_bubble(num_stages, num_microbatches, interleave_chunks))


# --------------------------------------------------------------------- compute


def matmul_time(flops: float, hw: Hardware) -> float:
    """Seconds for one matmul kernel of ``flops`` FLOPs (2mkn, Megatron PTD-P appendix):
    flops / (peak·efficiency·flops/(flops+saturation)) + launch, plus the host's
    ``host_op_s`` per kernel pass; 0 for 0 FLOPs."""
    if flops <= 0:
        return 0.0
    return float(_matmul_time(flops, hw.peak_flops, hw.matmul_efficiency, hw.saturation_flops,
                              hw.kernel_launch_s)) + hw.host_op_s


def memory_bound_time(bytes_moved: float, hw: Hardware) -> float:
    """Seconds for one memory-bound kernel moving ``bytes_moved`` bytes: bytes/bandwidth +
    launch, plus the host's ``host_op_s`` per kernel pass; the bandwidth is
    ``memory_bandwidth·memory_efficiency`` (the efficiency 1 but in a fitted preset)."""
    return float(_memory_bound_time(bytes_moved, hw.memory_bandwidth * hw.memory_efficiency,
                                    hw.kernel_launch_s)) + hw.host_op_s


def training_memory(param_elems: float, activation_bytes: float, *, param_bytes: float = 4,
                    grad_bytes: float = 4, optimizer_state_bytes: float = 8) -> float:
    """Bytes a device holds in training: parameters + gradients + optimizer state (AdamW keeps
    two fp32 moments: 8 bytes per element) + saved activations."""
    return float(_training_memory(param_elems, activation_bytes, param_bytes, grad_bytes,
                                  optimizer_state_bytes))


MATMUL_BACKWARD_FACTOR = 2
"""Backward of a matmul costs 2× its forward: gradients of both inputs (Megatron PTD-P appendix)."""
MEMORY_BOUND_BACKWARD_FACTOR = 1
"""Backward of a pointwise/normalisation kernel reads and writes about as much as its forward."""


def backward_factor(work) -> int:
    """Backward cost as a multiple of the forward for one node's work (a ``NodeWork``)."""
    return MATMUL_BACKWARD_FACTOR if work.is_matmul else MEMORY_BOUND_BACKWARD_FACTOR


def passes_per_step(work, *, recompute: bool = False) -> int:
    """Forward-equivalents one training step spends on a node: 1 forward + backward, plus one
    forward more under activation recomputation (which re-runs every forward kernel)."""
    return 1 + backward_factor(work) + (1 if recompute else 0)


def node_time(work, hw: Hardware) -> float:
    """Forward seconds of one node: matmul_time for matmuls, memory_bound_time for other
    kernels, each plus ``special_element_s`` per element it evaluates through a
    transcendental function (``work.special``: what a CPU computes rather than moves), the host's ``host_op_s`` for a view (no kernel, but a Python call and an
    autograd node: on the 2-core machine a view costs 10 µs forward and backward where a
    multiply costs 14 µs), 0 for placeholders and other non-kernels."""
    if work.is_view:
        return hw.host_op_s
    if not work.is_kernel:
        return 0.0
    special = work.special * hw.special_element_s
    if work.is_matmul:
        return matmul_time(work.flops, hw) + special
    return memory_bound_time(work.bytes_moved, hw) + special


def step_compute_time(works: Iterable, hw: Hardware, *, recompute: bool = False) -> float:
    """Compute seconds of one training step (forward + backward [+ recompute]) over ``works``
    (``NodeWork`` values, e.g. ``graph_work(gm).values()``): matmuls ×(1+2[+1]), other kernels ×(1+1[+1])."""
    total = 0.0
    for work in works:
        if work.is_kernel or work.is_view:
            total += node_time(work, hw) * passes_per_step(work, recompute=recompute)
    return total


def scaled_step_compute_time(works: Iterable, scale: float, hw: Hardware, *, recompute: bool = False) -> float:
    """:func:`step_compute_time` of ``works`` with every node's FLOPs and bytes times
    ``scale`` (a rank's share of them), without building the scaled works."""
    total = 0.0
    for work in works:
        if work.is_view:
            total += hw.host_op_s * passes_per_step(work, recompute=recompute)
        elif work.is_kernel:
            seconds = (matmul_time(work.flops * scale, hw) if work.is_matmul
                       else memory_bound_time(work.bytes_moved * scale, hw)) + work.special * scale * hw.special_element_s
            total += seconds * passes_per_step(work, recompute=recompute)
    return total


__all__ = [
    "G", "m", "beta", "alpha", "ALL_GATHER", "REDUCE_SCATTER", "ALL_REDUCE", "ALL_TO_ALL", "BROADCAST", "SCATTER", "POINT_TO_POINT",
    "PLACEMENT_BANDWIDTH", "MATMUL_TIME", "MEMORY_BOUND_TIME", "PIPELINE_BUBBLE", "TRAINING_MEMORY",
    "FORMULAS", "group_link", "all_gather_time", "reduce_scatter_time", "all_reduce_time", "all_to_all_time",
    "broadcast_time", "scatter_time",
    "point_to_point_time", "pipeline_bubble_fraction", "matmul_time", "memory_bound_time",
    "training_memory", "MATMUL_BACKWARD_FACTOR", "MEMORY_BOUND_BACKWARD_FACTOR", "backward_factor",
    "passes_per_step", "node_time", "step_compute_time", "scaled_step_compute_time",
]
