"""Capture: turn a user's ``nn.Module`` (and optionally its loss) into an ``fx.GraphModule``.

``torch.fx.symbolic_trace`` is tried first: it keeps ``nn.Linear`` and friends as
``call_module`` nodes and the source-level spelling of views, which makes the rank
graphs easy to read. When it fails (Hugging Face models use control flow on shapes),
``torch.export.export(strict=False)`` is used; it yields an ATen-level graph. Both
results carry :data:`autopar.ir.SPEC` on every node, written by :func:`propagate_specs`.

Example::

    >>> gm = capture(nn.Sequential(nn.Linear(4, 8), nn.ReLU()), (torch.randn(2, 4),))
    >>> [str(n.meta[SPEC]) for n in gm.graph.nodes if n.op != "output"]
    ['float32[2, 4]', 'float32[2, 8]', 'float32[2, 8]']

When a loss function is given the graph computes ``loss_fn(model(*inputs), target)``
so the planner sees the loss (e.g. cross-entropy, which Megatron makes vocab-parallel).
"""
from __future__ import annotations

import contextlib
import linecache
import logging
import traceback
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.ir import CAPTURE, SPEC, CaptureInfo, spec_from_value
from autopar.standard_layers import mha_fast_path_disabled
from autopar.standard_layers import symbolic_trace as symbolic_trace_standard_layers

log = logging.getLogger("autopar.capture")


class CaptureError(RuntimeError):
    """Neither tracer could capture the model; the message names the construct."""


MODEL_PREFIX = "model."
"""Parameter names in captured graphs are the user's names behind this prefix."""


def wrap_model(model: nn.Module, loss_fn: Callable | None, n_inputs: int) -> nn.Module:
    """A module holding ``model`` as ``.model`` whose forward is ``model(input_0, ...)``,
    or ``loss_fn(model(input_0, ...), target)`` when a loss is given.

    Both the forward-only and the training graph are captured through this wrapper so
    their parameters have the same qualified names (``model.<user name>``) and the rank
    programs built from them can share one module tree. The forward has an explicit
    signature (no ``*args``) because symbolic tracing makes one placeholder per name.
    """
    names = [f"input_{i}" for i in range(n_inputs)]
    call = f"self.model({', '.join(names)})"
    if loss_fn is not None:
        src = f"def forward(self, {', '.join(names + ['target'])}):\n    return self.loss_fn({call}, target)\n"
    else:
        src = f"def forward(self, {', '.join(names)}):\n    return {call}\n"
    scope: dict[str, Any] = {}
    exec(compile(src, "<autopar wrapper>", "exec"), scope)

    class Wrapped(nn.Module):
        forward = scope["forward"]

        def __init__(self):
            super().__init__()
            self.model = model
            self.loss_fn = loss_fn

    Wrapped.__name__ = "ModelWithLoss" if loss_fn is not None else "ModelOnly"
    return Wrapped()


def capture(
    model: nn.Module,
    example_inputs: Sequence[Any],
    loss_fn: Callable | None = None,
    example_target: Any = None,
    *,
    tracer: str = "auto",
) -> fx.GraphModule:
    """Capture ``model`` (with ``loss_fn`` when given) at the shapes of the examples.

    ``tracer`` is ``"auto"`` (symbolic trace, then export), ``"symbolic_trace"`` or
    ``"export"``. Raises :class:`CaptureError` naming the model class and the construct
    each tracer stopped at. The model's buffers are left as they were: capturing runs
    the model, and a batch norm in training mode would otherwise count the run and move
    its running statistics. A Hugging Face model is captured with its generation cache
    off (:func:`no_generation_cache`).
    """
    saved = {name: b.detach().clone() for name, b in model.named_buffers() if b.device.type != "meta"}
    try:
        with no_generation_cache(model):
            return _capture(model, tuple(example_inputs), loss_fn, example_target, tracer)
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in saved:
                    b.copy_(saved[name])


@contextlib.contextmanager
def no_generation_cache(model: nn.Module):
    """Set ``config.use_cache = False`` on every Hugging Face (sub)model of ``model`` while
    capturing, and restore it after.

    ``use_cache`` (on by default in causal LMs) makes the forward build the key/value cache
    of generation: a ``DynamicCache`` object in the output, which ``torch.export`` cannot
    return, and cache updates after every key and value projection, which hide the
    attention pattern from analysis (Qwen2, OPT and GPT-NeoX had no attention region and
    no blocks). Training never reads the cache, so the rank programs are built without it
    and their outputs hold ``past_key_values=None``.
    """
    changed = []
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", False) is True and all(config is not c for c in changed):
            config.use_cache = False
            changed.append(config)
    if changed:
        log.info("capturing %s with config.use_cache=False: training builds no generation cache",
                 type(model).__name__)
    try:
        yield
    finally:
        for config in changed:
            config.use_cache = True


