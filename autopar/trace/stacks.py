"""The stack of repeated layers a model is exported with cut short
(:mod:`autopar.trace.stamping`): which ``ModuleList`` it is, where its units of alike
layers start and how long they are (:func:`find_stack`), and the model cut to the
layers its export keeps (:func:`shallow`)."""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import inspect
import os
import textwrap
from typing import Iterator

import torch
import torch.nn as nn

from autopar._torch_compat import children_of, forward_hooks, set_children

SHALLOW = 3
"""The layers of a stamped stack of copies that are exported: layer 2 is the template,
layer 1 checks it (a stack repeating in units of several layers keeps more,
:attr:`Stack.kept`)."""

MIN_LAYERS = SHALLOW + 1
"""The shortest stack worth stamping."""

MAX_PERIOD = 8
"""The longest unit of layers a stack may repeat in (Gemma 3's five local layers and one
global are 6)."""

COMPUTE_OPS = ("call_function", "call_method", "call_module")
"""The fx ops of nodes that compute (a layer's own nodes, the model's between them)."""

_PLAIN = (bool, int, float, complex, str, type(None), torch.dtype, torch.device)


@dataclasses.dataclass(frozen=True)
class Stack:
    """A stack of repeated layers: the ``ModuleList``'s path in the model, its length,
    where the stamped units start and their period. Layers ``start .. depth-1`` repeat
    in units of ``period`` layers, and so does the layer before them; the export keeps
    the first :attr:`kept` layers (everything before ``start``, the unit checked and the
    unit stamped from), the later units are stamped."""

    path: str
    depth: int
    start: int = 1
    period: int = 1

    @property
    def kept(self) -> int:
        return self.start + 2 * self.period

    @property
    def template(self) -> range:
        """The layers the later units are stamped from."""
        return range(self.start + self.period, self.kept)

    def template_of(self, layer: int) -> int:
        """The template layer a later ``layer`` is stamped from: the one of its place in the unit."""
        return self.start + self.period + (layer - self.start) % self.period

    @property
    def checked(self) -> range:
        """The layers that, stamped, must give the template's."""
        return range(self.start, self.start + self.period)


def stamping_enabled() -> bool:
    return os.environ.get("AUTOPAR_STAMP_LAYERS", "1") not in ("0", "false", "False", "no")


# ------------------------------------------------------------------ finding the stack


def find_stack(model: nn.Module) -> Stack | None:
    """The model's stack of repeated layers holding the most parameters (None: none of
    at least :data:`MIN_LAYERS` layers), with the shortest export that stamps it
    (:func:`_repeats`)."""
    best, best_size = None, 0
    owners = _parameter_owners(model)
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < MIN_LAYERS:
            continue
        layers = list(module)
        size = sum(p.numel() for layer in layers for p in layer.parameters())
        if size <= best_size:
            continue
        found = _repeats(layers)
        if found is not None and _own_parameters(path, layers, owners) and \
                index_read(layers[found[0]], _index_attributes(layers, found[0])) is None:
            best, best_size = Stack(path, len(layers), *found), size
    return best


def _index_attributes(layers: list[nn.Module], start: int) -> set[tuple[str, str]]:
    """The plain attributes holding each layer's own index (``(submodule, name)``), read
    off the first stamped layer and the one after it."""
    (attrs, _), (after, _) = _facts(layers[start]), _facts(layers[start + 1])
    return {key for key, value in attrs.items()
            if type(value) is int and value == start and after.get(key) == start + 1}


def index_read(layer: nn.Module, names: set[tuple[str, str]]) -> str | None:
    """Where a layer's code computes with an attribute holding its own index (``names``:
    ``(submodule path, attribute)``): in a comparison, a condition or arithmetic, which
    could make a layer the export does not trace differ from the template (None:
    nowhere; passing it to a call or indexing a container by it, as the generation
    cache does, ``past_key_values.update(k, v, self.layer_idx)``, is not computing)."""
    for path, attribute in sorted(names):
        cls = type(layer.get_submodule(path) if path else layer)
        where = _computed_in(cls, attribute)
        if where is not None:
            return f"{cls.__name__}.{where} computes with self.{attribute}"
    return None


_COMPUTING = (ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.IfExp, ast.AugAssign)


@functools.lru_cache(maxsize=256)
def _computed_in(cls: type, attribute: str) -> str | None:
    """The method of ``cls`` (or of a base outside torch) other than ``__init__`` that
    computes with ``self.<attribute>`` (:func:`index_read`), or None; a class whose
    source cannot be read is taken to."""
    for klass in cls.__mro__:
        if klass in (nn.Module, object) or klass.__module__.startswith("torch."):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            return f"{klass.__name__} (no source)"
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name == "__init__":
                continue
            parents = {child: node for node in ast.walk(fn) for child in ast.iter_child_nodes(node)}
            for node in ast.walk(fn):
                if not (isinstance(node, ast.Attribute) and node.attr == attribute and isinstance(node.ctx, ast.Load)
                        and isinstance(node.value, ast.Name) and node.value.id == "self"):
                    continue
                child, parent = node, parents.get(node)
                while parent is not None and not isinstance(parent, ast.stmt):
                    if isinstance(parent, _COMPUTING):
                        return fn.name
                    child, parent = parent, parents.get(parent)
                if isinstance(parent, (ast.If, ast.While, ast.Assert)) and child is parent.test:
                    return fn.name
                if isinstance(parent, ast.AugAssign):
                    return fn.name
    return None


def _repeats(layers: list[nn.Module]) -> tuple[int, int] | None:
    """``(start, period)`` of the shortest export that stamps ``layers`` (None: none
    stamps a layer): each layer from some index on alike the layer ``period`` after it
    (:func:`_alike`), the layer before ``start`` among them, and ``start`` leaving whole
    units after it. A stack of copies is ``(1, 1)``: layers 0 to 2 exported."""
    facts = [_facts(layer) for layer in layers]
    depth, best = len(layers), None
    for period in range(1, MAX_PERIOD + 1):
        first = depth - period   # the first layer from which every layer is alike its next unit's
        while first > 0 and _alike(facts, first - 1, period):
            first -= 1
        if first == depth - period:
            continue
        start = first + 1 + (depth - first - 1) % period
        kept = start + 2 * period
        if kept < depth and (best is None or kept < best[0] + 2 * best[1]):
            best = (start, period)
    return best


def _parameter_owners(model: nn.Module) -> dict[int, set[str]]:
    owners: dict[int, set[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        owners.setdefault(id(t), set()).add(name)
    return owners


def _own_parameters(path: str, layers: list[nn.Module], owners: dict[int, set[str]]) -> bool:
    """No module twice in the stack, and every tensor of a layer held by that layer only
    (a weight tied across layers would be one parameter under several names)."""
    if len({id(layer) for layer in layers}) != len(layers):
        return False
    for i, layer in enumerate(layers):
        inside = f"{path}.{i}." if path else f"{i}."
        for t in [*layer.parameters(), *layer.buffers()]:
            if any(not name.startswith(inside) for name in owners.get(id(t), ())):
                return False
    return True


def _plain(value) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN)


def _facts(layer: nn.Module) -> tuple[dict, tuple]:
    """A layer's plain attributes by ``(module, attribute)``, and everything else a
    capture of it depends on (classes, hooks, parameters, buffers, other attributes'
    identities)."""
    attributes, rest = {}, []
    for name, m in layer.named_modules(remove_duplicate=False):
        others = []
        for key, value in vars(m).items():
            if _plain(value):   # private ones too (a flag set per layer as ``self._global = ...``)
                attributes[(name, key)] = value
            elif key.startswith("_"):   # the module's own bookkeeping (_parameters, _forward_hooks...)
                continue
            elif not isinstance(value, (nn.Module, torch.Tensor)):
                others.append((key, _identity(value, m)))   # a config object: the same one in every layer
        rest.append((name, type(m), forward_hooks(m), tuple(others), "forward" in vars(m)))
    for name, p in layer.named_parameters(remove_duplicate=False):
        rest.append((name, type(p), tuple(p.shape), p.dtype, p.device, p.requires_grad))
    for name, b in layer.named_buffers(remove_duplicate=False):
        rest.append((name, tuple(b.shape), b.dtype, b.device))
    return attributes, tuple(rest)


def _identity(value, owner: nn.Module):
    """What an attribute that is no plain value, module or tensor is, for comparing
    layers: the object itself (its id: a config shared by every layer), except a
    ``functools.partial`` of the same function with the same plain arguments (an
    activation made per layer, ``partial(gelu, approximate="tanh")``) and the owner's
    own method (one function, bound to each layer)."""
    if isinstance(value, functools.partial) and _plain(value.args) and _plain(tuple(value.keywords.values())):
        return ("partial", _identity(value.func, owner), value.args, tuple(sorted(value.keywords.items())))
    if inspect.ismethod(value) and value.__self__ is owner:
        return ("method", id(value.__func__))
    return id(value)


def _alike(facts: list, i: int, period: int) -> bool:
    """Whether layer ``i`` and layer ``i + period`` are copies of one another by their
    :func:`_facts`: the same classes, hooks, parameters and plain attributes, an integer
    attribute that is each layer's own index (``layer_idx``) aside."""
    (attrs, rest), (other, other_rest) = facts[i], facts[i + period]
    if rest != other_rest or attrs.keys() != other.keys():
        return False
    for key, value in attrs.items():
        v = other[key]
        if v == value and type(v) is type(value):
            continue
        if not (type(value) is int and type(v) is int and value == i and v == i + period):
            return False
    return True


def shallow(model: nn.Module, stack: Stack):
    """The model with its stack cut to its first :attr:`Stack.kept` layers, inside."""
    children = children_of(model.get_submodule(stack.path))
    return layers_replaced(model, stack, dict(list(children.items())[:stack.kept]))


@contextlib.contextmanager
def layers_replaced(model: nn.Module, stack: Stack, layers: dict) -> Iterator[None]:
    """The model with ``layers`` (name -> module) as its stack's children, inside."""
    module = model.get_submodule(stack.path)
    children = children_of(module)
    set_children(module, layers)
    try:
        yield
    finally:
        set_children(module, children)


__all__ = ["COMPUTE_OPS", "MAX_PERIOD", "MIN_LAYERS", "SHALLOW", "Stack", "find_stack", "index_read", "layers_replaced",
           "shallow", "stamping_enabled"]
