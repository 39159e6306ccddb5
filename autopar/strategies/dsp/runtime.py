"""D&SP on a rank at run time (:class:`~autopar.runtime.family_runtime.RankRuntime`).

Under D&SP-cSub the common layers run on sub-grid 0 only (SUPER §III-C): the ranks off
it run a program of their branches alone (``partial``), which takes no inputs, and get
the call's outputs and the step's loss from sub-grid 0 over their segment group. In a
mixed plan whose D&SP regions run on sub-grids of the tensor group, a rank's program
splits only its own sub-grid's branches: the others' parameters are not its to split."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from autopar.grid import MeshAxis
from autopar.ir import ROOT_OUTPUT, TensorSpec
from autopar.runtime import devices
from autopar.runtime.family_runtime import RankRuntime
from autopar.runtime.groups import get_group


class DspRankRuntime(RankRuntime):
    """Active under D&SP-cSub or a mixed plan's sub-grids of the tensor group."""

    name = "dsp"

    def __init__(self, plan, rank: int, region_strategy: str):
        self.plan, self.csub = plan, plan.csub
        self.active = plan.csub or bool(plan.tensor_subgrids)
        self.partial = plan.partial_rank(rank)
        self.region_strategy = region_strategy

    def absent_shards(self) -> set[str]:
        if not self.plan.tensor_subgrids:
            return set()
        return {name for d in self.plan.region_details(self.region_strategy).values()
                for names in d["branch_params"] for name in names}

    def outputs(self, state, value: Any) -> Any:
        """cSub: sub-grid 0's ``value`` on every rank of its segment (outputs of any
        structure; a forward-only path, so the pickling of ``broadcast_object_list`` is fine)."""
        segment = get_group(MeshAxis.SEGMENT) if self.csub else None
        if segment is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, group=segment, group_src=0)
        return devices.to_rank_device(box[0], state.device)   # unpickled on the sender's device

    def loss(self, state, program, loss: torch.Tensor | None) -> torch.Tensor | None:
        """cSub: the whole batch's loss, computed on sub-grid 0, sent over the segment."""
        segment = get_group(MeshAxis.SEGMENT) if self.csub else None
        if segment is None:
            return loss
        if loss is None:
            spec = program.meta[ROOT_OUTPUT]
            if not isinstance(spec, TensorSpec):
                raise RuntimeError(f"D&SP-cSub: the loss function returns {spec!r}, not one tensor; step() "
                                   f"needs a tensor loss to send to the other sub-grids")
            loss = torch.empty(spec.shape, dtype=spec.dtype, device=devices.current())
        dist.broadcast(loss, group=segment, group_src=0)
        return loss
