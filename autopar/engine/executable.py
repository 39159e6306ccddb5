"""What a rank runs and shows: its share of the batch (:func:`local_batch`), a rewritten
graph as the module it executes over the rank's parameters (:func:`executable`), and
its code for plan dumps (:func:`rank_graph_code`). Below the families, so that their
runners use it; :mod:`autopar.driver.rank_program` builds the graphs.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.passes.manager import graph_code
from autopar.ir import FUSION, PASSES_RUN
from autopar.planning.plan import Plan
from autopar.planning.strategy import PlanError
from autopar.passes.recompute import rebound
from autopar.timing import phase


def batch_of(inputs: tuple) -> int | None:
    """The batch size: the first dimension of the first tensor input."""
    return next((x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0), None)


def local_batch(data: int, index: int, inputs: tuple, target: Any):
    """Chunk ``index`` of ``data`` of a global batch: every tensor whose first dimension is
    the batch (that of the first tensor input) is split along it; others are replicated."""
    if data == 1:
        return inputs, target
    batch = batch_of(inputs)
    if batch is not None and batch % data:
        raise PlanError(f"input 0: batch {batch} is not divisible by the data degree {data}; give a batch that is a "
                        f"multiple of {data}")

    def take(x):
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch:
            return x.chunk(data, 0)[index]
        return x

    return tuple(take(x) for x in inputs), (take(target) if target is not None else None)


def microbatches(values: tuple, m: int, batch: int) -> list[tuple]:
    """``values`` split into ``m`` along the batch (tensors whose first dimension is it;
    others, and None, repeated in each)."""
    def take(x, i):
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch:
            return x.chunk(m, 0)[i]
        return x
    return [tuple(take(x, i) for x in values) for i in range(m)]


def rank_graph_code(gm: fx.GraphModule, plan_: Plan, rank: int) -> str:
    coords = ", ".join(f"{k}={v}" for k, v in plan_.rank_coordinates(rank).items() if k in plan_.mesh)
    if plan_.subgrids > 1:
        s, p = plan_.subgrid_coordinates(rank)
        coords += f"; sub-grid {s}, position {p}, batch chunk {plan_.batch_chunk(rank)}"
    passes = " -> ".join(gm.meta.get(PASSES_RUN, []))
    header = f"rank {rank} of {plan_.world_size} ({coords}); built by passes: {passes}"
    return with_kernels(graph_code(gm, header=header), gm)


def with_kernels(code: str, gm: fx.GraphModule) -> str:
    """``code`` followed by the fusion pass's report and the source of every kernel it generated."""
    report = gm.meta.get(FUSION)
    if report is None:
        return code
    out = code + "\n" + "\n".join(f"# {line}" for line in report.summary().splitlines()) + "\n"
    for kernel in report.kernels:
        out += "\n\n" + kernel.source
    return out


def compiled(program: fx.GraphModule) -> fx.GraphModule:
    """``program`` run under ``torch.compile`` (``compile(torch_compile=True)``): its
    ``forward`` traced by Dynamo and compiled by Inductor (C++ on the CPU, Triton on
    GPUs) at its first call, static shapes. autopar's collectives, autograd functions and
    ZeRO's parameter reads run as they are between the compiled parts (Dynamo breaks
    the graph where it cannot trace them); autopar's own kernel fusion is off (Inductor
    fuses the same chains)."""
    program.forward = torch.compile(program.forward, dynamic=False)
    return program


def executable(gm: fx.GraphModule, root: nn.Module, class_name: str, torch_compile: bool = False) -> fx.GraphModule:
    """The rewritten ``gm`` as the program a rank runs: over ``root``'s module tree
    (this rank's parameters), with every module, parameter and constant under one flat
    name, and ``gm``'s metadata; ``torch_compile``: run under :func:`compiled`."""
    with phase("recompile"):
        program = _executable(gm, root, class_name)
    return compiled(program) if torch_compile else program


