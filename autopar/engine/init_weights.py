"""Initialising a rank's parts with the model's own scheme (docs/guide/large_models.md#init_weightsseed).

:func:`init_weights` replays each module's initialisation one module at a time: the
module's own parameters and buffers are made whole on the rank's device, initialised as
the model initialises them, and cut to the rank's part. Every module's random stream is
seeded from the user's seed and the module's path alone (:func:`module_seed`), so the
gathered model is the same whatever the plan, the world size or the rank.

A module's initialisation may write tensors of its descendants (GPT-2's attention and
MLP rescale their child projections' weights by ``1/sqrt(2·layers)``, PyTorch's
``MultiheadAttention`` zeroes its ``out_proj`` bias). Which it writes is found by a dry
run on meta stand-ins (:func:`_written`: an in-place write bumps a tensor's version
counter, meta or not); those descendants' tensors are made whole again from their own
module's initialisation, then the parent's is applied over them, as on one device
(children first, then the parent, as ``PreTrainedModel.initialize_weights`` does).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from autopar.runtime.layout import ParamLayout

META = torch.device("meta")


def init_weights(model: nn.Module, layout: ParamLayout, seed: int, device: torch.device,
                 keep: Callable[[str], bool] | None = None, after_load: bool = False) -> None:
    """Initialise this rank's parameters and buffers of ``model`` (the rank's module tree
    of the original model) with the model's own scheme (module docstring). The scheme of a
    module is its ``reset_parameters()`` (``nn`` layers; ``_reset_parameters`` of
    ``nn.MultiheadAttention``), then, inside a Hugging Face model, the innermost
    ``PreTrainedModel``'s ``_init_weights(module)``: the order of the model's constructor
    and ``post_init``. A parameter tied to several modules is initialised by the first.
    A tensor that no scheme writes is an error naming it.

    ``keep``: only the tensors whose name it accepts are written (the others are made and
    dropped): after a load (``after_load``), what the load did not give (rotary
    ``inv_freq``, entries a checkpoint lacks). The random streams of the CPU and of every
    GPU are those of before when it returns."""
    keep = keep or (lambda name: True)
    gpu = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=gpu):  # the CPU's and the rank's GPU's streams put back
        _init_all(model, _Init(layout, seed, device, keep, after_load))


@dataclass(frozen=True)
class _Init:
    """What one :func:`init_weights` call initialises every module with: the rank's
    ``layout``, the user's ``seed``, the rank's ``device``, ``keep`` (the names of the
    tensors written) and ``after_load`` (what the error for a tensor no scheme writes advises)."""

    layout: ParamLayout
    seed: int
    device: torch.device
    keep: Callable[[str], bool]
    after_load: bool = False


def _init_all(model: nn.Module, init: _Init) -> None:
    layout, keep = init.layout, init.keep
    seen: set[int] = set()
    home: dict[int, tuple[str, nn.Module, object, str, str]] = {}  # tensor -> its first module
    for path, module, owner in _modules_children_first(model, "", None):
        own = _own_tensors(module, seen)
        for attr, store, t in own:
            home[id(t)] = (path, module, owner, attr, store)
        written = _written(module, owner, path, layout)
        below = [home[i] for i in written if i in home and home[i][1] is not module]
        wanted = [(_join(path, attr), t) for attr, _, t in own] + \
                 [(_join(p, attr), getattr(m, store)[attr]) for p, m, _, attr, store in below]
        if not any(layout.holds(name) and keep(name) for name, _ in wanted):
            continue  # nothing of it here (another pipeline stage's), or nothing to write
        _init_module(path, module, owner, own, below, init)


def _modules_children_first(module: nn.Module, path: str, owner):
    """``(path, module, init owner)`` for every module of the tree, children before their
    parent; the owner is the innermost module that initialises its descendants
    (a Hugging Face ``PreTrainedModel``: one with ``_init_weights`` and a ``config``)."""
    if callable(getattr(module, "_init_weights", None)) and hasattr(module, "config"):
        owner = module
    for name, child in module.named_children():
        yield from _modules_children_first(child, _join(path, name), owner)
    yield path, module, owner


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _own_tensors(module: nn.Module, seen: set[int]) -> list[tuple[str, str, torch.Tensor]]:
    """``(attribute, store, tensor)`` of the module's own parameters and buffers that no
    module visited before holds (a tied parameter is initialised by its first module)."""
    own = []
    for store in ("_parameters", "_buffers"):
        for attr, t in getattr(module, store).items():
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            own.append((attr, store, t))
    return own


def module_seed(seed: int, path: str) -> int:
    """The seed of the random stream a module is initialised from: a function of the
    user's ``seed`` and the module's path only (the same on every rank and plan)."""
    digest = hashlib.sha256(f"{seed}\x00{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _run_scheme(module: nn.Module, owner, seed: int | None, path: str, device: torch.device | None = None) -> None:
    """The module's own initialisation, from its own random stream: the CPU's and
    ``device``'s generators seeded (no other GPU's; ``seed`` None: no seeding, a dry run
    on meta tensors, which draw nothing)."""
    with torch.no_grad():
        if seed is not None:
            torch.default_generator.manual_seed(module_seed(seed, path))
            if device is not None and device.type == "cuda":
                index = device.index if device.index is not None else torch.cuda.current_device()
                torch.cuda.default_generators[index].manual_seed(module_seed(seed, path))
        reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
        if callable(reset):
            reset()
        if owner is not None:
            owner._init_weights(module)


def _written(module: nn.Module, owner, path: str, layout: ParamLayout) -> set[int]:
    """The ids of the tensors of ``module``'s subtree its initialisation writes: a dry run
    with every one of them swapped for a meta stand-in (no storage, no random numbers
    drawn), read off their version counters. A scheme that cannot run on meta tensors
    (it reads values) is taken to write the module's own tensors only."""
    stand_ins, swapped = {}, []
    for sub_path, sub in module.named_modules(prefix=path, remove_duplicate=False):
        for store_name in ("_parameters", "_buffers"):
            store = getattr(sub, store_name)
            for attr, t in list(store.items()):
                if t is None:
                    continue
                if id(t) not in stand_ins:  # at the full shape (a pipeline rank holds other stages' empty)
                    meta = torch.empty(_shape_of(layout, _join(sub_path, attr), t), dtype=t.dtype, device=META)
                    stand_ins[id(t)] = (nn.Parameter(meta, requires_grad=t.requires_grad)
                                        if isinstance(t, nn.Parameter) else meta, t)
                swapped.append((store, attr, t))
                store[attr] = stand_ins[id(t)][0]
    versions = {i: s._version for i, (s, _) in stand_ins.items()}
    try:
        _run_scheme(module, owner, None, path)
        return {i for i, (s, _) in stand_ins.items() if s._version != versions[i]}
    except Exception as exc:  # noqa: BLE001 - a scheme that reads values: its own tensors only
        own = {id(t) for _, _, t in _own(module)}
        split = [name for name, p in module.named_parameters(prefix=path, remove_duplicate=False)
                 if id(p) not in own and (layout.get(name) is not None and
                                          (layout.get(name).cut is not None or layout.get(name).zero is not None))]
        if split:  # whatever it draws into them would be the rank's part only
            raise NotImplementedError(
                f"init_weights: the initialisation of {path or 'the model'} ({type(module).__name__}) reads values "
                f"({type(exc).__name__}: {exc}), so which of its descendants' tensors it writes cannot be found, and "
                f"this plan splits some of them ({split[0]}); load the weights (pm.load_pretrained) instead") from exc
        return own
    finally:
        for store, attr, t in swapped:
            store[attr] = t


