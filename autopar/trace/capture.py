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

Keyword inputs (``model(input_ids=..., attention_mask=..., labels=...)``, as Hugging
Face models are called) are laid out by :class:`Keywords`: each tensor becomes a graph
input after the positional ones, named after its keyword, in the example's key order;
every other value (``use_cache=False``, ``None``, an int) is a constant of the capture.
A model that computes its own loss (``labels=``) is captured with ``model_loss``: the
graph returns the loss its output carries (:func:`output_loss`) instead of the output.
"""
from __future__ import annotations

import contextlib
import dataclasses
import keyword
import linecache
import logging
import traceback
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.trace.memo import EXPORTS, CaptureCall
from autopar.trace.exporting import export, unlifted
from autopar.trace.meta import ShapesOnly, check_no_fake_constants, examples_device, holds_meta
from autopar.trace.specs import propagate_specs
from autopar.timing import phase
from autopar.ir import CAPTURE, SPEC, CaptureInfo, TensorSpec
from autopar.trace.standard_layers import symbolic_trace as symbolic_trace_standard_layers

log = logging.getLogger("autopar.capture")


class CaptureError(RuntimeError):
    """Neither tracer could capture the model; the message names the construct."""


MODEL_PREFIX = "model."
"""Parameter names in captured graphs are the user's names behind this prefix."""


def layout_name(root_name: str) -> str:
    """A parameter's name in the layout: the original model's (the wrapper's prefix off)."""
    return root_name[len(MODEL_PREFIX):] if root_name.startswith(MODEL_PREFIX) else root_name


@dataclasses.dataclass(frozen=True)
class Keywords:
    """How a model's keyword arguments enter its graph, fixed by the example's.

    ``tensors``: the keywords whose values are tensors, in the example's order; each is a
    graph input after the positional ones, named ``parameters[i]`` in the wrapper
    (the keyword itself unless that clashes with the wrapper's own names).
    ``constants``: ``(keyword, value)`` for every other value, passed as is and baked into
    the capture (a call must give the same values)."""

    tensors: tuple[str, ...] = ()
    constants: tuple[tuple[str, Any], ...] = ()
    parameters: tuple[str, ...] = ()

    @staticmethod
    def of(example_kwargs: Mapping[str, Any] | None, n_positional: int = 0) -> "Keywords":
        if not example_kwargs:
            return Keywords()
        tensors, constants = [], []
        for name, value in example_kwargs.items():
            if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
                raise ValueError(f"example_kwargs: {name!r} is not a Python identifier; keyword inputs are passed "
                                 f"to the model as model(..., name=value)")
            if isinstance(value, torch.Tensor):
                tensors.append(name)
            elif _holds_tensor(value):
                raise ValueError(f"keyword input {name}: a {type(value).__name__} holding tensors; autopar takes "
                                 f"tensors and constants (bool, int, float, str, None) as keyword inputs. Pass each "
                                 f"tensor as a keyword of its own")
            else:
                constants.append((name, value))
        taken = {"self", "target", *(f"input_{i}" for i in range(n_positional))}
        parameters = tuple(name if name not in taken else f"kw_{name}" for name in tensors)
        return Keywords(tuple(tensors), tuple(constants), parameters)

    @property
    def names(self) -> tuple[str, ...]:
        """Every keyword of the example, tensors first."""
        return self.tensors + tuple(name for name, _ in self.constants)


def _holds_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple, set)):
        return any(_holds_tensor(v) for v in value)
    return False


class ModelLossError(ValueError):
    """The model was to provide its own loss (no ``loss_fn``) and its output carries none."""


def output_loss(output: Any, required: bool) -> tuple[Any, bool]:
    """``(loss, True)`` when the model's ``output`` carries its own loss: a Hugging Face
    ``ModelOutput`` or a dict with a ``"loss"`` that is not None, or a tensor (which must
    be a scalar: checked on the captured graph), or a tuple or list holding exactly one
    scalar floating-point tensor, wherever it stands (nanoGPT's and minGPT's
    ``(logits, loss)``, Hugging Face's ``(loss, logits, ...)`` of ``return_dict=False``;
    read on the captured graph when symbolic tracing gives proxies, see
    :func:`_returns_loss`). Otherwise ``(output, False)``, or, when ``required``,
    :class:`ModelLossError` naming what the output holds."""
    if isinstance(output, Mapping):
        loss = output.get("loss")
        if loss is not None:
            return loss, True
        if required:
            raise ModelLossError(f"the model's output ({type(output).__name__} with {sorted(output.keys())}) carries "
                                 f"no loss; pass the labels keyword the model computes its loss from (labels=...), "
                                 f"or give compile a loss_fn and example_target")
        return output, False
    if isinstance(output, (torch.Tensor, fx.Proxy)):
        return output, True
    if isinstance(output, (tuple, list)):
        if any(isinstance(v, fx.Proxy) for v in output):
            return output, True
        scalars = [i for i, v in enumerate(output)
                   if isinstance(v, torch.Tensor) and v.dim() == 0 and v.is_floating_point()]
        if len(scalars) == 1:
            _tuple_loss_taken(output, scalars[0])
            return output[scalars[0]], True
    if required:
        raise ModelLossError(f"the model returns a {type(output).__name__}, which carries no loss autopar can read (a "
                             f"ModelOutput or dict with 'loss', a scalar tensor, or a tuple holding one scalar tensor, "
                             f"as (logits, loss)); give compile a loss_fn and example_target")
    return output, False


