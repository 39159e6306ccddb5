"""The registry of named process groups that rewritten graphs refer to.

A rank's rewritten graph never holds a ``ProcessGroup`` object; it names the group it
communicates over, so its generated code reads like the paper::

    reduce_from_tensor_region = autopar_runtime_collectives_reduce_from_tensor_region(linear_1, 'tensor')

The names (``"data"``, ``"tensor"``, ``"pipeline"``, ...) are the mesh dimension names
chosen by the planner; :func:`groups_from_mesh` turns a ``DeviceMesh`` into the mapping.

The registry is one module-level dict because the common case is one compiled program
per process. Two ``ParallelModule`` s in one process each install their own mapping
around their call with :func:`use_groups`. A collective looks its group up when its
*forward* runs and keeps the ``ProcessGroup`` for its backward, so a backward that runs
after the ``use_groups`` block has exited still talks to the right group.

``None`` in the mapping stands for a group of size 1: every collective over it is the
identity, so a single-rank program needs no process group at all.
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch.distributed as dist
from torch.distributed import ProcessGroup

from autopar.runtime._swap import SwapGlobal

_GROUPS: dict[str, Optional[ProcessGroup]] = {}


def set_groups(mapping: Mapping[str, Optional[ProcessGroup]]) -> None:
    """Replace the registry with ``mapping`` (name -> group; ``None`` means size 1)."""
    global _GROUPS
    _GROUPS = dict(mapping)


def clear_groups() -> None:
    """Empty the registry."""
    global _GROUPS
    _GROUPS = {}


def registered_groups() -> dict[str, Optional[ProcessGroup]]:
    """A copy of the current registry."""
    return dict(_GROUPS)


class use_groups(SwapGlobal):
    """Install ``mapping`` as the registry for the duration of the block, then restore it."""

    __slots__ = ()

    def __init__(self, mapping: Mapping[str, Optional[ProcessGroup]]):
        super().__init__(globals(), "_GROUPS", mapping if isinstance(mapping, dict) else dict(mapping))

def get_group(name: str) -> Optional[ProcessGroup]:
    """The process group registered under ``name`` (``None``: a group of size 1).

    Raises ``KeyError`` for an unregistered name rather than guessing a size, because a
    wrong guess on a multi-rank run gives silently wrong numerics.
    """
    try:
        return _GROUPS[name]
    except KeyError:
        known = ", ".join(repr(n) for n in _GROUPS) or "none"
        raise KeyError(
            f"no process group named {name!r} is registered (registered: {known}); "
            "install one with autopar.runtime.set_groups({...}) or use_groups({...}), "
            "e.g. set_groups(groups_from_mesh(mesh))"
        ) from None


def size_of(group: Optional[ProcessGroup]) -> int:
    """Number of ranks in ``group``; ``None`` counts as 1."""
    return 1 if group is None else dist.get_world_size(group)


def rank_in(group: Optional[ProcessGroup]) -> int:
    """This process's rank inside ``group``; ``None`` counts as rank 0."""
    return 0 if group is None else dist.get_rank(group)


def group_size(name: str) -> int:
    """Number of ranks in the group named ``name``."""
    return size_of(get_group(name))


def group_rank(name: str) -> int:
    """This process's rank inside the group named ``name``."""
    return rank_in(get_group(name))


def tied_group_name(positions) -> str:
    """The name of the group of the pipeline positions that share a weight (``tied:0,3``)."""
    return "tied:" + ",".join(str(k) for k in sorted(positions))


def groups_from_mesh(mesh) -> dict[str, ProcessGroup]:
    """Map each dimension name of a ``DeviceMesh`` to its process group.

    Example: ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "tensor"))`` gives
    ``{"data": <group of 2>, "tensor": <group of 2>}``.
    """
    names = mesh.mesh_dim_names
    if not names:
        raise ValueError(
            "groups_from_mesh needs a mesh with mesh_dim_names, e.g. "
            "init_device_mesh('cpu', (2, 2), mesh_dim_names=('data', 'tensor'))"
        )
    return {name: mesh.get_group(name) for name in names}
