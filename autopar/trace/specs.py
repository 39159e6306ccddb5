"""``SPEC`` (shape and dtype) on every node of a captured graph, by running it once
(:func:`propagate_specs`)."""
from __future__ import annotations

import contextlib
import operator
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.modules import module as nn_module

from autopar.ir import SPEC, spec_from_value


class _SpecRecorder(fx.Interpreter):
    """Runs the graph once and records each node's output spec under ``SPEC``.

    A model's repeated layers run the same operations on inputs of the same shapes
    (GPT-3's 96 blocks: 3,900 of its 4,000 nodes), and a fake tensor's operation costs
    its dispatch (0.3 ms for a linear on the 2-core machine) to answer what the layer
    before already answered. So an operation whose result is a function of its inputs'
    metadata alone is run once per distinct :func:`_op_key` (its target, and per
    argument a tensor's shape, strides, dtype, device and ``requires_grad``, or the
    constant itself); a repeat gets the remembered tensor itself where nothing in the
    graph works in place, else fresh empty tensors of its metadata. Not remembered:
    in-place operations (their effect on the input is the point), results of data-dependent size (symbolic
    sizes), results that are not tensors, plain numbers or tuples of them, views with an
    offset, and modules other than torch's own layers (whose behaviour their plain
    attributes and parameters' metadata fix)."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.memo: dict = {}
        self.in_place = {n for n in gm.graph.nodes if n.op in _REMEMBERED and _in_place(n)}
        # with nothing in place in the graph, a tensor is never changed after it is made,
        # and a repeat can be handed the remembered tensor itself (a fake one has no
        # values to share); else each gets its own
        self.share = not self.in_place

    def run_node(self, n: fx.Node) -> Any:
        key = _op_key(self, n) if n.op in _REMEMBERED and n not in self.in_place else None
        if key is not None and key in self.memo:
            result = self.memo[key] if self.share else _fresh(self.memo[key])
        else:
            result = super().run_node(n)
            if key is not None and _rememberable(result):
                self.memo[key] = result if self.share else _fresh(result)  # a later in-place op cannot reach it
        if n.op != "output":
            n.meta[SPEC] = spec_from_value(result)
        return result


_REMEMBERED = ("call_function", "call_method", "call_module")
_IN_PLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.imatmul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
    operator.iconcat, operator.setitem, operator.delitem})
_CONSTANTS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout,
              type(Ellipsis))


class _Unknown(Exception):
    """An argument :func:`_op_key` cannot key by value."""


def _value_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        # a real tensor's values can set a result's size (nonzero, masked selection) with
        # no symbolic size to tell: only fake and meta tensors are keyed by metadata
        if not (isinstance(value, FakeTensor) or value.is_meta) or not _concrete(value):
            raise _Unknown
        return ("T", type(value), tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype,
                value.device, value.requires_grad)
    if type(value) in _CONSTANTS:
        return (type(value), value)
    if type(value) is slice:
        return ("S", _value_key(value.start), _value_key(value.stop), _value_key(value.step))
    if type(value) in (tuple, list, torch.Size, immutable_list):
        return (type(value), tuple(_value_key(v) for v in value))
    if type(value) in (dict, immutable_dict):
        return ("D", tuple((k, _value_key(v)) for k, v in value.items()))
    raise _Unknown


def _concrete(t: torch.Tensor) -> bool:
    return all(type(d) is int for d in (*t.shape, *t.stride()))


def _module_key(module: torch.nn.Module) -> Any:
    """What a leaf of torch's own layers computes from: its class, plain attributes
    (sizes, flags, ``training``) and its tensors' metadata; None for another module."""
    cls = type(module)
    if (not cls.__module__.startswith("torch.nn.modules.") or module._forward_hooks or module._forward_pre_hooks
            or nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks or module._modules):
        return None  # hooks, or children whose own state the key does not read
    plain = []
    for name, value in sorted(vars(module).items()):
        if name in ("_parameters", "_buffers", "_modules"):
            continue
        if type(value) in _CONSTANTS or type(value) is tuple:
            plain.append((name, _value_key(value)))
        elif not name.startswith("_"):
            return None  # an attribute of another kind: not keyed, not remembered
    tensors = [(name, _value_key(t)) for name, t in (*module._parameters.items(), *module._buffers.items())
               if t is not None]
    return (cls, tuple(plain), tuple(tensors))