def wrap_model(model: nn.Module, loss_fn: Callable | None, n_inputs: int, keywords: Keywords | None = None,
               model_loss: str | None = None) -> nn.Module:
    """A module holding ``model`` as ``.model`` whose forward is
    ``model(input_0, ..., **keyword inputs)``, or ``loss_fn(model(...), target)`` when a
    loss is given, or, with ``model_loss`` ``"required"`` or ``"if_present"``, the loss
    the model's output carries (:func:`output_loss`; ``if_present`` returns the output
    unchanged when it has none, and sets ``.loss_found``).

    Both the forward-only and the training graph are captured through this wrapper so
    their parameters have the same qualified names (``model.<user name>``) and the rank
    programs built from them can share one module tree. The forward has an explicit
    signature (no ``*args``) because symbolic tracing makes one placeholder per name:
    ``forward(self, input_0, ..., <keyword tensors>, [target])``.
    """
    keywords = keywords or Keywords()
    names = [f"input_{i}" for i in range(n_inputs)]
    passed = names + [f"{k}={p}" for k, p in zip(keywords.tensors, keywords.parameters)]
    call = f"self.model({', '.join(passed + ['**self.constant_kwargs'])})"
    parameters = names + list(keywords.parameters)
    if loss_fn is not None:
        src = f"def forward(self, {', '.join(parameters + ['target'])}):\n    return self.loss_fn({call}, target)\n"
    elif model_loss is not None:
        src = f"def forward(self, {', '.join(parameters)}):\n    return self.select_loss({call})\n"
    else:
        src = f"def forward(self, {', '.join(parameters)}):\n    return {call}\n"
    scope: dict[str, Any] = {}
    exec(compile(src, "<autopar wrapper>", "exec"), scope)

    # outside the module's state: torch.export does not keep attributes set while tracing
    found = [loss_fn is not None]

    class Wrapped(nn.Module):
        forward = scope["forward"]

        def __init__(self):
            super().__init__()
            self.model = model
            self.loss_fn = loss_fn
            self.constant_kwargs = dict(keywords.constants)

        @property
        def loss_found(self) -> bool:
            return found[0]

        def select_loss(self, output):
            loss, found[0] = output_loss(output, model_loss == "required")
            return loss

    Wrapped.__name__ = "ModelWithLoss" if loss_fn is not None or model_loss is not None else "ModelOnly"
    return Wrapped()


def capture(
    model: nn.Module,
    example_inputs: Sequence[Any],
    loss_fn: Callable | None = None,
    example_target: Any = None,
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    model_loss: str | None = None,
    tracer: str = "auto",
) -> fx.GraphModule:
    """Capture ``model`` (with ``loss_fn`` when given) at the shapes of the examples.

    ``example_kwargs``: keyword inputs, laid out by :class:`Keywords`. ``model_loss``
    (without ``loss_fn``): ``"required"`` captures the loss the model's output carries
    (:func:`output_loss`), ``"if_present"`` that loss when there is one, else the output;
    ``gm.meta[CAPTURE].with_loss`` says whether the graph returns a loss.
    ``tracer`` is ``"auto"`` (symbolic trace, then export), ``"symbolic_trace"`` or
    ``"export"``. Raises :class:`CaptureError` naming the model class and the construct
    each tracer stopped at. The model's buffers are left as they were: capturing runs
    the model, and a batch norm in training mode would otherwise count the run and move
    its running statistics. A Hugging Face model is captured with its generation cache
    off (:func:`no_generation_cache`).
    """
    if model_loss not in (None, "required", "if_present"):
        raise ValueError(f"capture: model_loss={model_loss!r}; use None, 'required' or 'if_present'")
    example_inputs, example_kwargs = tuple(example_inputs), dict(example_kwargs or {})
    model_loss = None if loss_fn is not None else model_loss
    with phase("capture"):
        if holds_meta(model):  # shapes only (autopar.trace.meta), on the examples' device
            with ShapesOnly(model, examples_device((example_inputs, example_kwargs, example_target))) as shapes:
                example_inputs, example_kwargs, example_target = shapes.examples(
                    (example_inputs, example_kwargs, example_target))
                gm = _capture_call(model, example_inputs, loss_fn, example_target, tracer, example_kwargs, model_loss)
            return check_no_fake_constants(gm, type(model).__name__, shapes.fake_ids())
        saved = {name: b.detach().clone() for name, b in model.named_buffers()}
        try:
            return _capture_call(model, example_inputs, loss_fn, example_target, tracer, example_kwargs, model_loss)
        finally:
            with torch.no_grad():
                for name, b in model.named_buffers():
                    if name in saved:
                        b.copy_(saved[name])


