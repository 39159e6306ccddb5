"""The presets of :mod:`autopar.cost.hardware`, each with where its figures come from.

Datasheet figures are cited beside each; fitted figures name what they were fitted to
(docs/benchmarks.md "Published runs" lists the runs they are checked against, with the
rows kept out of every fit).
"""
from __future__ import annotations

import dataclasses

from autopar.cost.spec import Hardware

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

# DGX A100 80GB nodes of 8 elsewhere than Selene: the same GPU, links and GEMMs as
# A100_SELENE (the NCCL bus bandwidths and the matmul fit above), memory-bound kernels at
# the datasheet's HBM2e rate. A100_SELENE's memory efficiency 0.16 stands for what the
# captured Megatron GPT omits (dropout masks, fp32 softmax work); a model captured whole
# (an eager Llama's every norm, rotary and activation kernel) would pay it twice: on
# torchtitan's published A100 runs it predicts 0.72-0.80 of their throughput, this preset
# (docs/benchmarks.md, "Published runs").
A100 = dataclasses.replace(
    A100_SELENE, name="a100",
    description=(
        "DGX A100 80GB nodes of 8: 312 TFLOP/s fp16/bf16 peak, HBM2e 2039 GB/s, 80 GB (A100 datasheet); "
        "NVLink/NVSwitch 235 GB/s and 20 GB/s per GPU across nodes as NCCL bus bandwidth, matmul efficiency "
        "0.76 (a100-selene's figures: the same machine type); memory-bound kernels at the datasheet rate. "
        "Saturation, launch latency and α are estimates."),
    memory_efficiency=1.0)

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

# GEMM efficiency of the Hopper presets, measured rather than estimated: XLA's table of
# cuBLAS bf16 GEMM throughput on H100 SXM (sm_90) at 375 shapes, batch 1-4 and m, n, k of
# 256..4096 (openxla/xla, xla/service/gpu/model/matmul_interpolator_data.h; 4096^3: 783
# TFLOP/s, 2048^3: 632, 256 x 2048 x 256: 42), fitted to MATMUL_TIME's saturating rate
# R·f/(f + S) by least squares on relative error: R = 758 TFLOP/s (0.766 of the 989
# dense peak), S = 4.75 GFLOP, median error 6 % over the 375 shapes (19 % at the 90th
# percentile: the small-k shapes).
HOPPER_EFFICIENCY, HOPPER_SATURATION = 0.766, 4.75e9

