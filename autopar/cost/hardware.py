"""Hardware descriptions: the numbers the cost model turns work and bytes into seconds with.

A :class:`Hardware` gives per-device compute rates, memory bandwidth, kernel launch
latency, and the α-β parameters of the links inside and between nodes. The presets:

* ``"cpu-gloo"``: measured on the 2-core development machine (the default);
* ``"a100-selene"``: DGX A100 80 GB nodes of 8, the machine of Megatron PTD-P (§5);
* ``"v100-lassen"``: LLNL Lassen, 4 V100 16 GB per node, the machine of SUPER (§VI-A);
* ``"a100-perlmutter"``: NERSC Perlmutter, 4 A100 40 GB per node (AxoNN §VI);
* ``"mi250x-frontier"``: OLCF Frontier, 4 MI250X = 8 GCDs per node, a GCD per device (AxoNN §VI);
* ``"h100"``: DGX H100-style nodes of 8 H100 SXM 80 GB (NVIDIA datasheets).

Link, memory and peak figures are cited beside each preset; matmul efficiency, saturation,
launch latency and α of the GPU presets are estimates, except ``a100-selene``'s links
(NCCL bus bandwidth), matmul and memory-bound efficiency, fitted to Megatron PTD-P's
Table 2 and §5.8 and public NCCL measurements. Any other machine is a JSON file
written by :meth:`Hardware.to_json`::

    >>> hw = get_hardware("a100-selene")
    >>> hw.peak_flops, hw.devices_per_node, hw.inter_node_bandwidth
    (312000000000000.0, 8, 20000000000.0)
    >>> frontier = get_hardware("mi250x-frontier")
    >>> frontier.devices_per_node, frontier.peak_flops, frontier.memory_bytes / 2**30
    (8, 192000000000000.0, 64.0)
    >>> get_hardware(None).name
    'cpu-gloo'
"""
from __future__ import annotations

import dataclasses
import json
import os
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


# Measured on the development machine (Intel Xeon, 2 cores, KVM guest, 23.5 GiB RAM, no
# GPU; torch 2.13 CPU) with a throwaway script, one process per core, 1 intra-op thread:
# * matmul: fp32 square sgemm medians. 2048^3 -> 218 GFLOP/s (the peak); 128^3..1024^3 ->
#   185..210 GFLOP/s (efficiency 0.92); 32^3 -> 1.7 us, 64^3 -> 4.3 us. Fitting
#   t = (f + S) / (peak * efficiency) + launch to f < 1e7 gives S ~ 1.5e5 FLOPs.
# * launch: median of a 1-element torch.add / mul / relu: 0.74..0.89 us.
# * memory: single-thread copy_ of 256 MB: 14.6..15.5 GB/s read+write (add: 16.7 GB/s).
# * gloo over loopback, 2 spawned processes (torch.multiprocessing + init_process_group
#   "gloo"): all_reduce of 4 B takes 140..190 us (= 2 ring steps -> α ~ 90 us); a
#   least-squares fit of 4 B..64 MB all_reduces to 2(G-1)/G m/β + 2(G-1)α gives β 1.0..1.35
#   GB/s. gloo's all_gather / reduce_scatter reach only ~0.3 GB/s on the same formula.
# * 4 processes on the 2 cores (oversubscribed; modelled as two "nodes" of 2): all_reduce
#   fixed cost 1.2 ms over 6 ring steps (α ~ 200 us), ring bandwidth ~0.9 GB/s, stored per
#   device as 0.9 / 2 (the field's convention: node bandwidth / devices_per_node).
CPU_GLOO = Hardware(
    name="cpu-gloo",
    description=(
        "2-core x86 CPU (Xeon, AVX-512), no GPU; one gloo process per core over loopback, 1 thread "
        "each. Measured: fp32 sgemm 218 GFLOP/s at 2048^3, ~200 at 128^3..1024^3; tiny-op launch "
        "0.85 us; copy bandwidth 15 GB/s; gloo all_reduce 2 ranks: 90 us per ring step, 1.0 GB/s; "
        "4 ranks (oversubscribed): 200 us per step, 0.9 GB/s. gloo all_gather/reduce_scatter "
        "reach ~0.3 GB/s."),
    peak_flops=2.2e11,
    matmul_efficiency=0.92,
    saturation_flops=1.5e5,
    memory_bandwidth=1.5e10,
    kernel_launch_s=0.85e-6,
    devices_per_node=2,
    intra_node_bandwidth=1.0e9,
    inter_node_bandwidth=0.45e9,
    intra_node_latency_s=90e-6,
    inter_node_latency_s=200e-6,
    memory_bytes=24683656 * 1024 / 2,  # MemTotal shared by the two processes
)

