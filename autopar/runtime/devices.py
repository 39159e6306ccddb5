"""Where the tensors autopar makes at run time live.

Every tensor a rank's runtime creates (a pipeline's receive buffers, D&SP-cSub's
placeholders and shared scalars, the loss a sub-grid receives, ZeRO's refresh flag,
``grad_norm``'s partial sums) lives on the device of the values it serves. Where such a
value is at hand the tensor follows it (``torch.empty_like(x)``, ``device=x.device``);
where none is (a receive buffer, a stand-in for a value another rank computes) it goes
on the *rank's device*, the device of the rank's parameters (:func:`rank_device`), which
:func:`use_device` makes current while the rank's programs run (``RankState.running``
enters it) and :func:`current` reads. Never the default device: a user who called
``torch.set_default_device`` does not move autopar's buffers, and the CPU guard test
(``tests/runtime/test_devices.py``) runs every family's step under a default device that is not
the tensors' (``meta``) to show that nothing reads it, and checks the source statically.

The wire: NCCL communicates tensors on the rank's GPU. Gloo communicates CPU tensors;
its collectives (all-reduce, broadcast, all-gather, gather, scatter, reduce, all-to-all)
also take CUDA tensors through host copies, but its point-to-point ``send``/``recv`` hand
the tensor's data pointer to the TCP transport as host memory (ProcessGroupGloo.cpp,
``ProcessGroupGloo::send``), so :func:`wire_device` puts point-to-point buffers on the
CPU under gloo (one GPU shared by several local ranks, which NCCL refuses).
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map_only

from autopar.runtime._swap import SwapGlobal

CPU = torch.device("cpu")
_DEVICE: torch.device = CPU  # the rank's device while its programs run (use_device); the CPU outside


def rank_device(params: Iterable[torch.Tensor], inputs: Iterable = ()) -> torch.device:
    """The device a rank's programs run on: its first parameter's that holds elements
    (a pipeline rank holds empty stand-ins of other stages' parameters), else the first
    tensor input's, else the CPU. A meta parameter (a model planned without weights)
    does not run, so it does not decide."""
    for p in params:
        if p.numel() and p.device.type != "meta":
            return p.device
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.device.type != "meta":
            return x.device
    return CPU


class use_device(SwapGlobal):
    """Make ``device`` the rank's device for the runtime's buffers while the block runs
    (nested blocks restore the outer one's).

    A swap of one module global, as ``groups.use_groups`` and ``rng.use_random_states``,
    not a ``contextlib.contextmanager`` generator: ``RankState.running`` enters it around
    every step, where a generator's frame and a ``torch.device`` built again on each
    entry cost more than the swap itself."""

    __slots__ = ()

    def __init__(self, device: torch.device):
        super().__init__(globals(), "_DEVICE", device if type(device) is torch.device else torch.device(device))


def current() -> torch.device:
    """The rank's device while its programs run (:func:`use_device`); the CPU outside."""
    return _DEVICE


def wire_device(device: torch.device, group=None) -> torch.device:
    """The device a point-to-point buffer for values on ``device`` must be on over
    ``group``'s backend: ``device`` itself under NCCL (or any backend but gloo), the CPU
    under gloo (its send/recv read host memory)."""
    if device.type == "cpu":
        return device
    backend = dist.get_backend(group) if dist.is_initialized() else "gloo"
    return CPU if str(backend) == "gloo" else device


def to_rank_device(value, device: torch.device):
    """``value`` (outputs of any structure) with its tensors on ``device``: what
    ``broadcast_object_list`` hands a rank is unpickled on the sender's device (another GPU
    index under NCCL)."""
    return tree_map_only(torch.Tensor, lambda x: x.to(device), value)


def check_backend_device(device: torch.device, group=None) -> None:
    """Refuse, with what to do, a rank whose values are on the CPU under NCCL (NCCL
    communicates GPU tensors only)."""
    if not dist.is_initialized():
        return
    if str(dist.get_backend(group)) == "nccl" and device.type != "cuda":
        raise ValueError(
            f"autopar: the model's parameters are on {device}, but the process group's backend is NCCL, which "
            f"communicates CUDA tensors only; move the model and inputs to this rank's GPU "
            f"(model.to(f'cuda:{{local_rank}}')) or initialise the process group with backend='gloo'")


__all__ = ["CPU", "check_backend_device", "current", "rank_device", "to_rank_device", "use_device", "wire_device"]
