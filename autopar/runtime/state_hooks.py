"""A model's own state-dict hooks, run on full tensors.

A module may rename or reshape its state on the way out and in: torchtitan's fused Q/K/V
projection saves its ``wqkv`` weight as ``wq``, ``wk`` and ``wv`` (a state-dict hook) and
merges them again on load (a load pre-hook). On a rank those hooks would see the rank's
part of each tensor. :meth:`~autopar.engine.module.ParallelModule.full_state_dict` and
``load_full_state_dict`` therefore gather each parameter and buffer by the model's own
names, put the full tensors in the model's place for the length of one ``state_dict()``
or ``load_state_dict()`` call (:func:`full_tensors_in_place`), and keep each rank's part
of what the hooks loaded. A model without such hooks takes the direct path.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn as nn


def has_save_hooks(model: nn.Module) -> bool:
    """Whether a module of ``model`` changes its state dict on the way out."""
    return any(m._state_dict_hooks or m._state_dict_pre_hooks for m in model.modules())


def has_load_hooks(model: nn.Module) -> bool:
    """Whether a module of ``model`` changes a state dict on the way in."""
    return any(m._load_state_dict_pre_hooks or m._load_state_dict_post_hooks for m in model.modules())


def own_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``model`` by its own qualified name (tied ones under
    each name), as the layout knows them."""
    return {**dict(model.named_parameters(remove_duplicate=False)),
            **dict(model.named_buffers(remove_duplicate=False))}


def plain_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict(keep_vars=True)`` without the modules' hooks: every parameter
    and persistent buffer under each of its names, as the layout knows them (what
    autopar's own checkpoints hold: they load back into the same model)."""
    out: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = prefix + "." if prefix else ""
        for name, param in module._parameters.items():
            if param is not None:
                out[dot + name] = param
        for name, buffer in module._buffers.items():
            if buffer is not None and name not in module._non_persistent_buffers_set:
                out[dot + name] = buffer
    return out


def refuse_hooks(model: nn.Module, call: str, instead: str) -> None:
    """A clear error where ``call`` reads or writes files by slices under the names of
    ``model.state_dict()`` and a module's save hooks change those names or tensors (a
    load hook that only renames legacy keys, as Hugging Face's Mamba has, changes nothing
    here)."""
    hooked = sorted({type(m).__name__ for m in model.modules() if m._state_dict_hooks or m._state_dict_pre_hooks})
    if hooked:
        raise NotImplementedError(f"{call}: the model's modules {hooked} change its state dict on save "
                                  f"(state-dict hooks), which {call} cannot run on the slices it reads and writes; "
                                  f"{instead}")


@contextlib.contextmanager
def full_tensors_in_place(model: nn.Module, full: dict[str, torch.Tensor]) -> Iterator[None]:
    """``model`` holding ``full[name]`` in place of each parameter's data and each buffer
    while the block runs; the rank's own tensors back afterwards, whatever happens."""
    restore: list = []   # what puts each swapped tensor back
    try:
        done: set[int] = set()
        for name, value in full.items():
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner) if owner else model
            if leaf in module._parameters:
                param = module._parameters[leaf]
                if id(param) not in done:   # a tied parameter is swapped once
                    done.add(id(param))
                    restore.append(lambda param=param, data=param.data: setattr(param, "data", data))
                    param.data = value.detach()
            elif leaf in module._buffers:
                restore.append(lambda module=module, leaf=leaf, old=module._buffers[leaf]:
                               module._buffers.__setitem__(leaf, old))
                module._buffers[leaf] = value.detach()
        yield
    finally:
        for undo in reversed(restore):
            undo()