# Megatron PTD-P §5 (experimental setup): "Each cluster node has 8 NVIDIA 80-GB A100 GPUs,
# connected to each other by NVLink and NVSwitch. Each node has eight NVIDIA Mellanox
# 200Gbps HDR InfiniBand HCAs for application communication ... The peak device throughput
# of an A100 GPU with 16-bit precision is 312 teraFLOP/s." HBM2e 2039 GB/s is the A100 80GB
# SXM datasheet figure. The other figures are fitted to evidence other than Table 1 (the
# table this preset is checked against, docs/benchmarks.md §10):
# * links, as NCCL's achievable bus bandwidth, not the line rate: nccl-tests all_reduce on
#   an 8-A100 NVLink node reaches 235 GB/s busbw, 0.78 of the 300 GB/s per direction
#   (S. Bekman, "Machine Learning Engineering", github.com/stas00/ml-engineering,
#   network/README.md); the same fraction of one 200 Gb/s HDR HCA (25 GB/s) per GPU is
#   20 GB/s, which Table 2's ZeRO-3 rows bear out (175B on 768 and 1536 GPUs both take
#   ~67 s a step: its ~1.4 TB per GPU of parameter gathers and gradient reduce-scatters
#   at ~21 GB/s).
# * memory_efficiency 0.16 (326 GB/s per byte the captured graph counts): fitted so that
#   pricing the pointwise chains unfused against fused reproduces §5.8's operator-fusion
#   gains, 113 -> 135 TFLOP/s (x1.195) for GPT-3 175B and 133 -> 148 (x1.113) for 530B
#   (predicted x1.177 and x1.107 on Table 2's PTD-P layouts). It stands for the dropout
#   masks, layer norms and softmax work the captured GPT omits, not a bandwidth.
# * matmul_efficiency 0.76 (237 TFLOP/s for a large GEMM): fitted, with the figures above,
#   to Table 2's six PTD-P rows (175B on 384/768/1536 GPUs at 153/149/141 TFLOP/s, 530B on
#   560/1120/2240 at 171/167/159; t=8, p=12 or 35, microbatch 1, interleaved, full
#   recomputation), each predicted within 3%. For comparison, cuBLAS bf16 GEMMs on an A100
#   SXM reach 268 TFLOP/s (0.86) at their best shape with CUDA 12.1 (ml-engineering,
#   compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS"); Megatron ran the
#   NGC PyTorch 20.12 container (Megatron-LM examples/pretrain_gpt3_175B.sh).
# Saturation (2 GFLOP), launch (5 µs) and α (2 µs per ring step inside a node, 5 µs
# across) remain estimates: none of the evidence above separates them.
A100_SELENE = Hardware(
    name="a100-selene",
    description=(
        "DGX A100 80GB nodes of 8 GPUs as on Selene (Megatron PTD-P §5): 312 TFLOP/s fp16 peak; "
        "HBM2e 2039 GB/s, 80 GB (A100 datasheet); NVLink/NVSwitch 235 GB/s per direction and "
        "8 x 200 Gb/s HDR InfiniBand = 20 GB/s per GPU per direction, as NCCL all-reduce bus "
        "bandwidth (0.78 of the line rate, nccl-tests on an A100 node, stas00/ml-engineering). "
        "Fitted to evidence other than Table 1: memory-bound efficiency 0.16 to §5.8's fusion "
        "gains (x1.195 at 175B, x1.113 at 530B); matmul efficiency 0.76 to Table 2's six PTD-P "
        "rows (within 3%). Saturation, launch latency and α are estimates."),
    peak_flops=312e12,
    matmul_efficiency=0.76,
    saturation_flops=2e9,
    memory_bandwidth=2039e9,
    kernel_launch_s=5e-6,
    devices_per_node=8,
    intra_node_bandwidth=235e9,
    inter_node_bandwidth=20e9,
    intra_node_latency_s=2e-6,
    inter_node_latency_s=5e-6,
    memory_bytes=80 * 2**30,
    fused_kernels=True,
    memory_efficiency=0.16,
)

