"""Hugging Face safetensors checkpoints, read and written shard by shard.

    pm.load_pretrained("llama-dir")       # every rank reads only the boxes it holds
    pm.save_pretrained("out", max_shard_size="2GB")   # rank 0 writes, one tensor gathered at a time

:func:`load_pretrained` reads a directory holding ``model.safetensors``, or
``model.safetensors.index.json`` and the files it names (what ``transformers``'
``save_pretrained`` writes), or one ``.safetensors`` file. For each state-dict entry
it holds (:func:`autopar.engine.checkpoint.model_entries`), a rank reads the N-D boxes
of the full tensor its part covers (:mod:`autopar.engine.checkpoint_chunks`) with
``safe_open(...).get_slice(key)[box]``, copies each into the local tensor (cast to its
dtype) and scatters back what no view reaches: no full tensor of a split parameter is
read, and a rank's memory is its shards and one box. Which key feeds which entry:
:mod:`autopar.engine.pretrained_keys`. A directory with a ``.metadata`` file is an
autopar DCP checkpoint and goes to :func:`~autopar.engine.checkpoint.load_checkpoint`.

:func:`save_pretrained` gathers one tensor at a time (``ParamLayout.gather``, every rank
in the same order, as ``full_state_dict`` does); rank 0 keeps them until the next would
pass ``max_shard_size`` and writes them as one file under a temporary name. At the end
one file becomes ``model.safetensors``, several ``model-0000k-of-0000n.safetensors``
with ``model.safetensors.index.json``; the files of an earlier save those names do not
reuse are removed. A ``PreTrainedModel``'s ``config.json`` (and
``generation_config.json``) is written beside them.

Both are collectives over the default group and agree: when a rank fails, every rank
raises (its own error, or a :class:`~autopar.engine.checkpoint.CheckpointError` naming
the rank that failed and its error).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import warnings
from typing import Optional

import torch
import torch.distributed as dist

from autopar.runtime import devices, health, state_hooks
from autopar.engine.checkpoint import CheckpointError, Entry, load_checkpoint, model_entries
from autopar.engine.checkpoint_chunks import local_chunks, scatter_back
from autopar.runtime.groups import use_groups
from autopar.engine.pretrained_keys import KeyMatch, is_pretrained_model, match_keys, saved_names

log = logging.getLogger("autopar.engine.pretrained")

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHARD = "model-{:05d}-of-{:05d}.safetensors"
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
_FEW = 5


# ---------------------------------------------------------------------------- loading
@health.guarded("load_pretrained()")
def load_pretrained(pm, path: str | os.PathLike, *, strict: bool = True,
                    key_mapping: Optional[dict[str, str]] = None) -> None:
    """Load the safetensors checkpoint at ``path`` into ``pm``, each rank reading only
    what it holds (module docstring). ``strict``: a key the checkpoint lacks or one it
    holds for no entry is an error (else a warning; a missing entry keeps its value, or, in a model compiled from the meta
    device, gets the model's own initialisation).
    ``key_mapping``: regular expression -> replacement, applied to the checkpoint's keys
    before matching (as ``from_pretrained``'s). A collective: every rank calls it."""
    where = os.fspath(path)
    if os.path.isfile(os.path.join(where, ".metadata")):
        load_checkpoint(pm, where)
        return
    state_hooks.refuse_hooks(pm.root.model, "load_pretrained",
                             "read the files with safetensors.torch.load_file and give them to "
                             "pm.load_full_state_dict, which runs the hooks on whole tensors")
    error, loaded = None, None
    try:
        loaded = _load_safetensors(pm, where, strict, key_mapping)
    except Exception as exc:  # noqa: BLE001 - every rank raises, after agreeing (_agree)
        error = exc
    _agree(pm, error, "load_pretrained")
    # what the checkpoint did not hold (missing entries under strict=False, keys the
    # model lists as ignorable, non-persistent buffers) is initialised by the model's
    # own scheme where it never had a value (a model compiled from the meta device)
    pm._mark_initialised(loaded)


def checkpoint_files(where: str) -> tuple[list[str], Optional[dict[str, str]]]:
    """The safetensors files of the checkpoint at ``where``, and the index's
    ``weight_map`` (key -> file name) when it has one."""
    if os.path.isfile(where):
        if not where.endswith(".safetensors"):
            raise CheckpointError(f"load_pretrained: {where!r} is not a .safetensors file; give a directory that "
                                  f"save_pretrained wrote, or a .safetensors file")
        return [where], None
    if not os.path.isdir(where):
        raise FileNotFoundError(f"load_pretrained: no checkpoint at {where!r} (the path does not exist)")
    index = os.path.join(where, INDEX)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"load_pretrained: {index!r} has no weight_map")
        files = sorted(set(weight_map.values()))
        absent = [f for f in files if not os.path.isfile(os.path.join(where, f))]
        if absent:
            raise FileNotFoundError(f"load_pretrained: {index!r} names {len(absent)} file(s) that are not in "
                                    f"{where!r}: {', '.join(absent[:_FEW])}")
        return [os.path.join(where, f) for f in files], weight_map
    if os.path.isfile(os.path.join(where, SINGLE)):
        return [os.path.join(where, SINGLE)], None
    found = sorted(os.listdir(where))
    raise FileNotFoundError(f"load_pretrained: {where!r} holds neither {SINGLE} nor {INDEX} (it holds "
                            f"{', '.join(found[:8]) or 'nothing'}{', …' if len(found) > 8 else ''})")


def _load_safetensors(pm, where: str, strict: bool, key_mapping) -> None:
    from safetensors import safe_open
    files, weight_map = checkpoint_files(where)
    entries = model_entries(pm)
    with contextlib.ExitStack() as stack:
        handles = {f: stack.enter_context(safe_open(f, framework="pt", device="cpu")) for f in files}
        stored: dict[str, str] = {}  # key -> file
        for file, handle in handles.items():
            for key in handle.keys():
                stored.setdefault(key, file)
        if weight_map is not None:
            _check_index(weight_map, stored, where)
        match = match_keys(pm.root.model, list(entries), _tied(pm, entries), stored, key_mapping)
        _report_keys(match, where, strict)
        sources = {name: (key, stored[key], handles[stored[key]]) for name, key in match.sources.items()}
        _check_shapes(entries, sources)
        read = _read_boxes(entries, sources)
    log.info("rank %d read %d boxes (%d elements) of %d files at %s", pm.rank, read[0], read[1], len(files), where)
    return set(sources)


def _tied(pm, entries: dict[str, Entry]) -> dict[str, tuple[str, ...]]:
    """name -> every name of its parameter (several for a tied one), from the layout."""
    out = {}
    for name in entries:
        placement = pm.layout.get(name)
        if placement is not None and len(placement.names) > 1:
            out[name] = placement.names
    return out


def _check_index(weight_map: dict[str, str], stored: dict[str, str], where: str) -> None:
    lost = [k for k, f in weight_map.items() if os.path.basename(stored.get(k, "")) != f]
    if lost:
        raise CheckpointError(f"load_pretrained: {os.path.join(where, INDEX)!r} places {len(lost)} key(s) in files "
                              f"that do not hold them: {', '.join(f'{k} in {weight_map[k]}' for k in lost[:_FEW])}")


def _report_keys(match: KeyMatch, where: str, strict: bool) -> None:
    if match.converted:
        shown = ", ".join(f"{k} (-> {v})" for k, v in list(match.converted.items())[:_FEW])
        raise CheckpointError(f"load_pretrained: the checkpoint at {where!r} holds {len(match.converted)} key(s) that "
                              f"transformers converts (merges or splits) on loading, which load_pretrained does not: "
                              f"{shown}; load it with from_pretrained and compile that model, or save it again with "
                              f"transformers first")
    problems = []
    if match.missing:
        problems.append(f"missing {_few(match.missing)}")
    if match.unexpected:
        problems.append(f"unexpected {_few(match.unexpected)}")
    if not problems:
        return
    message = (f"load_pretrained: the checkpoint at {where!r} does not fit this model: {'; '.join(problems)} "
               f"(the model's names are those of pm.full_state_dict())")
    if strict:
        raise CheckpointError(message + "; pass strict=False to load what fits")
    warnings.warn(message + ("; the missing entries keep their values (the model's own initialisation where "
                             "they had none)" if match.missing else ""),
                  stacklevel=_outside_autopar())


def _outside_autopar() -> int:
    """The ``stacklevel`` of the first caller outside autopar (a warning's line is the user's)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _few(keys: list[str]) -> str:
    return f"{len(keys)} key(s): {', '.join(keys[:_FEW])}{', …' if len(keys) > _FEW else ''}"


def _check_shapes(entries: dict[str, Entry], sources: dict) -> None:
    """Every key's stored shape is its entry's full shape (checked on every rank, held or not)."""
    for name, (key, file, handle) in sources.items():
        shape = tuple(handle.get_slice(key).get_shape())
        if shape != tuple(entries[name].full_shape):
            raise CheckpointError(f"load_pretrained: {key} in {file!r} has shape {list(shape)}, the model's {name} "
                                  f"is {list(entries[name].full_shape)}; load a checkpoint of the same "
                                  f"configuration")


def _read_boxes(entries: dict[str, Entry], sources: dict) -> tuple[int, int]:
    """Read every box this rank holds into its local tensors; ``(boxes, elements)`` read."""
    done: set[int] = set()  # tied names share one local tensor: read it once
    cache: dict = {}
    boxes = elements = 0
    with torch.no_grad():
        for name, entry in entries.items():
            if entry.local is None or name not in sources or id(entry.local) in done:
                continue
            done.add(id(entry.local))
            key, _, handle = sources[name]
            chunks = local_chunks(entry.local, entry.full_shape, entry.cut, cache, entry.key)
            if not entry.full_shape:  # a scalar: no slice to take
                for chunk in chunks:
                    chunk.data.copy_(handle.get_tensor(key))
            else:
                stored = handle.get_slice(key)
                for chunk in chunks:
                    chunk.data.copy_(stored[tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))])
                    boxes, elements = boxes + 1, elements + chunk.data.numel()
            scatter_back(chunks, entry.local)
    return boxes, elements


# ---------------------------------------------------------------------------- agreeing
def _agree(pm, error: Optional[BaseException], what: str) -> None:
    """Every rank learns whether any failed (an all-reduce of the first failing rank), and
    raises if one did: its own error, or the first failing rank's, broadcast. Without a
    process group: raise ``error``."""
    if not (dist.is_available() and dist.is_initialized()):
        if error is not None:
            raise error
        return
    world, rank = dist.get_world_size(), dist.get_rank()
    device = devices.wire_device(pm._state.device)
    first = torch.tensor([rank if error is not None else world], dtype=torch.int64, device=device)
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    first = int(first.item())
    if first == world:
        return
    message = [f"{type(error).__name__}: {error}" if rank == first else None]
    dist.broadcast_object_list(message, src=first, device=device)
    if error is not None:
        raise error
    raise CheckpointError(f"{what}: rank {first} failed: {message[0]}")


# ---------------------------------------------------------------------------- saving
@health.guarded("save_pretrained()")
def save_pretrained(pm, path: str | os.PathLike, *, max_shard_size: int | str = "5GB") -> None:
    """Write ``pm``'s state dict as a safetensors checkpoint at the directory ``path``
    (module docstring): full tensors, the original model's names, each tied parameter
    once; files of at most ``max_shard_size`` (bytes, or a string such as ``"500MB"``,
    ``"2GiB"``; a larger tensor gets a file of its own). A collective: every rank calls
    it, each returns when rank 0 has written everything."""
    where = os.fspath(path)
    limit = shard_bytes(max_shard_size)
    model = pm.root.model
    state_hooks.refuse_hooks(model, "save_pretrained", "write pm.full_state_dict(), which runs the hooks on "
                                                       "whole tensors, with safetensors.torch.save_file")
    state = model.state_dict(keep_vars=True)
    names = set(saved_names(model, list(state), _tied(pm, state)))
    writer, error = None, None
    if not dist.is_initialized() or dist.get_rank() == 0:
        try:
            writer = ShardWriter(where, limit)
        except Exception as exc:  # noqa: BLE001 - the gathers go on: every rank takes part in each
            error = exc
    with use_groups(pm.process_groups), torch.no_grad():
        for name, value in state.items():
            if name not in names:
                continue
            full = pm.layout.gather(name, value, value)
            if writer is not None and error is None:
                try:
                    writer.add(name, full)
                except Exception as exc:  # noqa: BLE001
                    error = exc
            del full
    if writer is not None and error is None:
        try:
            writer.finish()
            _save_configs(model, where)
        except Exception as exc:  # noqa: BLE001
            error = exc
    if writer is not None and error is not None:
        writer.abandon()
    _agree(pm, error, "save_pretrained")


def shard_bytes(size: int | str) -> int:
    """``max_shard_size`` in bytes: an int, or a number and a unit (``"5GB"`` is 5·10⁹,
    ``"5GiB"`` 5·2³⁰; ``KB``/``MB``/``GB``/``TB`` and ``KiB``/``MiB``/``GiB``/``TiB``; a
    lower-case ``b`` after a decimal unit means bits, as in transformers)."""
    if isinstance(size, int) and not isinstance(size, bool):
        if size <= 0:
            raise ValueError(f"save_pretrained: max_shard_size must be positive, not {size}")
        return size
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)([Bb]?)\s*", str(size), re.IGNORECASE)
    if found is None or (not found.group(2) and not found.group(4)):
        raise ValueError(f"save_pretrained: max_shard_size {size!r} is neither a number of bytes nor a size such as "
                         f"'5GB', '500MB' or '2GiB'")
    number, unit, binary, b = found.groups()
    power = "KMGT".find(unit.upper()) + 1
    value = float(number) * ((1024 if binary else 1000) ** power)
    if b == "b" and not binary and unit:
        value /= 8
    if int(value) <= 0:
        raise ValueError(f"save_pretrained: max_shard_size must be positive, not {size!r}")
    return int(value)


class ShardWriter:
    """Rank 0's side of :func:`save_pretrained`: full tensors come in one at a time and
    leave as files of at most ``limit`` bytes, under temporary names until
    :meth:`finish` knows how many there are."""

    def __init__(self, directory: str, limit: int):
        os.makedirs(directory, exist_ok=True)
        self.directory, self.limit = directory, limit
        self.pending: dict[str, torch.Tensor] = {}
        self.size = 0
        self.written: list[tuple[str, list[str]]] = []  # (temporary path, its keys)
        self.total = 0
        self.parameters = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.size + size > self.limit:
            self._flush()
        self.pending[name] = tensor.detach().to("cpu").contiguous()
        self.size += size
        self.total += size
        self.parameters += tensor.numel()

    def _flush(self) -> None:
        from safetensors.torch import save_file
        path = os.path.join(self.directory, f".model-{len(self.written) + 1:05d}.{os.getpid()}.safetensors.tmp")
        save_file(self.pending, path, metadata={"format": "pt"})
        _sync(path)
        self.written.append((path, list(self.pending)))
        self.pending, self.size = {}, 0

    def finish(self) -> list[str]:
        """Write what is left, give the files their names (and the index), remove the
        files of an earlier save these do not replace; the names written."""
        if self.pending or not self.written:
            self._flush()
        count = len(self.written)
        if count == 1:
            final = [SINGLE]
        else:
            final = [SHARD.format(k + 1, count) for k in range(count)]
        for (path, _), name in zip(self.written, final):
            os.replace(path, os.path.join(self.directory, name))
        if count > 1:
            index = {"metadata": {"total_parameters": self.parameters, "total_size": self.total},
                     "weight_map": {k: name for (_, keys), name in zip(self.written, final) for k in keys}}
            _write_text(os.path.join(self.directory, INDEX), json.dumps(index, indent=2, sort_keys=True) + "\n")
        for stale in os.listdir(self.directory):
            if stale not in final and (_SHARD_RE.match(stale) or stale == SINGLE or (stale == INDEX and count == 1)):
                os.remove(os.path.join(self.directory, stale))
        return final


    def abandon(self) -> None:
        """Remove the files written under temporary names (a save that failed)."""
        for path, _ in self.written:
            with contextlib.suppress(OSError):
                os.remove(path)
        self.written, self.pending = [], {}


def _sync(path: str) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _write_text(path: str, text: str) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def _save_configs(model, where: str) -> None:
    """A ``PreTrainedModel``'s ``config.json`` (with its class and dtype, as transformers
    writes them) and, for a model that generates, ``generation_config.json``."""
    if not is_pretrained_model(model):
        return
    config = model.config
    config.architectures = [type(model).__name__]
    config.dtype = str(model.dtype).split(".")[1]
    config.save_pretrained(where)
    generation = getattr(model, "generation_config", None)
    if generation is not None and model.can_generate():
        generation.save_pretrained(where)
