"""Hardware descriptions: the numbers the cost model turns work and bytes into seconds with.

A :class:`Hardware` gives per-device compute rates, memory bandwidth, kernel launch
latency, and the α-β parameters of the links inside and between nodes. Two presets
ship here: ``"cpu-gloo"`` (measured on the 2-core development machine) and
``"a100-selene"`` (the machine of the Megatron PTD-P paper). Any other machine is a JSON
file written by :meth:`Hardware.to_json`::

    >>> hw = get_hardware("a100-selene")
    >>> hw.peak_flops, hw.devices_per_node, hw.inter_node_bandwidth
    (312000000000000.0, 8, 25000000000.0)
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
    # placement model of cost.group_link for that collective and group size.
    measured: dict = field(default_factory=dict, hash=False)

    def link(self, collective: str, group_size: int) -> "tuple[float, float] | None":
        """The calibrated (β, α) of ``collective`` over ``group_size`` ranks, or None."""
        fit = self.measured.get(collective, {}).get(str(group_size))
        return None if fit is None else (float(fit[1]), float(fit[0]))

    def to_json(self) -> dict[str, Any]:
        """A plain dict (JSON-serialisable) with one entry per field."""
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Hardware":
        """Inverse of :meth:`to_json`; names missing or unknown fields in the error."""
        names = [f.name for f in dataclasses.fields(Hardware)]
        missing = [n for n in names if n not in d and n != "measured"]
        unknown = sorted(set(d) - set(names))
        if missing or unknown:
            raise ValueError(
                f"not a Hardware description: missing fields {missing}, unknown fields {unknown}; "
                f"write one with Hardware.to_json() (fields: {', '.join(names)})")
        values = {}
        for f in dataclasses.fields(Hardware):
            if f.name == "measured":
                values[f.name] = {str(c): {str(g): [float(a), float(b)] for g, (a, b) in fits.items()}
                                  for c, fits in d.get("measured", {}).items()}
                continue
            v = d[f.name]
            values[f.name] = str(v) if f.type == "str" else int(v) if f.type == "int" else float(v)
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
# of an A100 GPU with 16-bit precision is 312 teraFLOP/s." NVLink 3 gives 600 GB/s total
# per GPU (A100 datasheet), i.e. 300 GB/s per direction; one 200 Gb/s HCA per GPU gives
# 25 GB/s per direction. Memory bandwidth 2039 GB/s is the A100 80GB SXM datasheet figure.
# Efficiency, saturation, launch and α are estimates (cuBLAS fp16 GEMMs reach ~250 TFLOP/s
# when large and about half that near 2 GFLOP; NCCL ring steps cost a few µs).
A100_SELENE = Hardware(
    name="a100-selene",
    description=(
        "DGX A100 80GB nodes of 8 GPUs as on Selene (Megatron PTD-P §5): 312 TFLOP/s fp16 peak; "
        "NVLink/NVSwitch 600 GB/s per GPU = 300 GB/s per direction; 8 x 200 Gb/s HDR InfiniBand "
        "HCAs per node = 25 GB/s per GPU per direction; HBM2e 2039 GB/s, 80 GB (A100 datasheet). "
        "Matmul efficiency, saturation, launch latency and α are estimates, not measurements."),
    peak_flops=312e12,
    matmul_efficiency=0.8,
    saturation_flops=2e9,
    memory_bandwidth=2039e9,
    kernel_launch_s=5e-6,
    devices_per_node=8,
    intra_node_bandwidth=300e9,
    inter_node_bandwidth=25e9,
    intra_node_latency_s=2e-6,
    inter_node_latency_s=5e-6,
    memory_bytes=80 * 2**30,
)

PRESETS: dict[str, Hardware] = {hw.name: hw for hw in (CPU_GLOO, A100_SELENE)}


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