# LLNL Lassen, the machine of SUPER (sub-graph parallelism) §VI-A: "A compute node consists
# of two 22-core IBM Power9 CPUs and four Nvidia V100 GPUs. The GPUs have 16 GB HBM2 memory
# and each CPU has NVLink interconnects with two GPUs. Racks are composed of 18 nodes
# connected with InfiniBand EDR." (IBM Power System AC922 nodes.) Not in the paper:
# * peak: 125 TFLOP/s fp16 tensor-core, memory bandwidth 900 GB/s (NVIDIA V100 SXM2 datasheet).
# * intra: NVLink 2.0 is 25 GB/s per direction per link; in the 4-GPU AC922 each GPU has
#   three links to the other GPU on its socket = 75 GB/s per direction (IBM Redpaper "IBM
#   Power System AC922 Introduction and Technical Overview"). A ring over all four GPUs
#   also crosses the POWER9 X-bus between the sockets, which this figure ignores, so
#   75 GB/s is an upper bound for a whole-node ring.
# * inter: dual-rail EDR InfiniBand, 2 x 100 Gb/s = 25 GB/s per node per direction, i.e.
#   6.25 GB/s per GPU (LLNL's Lassen system page, SUPER ref [25]; the paper says only
#   "InfiniBand EDR", so "dual-rail" is taken from LLNL's description, not the paper).
# Efficiency, saturation, launch and α are estimates: cuBLAS fp16 GEMMs on a V100 reach
# ~90-100 TFLOP/s when large (0.75); saturation half A100_SELENE's (the peak is 0.4 of
# it); launch and α as A100_SELENE.
V100_LASSEN = Hardware(
    name="v100-lassen",
    description=(
        "LLNL Lassen, IBM AC922 nodes of 4 V100 16 GB (SUPER §VI-A): 125 TFLOP/s fp16 tensor-core "
        "peak, HBM2 900 GB/s (V100 SXM2 datasheet); NVLink 2.0 3 links x 25 GB/s = 75 GB/s per "
        "direction between the GPUs of a socket (the cross-socket X-bus is ignored); dual-rail EDR "
        "InfiniBand 2 x 100 Gb/s per node = 6.25 GB/s per GPU per direction (LLNL Lassen page). "
        "Matmul efficiency, saturation, launch latency and α are estimates, not measurements."),
    peak_flops=125e12,
    matmul_efficiency=0.75,
    saturation_flops=1e9,
    memory_bandwidth=900e9,
    kernel_launch_s=5e-6,
    devices_per_node=4,
    intra_node_bandwidth=75e9,
    inter_node_bandwidth=6.25e9,
    intra_node_latency_s=2e-6,
    inter_node_latency_s=5e-6,
    memory_bytes=16 * 2**30,
    fused_kernels=True,
)