def _capture_call(model, example_inputs: tuple, loss_fn, example_target, tracer: str, example_kwargs: dict,
                  model_loss: str | None) -> fx.GraphModule:
    """A capture of the call, replayed from the export memo where an earlier one matches."""
    call = CaptureCall.of(model, example_inputs, loss_fn, example_target, tracer, example_kwargs, model_loss)
    found = EXPORTS.find(call)
    if found is not None:
        exported, info = found
        gm = unlifted(exported, model, _graph_args(example_inputs, example_kwargs, loss_fn, example_target))
        if gm is not None:  # (a kept export of a stack stamps as it did when kept)
            gm.meta[CAPTURE] = info
            log.info("capture of %s replayed from an earlier capture of the same call", info.model_class)
            return gm
    with no_generation_cache(model):
        return _capture(model, example_inputs, loss_fn, example_target, tracer, example_kwargs, model_loss, call)


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


def _capture(model, example_inputs: tuple, loss_fn, example_target, tracer: str, example_kwargs: dict,
             model_loss: str | None, call: CaptureCall | None = None) -> fx.GraphModule:
    with_loss = loss_fn is not None
    if with_loss and example_target is None:
        raise ValueError("capture: a loss_fn was given without example_target; pass the target tensor "
                         "the loss is computed against")
    keywords = Keywords.of(example_kwargs, len(example_inputs))
    root = wrap_model(model, loss_fn, len(example_inputs), keywords, model_loss)
    args = _graph_args(example_inputs, example_kwargs, loss_fn, example_target)
    model_class = type(model).__name__

    fx_error: BaseException | None = None
    traced = False   # symbolic tracing worked but the traced model failed to run
    if tracer in ("auto", "symbolic_trace"):
        try:
            versions = _versions(root)
            with _attributes_kept(root):
                gm = symbolic_trace_standard_layers(root)
            _check_not_mutated(root, versions)
            traced = True
            propagate_specs(gm, args)
            gm.meta[CAPTURE] = CaptureInfo("symbolic_trace", model_class, _placeholder_names(gm),
                                           _returns_loss(gm, root, model_loss))
            return gm
        except ModelLossError:
            raise
        except Exception as e:  # noqa: BLE001 - any tracer failure means: try the next one
            fx_error = e
            log.info("symbolic_trace failed for %s (%s); trying torch.export", model_class, _one_line(e))
            if tracer == "symbolic_trace":
                raise CaptureError(_failure_message(model_class, fx_error, None)) from e
    try:
        # a model that failed to run at these inputs is run again when exported: export
        # traces fake tensors, which an index out of range does not stop
        exported, gm = export(root, model, args, run=traced)
    except ModelLossError:
        raise
    except Exception as e:  # noqa: BLE001
        if isinstance(e.__cause__, ModelLossError):
            raise e.__cause__ from None
        raise CaptureError(_failure_message(model_class, fx_error, e)) from e
    gm.meta[CAPTURE] = CaptureInfo("export", model_class, _placeholder_names(gm), _returns_loss(gm, root, model_loss),
                                   None if fx_error is None else _one_line(fx_error))
    if call is not None:
        EXPORTS.keep(call, exported, gm.meta[CAPTURE])
    return gm


