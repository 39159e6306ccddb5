"""Generated kernels: the fusion IR (:mod:`.chain`), Triton source generation
(:mod:`.codegen`), hand-written device helpers (:mod:`.triton_helpers`) and launching
through autograd (:mod:`.launch`). The pass that finds chains in a rank graph is
:mod:`autopar.passes.fusion.rewrite`. Triton is optional: imported only to run a kernel."""
from __future__ import annotations

import importlib.util
import logging
import os

import torch

log = logging.getLogger("autopar.fusion")


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``: on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_fusion(requested: bool | None, device: torch.device) -> bool:
    """Whether compiled programs fuse: ``requested`` None means on for CUDA when Triton is
    installed, off elsewhere; True forces it (on the CPU only under Triton's interpreter);
    False turns it off."""
    if requested is False:
        return False
    if importlib.util.find_spec("triton") is None:
        if requested:
            raise ImportError("fusion=True needs Triton: pip install 'autopar[triton]' (or pip install triton)")
        log.info("fusion off: Triton is not installed")
        return False
    if device.type == "cuda":
        return True
    if requested:
        if not interpreting():
            raise ValueError(f"fusion=True with the model on {device}: generated Triton kernels run on CPU tensors "
                             f"only in Triton's interpreter; start Python with TRITON_INTERPRET=1, or leave "
                             f"fusion=None (on for CUDA, off elsewhere)")
        return True
    log.info("fusion off: the model is on %s (generated kernels are for CUDA; fusion=True forces them under "
             "TRITON_INTERPRET=1)", device)
    return False