# NERSC Perlmutter GPU nodes, the machine of AxoNN §VI (experimental setup): "On Perlmutter,
# each node is equipped with four NVIDIA A100 GPUs, each with a DRAM capacity of 40GB ...
# Nodes on both systems have four HPE Slingshot 11 NICs, with each NIC capable of link
# speeds of 200 Gb/s." and §VI-C: "the theoretical peaks on each machine (312 TFLOP/s per
# GPU on Perlmutter, and 192 TFLOP/s per GCD on Frontier)". One 200 Gb/s NIC per GPU gives
# 25 GB/s per direction. Not in the paper: the four GPUs are fully connected by NVLink 3
# without NVSwitch (NERSC "Perlmutter Architecture" page); the A100's 12 links give 600 GB/s
# total = 300 GB/s per direction (A100 datasheet), 4 links = 100 GB/s per direction to each
# peer, so 300 GB/s is what NCCL's several rings over the fully connected four reach at
# best and one pair alone sees 100 GB/s. HBM2 1555 GB/s is the A100 40GB SXM datasheet
# figure. Efficiency, saturation, launch and α are estimates, the same as A100_SELENE.
A100_PERLMUTTER = Hardware(
    name="a100-perlmutter",
    description=(
        "NERSC Perlmutter GPU nodes of 4 A100 40 GB (AxoNN §VI): 312 TFLOP/s fp16 peak "
        "(AxoNN §VI-C); 4 HPE Slingshot-11 NICs of 200 Gb/s per node = 25 GB/s per GPU per "
        "direction (AxoNN §VI); "
        "NVLink 3 all-to-all without NVSwitch, 600 GB/s per GPU = 300 GB/s per direction over its "
        "3 peers (A100 datasheet; 100 GB/s to any one peer); HBM2 1555 GB/s (A100 40GB datasheet). "
        "Matmul efficiency, saturation, launch latency and α are estimates, not measurements."),
    peak_flops=312e12,
    matmul_efficiency=0.8,
    saturation_flops=2e9,
    memory_bandwidth=1555e9,
    kernel_launch_s=5e-6,
    devices_per_node=4,
    intra_node_bandwidth=300e9,
    inter_node_bandwidth=25e9,
    intra_node_latency_s=2e-6,
    inter_node_latency_s=5e-6,
    memory_bytes=40 * 2**30,
    fused_kernels=True,
)

# OLCF Frontier, the other machine of AxoNN §VI: "Whereas on Frontier, each node has four
# AMD Instinct MI250X GPUs each with a DRAM capacity of 128GB. Each MI250X GPU is
# partitioned into two Graphic Compute Dies (GCDs) and each GCD appears as a separate
# device to any deep learning framework. Nodes on both systems have four HPE Slingshot 11 NICs, with each NIC capable of
# link speeds of 200 Gb/s." §VI-C: "192 TFLOP/s per GCD on Frontier" (the AMD MI250X
# datasheet's 383 TFLOP/s fp16/bf16 matrix peak, halved). So a device is a GCD: 8 per node,
# 64 GB each, and the node's 4 x 25 GB/s of NICs are 12.5 GB/s per GCD per direction.
# Not in the paper: HBM2e 3.2768 TB/s per MI250X = 1638.4 GB/s per GCD (AMD MI250X
# datasheet). OLCF Frontier User Guide ("Frontier Compute Nodes"): "The 2 GCDs on the same
# MI250X are connected with Infinity Fabric GPU-GPU with a peak bandwidth of 200 GB/s. The
# GCDs on different MI250X are connected ... where the peak bandwidth ranges from 50-100
# GB/s"; a ring over all 8 GCDs takes cross-package hops, so β_intra is set to the 50 GB/s
# of one Infinity Fabric link (an estimate at the low end: pairs on one MI250X see 200,
# some cross-package pairs 100). Efficiency (0.65: rocBLAS/hipBLASLt reach a smaller
# fraction of peak than cuBLAS), saturation, launch (HIP launches cost more than CUDA's)
# and α are estimates.
MI250X_FRONTIER = Hardware(
    name="mi250x-frontier",
    description=(
        "OLCF Frontier nodes of 4 MI250X = 8 GCDs, one device per GCD (AxoNN §VI): 192 TFLOP/s "
        "fp16/bf16 matrix peak per GCD (AxoNN §VI-C; MI250X datasheet 383 per package); 64 GB "
        "HBM2e per GCD (128 GB per MI250X, AxoNN §VI); 4 HPE Slingshot-11 NICs of 200 Gb/s per "
        "node = 12.5 GB/s per GCD per direction (AxoNN §VI); Infinity Fabric between GCDs 50-200 "
        "GB/s (OLCF Frontier User Guide), 50 GB/s taken for a ring over the node; HBM2e 1638 GB/s "
        "per GCD (MI250X datasheet). Matmul efficiency, saturation, launch latency, α and the "
        "choice of 50 GB/s are estimates, not measurements."),
    peak_flops=192e12,
    matmul_efficiency=0.65,
    saturation_flops=2e9,
    memory_bandwidth=1638.4e9,
    kernel_launch_s=8e-6,
    devices_per_node=8,
    intra_node_bandwidth=50e9,
    inter_node_bandwidth=12.5e9,
    intra_node_latency_s=3e-6,
    inter_node_latency_s=6e-6,
    memory_bytes=64 * 2**30,
    fused_kernels=True,
)

