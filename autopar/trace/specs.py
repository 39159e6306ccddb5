"""``SPEC`` (shape and dtype) on every node of a captured graph, by running it once
(:func:`propagate_specs`)."""
from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode

from autopar.ir import SPEC, spec_from_value


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
