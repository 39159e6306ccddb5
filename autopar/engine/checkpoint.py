"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP) that survive a change of plan.

    autopar.save_checkpoint(pm, "ckpt/step100", optimizer)    # every rank calls it
    autopar.load_checkpoint(pm2, "ckpt/step100", optimizer2)  # any plan, any world size

A checkpoint is a DCP directory whose keys are the original model's names at their full
shapes, so it does not depend on the plan that wrote it:

* ``model.<name>``: every entry of the model's state dict (``pm.full_state_dict()``'s keys);
* ``optim.<name>.<state>``: the optimizer's state of parameter ``<name>`` (AdamW's
  ``exp_avg``, ``exp_avg_sq``, ``step``): a tensor shaped like the parameter has its full
  shape and is split as the parameter is, any other value is stored as it is;
* ``optim.param_groups.<i>.<hyperparameter>``: the optimizer's hyperparameters
  (``lr``, ``betas``, ...) of group ``i``.

Each rank writes only what it holds, never gathering a full tensor; what it holds, the
cut and whether its copy is current are read off the module's parameter layout
(``pm.layout``, :mod:`autopar.runtime.layout`). The cut that the runtime applies to a full parameter (Megatron's blocks, the 3D grid's block and flat z
piece, Bian's diagonal vectors) is applied to ``arange(numel).view(full_shape)``; the
global indices this rank holds are then covered by N-D boxes of the full tensor, found
from the set of indices alone (runs along the last dimension, merged dimension by
dimension where they line up), so ranks that hold the same elements (data-parallel
replicas, tied weights on two pipeline stages) describe them with the same boxes and
DCP's deduplication keeps one copy of each. A box is a strided view of the local tensor
when its elements lie at regular steps there (always, for autopar's layouts); otherwise it
is copied out for saving and scattered back after loading
(:mod:`autopar.engine.checkpoint_chunks`). Ranks whose copy is stale write nothing: a
D&SP branch's parameters off its sub-grid, parameters another pipeline stage holds. Loading reads, for the boxes of the new layout, whatever stored chunks
overlap them: DCP does the resharding.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from autopar.runtime import state_hooks
from autopar.engine.checkpoint_chunks import ChunkedTensor, local_chunks, scatter_back

log = logging.getLogger("autopar.engine.checkpoint")

MODEL, OPTIM = "model.", "optim."
PARAM_GROUPS = "optim.param_groups"
SYNC_FILES = True  # fsync each file before the save returns (a power cut, not only a dead process, spares it)


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model or optimizer it is loaded into."""




# ---------------------------------------------------------------------------- what a rank holds
@dataclass
class Entry:
    """One key of the checkpoint on this rank: the local tensor (None: holds none of it),
    the full shape, the cut from full to local (None: the whole tensor), whether this
    rank's copy is current (writes it), and what identifies the cut (its shard)."""

    local: Optional[torch.Tensor]
    full_shape: tuple[int, ...]
    cut: Optional[Callable] = None
    current: bool = True
    key: Any = None
    chunks: list = field(default_factory=list)

    def chunked(self, cache: dict, for_load: bool = False) -> Optional[ChunkedTensor]:
        """What DCP is handed (None: nothing on this rank); the chunks stay in ``self.chunks``."""
        if self.local is None or (not for_load and not self.current):
            return None
        self.chunks = local_chunks(self.local, self.full_shape, self.cut, cache, self.key)
        if not self.chunks:
            return None
        return ChunkedTensor(self.full_shape, self.local.dtype, self.local.device, self.chunks)


def model_entries(pm) -> dict[str, Entry]:
    """``name -> Entry`` for every entry of the model's state dict on this rank, from the
    module's :class:`~autopar.runtime.layout.ParamLayout` (``pm.layout``): each parameter's cut,
    whether this rank holds it (a pipeline's other stages) and whether its copy is
    current (a D&SP branch on another sub-grid). Buffers are whole on every rank."""
    layout = pm.layout
    out = {}
    for name, value in state_hooks.plain_state(pm.root.model).items():   # by the layout's names
        placement = layout.get(name)
        if placement is None:   # a buffer: whole; current where it has no home or at its home
            out[name] = Entry(value, tuple(value.shape), None, layout.buffer_current(name))
        elif not placement.held:
            out[name] = Entry(None, placement.full_shape)
        elif placement.cut is None and placement.zero is None:
            out[name] = Entry(value, tuple(value.shape), None, layout.current(placement))
        else:  # a family's cut, and under ZeRO the data rank's rows of it
            out[name] = Entry(value, placement.full_shape, _cut(layout, name), layout.current(placement),
                              (placement.cut, placement.zero))
    return out


def _cut(layout, name: str) -> Callable:
    return lambda full: layout.local_part(name, full)


def _parameter_names(pm, entries: dict[str, Entry], optimizer) -> dict[int, str]:
    """The model name of each parameter the optimizer steps (the first, for tied ones)."""
    names: dict[int, str] = {}
    for name, entry in entries.items():
        if entry.local is not None:
            names.setdefault(id(entry.local), name)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise CheckpointError(f"the optimizer steps a tensor of shape {list(p.shape)} that is not a "
                                      f"parameter of the compiled model; build it over pm.parameters()")
    return names


def _state_entry(fqn: str, value: torch.Tensor, param_entry: Entry) -> Entry:
    """A state tensor shaped like its parameter is split as the parameter; others are whole."""
    if value.shape == param_entry.local.shape:
        return Entry(value, param_entry.full_shape, param_entry.cut, param_entry.current, param_entry.key)
    _check_whole_state(fqn, tuple(value.shape), param_entry)
    return Entry(value, tuple(value.shape), None, param_entry.current)


def _check_whole_state(fqn: str, shape: tuple[int, ...], param_entry: Entry) -> None:
    """Only scalars (a step count) can stand whole beside a split parameter: the split
    parameter's other state differs from rank to rank in ways no full shape describes."""
    if param_entry.cut is not None and shape:
        raise CheckpointError(f"{fqn}: optimizer state of shape {list(shape)} for a parameter split into "
                              f"{list(param_entry.local.shape)} of {list(param_entry.full_shape)}; only state "
                              f"shaped like the parameter (or scalars) can be checkpointed independently of the plan")


# ---------------------------------------------------------------------------- save and load
def save_checkpoint(pm, path: str | os.PathLike, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
    """Write ``pm``'s parameters and buffers (and ``optimizer``'s state) to the DCP directory
    ``path``, each rank its own chunks (see the module docstring for the format). A
    collective: every rank of the model calls it with the same ``path``."""
    write_state(saved_state(pm, optimizer), path, pm.rank)


def saved_state(pm, optimizer: Optional[torch.optim.Optimizer] = None) -> dict[str, Any]:
    """The DCP state dict :func:`save_checkpoint` writes: this rank's chunks of every
    entry (views of the live tensors) and the optimizer's other values."""
    pm._check_initialised("save_checkpoint()")
    entries = model_entries(pm)
    state: dict[str, Any] = {}
    cache: dict = {}  # placements, shared by a parameter and its optimizer state
    for name, entry in entries.items():
        chunked = entry.chunked(cache)
        if chunked is not None:
            state[MODEL + name] = chunked
    if optimizer is not None:
        names = _parameter_names(pm, entries, optimizer)
        for p, values in optimizer.state.items():
            entry = entries[names[id(p)]]
            if not entry.current:
                continue
            for key, value in values.items():
                fqn = f"{OPTIM}{names[id(p)]}.{key}"
                if isinstance(value, torch.Tensor):
                    chunked = _state_entry(fqn, value, entry).chunked(cache)
                    if chunked is not None:
                        state[fqn] = chunked
                else:
                    state[fqn] = value
        for i, group in enumerate(optimizer.param_groups):
            state.update((f"{PARAM_GROUPS}.{i}.{k}", v) for k, v in group.items() if k != "params")
    return state


def staged(state: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """A copy of ``state`` in host memory, detached from the live tensors (what an
    asynchronous save writes while training goes on), and its bytes."""
    out, nbytes = {}, 0
    for key, value in state.items():
        if isinstance(value, ChunkedTensor):
            chunks = [dataclasses.replace(c, data=c.data.detach().to("cpu", copy=True),
                                          scatter=None if c.scatter is None else c.scatter.to("cpu", copy=True))
                      for c in value.chunks]
            nbytes += sum(c.data.numel() * c.data.element_size() for c in chunks)
            out[key] = ChunkedTensor(value.shape, value.dtype, torch.device("cpu"), chunks)
        elif isinstance(value, torch.Tensor):
            out[key] = value.detach().to("cpu", copy=True)
            nbytes += value.numel() * value.element_size()
        else:
            out[key] = copy.deepcopy(value)
    return out, nbytes


def write_state(state: dict[str, Any], path: str | os.PathLike, rank: int, process_group=None) -> None:
    """Write a state of :func:`saved_state` (or :func:`staged`) to the DCP directory
    ``path`` (a collective over ``process_group``, the default group without one)."""
    import torch.distributed.checkpoint as dcp
    with _quiet_without_process_group():
        dcp.save(state, storage_writer=dcp.FileSystemWriter(os.fspath(path), sync_files=SYNC_FILES),
                 process_group=process_group, no_dist=not _distributed())
    log.info("saved %d keys (%d chunks) of rank %d to %s", len(state),
             sum(len(v.chunks) for v in state.values() if isinstance(v, ChunkedTensor)), rank, path)


def load_checkpoint(pm, path: str | os.PathLike, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
    """Load the checkpoint at ``path`` into ``pm`` (and ``optimizer``, whose state is
    replaced by the checkpoint's) whatever plan and world size wrote it. Each rank reads
    the parts of the stored chunks that overlap what it holds. A collective: every rank
    of the model calls it."""
    import torch.distributed.checkpoint as dcp
    metadata = read_metadata(path)
    stored = metadata.state_dict_metadata
    entries = model_entries(pm)
    _check_model_keys(entries, stored, path)
    loading = _Loading()
    state = loading.state
    for name, entry in entries.items():
        chunked = entry.chunked(loading.cache, for_load=True)
        if chunked is not None:
            state[MODEL + name] = chunked
            loading.targets.append((entry, entry.local))
    new_states: dict[int, dict[str, Any]] = {}
    if optimizer is not None:
        hyperparameters = [k for k in stored if k.startswith(PARAM_GROUPS + ".")]
        if not hyperparameters:
            raise CheckpointError(f"the checkpoint at {os.fspath(path)!r} holds no optimizer state (it was saved "
                                  f"without optimizer=); load it without optimizer=, or save one with it")
        state.update((k, None) for k in hyperparameters)  # DCP puts the stored values here
        names = _parameter_names(pm, entries, optimizer)
        by_parameter: dict[str, dict] = defaultdict(dict)  # name -> {state key: its metadata}
        for fqn, md in stored.items():
            if fqn.startswith(OPTIM) and not fqn.startswith(PARAM_GROUPS + "."):
                name, _, key = fqn[len(OPTIM):].rpartition(".")
                by_parameter[name][key] = md
        for group in optimizer.param_groups:
            for p in group["params"]:
                entry = entries[names[id(p)]]
                # a parameter whose copy here is not current (a D&SP branch off its sub-grid)
                # is not stepped here: it keeps no state, as before the save
                new_states[id(p)] = _optimizer_targets(p, names[id(p)], entry, group, optimizer.state.get(p, {}),
                                                       by_parameter[names[id(p)]], loading) if entry.current else {}
    with _quiet_without_process_group():
        dcp.load(state, storage_reader=dcp.FileSystemReader(os.fspath(path)), no_dist=not _distributed())
    with torch.no_grad():
        for entry, local in loading.targets:
            scatter_back(entry.chunks, local)
    pm._mark_initialised()  # a model compiled from the meta device may run now
    if optimizer is not None:
        _restore_optimizer(optimizer, new_states, state, path)
    log.info("loaded %d keys into rank %d from %s", len(state), pm.rank, path)


@dataclass(frozen=True)
class _Loading:
    """What one :func:`load_checkpoint` gathers before DCP reads: ``state`` (key -> where
    DCP loads it), ``targets`` (``(entry, tensor)``: scattered back into the tensor after
    the read) and ``cache`` (placements, shared by a parameter and its optimizer state)."""

    state: dict[str, Any] = field(default_factory=dict)
    targets: list[tuple[Entry, torch.Tensor]] = field(default_factory=list)
    cache: dict = field(default_factory=dict)


def _optimizer_targets(p, name: str, entry: Entry, group: dict, current: dict, stored: dict,
                       loading: _Loading) -> dict[str, Any]:
    """The state tensors of ``p`` to load the checkpoint's ``optim.<name>.<key>`` (``stored``:
    key -> metadata) into: the optimizer's own where they fit, new ones otherwise. They
    join ``loading``'s ``state`` (what DCP loads) and ``targets`` (what is scattered back)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    state = loading.state
    out: dict[str, Any] = {}
    for key, md in stored.items():
        fqn = f"{OPTIM}{name}.{key}"
        if not isinstance(md, TensorStorageMetadata):
            state[fqn] = None  # DCP puts the stored object here
            out[key] = _Stored(fqn)
            continue
        like_param = tuple(md.size) == entry.full_shape and entry.local is not None
        if not like_param and entry.local is not None:
            _check_whole_state(fqn, tuple(md.size), entry)
        shape = tuple(entry.local.shape) if like_param else tuple(md.size)
        on_param_device = like_param or key != "step" or group.get("capturable") or group.get("fused")
        device = p.device if on_param_device else torch.device("cpu")
        value = current.get(key)
        if not (isinstance(value, torch.Tensor) and tuple(value.shape) == shape
                and value.dtype == md.properties.dtype and value.device == device):
            value = torch.zeros(shape, dtype=md.properties.dtype, device=device)
        out[key] = value
        sub = Entry(value, entry.full_shape, entry.cut, key=entry.key) if like_param else Entry(value, shape)
        chunked = sub.chunked(loading.cache, for_load=True)
        if chunked is not None:
            state[fqn] = chunked
            loading.targets.append((sub, value))
    return out


@dataclass(frozen=True)
class _Stored:
    """A non-tensor state value, found in DCP's state dict under ``fqn`` after loading."""

    fqn: str


def _restore_optimizer(optimizer, new_states: dict, state: dict, path) -> None:
    groups: dict[int, dict] = defaultdict(dict)
    for fqn, value in state.items():
        if fqn.startswith(PARAM_GROUPS + "."):
            index, key = fqn[len(PARAM_GROUPS) + 1:].split(".", 1)
            groups[int(index)][key] = value
    if len(groups) != len(optimizer.param_groups):
        raise CheckpointError(f"the checkpoint at {os.fspath(path)} has {len(groups)} optimizer parameter group(s), "
                              f"the optimizer {len(optimizer.param_groups)}; build the optimizer with the same groups")
    for i, group in enumerate(optimizer.param_groups):
        group.update(groups[i])
    optimizer.state.clear()
    for group in optimizer.param_groups:
        for p in group["params"]:
            values = {k: (state[v.fqn] if isinstance(v, _Stored) else v) for k, v in new_states[id(p)].items()}
            if values:
                optimizer.state[p] = values


def read_metadata(path):
    """The DCP metadata of the checkpoint at ``path`` (a clear error when there is none)."""
    import torch.distributed.checkpoint as dcp
    where = os.fspath(path)
    if not os.path.isfile(os.path.join(where, ".metadata")):
        what = "is not a directory" if not os.path.isdir(where) else "has no .metadata file"
        raise FileNotFoundError(f"load_checkpoint: no checkpoint at {where!r} (the path {what}); give the "
                                f"directory that save_checkpoint wrote")
    return dcp.FileSystemReader(where).read_metadata()


def _check_model_keys(entries: dict[str, Entry], stored: dict, path) -> None:
    """Every model key stored at its full shape, and nothing else stored under ``model.``."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    where = os.fspath(path)
    saved = {k[len(MODEL):]: md for k, md in stored.items() if k.startswith(MODEL)}
    missing = [k for k in entries if k not in saved]
    unexpected = [k for k in saved if k not in entries]
    if missing or unexpected:
        raise CheckpointError(
            f"the checkpoint at {where!r} does not fit this model: "
            + (f"missing {_few(missing)}" if missing else "")
            + ("; " if missing and unexpected else "")
            + (f"unexpected {_few(unexpected)}" if unexpected else "")
            + "; load a checkpoint saved from the same model (the names of pm.full_state_dict())")
    for name, entry in entries.items():
        md = saved[name]
        size = tuple(md.size) if isinstance(md, TensorStorageMetadata) else None
        if size != entry.full_shape:
            raise CheckpointError(f"{MODEL}{name}: the checkpoint at {where!r} holds shape "
                                  f"{list(size) if size is not None else 'a non-tensor'}, the model's is "
                                  f"{list(entry.full_shape)}; build the model with the configuration it was saved "
                                  f"with")


def _few(keys: list[str]) -> str:
    shown = ", ".join(MODEL + k for k in keys[:5])
    return f"{len(keys)} key(s): {shown}{', …' if len(keys) > 5 else ''}"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _quiet_without_process_group():
    """DCP warns that it runs in one process when there is no process group: that is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