# DGX H100-style nodes: H100 SXM5 80GB dense bf16 tensor peak 989 TFLOP/s (the
# datasheet's 1,979 is with 2:4 sparsity), HBM3 3.35 TB/s, NVLink 4 900 GB/s total per
# GPU = 450 GB/s per direction through NVSwitch (H100 datasheet); 8 x 400 Gb/s NDR
# InfiniBand (ConnectX-7) per node, one per GPU = 50 GB/s per GPU per direction (DGX H100
# datasheet). Matmul efficiency and saturation: the XLA fit above. Launch and α are
# estimates.
H100 = Hardware(
    name="h100",
    description=(
        "DGX H100-style nodes of 8 H100 SXM 80 GB: 989 TFLOP/s dense bf16 peak, HBM3 3.35 TB/s "
        "(H100 datasheet); NVLink 4 / NVSwitch 900 GB/s per GPU = 450 GB/s per direction; "
        "8 x 400 Gb/s NDR InfiniBand per node = 50 GB/s per GPU per direction (DGX H100 "
        "datasheet). Matmul efficiency 0.766 and saturation 4.75 GFLOP fitted to XLA's measured cuBLAS "
        "bf16 GEMM table for sm_90 (openxla/xla matmul_interpolator_data.h, 375 shapes, median error 6%). "
        "Launch latency and α are estimates."),
    peak_flops=989e12,
    matmul_efficiency=HOPPER_EFFICIENCY,
    saturation_flops=HOPPER_SATURATION,
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

# HGX H200 nodes of 8: the H100's GH100 die and clocks (989 TFLOP/s dense bf16, as
# torchtitan's get_peak_flops takes it) with 141 GB of HBM3e at 4.8 TB/s (H200
# datasheet); NVLink 4 / NVSwitch 450 GB/s per direction and one 400 Gb/s NIC per GPU as
# the H100 (H200 datasheet, HGX H200). The GEMMs are the same Tensor Cores: the Hopper fit.
H200 = dataclasses.replace(
    H100, name="h200",
    description=(
        "HGX H200 nodes of 8 H200 SXM 141 GB: 989 TFLOP/s dense bf16 peak (the H100's die), HBM3e 4.8 TB/s "
        "(H200 datasheet); NVLink 4 / NVSwitch 450 GB/s per direction; 400 Gb/s per GPU = 50 GB/s per "
        "direction. Matmul efficiency and saturation: the H100's fit to XLA's sm_90 GEMM table (same Tensor "
        "Cores). Launch latency and α are estimates."),
    memory_bandwidth=4800e9, memory_bytes=141 * 2**30)

# DGX B200 nodes of 8: 2.25 PFLOP/s dense bf16 per GPU (NVIDIA DGX B200 datasheet: 72
# PFLOP/s FP8 training per 8 GPUs with sparsity = 4.5 dense FP8 = 2.25 dense bf16; the same
# figure as torchtitan's get_peak_flops), HBM3e 8 TB/s, 180 GB usable per GPU (1,440 GB
# per node); NVLink 5 1.8 TB/s total per GPU = 900 GB/s per direction; 8 x 400 Gb/s
# ConnectX-7 per node = 50 GB/s per GPU (DGX B200 datasheet). No measured GEMM table was
# read for sm_100: the Hopper fit's fraction of peak is taken, its saturation scaled with
# the peak (a kernel fills the device at proportionally more FLOPs): estimates.
B200 = dataclasses.replace(
    H100, name="b200",
    description=(
        "DGX B200 nodes of 8 B200 180 GB: 2,250 TFLOP/s dense bf16 peak, HBM3e 8 TB/s (DGX B200 "
        "datasheet); NVLink 5 / NVSwitch 1.8 TB/s per GPU = 900 GB/s per direction; 8 x 400 Gb/s "
        "ConnectX-7 per node = 50 GB/s per GPU per direction. Matmul efficiency (0.766) and saturation "
        "(the Hopper fit's, scaled with the peak) are estimates by analogy with H100; launch latency and α "
        "are estimates."),
    peak_flops=2250e12, saturation_flops=HOPPER_SATURATION * 2250 / 989, memory_bandwidth=8000e9,
    intra_node_bandwidth=900e9, memory_bytes=180 * 2**30)

# Platforms of 8 AMD Instinct MI300X: 1,307.4 TFLOP/s dense bf16 and 192 GB HBM3 at 5.3
# TB/s per GPU (AMD MI300X datasheet); the 8 GPUs fully connected by Infinity Fabric, 7
# links of 64 GB/s per direction each = 448 GB/s per direction to all peers, 64 GB/s to
# any one (AMD's platform figure, not read from a datasheet here: an estimate); one
# 400 Gb/s NIC per GPU = 50 GB/s. Matmul
# efficiency 0.55 is an estimate (AMD's "max-achievable FLOPs" methodology puts
# hipBLASLt's best bf16 GEMMs well below the boost-clock peak; no per-shape table was
# read), saturation scaled with the peak as B200's; launch and α are estimates.
MI300X = dataclasses.replace(
    H100, name="mi300x",
    description=(
        "Platforms of 8 AMD Instinct MI300X 192 GB: 1,307.4 TFLOP/s dense bf16 peak, HBM3 5.3 TB/s (MI300X "
        "datasheet); Infinity Fabric 7 x 64 GB/s per direction = 448 GB/s to all peers; 400 Gb/s per GPU = "
        "50 GB/s per direction. The links, matmul efficiency (0.55), saturation, launch latency and α are "
        "estimates."),
    peak_flops=1307.4e12, matmul_efficiency=0.55, saturation_flops=HOPPER_SATURATION * 1307.4 / 989,
    memory_bandwidth=5300e9, kernel_launch_s=8e-6, intra_node_bandwidth=448e9, intra_node_latency_s=3e-6,
    inter_node_latency_s=6e-6, memory_bytes=192 * 2**30)

PRESETS: dict[str, Hardware] = {hw.name: hw for hw in (
    CPU_GLOO, A100_SELENE, A100, V100_LASSEN, A100_PERLMUTTER, MI250X_FRONTIER, H100, H200, B200, MI300X)}

__all__ = ["PRESETS", "CPU_GLOO", "A100_SELENE", "A100", "V100_LASSEN", "A100_PERLMUTTER", "MI250X_FRONTIER", "H100", "H200", "B200", "MI300X"]