def _whole(module: nn.Module, path: str, tensors, layout: ParamLayout, device: torch.device,
           in_place: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """Whole tensors standing for ``tensors`` (``(attribute, store, tensor)`` of
    ``module``) on ``device``, swapped into the module; floating ones NaN, so that what
    no scheme writes shows. ``in_place``: a tensor whose name it accepts and that the
    rank holds whole is used itself (no second copy of it)."""
    whole = {}
    for attr, store, t in tensors:
        if in_place is not None and in_place(_join(path, attr)) and _held_whole(layout, _join(path, attr), t):
            value = t
        else:
            value = torch.empty(_shape_of(layout, _join(path, attr), t), dtype=t.dtype, device=device)
            value = nn.Parameter(value, requires_grad=t.requires_grad) if store == "_parameters" else value
        if value.is_floating_point() or value.is_complex():
            value.detach().fill_(float("nan"))
        whole[attr] = value
        getattr(module, store)[attr] = value
    return whole


def _held_whole(layout: ParamLayout, name: str, t: torch.Tensor) -> bool:
    """Whether the rank's tensor ``t`` is the whole tensor (not cut, not ZeRO's rows)."""
    placement = layout.get(name)
    whole = placement is None or (placement.held and placement.cut is None and placement.zero is None)
    return whole and t.device.type != "meta" and tuple(t.shape) == _shape_of(layout, name, t)


def _own(module: nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    """``(attribute, store, tensor)`` of every parameter and buffer registered on ``module``."""
    return [(attr, store, t) for store in ("_parameters", "_buffers") for attr, t in getattr(module, store).items()
            if t is not None]


def _init_module(path: str, module: nn.Module, owner, own, below, init: _Init) -> None:
    """Initialise ``module``'s ``own`` tensors whole, with the descendants' tensors it
    writes (``below``: their first module's path, module, owner, attribute, store) made
    whole from their own module's scheme first (all of that module's tensors made whole
    for it, so its scheme never draws into the rank's parts); keep the rank's part of
    each (those ``init.keep`` accepts)."""
    layout, seed, device, keep = init.layout, init.seed, init.device, init.keep
    children: dict[int, tuple] = {}
    for p, m, o, attr, store in below:
        children.setdefault(id(m), (p, m, o, []))[3].append((attr, store))
    restore = []
    try:
        wholes = []  # (name, whole tensor, rank's tensor)
        for p, m, o, written in children.values():  # each written descendant from its own scheme
            tensors = _own(m)
            restore.extend((m, store, attr, t) for attr, store, t in tensors)
            whole = _whole(m, p, tensors, layout, device)
            _run_scheme(m, o, seed, p, device)
            ranks = {attr: t for attr, _, t in tensors}
            wholes.extend((_join(p, attr), whole[attr], ranks[attr]) for attr, _ in written)
        restore.extend((module, store, attr, t) for attr, store, t in own)
        own_whole = _whole(module, path, own, layout, device, in_place=keep)
        versions = {attr: own_whole[attr]._version for attr, _, _ in own}
        _run_scheme(module, owner, seed, path, device)
    finally:
        for m, store, attr, t in restore:
            getattr(m, store)[attr] = t
    with torch.no_grad():
        for attr, store, t in own:
            name = _join(path, attr)
            if keep(name) and _unwritten(own_whole[attr], versions[attr]):
                kind, cls = "parameter" if store == "_parameters" else "buffer", type(module).__name__
                remedy = (f"the load did not give it (a non-persistent buffer is in no state dict): define "
                          f"reset_parameters() on {cls} computing it, or build the model with that buffer for real "
                          f"(only the parameters on the meta device)") if init.after_load else \
                    (f"define reset_parameters() on {cls}, or load the weights with pm.load_pretrained / "
                     f"pm.load_full_state_dict")
                raise NotImplementedError(
                    f"init_weights: {name} ({kind} of {cls}) is not initialised by the model's own scheme (no "
                    f"reset_parameters on {cls}, and no Hugging Face _init_weights covers it); {remedy}")
            wholes.append((name, own_whole[attr], t))
        for name, whole, t in wholes:
            if keep(name) and t.numel() and whole is not t:
                t.copy_(layout.local_part(name, whole.detach()))


def _shape_of(layout: ParamLayout, name: str, t: torch.Tensor) -> tuple[int, ...]:
    placement = layout.get(name)
    return tuple(placement.full_shape) if placement is not None else tuple(t.shape)


def _unwritten(value: torch.Tensor, version: int) -> bool:
    """Whether no initialisation wrote ``value``: NaN left (floating point), or its
    version counter unchanged (other dtypes)."""
    if value.is_floating_point() or value.is_complex():  # by pieces: no full-size mask
        flat = value.detach().reshape(-1)
        return any(bool(torch.isnan(flat[i:i + (1 << 22)]).any()) for i in range(0, flat.numel(), 1 << 22))
    return value._version == version


__all__ = ["init_weights", "module_seed"]