# DGX H100-style nodes; none of the papers ran on H100, so every figure is from NVIDIA's
# datasheets: H100 SXM5 80GB dense bf16 tensor peak 989 TFLOP/s (the datasheet's 1,979 is
# with 2:4 sparsity), HBM3 3.35 TB/s, NVLink 4 900 GB/s total per GPU = 450 GB/s per
# direction through NVSwitch (H100 datasheet); 8 x 400 Gb/s NDR InfiniBand (ConnectX-7) per
# node, one per GPU = 50 GB/s per GPU per direction (DGX H100 datasheet). Efficiency
# (large bf16 cuBLAS GEMMs reach ~700 TFLOP/s, 0.7), saturation (doubled from
# A100_SELENE: a faster device needs bigger kernels to fill), launch and α are estimates.
H100 = Hardware(
    name="h100",
    description=(
        "DGX H100-style nodes of 8 H100 SXM 80 GB: 989 TFLOP/s dense bf16 peak, HBM3 3.35 TB/s "
        "(H100 datasheet); NVLink 4 / NVSwitch 900 GB/s per GPU = 450 GB/s per direction; "
        "8 x 400 Gb/s NDR InfiniBand per node = 50 GB/s per GPU per direction (DGX H100 "
        "datasheet). "
        "Matmul efficiency, saturation, launch latency and α are estimates, not measurements."),
    peak_flops=989e12,
    matmul_efficiency=0.7,
    saturation_flops=4e9,
    memory_bandwidth=3350e9,
    kernel_launch_s=4e-6,
    devices_per_node=8,
    intra_node_bandwidth=450e9,
    inter_node_bandwidth=50e9,
    intra_node_latency_s=2e-6,
    inter_node_latency_s=5e-6,
    memory_bytes=80 * 2**30,
    fused_kernels=True,
)

PRESETS: dict[str, Hardware] = {hw.name: hw for hw in (
    CPU_GLOO, A100_SELENE, V100_LASSEN, A100_PERLMUTTER, MI250X_FRONTIER, H100)}


def get_hardware(spec: "str | Hardware | None") -> Hardware:
    """Resolve ``spec``: None → ``"cpu-gloo"``; a :class:`Hardware` as is; a preset name;
    or the path of a JSON file written from :meth:`Hardware.to_json`."""
    if spec is None:
        return PRESETS["cpu-gloo"]
    if isinstance(spec, Hardware):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        key = os.fspath(spec)
        if key in PRESETS:
            return PRESETS[key]
        if os.path.isfile(key):
            with open(key) as f:
                try:
                    return Hardware.from_json(json.load(f))
                except (ValueError, TypeError) as e:
                    raise ValueError(f"hardware file {key!r}: {e}") from e
    raise ValueError(
        f"unknown hardware {spec!r}: expected one of the presets {sorted(PRESETS)} or the path of "
        f"a JSON file written by Hardware.to_json()")


__all__ = ["Hardware", "PRESETS", "get_hardware"]
