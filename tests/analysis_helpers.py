"""Shared by the analysis-pass tests: capture, run one pass, check it wrote only metadata."""
import json

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.trace.capture import capture
from autopar.ir import regions


def run_analysis_pass(pass_fn, kind: str, model: nn.Module, *inputs: torch.Tensor,
                      tracer: str = "auto") -> fx.GraphModule:
    """Capture ``model``, run ``pass_fn``, and check the graph is unchanged, still lints,
    and every region of ``kind`` it wrote is JSON-serialisable."""
    gm = capture(model, inputs, tracer=tracer)
    code = gm.code
    gm = pass_fn(gm)
    gm.graph.lint()
    assert gm.code == code, "an analysis pass must not change the graph"
    for region in regions(gm, kind):
        json.dumps(region.to_json())
    return gm
