"""Hardware descriptions: the numbers the cost model turns work and bytes into seconds with.

A :class:`Hardware` gives per-device compute rates, memory bandwidth, kernel launch
latency, and the α-β parameters of the links inside and between nodes. The presets:

* ``"cpu-gloo"``: measured on the 2-core development machine (the default);
* ``"a100-selene"``: DGX A100 80 GB nodes of 8, the machine of Megatron PTD-P (§5);
* ``"a100"``: the same nodes elsewhere, memory-bound kernels at the datasheet rate;
* ``"v100-lassen"``: LLNL Lassen, 4 V100 16 GB per node, the machine of SUPER (§VI-A);
* ``"a100-perlmutter"``: NERSC Perlmutter, 4 A100 40 GB per node (AxoNN §VI);
* ``"mi250x-frontier"``: OLCF Frontier, 4 MI250X = 8 GCDs per node, a GCD per device (AxoNN §VI);
* ``"h100"``: DGX H100-style nodes of 8 H100 SXM 80 GB (NVIDIA datasheets; GEMMs fitted to
  XLA's measured sm_90 table);
* ``"h200"``: HGX H200 nodes of 8 H200 141 GB (the H100's compute, more and faster memory);
* ``"b200"``: DGX B200 nodes of 8 B200 180 GB;
* ``"mi300x"``: platforms of 8 AMD Instinct MI300X 192 GB.

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

import json
import os

from autopar.cost.spec import Hardware
from autopar.cost.presets import PRESETS


def get_hardware(spec: "str | Hardware | None") -> Hardware:
    """Resolve ``spec``: None → ``"cpu-gloo"``; a :class:`Hardware` as is; a preset name;
    or the path of a JSON file written from :meth:`Hardware.to_json` (a cached profile of
    :mod:`autopar.cost.profiles`, which wraps one with the machine's facts, is read too)."""
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
                    data = json.load(f)
                    if isinstance(data, dict) and isinstance(data.get("hardware"), dict) and "machine" in data:
                        data = data["hardware"]  # a cached profile: the Hardware it wraps
                    return Hardware.from_json(data)
                except (ValueError, TypeError) as e:
                    raise ValueError(f"hardware file {key!r}: {e}") from e
    raise ValueError(
        f"unknown hardware {spec!r}: expected one of the presets {sorted(PRESETS)} or the path of "
        f"a JSON file written by Hardware.to_json()")


__all__ = ["Hardware", "PRESETS", "get_hardware"]