def _capture(model, example_inputs: tuple, loss_fn, example_target, tracer: str) -> fx.GraphModule:
    with_loss = loss_fn is not None
    if with_loss and example_target is None:
        raise ValueError("capture: a loss_fn was given without example_target; pass the target tensor "
                         "the loss is computed against")
    root = wrap_model(model, loss_fn, len(example_inputs))
    args = example_inputs + ((example_target,) if with_loss else ())
    model_class = type(model).__name__

    fx_error: BaseException | None = None
    if tracer in ("auto", "symbolic_trace"):
        try:
            gm = symbolic_trace_standard_layers(root)
            propagate_specs(gm, args)
            gm.meta[CAPTURE] = CaptureInfo("symbolic_trace", model_class, _placeholder_names(gm), with_loss)
            return gm
        except Exception as e:  # noqa: BLE001 - any tracer failure means: try the next one
            fx_error = e
            log.info("symbolic_trace failed for %s (%s); trying torch.export", model_class, _one_line(e))
            if tracer == "symbolic_trace":
                raise CaptureError(_failure_message(model_class, fx_error, None)) from e
    try:
        gm = _export(root, args)
    except Exception as e:  # noqa: BLE001
        raise CaptureError(_failure_message(model_class, fx_error, e)) from e
    gm.meta[CAPTURE] = CaptureInfo("export", model_class, _placeholder_names(gm), with_loss,
                                   None if fx_error is None else _one_line(fx_error))
    return gm


_EXPORT_NOISE = {torch.ops.aten._assert_tensor_metadata.default}


def _export(root: nn.Module, args: tuple) -> fx.GraphModule:
    with mha_fast_path_disabled():  # the slow path's ATen ops are what analysis reads
        ep = torch.export.export(root, args, strict=False)
    gm = ep.module()
    # The unlifted module checks input shapes with a guard submodule and asserts dtypes
    # with side-effect-only nodes; neither carries a tensor, and rank programs are
    # captured at their own shapes, so they are dropped to keep rank graphs readable.
    for node in list(gm.graph.nodes):
        if not node.users and (node.target in _EXPORT_NOISE or
                               (node.op == "call_module" and node.target == "_guards_fn")):
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    propagate_specs(gm, args)
    return gm


def _placeholder_names(gm: fx.GraphModule) -> tuple[str, ...]:
    return tuple(n.name for n in gm.graph.nodes if n.op == "placeholder")


class _SpecRecorder(fx.Interpreter):
    """Runs the graph once and records each node's output spec under ``SPEC``."""

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if n.op != "output":
            n.meta[SPEC] = spec_from_value(result)
        return result


def propagate_specs(gm: fx.GraphModule, args: Sequence[Any]) -> fx.GraphModule:
    """Write ``SPEC`` (shape, dtype) on every node by running ``gm`` on ``args``.

    Runs under ``torch.no_grad`` on the given tensors; parameters on the meta device
    give meta results, so a model built on the meta device costs no memory here.
    """
    with torch.no_grad():
        _SpecRecorder(gm).run(*args)
    return gm


# ---------------------------------------------------------------- error messages


def _user_frame(exc: BaseException | None) -> str | None:
    """The innermost traceback frame outside torch and autopar: the construct that failed."""
    if exc is None:
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    chosen = None
    for fr in frames:
        f = fr.filename.replace("\\", "/")
        if "/torch/" in f or "/autopar/" in f or f.startswith("<"):
            continue
        chosen = fr
    if chosen is None:
        return None
    line = (chosen.line or linecache.getline(chosen.filename, chosen.lineno)).strip()
    return f"{chosen.filename}:{chosen.lineno} in {chosen.name}: `{line}`"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first[:300]}"


def _failure_message(model_class: str, fx_error: BaseException | None, export_error: BaseException | None) -> str:
    parts = [f"autopar could not capture model {model_class}."]
    if fx_error is not None:
        where = _user_frame(fx_error)
        parts.append(f"  torch.fx.symbolic_trace failed: {_one_line(fx_error)}"
                     + (f"\n    at {where}" if where else ""))
    if export_error is not None:
        where = _user_frame(export_error)
        parts.append(f"  torch.export(strict=False) failed: {_one_line(export_error)}"
                     + (f"\n    at {where}" if where else ""))
    parts.append("  What to do: make the construct above traceable (no Python control flow on tensor "
                 "values, no data-dependent shapes, no untraceable calls such as .item() or print of a "
                 "tensor), or move it outside the model's forward.")
    if export_error is not None and "expert" in (_user_frame(export_error) or ""):
        parts.append("  Mixture-of-experts layers loop over the experts a batch routes to (a data-dependent "
                     "loop). For Hugging Face models use experts_implementation=\"grouped_mm\" (the default) or "
                     "\"batched_mm\": their routing is computed in the captured graph, for any input.")
    return "\n".join(parts)


__all__ = ["capture", "propagate_specs", "CaptureError"]
