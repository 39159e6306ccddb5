"""The batch rule of an op autopar's own tables do not cover, read off PyTorch's: what
DTensor's sharding propagation gives the op's inputs split along the batch.

A value holding the batch's rows in dimension ``d`` is, in DTensor's terms, ``Shard(d)``
over the ranks that split the batch; a value the same on every part is ``Replicate()``;
a reduction over the rows is ``Partial``. For a node no rule of
:mod:`.view_rules`/:mod:`.compute_rules` covers, :func:`rule_of` runs the node on meta
tensors of its inputs' shapes under a dispatch mode that sees the ATen ops it runs (a
``torch`` function, a ``Tensor`` method or a module decomposed as autograd would), and
asks DTensor's propagator, op by op, for the output placements of the inputs' placements
(``ShardingPropagator.propagate_op_sharding``). Where DTensor would first redistribute an
input (gather a ``Shard`` to ``Replicate``, reduce a ``Partial``, slice a
``Replicate`` of the batch's size), the rows of the batch meet there: the node is a
coupling. Where it runs the op as given, the output's placement is the node's rows
(``Shard(d)``: rows in ``d``; ``Replicate``: none; ``Partial``: a reduction over the
batch, sum or mean). An op neither autopar nor DTensor has a rule for is refused.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from autopar.ir import SPEC, TensorSpec


@dataclass(frozen=True)
class Verdict:
    """What DTensor says of a node: ``outputs`` (per output: ``("rows", d)``, ``("free",)``
    or ``("partial", "sum" | "mean" | "other")``), or where the rows meet (``meets``: the
    ATen op and the redistribution it would need), or that it has no rule (``none``)."""

    outputs: tuple = ()
    meets: str = ""
    none: str = ""


@functools.lru_cache(maxsize=1)
def _mesh():
    from torch.distributed.device_mesh import DeviceMesh
    return DeviceMesh("cpu", torch.arange(2, device="cpu"), _init_backend=False, _rank=0)


def _propagator():
    from torch.distributed.tensor import DTensor
    return DTensor._op_dispatcher.sharding_propagator


class _Record(TorchDispatchMode):
    """The ATen ops a call runs, with their arguments and results."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.calls.append((func, args, kwargs, out))
        return out


def _placement(kind: tuple):
    from torch.distributed.tensor import Partial, Replicate, Shard
    if kind[0] == "rows":
        return Shard(kind[1])
    if kind[0] == "partial":
        return Partial("sum" if kind[1] == "sum" else "avg")
    return Replicate()


def _kind(placement) -> tuple:
    from torch.distributed.tensor import Partial, Replicate, Shard
    if isinstance(placement, Shard) and type(placement) is Shard:
        return ("rows", placement.dim)
    if isinstance(placement, Replicate):
        return ("free",)
    if isinstance(placement, Partial):
        op = getattr(placement, "reduce_op", "sum")
        return ("partial", "sum" if op == "sum" else "mean" if op == "avg" else "other")
    return ("other", repr(placement))


def _spec(t: torch.Tensor, kind: tuple):
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    return DTensorSpec(_mesh(), (_placement(kind),), TensorMeta(t.shape, t.stride(), t.dtype))


def _meta(spec: TensorSpec) -> torch.Tensor:
    return torch.empty(tuple(spec.shape), dtype=spec.dtype, device="meta")