def _executable(gm: fx.GraphModule, root: nn.Module, class_name: str) -> fx.GraphModule:
    _copy_missing_attributes(gm, gm.graph, root)
    for node in gm.graph.nodes:  # a recomputed region's sub-graph reads the rank's modules too
        body = getattr(node.target, "body", None) if node.op == "call_function" else None
        if isinstance(body, fx.GraphModule):
            graph = fx.Graph()
            graph.output(graph.graph_copy(body.graph, {}))
            node.target = rebound(node.target, _Program(_flat_root(root, graph), graph,
                                                         class_name=type(body).__name__))
    program = _Program(_flat_root(root, gm.graph), gm.graph, class_name=class_name)
    program.meta.update(gm.meta)
    return program


class _Program(fx.GraphModule):
    """A rank's executed program: an ``fx.GraphModule`` whose submodules are also in its
    instance ``__dict__``, so that the generated code's ``self.model_body_0(x)`` finds each
    by plain attribute lookup instead of calling ``nn.Module.__getattr__`` (a Python
    function searching ``_parameters``, ``_buffers`` and ``_modules``) for every module
    call of every step: 7 such calls a step on a 3-layer MLP, 17 on a 2-block
    transformer. The modules stay registered (``named_modules``, ``parameters``,
    ``state_dict`` see them as before). Every way of replacing or removing a submodule
    (``setattr``, ``add_module``/``register_module``, ``delattr``, fx's
    ``add_submodule``/``delete_submodule``) goes through the three methods below, which
    keep the alias equal to ``_modules``; ``_apply`` (``.to()``, ``.float()``) changes
    modules in place. Parameters and buffers are not aliased (``_apply`` may replace them
    in ``_parameters`` / ``_buffers`` without touching ``__dict__``)."""

    def __init__(self, root: nn.Module, graph: fx.Graph, class_name: str):
        super().__init__(root, graph, class_name=class_name)
        for name in self._modules:
            self._alias(name)

    def _alias(self, name: str) -> None:
        module = self.__dict__["_modules"].get(name)
        if module is None:
            self.__dict__.pop(name, None)
        else:
            self.__dict__[name] = module

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        modules = self.__dict__.get("_modules")
        if modules is not None and name in modules:
            self._alias(name)

    def __delattr__(self, name: str) -> None:
        aliased = name in self.__dict__.get("_modules", ())
        super().__delattr__(name)
        if aliased:
            self.__dict__.pop(name, None)

    def add_module(self, name: str, module: nn.Module | None) -> None:
        super().add_module(name, module)
        self._alias(name)


def _copy_missing_attributes(src: fx.GraphModule, graph: fx.Graph, dst: nn.Module) -> None:
    """Give ``dst`` the constants a captured graph reads that the model lacks (export lifts
    tensor constants onto the captured module as ``_tensor_constant0`` and the like)."""
    for node in graph.nodes:
        if node.op != "get_attr":
            continue
        try:
            _getattr_path(dst, node.target)
        except AttributeError:
            owner_path, _, attr = node.target.rpartition(".")
            owner = _getattr_path(dst, owner_path) if owner_path else dst
            value = _getattr_path(src, node.target)
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                owner.register_buffer(attr, value, persistent=False)
            else:
                setattr(owner, attr, value)


def _flat_root(root: nn.Module, graph: fx.Graph) -> nn.Module:
    """A module giving every module, parameter and constant the graph reaches one flat
    name, so the executed program does ``self.model_body_0(x)`` instead of walking
    ``getattr(self.model.body, "0")`` on every call. The objects are ``root``'s own
    (parameters are shared, not copied); the names in the graph are rewritten to match.
    Dumped rank graphs keep the hierarchical names."""
    flat = nn.Module()
    names: dict[int, str] = {}  # object -> its flat name
    for node in graph.nodes:
        if node.op not in ("call_module", "get_attr"):
            continue
        value = _getattr_path(root, node.target)
        if id(value) not in names:
            alias = base = node.target.replace(".", "_")
            suffix = 0
            while hasattr(flat, alias):  # two paths that flatten to one name
                suffix += 1
                alias = f"{base}_{suffix}"
            if isinstance(value, (nn.Module, nn.Parameter)):
                setattr(flat, alias, value)
            else:
                flat.__dict__[alias] = value  # a buffer or constant, shared by reference
            names[id(value)] = alias
        node.target = names[id(value)]
    return flat


def _getattr_path(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj
