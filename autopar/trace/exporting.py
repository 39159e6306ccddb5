"""The ``torch.export`` path of a capture: the export (:func:`export`; a model's stack of
identical layers exported shallow and stamped, :mod:`autopar.trace.stamping`), and a
fresh module of it with ``SPEC`` on every node (:func:`unlifted`), which is also how the
export memo (:mod:`autopar.trace.memo`) replays a kept export."""
from __future__ import annotations

import dataclasses
import logging
import operator

import torch
import torch.fx as fx
import torch.nn as nn

from autopar._torch_compat import no_stack_traces
from autopar.ir import SPEC, spec_from_value
from autopar.trace.specs import propagate_specs
from autopar.trace.loop_check import loop_differs, recorded_outputs, stubbed
from autopar.trace.stamping import Stack, find_stack, shallow, stamp, stamping_enabled
from autopar.trace.standard_layers import mha_fast_path_disabled

log = logging.getLogger("autopar.capture")

_EXPORT_NOISE = {torch.ops.aten._assert_tensor_metadata.default}


@dataclasses.dataclass(frozen=True)
class Exported:
    """An exported program, and the stack of identical layers it was exported with cut
    short (:mod:`autopar.trace.stamping`; None: the whole model), stamped when unlifted."""

    program: torch.export.ExportedProgram
    stack: Stack | None = None


def export(root: nn.Module, model: nn.Module, args: tuple, run: bool = False) -> tuple[Exported, fx.GraphModule]:
    """``root`` exported, and its module: the model's stack of identical layers exported
    shallow and stamped where its export shows the layers alike, else the whole model.
    ``run``: write the specs by running the module (:func:`unlifted`)."""
    stack = find_stack(model) if stamping_enabled() else None
    if stack is not None:
        try:
            with recorded_outputs(model, stack) as outputs, shallow(model, stack):
                exported = Exported(_exported_program(root, args), stack)
            gm = unlifted(exported, model, args, run)
        except Exception as e:  # noqa: BLE001 - e.g. a forward that indexes its layers by a count of its own
            log.debug("%s cut to %d layers does not export (%s: %s); exporting it whole", type(model).__name__,
                      stack.kept, type(e).__name__, e)
            gm = None
        if gm is not None:  # the model's own code at the whole depth, its layers stubs (loop_check)
            why = _loop_differs(root, model, stack, args, outputs, gm)
            if why is not None:
                log.debug("the layers of %s are exported whole: %s", stack.path, why)
                gm = None
        if gm is not None:
            log.info("capture of %s: %s exported with its first %d of %d layers, the others stamped",
                     type(model).__name__, stack.path, stack.kept, stack.depth)
            return exported, gm
    exported = Exported(_exported_program(root, args))
    return exported, unlifted(exported, model, args, run)


def _loop_differs(root: nn.Module, model: nn.Module, stack: Stack, args: tuple, outputs: dict,
                  gm: fx.GraphModule) -> str | None:
    """Why the stamped ``gm`` is not the model at its whole depth (:func:`loop_differs`), or None."""
    try:
        with stubbed(model, stack, outputs):
            program = _exported_program(root, args)
    except Exception as e:  # noqa: BLE001 - a model that does not run with stub layers is not stamped
        return f"with stub layers it does not export ({type(e).__name__}: {e})"
    return loop_differs(_plain_module(program), gm, stack, f"model.{stack.path}" if stack.path else "model")


def _exported_program(root: nn.Module, args: tuple) -> torch.export.ExportedProgram:
    # the slow path's ATen ops are what analysis reads; no node's stack trace is
    with mha_fast_path_disabled(), no_stack_traces():
        return torch.export.export(root, args, strict=False)


def unlifted(exported: Exported, model: nn.Module, args: tuple, run: bool = False) -> fx.GraphModule | None:
    """A fresh module of the exported program (its own graph and node metadata; the
    parameters are the model's own), its stack stamped, with ``SPEC`` on every node
    (None: the stack cannot be stamped): read off the fake values export traced with,
    or with ``run`` by running the module on ``args`` (:func:`propagate_specs`), which
    also fails where the model does on these values (an index out of range)."""
    gm = _plain_module(exported.program)
    if exported.stack is None:
        gm.graph.lint()
        gm.recompile()
    elif stamp(gm, model, exported.stack) is None:   # (a stamped graph is linted and compiled)
        return None
    if run:
        propagate_specs(gm, args)
    else:
        _export_specs(gm, args)
    return gm


def _plain_module(program: torch.export.ExportedProgram) -> fx.GraphModule:
    """A fresh module of ``program``. The unlifted module checks input shapes with a
    guard submodule and asserts dtypes with side-effect-only nodes; neither carries a
    tensor, and rank programs are captured at their own shapes, so they are dropped to
    keep rank graphs readable; the grad-mode blocks are inlined (:func:`inline_grad_modes`)."""
    gm = program.module()
    for node in list(gm.graph.nodes):
        if not node.users and (node.target in _EXPORT_NOISE or
                               (node.op == "call_module" and node.target == "_guards_fn")):
            gm.graph.erase_node(node)
    inline_grad_modes(gm)
    return gm


def inline_grad_modes(gm: fx.GraphModule) -> None:
    """Each block the model runs under ``torch.no_grad()`` (a running statistic updated in
    forward, rotary tables), which ``torch.export`` wraps in a submodule called by
    ``wrap_with_set_grad_enabled``, inlined between two switches of the grad mode (the
    second restores the mode of the call), so the analysis reads its ops as any others;
    a block whose submodule reads attributes of its own is left as it is."""
    hop = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
    graph = gm.graph
    for node in list(graph.nodes):
        if hop is None or node.op != "call_function" or node.target is not hop:
            continue
        enabled, body_node, *operands = node.args
        body = getattr(gm, body_node.target, None)
        if not isinstance(body, fx.GraphModule) or any(n.op in ("get_attr", "call_module") for n in body.graph.nodes):
            continue
        env: dict = {}
        placeholders = iter(operands)
        with graph.inserting_before(node):
            mode = graph.call_function(torch.is_grad_enabled, ())
            switch = graph.call_function(torch._C._set_grad_enabled, (enabled,))
            results = None
            for n in body.graph.nodes:
                if n.op == "placeholder":
                    env[n] = next(placeholders)
                elif n.op == "output":
                    results = n.args[0]
                else:
                    env[n] = graph.node_copy(n, lambda x: env[x])
            back = graph.call_function(torch._C._set_grad_enabled, (mode,))
        for added in (mode, switch, back):
            added.meta["val"] = None   # no tensor: what the specs read off export's values
        outputs = [env.get(r, r) for r in (results if isinstance(results, (tuple, list)) else (results,))]
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(outputs[user.args[1]])
                graph.erase_node(user)
        if node.users:   # read whole (not by item): the tuple of the block's outputs
            with graph.inserting_before(node):
                packed = graph.call_function(tuple, (outputs,))
            node.replace_all_uses_with(packed)
        graph.erase_node(node)
        if not body_node.users:
            graph.erase_node(body_node)
            delattr(gm, body_node.target)


def _export_specs(gm: fx.GraphModule, args: tuple) -> None:
    """``SPEC`` on every node of an export from the fake value export traced it with
    (``meta["val"]``, the shape and dtype a run gives), without running the model; by a
    run (:func:`propagate_specs`) where some node has none."""
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    if not all("val" in n.meta for n in nodes):
        propagate_specs(gm, args)
        return
    for node in nodes:
        node.meta[SPEC] = spec_from_value(node.meta["val"])


__all__ = ["Exported", "export", "unlifted"]
