"""The :class:`Hardware` description: the numbers the cost model turns work and bytes
into seconds with (:mod:`autopar.cost.hardware` resolves presets and files to it;
:mod:`autopar.cost.presets` holds the presets)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Hardware:
    """One kind of device and the network between devices, all in SI units (s, bytes, FLOP)."""

    name: str
    description: str            # where the figures come from (paper section / datasheet / measurement)
    peak_flops: float           # FLOP/s per device for the training dtype
    matmul_efficiency: float    # fraction of peak a large matmul achieves
    saturation_flops: float     # per-kernel FLOPs at which a matmul reaches half the achievable rate
    memory_bandwidth: float     # bytes/s of device memory (pointwise ops are bound by it)
    kernel_launch_s: float      # fixed cost per kernel launch
    devices_per_node: int
    intra_node_bandwidth: float  # β_intra, bytes/s per device per direction
    inter_node_bandwidth: float  # β_inter, bytes/s per device per direction (node NIC bandwidth / devices per node)
    intra_node_latency_s: float  # α per ring step inside a node
    inter_node_latency_s: float  # α per ring step across nodes
    memory_bytes: float          # device memory
    # Fitted per collective by ``autopar calibrate`` on the live backend: collective name
    # ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send") →
    # group size (a string, JSON keys) → [α seconds per step, β bytes/s] fitted to that
    # collective's own formula (cost.FORMULAS). Where an entry exists it replaces the
    # placement model of cost.group_link for that collective and group size. Its "table"
    # entry holds the measured points, collective → group size → [[m bytes, seconds], ...],
    # which the cost model interpolates between (cost.measured_table), the fit past them.
    measured: dict = field(default_factory=dict, hash=False)
    # Whether compiled programs run their pointwise chains as generated Triton kernels
    # (autopar.passes.fusion.rewrite: on for GPUs); the cost model then prices each chain as one
    # kernel that reads its inputs and writes its outputs once.
    fused_kernels: bool = False
    # What a step pays besides FLOPs and bytes (docs/cost_model.md, "Overheads"), 0 where
    # the device hides it behind its own work (a GPU's queue runs ahead of the host):
    # host seconds per kernel pass beyond ``kernel_launch_s`` (the Python of the rank's
    # program and autograd's bookkeeping, forward and backward alike), per collective
    # call (autopar's autograd functions and hooks around the call), per pipeline action
    # (the executor's work for one stage's forward or backward of one microbatch).
    host_op_s: float = 0.0
    # Seconds per element a kernel evaluates through a transcendental function (exp, tanh,
    # erf, sigmoid: NodeWork.special), forward, beyond the bytes it moves; the backward
    # pass alike. A CPU core computes these rather than streams them (GELU forward and
    # backward 3.3x an add of the same shape on the 2-core machine); a GPU streams them,
    # and the presets leave it 0. Measured by ``autopar calibrate`` and on first use.
    special_element_s: float = 0.0
    collective_call_s: float = 0.0
    pipeline_action_s: float = 0.0
    step_overhead_s: float = 0.0  # per training step: the runner, its hooks and buckets (any plan)
    # Ranks sharing the cores of one host (a CPU machine running every rank locally):
    # ``host_cores`` cores (0: each rank has a device of its own), the figures measured
    # with ``measured_ranks`` ranks running at once. On ``world`` local ranks each rank
    # gets ``host_cores / world`` cores' worth where that is below one:
    # :meth:`on_world` scales the compute and host figures by the ratio of the shares.
    host_cores: int = 0
    measured_ranks: int = 1
    # The fraction of ``memory_bandwidth`` a step's memory-bound kernels achieve per byte
    # the cost model counts (cost.memory_bound_time): 1 prices them at the datasheet rate.
    # Below 1 where a preset is fitted to end-to-end evidence: it takes in what the captured
    # graph leaves out (dropout masks, layer norms, a fused softmax's fp32 work) and
    # kernels that reach a fraction of the bandwidth (a100-selene: Megatron PTD-P §5.8).
    memory_efficiency: float = 1.0
    # The fraction of an asynchronously issued collective's time a step still waits for:
    # several collectives in flight at once (AxoNN's prefetched all-gathers, deferred
    # reduce-scatters, backward all-reduces, axonn §IV) share their latencies. Measured by
    # ``autopar calibrate`` (k tiny all-gathers issued together then waited, over the same
    # k one after another: 0.6-0.7 on 4 gloo ranks sharing 2 cores); 1 in the presets, as
    # axonn eq 9 prices a grid's full communication.
    async_exposed: float = 1.0

    def __hash__(self) -> int:
        """The fields' hash (``measured`` left out, as the generated one did), computed
        once: the search keys its memos by the hardware, hundreds of thousands of times."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.hash is not False))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict:
        # the cached hash stays behind: a string's hash differs from process to process
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)

    def link(self, collective: str, group_size: int) -> "tuple[float, float] | None":
        """The calibrated (β, α) of ``collective`` over ``group_size`` ranks, or None."""
        fit = self.measured.get(collective, {}).get(str(group_size))
        return None if fit is None else (float(fit[1]), float(fit[0]))

    def sharing(self, ranks: int) -> float:
        """How many ranks share one core's time when ``ranks`` run on this host at once
        (at least 1; 1 without ``host_cores``)."""
        return max(1.0, ranks / self.host_cores) if self.host_cores else 1.0

    def without_overheads(self) -> "Hardware":
        """These figures with every host overhead term at 0 (the per-group-size
        ``measured["call"]`` dropped): what is left is FLOPs and bytes."""
        measured = {k: v for k, v in self.measured.items() if k != "call"}
        return dataclasses.replace(self, host_op_s=0.0, collective_call_s=0.0, pipeline_action_s=0.0,
                                   step_overhead_s=0.0, measured=measured)

    def on_world(self, world: int) -> "Hardware":
        """The figures each of ``world`` local ranks sees: compute rate and memory
        bandwidth divided, launch and host overheads multiplied, by
        ``sharing(world) / sharing(measured_ranks)`` (the contention when ranks share
        cores, relative to when the figures were measured); itself when that is 1."""
        return self._shared(self.sharing(world) / self.sharing(self.measured_ranks), world)

    def while_busy(self, ranks: float) -> "Hardware":
        """These figures (for ``measured_ranks`` ranks computing at once) when only
        ``ranks`` of them compute at a time on average, the others waiting (a pipeline's
        stages outside their turn): each computing rank gets more of the shared cores."""
        return self._shared(self.sharing(ranks) / self.sharing(self.measured_ranks), self.measured_ranks)

    def _shared(self, factor: float, ranks: int) -> "Hardware":
        if factor == 1.0:
            return self
        return dataclasses.replace(
            self, peak_flops=self.peak_flops / factor, memory_bandwidth=self.memory_bandwidth / factor,
            kernel_launch_s=self.kernel_launch_s * factor, host_op_s=self.host_op_s * factor,
            special_element_s=self.special_element_s * factor,
            collective_call_s=self.collective_call_s * factor, pipeline_action_s=self.pipeline_action_s * factor,
            step_overhead_s=self.step_overhead_s * factor, measured_ranks=ranks)

    def to_json(self) -> dict[str, Any]:
        """A plain dict (JSON-serialisable) with one entry per field."""
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Hardware":
        """Inverse of :meth:`to_json`; names missing or unknown fields in the error."""
        names = [f.name for f in dataclasses.fields(Hardware)]
        optional = {f.name for f in dataclasses.fields(Hardware)
                    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
        missing = [n for n in names if n not in d and n not in optional]
        unknown = sorted(set(d) - set(names))
        if missing or unknown:
            raise ValueError(
                f"not a Hardware description: missing fields {missing}, unknown fields {unknown}; "
                f"write one with Hardware.to_json() (fields: {', '.join(names)})")
        values = {}
        for f in dataclasses.fields(Hardware):
            if f.name == "measured":
                measured = d.get("measured", {})
                values[f.name] = {str(c): {str(g): [float(a), float(b)] for g, (a, b) in fits.items()}
                                  for c, fits in measured.items() if c != "table"}
                if "table" in measured:  # measured points: collective → G → [[m bytes, seconds], ...]
                    values[f.name]["table"] = {
                        str(c): {str(g): sorted([float(m), float(t)] for m, t in points) for g, points in by.items()}
                        for c, by in measured["table"].items()}
                continue
            if f.name not in d:
                continue  # an optional field written by an older autopar: its default
            v = d[f.name]
            values[f.name] = (str(v) if f.type == "str" else int(v) if f.type == "int" else bool(v)
                              if f.type == "bool" else float(v))
        return Hardware(**values)


__all__ = ["Hardware"]