def _in_place(n: fx.Node) -> bool:
    """Whether ``n`` changes one of its inputs (a method or function named ``..._``, an
    in-place operator, ``inplace=True``, ``out=``, a module made ``inplace``)."""
    target = n.target
    if n.op == "call_module":
        return bool(getattr(n.graph.owning_module.get_submodule(target), "inplace", False))
    schema = getattr(target, "_schema", None)
    if schema is not None and schema.is_mutable:  # an ATen overload ("unsqueeze_.default")
        return True
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return bool(name.endswith("_") and not name.endswith("__") or name.startswith("__i") or n.kwargs.get("inplace")
                or "out" in n.kwargs or target in _IN_PLACE_OPERATORS)


def _op_key(interpreter: fx.Interpreter, n: fx.Node) -> Any:
    """The key of ``n``'s operation (not in place) on its arguments' metadata, or None
    (not remembered)."""
    target = n.target
    try:
        args, kwargs = interpreter.fetch_args_kwargs_from_env(n)
        key = (_value_key(args), _value_key(kwargs))
    except _Unknown:
        return None
    if n.op == "call_module":
        try:
            found = _module_key(interpreter.fetch_attr(target))
        except _Unknown:  # its own tensors real, or an attribute not keyed by value
            return None
        return None if found is None else (n.op, found, key)
    try:
        hash(target)
    except TypeError:
        return None
    return (n.op, target, key)


def _rememberable(result: Any) -> bool:
    if isinstance(result, torch.Tensor):  # a real tensor's values are not its metadata's
        return (type(result) is not torch.nn.Parameter and (isinstance(result, FakeTensor) or result.is_meta)
                and _concrete(result) and result.storage_offset() == 0)
    if type(result) in (int, float, bool, torch.Size):
        return True
    return type(result) is tuple and all(_rememberable(r) for r in result)


def _fresh(result: Any) -> Any:
    """A new value of ``result``'s metadata (new empty tensors; numbers as they are)."""
    if isinstance(result, torch.Tensor):
        out = result.new_empty_strided(result.shape, result.stride())  # a fake tensor's in its mode
        return out.requires_grad_(result.requires_grad) if result.requires_grad else out
    if type(result) is tuple:
        return tuple(_fresh(r) for r in result)
    return result


def propagate_specs(gm: fx.GraphModule, args: Sequence[Any]) -> fx.GraphModule:
    """Write ``SPEC`` (shape, dtype) on every node by running ``gm`` on ``args``.

    Runs under ``torch.no_grad`` on the given tensors; parameters on the meta device
    give meta results, so a model built on the meta device costs no memory here; on
    fake tensors (:mod:`autopar.trace.meta`) it runs in their fake mode.
    """
    with torch.no_grad(), _no_progress_monitor(), detect_fake_mode(args) or contextlib.nullcontext():
        _SpecRecorder(gm).run(*args)
    return gm


@contextlib.contextmanager
def _no_progress_monitor():
    """``torch.fx.Interpreter.run`` makes a tqdm bar (disabled), and tqdm's first bar
    starts its monitor: a daemon thread that wakes every 10 s for the rest of the
    process. A daemon thread that runs Python may run the cyclic garbage collector, and
    a collection that frees torch objects (a compiled model's, once the function that
    trained it returned) releases and takes the GIL again inside their C++ destructors;
    when the interpreter finalises in between, the thread is ended with ``pthread_exit``
    inside a ``noexcept`` destructor and the process aborts (``terminate called without
    an active exception``, SIGABRT at exit). With ``monitor_interval`` 0 no monitor is
    started; a monitor already running is left alone."""
    try:
        from tqdm import tqdm
    except ImportError:  # torch.hub's stand-in starts no thread
        yield
        return
    before = tqdm.monitor_interval
    tqdm.monitor_interval = 0
    try:
        yield
    finally:
        tqdm.monitor_interval = before


__all__ = ["propagate_specs"]
