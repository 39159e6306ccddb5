"""autopar: a graph compiler that makes an ordinary PyTorch model train on many devices.

    pm = autopar.compile(model, mesh, example_inputs=(x,), loss_fn=loss_fn, example_target=y)
    loss = pm.step(x, target=y)
    print(pm.plan.explain())

See ``docs/architecture.md`` for the stages and ``docs/user_guide.md`` for the contract.
"""
from autopar import data
from autopar.api import ParallelModule, compile, plan, rank_graph
from autopar.trace.capture import CaptureError, capture
from autopar.cost.hardware import Hardware, get_hardware
from autopar.hf_config import plan_config
from autopar.planning.plan import Plan
from autopar.planning.strategy import PlanError, Strategy
from autopar.engine.checkpoint import CheckpointError, load_checkpoint
from autopar.engine.checkpoint_dir import resume, save_checkpoint, wait_checkpoints
from autopar.runtime.health import RankFailureError
from autopar.engine.pretrained import load_pretrained, save_pretrained
from autopar.strategies.registry import register_family

__all__ = ["compile", "plan", "plan_config", "data", "rank_graph", "ParallelModule", "Plan", "PlanError", "Strategy", "Hardware",
           "get_hardware", "capture", "CaptureError", "save_checkpoint", "load_checkpoint", "resume", "wait_checkpoints", "CheckpointError",
           "load_pretrained", "save_pretrained",
           "RankFailureError", "register_family"]
__version__ = "0.1.0"