@contextlib.contextmanager
def _attributes_kept(root: nn.Module):
    """Put back every plain attribute a module's forward assigned while symbolically
    traced (Meta's Llama: ``self.freqs_cis = self.freqs_cis.to(h.device)``): the trace ran
    the forward on proxies, so the model would keep a proxy, which the export tried next
    (and the user's own calls) would read instead of the tensor. One first set there
    from a proxy is removed."""
    kept = [(m, {k: v for k, v in vars(m).items() if k not in ("_parameters", "_buffers", "_modules")})
            for m in root.modules()]
    try:
        yield
    finally:
        for module, attributes in kept:
            for name in [n for n, v in vars(module).items() if isinstance(v, fx.Proxy) and n not in attributes]:
                delattr(module, name)
            for name, value in attributes.items():
                if vars(module).get(name, value) is not value:
                    setattr(module, name, value)


def _versions(root: nn.Module) -> dict[str, int]:
    """Each parameter's and buffer's version counter (in-place ops bump it)."""
    return {name: t._version for name, t in [*root.named_parameters(), *root.named_buffers()]}


def _check_not_mutated(root: nn.Module, before: dict[str, int]) -> None:
    """Symbolic tracing runs an in-place op on a module's own tensor with constant
    arguments eagerly (``self.running.mul_(0.9)`` of a statistic updated in forward) and
    records nothing of it: such a trace would lose the op. Raised, so the capture takes
    ``torch.export``, which records it (under its ``torch.no_grad()``)."""
    changed = sorted(name for name, version in _versions(root).items() if before.get(name, version) != version)
    if changed:
        raise RuntimeError(f"the forward changes {', '.join(changed[:3])} in place, which symbolic tracing runs "
                           f"instead of recording")


def _graph_args(example_inputs: tuple, example_kwargs: dict, loss_fn, example_target) -> tuple:
    """The captured graph's inputs: the positional ones, the keyword tensors in the
    example's order (:class:`Keywords`), then the target when a ``loss_fn`` is given."""
    return example_inputs + tuple(v for v in example_kwargs.values() if isinstance(v, torch.Tensor)) + \
        ((example_target,) if loss_fn is not None else ())


def _tuple_loss_taken(output, position: int) -> None:
    """Say which element of a returned tuple autopar trains on: a tuple's one scalar is
    taken as the model's loss (``(logits, loss)``), which is right for a language model's
    loss and wrong for a model returning ``(logits, aux_loss)`` whose loss the user's loop
    adds up: the warning names it so that the second gives a ``loss_fn``."""
    warnings.warn(f"autopar: the model returns a {type(output).__name__} of {len(output)} values and no loss_fn was "
                  f"given; its one scalar (position {position}) is taken as the loss to train on. If the loss is "
                  f"computed from the outputs outside the model, give compile a loss_fn and example_target",
                  stacklevel=3)


def _returns_loss(gm: fx.GraphModule, root: nn.Module, model_loss: str | None) -> bool:
    """Whether the captured graph returns a loss: ``loss_fn``'s, or the model's own (a
    scalar tensor; a tensor output of another shape is no loss)."""
    if root.loss_fn is not None:
        return True
    if model_loss is None or not root.loss_found:
        return False
    output = next(n for n in gm.graph.nodes if n.op == "output")
    value = output.args[0]
    if isinstance(value, (tuple, list)) and len(value) == 1:  # export's flat outputs
        value = value[0]
    if isinstance(value, (tuple, list)):  # a tuple of proxies (output_loss): the one scalar in it is the loss
        scalars = [v for v in value if isinstance(v, fx.Node) and isinstance(v.meta.get(SPEC), TensorSpec)
                   and v.meta[SPEC].shape == () and v.meta[SPEC].dtype.is_floating_point]
        if len(scalars) == 1:
            _tuple_loss_taken(value, value.index(scalars[0]))
            output.args = (scalars[0],)
            gm.recompile()
            return True
        if model_loss == "if_present":
            return False
    spec = value.meta.get(SPEC) if isinstance(value, fx.Node) else None
    if isinstance(spec, TensorSpec) and spec.shape == ():
        return True
    if model_loss == "required":
        shape = list(spec.shape) if isinstance(spec, TensorSpec) else None
        raise ModelLossError(f"the model returns {'a tensor of shape ' + str(shape) if shape is not None else value}, "
                             f"not a scalar loss; with no loss_fn autopar trains on the loss the model returns. Pass "
                             f"the labels the model computes its loss from, or give compile a loss_fn and "
                             f"example_target")
    return False


def _placeholder_names(gm: fx.GraphModule) -> tuple[str, ...]:
    return tuple(n.name for n in gm.graph.nodes if n.op == "placeholder")


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


__all__ = ["capture", "propagate_specs", "CaptureError", "Keywords", "ModelLossError", "output_loss", "wrap_model"]