def rule_of(node: fx.Node, gm: fx.GraphModule, kinds: dict[fx.Node, tuple]) -> Verdict:
    """DTensor's verdict on ``node`` whose tensor inputs hold ``kinds`` (by input node:
    ``("rows", d)``, ``("free",)``, ``("partial", kind)``; an input not in it is free)."""
    from torch.distributed.tensor._op_schema import OpSchema

    values: dict[fx.Node, torch.Tensor] = {}
    for a in node.all_input_nodes:
        spec = a.meta.get(SPEC)
        if isinstance(spec, TensorSpec):
            values[a] = _meta(spec)
        elif a.op == "get_attr" or spec is not None:
            return Verdict(none=f"its input {a.name} is no single tensor autopar can stand in for")
        else:
            return Verdict(none=f"its input {a.name} is a value known only when the model runs")
    args = tree_map(lambda x: values[x] if isinstance(x, fx.Node) else x, node.args)
    kwargs = tree_map(lambda x: values[x] if isinstance(x, fx.Node) else x, dict(node.kwargs))
    recorder = _Record()
    try:
        with recorder:
            if node.op == "call_function":
                out = node.target(*args, **kwargs)
            elif node.op == "call_method":
                out = getattr(args[0], node.target)(*args[1:], **kwargs)
            elif node.op == "call_module":
                module = gm.get_submodule(node.target)
                state = {k: torch.empty_like(v, device="meta") for k, v in
                         [*module.named_parameters(), *module.named_buffers()]}
                out = torch.func.functional_call(module, state, args, kwargs)
            else:
                return Verdict(none="not a call")
    except Exception as e:  # noqa: BLE001 - an op that cannot run on meta tensors has no rule here
        return Verdict(none=f"it does not run on meta tensors ({type(e).__name__})")
    placed: dict[int, tuple] = {id(values[a]): kinds.get(a, ("free",)) for a in values}
    propagator = _propagator()
    for func, call_args, call_kwargs, result in recorder.calls:
        flat, _ = tree_flatten((call_args, call_kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        given = [placed.get(id(t), ("free",)) for t in tensors]
        results = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        if all(k == ("free",) for k in given):
            for t in results:
                placed[id(t)] = ("free",)
            continue
        schema_args = tree_map(lambda t: _spec(t, placed.get(id(t), ("free",))) if isinstance(t, torch.Tensor) else t,
                               call_args)
        schema_kwargs = tree_map(lambda t: _spec(t, placed.get(id(t), ("free",)))
                                 if isinstance(t, torch.Tensor) else t, call_kwargs)
        try:
            # uncached: the cache keys some ops without their non-tensor arguments (flip's dims)
            sharding = propagator.propagate_op_sharding_non_cached(OpSchema(func, schema_args, schema_kwargs))
        except Exception as e:  # noqa: BLE001 - DTensor has no strategy for the op
            return Verdict(none=f"neither autopar nor DTensor has a rule for {func} ({type(e).__name__})")
        needed = sharding.redistribute_schema
        if needed is not None:
            wanted = [s for s in tree_flatten((needed.args_schema, needed.kwargs_schema))[0]
                      if hasattr(s, "placements")]
            for t, want in zip(tensors, wanted):
                have = _placement(placed.get(id(t), ("free",)))
                if want.placements[0] != have:
                    return Verdict(meets=f"DTensor's rule for {func} takes its input {_text(have)} as "
                                         f"{_text(want.placements[0])}: the rows of the batch meet there")
        specs = sharding.output_spec
        specs = specs if isinstance(specs, (tuple, list)) else (specs,)
        for t, s in zip(results, specs):
            placed[id(t)] = _kind(s.placements[0]) if s is not None else ("free",)
    outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    kinds_out = tuple(placed.get(id(t), ("free",)) for t in outputs)
    odd = next((k for k in kinds_out if k[0] == "other"), None)
    if odd is not None:
        return Verdict(none=f"DTensor places its output as {odd[1]}, which autopar does not split")
    return Verdict(outputs=kinds_out)


def _text(placement) -> str:
    from torch.distributed.tensor import Partial, Replicate, Shard
    if isinstance(placement, Shard):
        return f"split along dimension {placement.dim} (Shard({placement.dim}))"
    if isinstance(placement, Replicate):
        return "whole (Replicate)"
    if isinstance(placement, Partial):
        return "a partial reduction (Partial)"
    return repr(placement)


__all__ = ["Verdict", "rule_of"]
