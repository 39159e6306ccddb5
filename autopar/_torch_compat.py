"""The private torch APIs autopar relies on, in one place so a torch upgrade touches one file.

* ATen operator overloads (``torch.ops.aten.addmm.default``) are ``torch._ops.OpOverload``
  objects; their ``_schema`` names arguments and says which returns alias inputs.
* The local launcher hosts the rendezvous store in the parent process and tells the
  ranks so with torchrun's ``TORCHELASTIC_USE_AGENT_STORE`` contract.
"""
from __future__ import annotations

import torch

OpOverload = torch._ops.OpOverload

AGENT_STORE_ENV = {"TORCHELASTIC_USE_AGENT_STORE": "True"}
"""Environment telling ``init_process_group`` that the store at MASTER_ADDR:PORT is hosted
by the launching process (as torchrun's agent does), so ranks connect as clients."""


def is_aten_op(target) -> bool:
    return isinstance(target, OpOverload)


def schema_of(target):
    """The operator schema of an ATen overload, or None for anything else."""
    return target._schema if isinstance(target, OpOverload) else None


def argument_names(target) -> list[str]:
    schema = schema_of(target)
    return [a.name for a in schema.arguments] if schema is not None else []


def aten_name(target) -> str:
    """``aten.addmm`` for ``torch.ops.aten.addmm.default``."""
    return f"aten.{target._schema.name.split('::')[-1]}"


def _flat_collectives():
    """``(all_gather, reduce_scatter)`` of flat tensors into/out of one buffer:
    ``all_gather_single``/``reduce_scatter_single`` where torch has them (2.13 deprecates
    the ``*_tensor`` names), else the older names."""
    import torch.distributed as dist
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor,
            getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)


all_gather_flat, reduce_scatter_flat = _flat_collectives()
