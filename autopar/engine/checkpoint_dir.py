"""A directory of step checkpoints, each complete or absent, and resuming from the latest.

    autopar.save_checkpoint(pm, "ckpt", optimizer, step=step, extra={"data": pos},
                            scheduler=scheduler, keep=3)
    found = autopar.resume(pm, "ckpt", optimizer, scheduler=scheduler)  # None, or (step, extra)

With ``step=`` the path is a directory holding one entry per saved step,
``step_<8 digits>``. An entry is written under a hidden name, ``.partial-step_<8 digits>``:
every rank's DCP shards and the coordinator's metadata
(:func:`autopar.engine.checkpoint.save_checkpoint`), each rank's random streams
(``rank<r>.rng``: the state of autopar's random draws, :mod:`autopar.runtime.rng`, and
torch's default generator), and rank 0's ``trainer.pt`` (the step, the user's ``extra``,
the LR scheduler's state) and ``autopar.json`` (the step, the world size and the plan it
was written under, for reading). After a barrier, rank 0 renames it to its final name in
one ``os.replace``: a reader sees the entry whole or not at all, and a crash at any
moment leaves the entries before it as they were. ``keep=K`` then removes all but the K
latest complete entries, and any hidden leftover of an interrupted save.

:func:`resume` loads the latest complete entry into any plan and world size (the model
and optimizer through DCP, resharded as :func:`~autopar.engine.checkpoint.load_checkpoint`
does), restores the scheduler and autopar's random draws (the number of calls, which is
the same in every plan and world size: a run resumed on another world draws as it would
have), and, where the world size is the one that wrote it, torch's own generator. ``trainer.pt`` is
read with ``torch.load(weights_only=False)``: load only checkpoints you wrote.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
from typing import Any, Optional

import torch
import torch.distributed as dist

from autopar._torch_compat import group_timeout
from autopar.runtime import health
from autopar.engine import checkpoint as dcp_checkpoint

log = logging.getLogger("autopar.engine.checkpoint")

ENTRY = re.compile(r"^step_(\d{8,})$")
PARTIAL = ".partial-"


def entry_name(step: int) -> str:
    if step < 0:
        raise ValueError(f"save_checkpoint(step={step}): the step must be 0 or more")
    return f"step_{step:08d}"


def complete_entries(directory: str | os.PathLike) -> list[tuple[int, str]]:
    """``(step, path)`` of every complete entry under ``directory``, oldest first."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    out = []
    for name in os.listdir(directory):
        match = ENTRY.match(name)
        if match and os.path.isfile(os.path.join(directory, name, "trainer.pt")):
            out.append((int(match.group(1)), os.path.join(directory, name)))
    return sorted(out)


def _barrier(group=None) -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=group)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def save_step(pm, directory: str | os.PathLike, optimizer=None, *, step: int, extra: Any = None, scheduler=None,
              keep: Optional[int] = None, async_: bool = False) -> str:
    """Write the entry of ``step`` under ``directory`` (module docstring); returns its
    final path. ``async_``: return once this rank's shards are copied to host memory; a
    thread writes them, then commits the entry (barrier, rename, prune) over a process
    group of its own, while training goes on. The next save, :func:`resume`,
    :func:`wait_checkpoints` and the process's orderly exit wait for it. A collective:
    every rank calls it with the same arguments."""
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"save_checkpoint(keep={keep!r}): keep a whole number of at least 1 checkpoints, or leave "
                         f"keep out")
    wait_checkpoints()  # one save in flight at a time
    directory = os.fspath(directory)
    name = entry_name(step)
    partial, final = os.path.join(directory, PARTIAL + name), os.path.join(directory, name)
    rank = _rank()
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)  # an earlier save of this step that died
        os.makedirs(partial)
    _barrier()
    state = dcp_checkpoint.saved_state(pm, optimizer)
    random = pm._state.random
    torch.save({"streams": random.get_state() if random is not None else None, "torch": torch.get_rng_state()},
               os.path.join(partial, f"rank{rank}.rng"))
    if rank == 0:
        torch.save({"step": step, "extra": extra, "scheduler": scheduler.state_dict() if scheduler else None},
                   os.path.join(partial, "trainer.pt"))
        with open(os.path.join(partial, "autopar.json"), "w") as f:
            json.dump({"step": step, "world_size": _world(), "plan": json.loads(pm.plan.to_json())}, f)
    if not async_:
        dcp_checkpoint.write_state(state, partial, rank)
        _commit(partial, final, directory, keep, None)
        return final
    state, nbytes = dcp_checkpoint.staged(state)
    writer = _Writer(state, partial, final, directory, keep, _checkpoint_group(), rank)
    log.info("step %d staged in host memory (%.1f MiB on rank %d); writing it in the background", step,
             nbytes / 2**20, rank)
    writer.start()
    _PENDING.append(writer)
    return final


def _commit(partial: str, final: str, directory: str, keep: Optional[int], group) -> None:
    """Every rank's part written: rank 0 renames the entry into view and prunes; every
    rank learns whether it could (an error on rank 0 is raised on every rank)."""
    _barrier(group)
    ok, error = torch.ones(1, device="cpu"), None  # the checkpoint group is gloo
    if _rank() == 0:
        try:
            if os.path.exists(final):  # the same step saved again: the old one out of view first
                old = os.path.join(directory, PARTIAL + "replaced-" + os.path.basename(final))
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
                os.replace(partial, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(partial, final)
            if keep is not None:
                _prune(directory, keep)
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            ok.zero_()
            error = e
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    if error is not None:
        raise error
    if not ok.item():
        raise dcp_checkpoint.CheckpointError(f"rank 0 could not commit {final!r} (see its error); the entries before "
                                             f"it are intact")
    log.info("committed %s", final)


class _Writer(threading.Thread):
    """An asynchronous save's write and commit (:func:`save_step`)."""

    def __init__(self, state, partial, final, directory, keep, group, rank):
        super().__init__(name=f"autopar-checkpoint-{os.path.basename(final)}", daemon=True)
        self.args_ = (state, partial, final, directory, keep, group, rank)
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        state, partial, final, directory, keep, group, rank = self.args_
        try:
            dcp_checkpoint.write_state(state, partial, rank, process_group=group)
            _commit(partial, final, directory, keep, group)
        except BaseException as e:  # reported by wait_checkpoints, in the training thread
            self.error = e
        finally:
            self.args_ = ()


_PENDING: list[_Writer] = []
_GROUP: list = []  # the asynchronous saves' own process group, made at the first one


def _checkpoint_group():
    """A gloo group of every rank for the writes in the background, apart from the
    training's collectives (made collectively: every rank saves at once)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if not _GROUP or _GROUP[0][0] is not dist.group.WORLD:
        timeout = group_timeout(dist.group.WORLD)  # the default group's, as every group autopar makes
        _GROUP[:] = [(dist.group.WORLD, dist.new_group(backend="gloo", timeout=timeout))]
    return _GROUP[0][1]


def wait_checkpoints() -> None:
    """Wait until this process's asynchronous save (if any) is written and committed;
    raises :class:`~autopar.engine.checkpoint.CheckpointError` naming it if it failed.
    The next save, :func:`resume` and the process's exit call it; call it yourself
    before ``destroy_process_group``."""
    while _PENDING:
        writer = _PENDING.pop(0)
        writer.join()
        if writer.error is not None:
            raise dcp_checkpoint.CheckpointError(f"the asynchronous save {writer.name[len('autopar-checkpoint-'):]!r} "
                                                 f"failed: {writer.error!r}; the entries before it are intact"
                                                 ) from writer.error


health.before_stop(wait_checkpoints)  # launch's orderly end of a rank, and interpreter exit


def save_checkpoint(pm, path: str | os.PathLike, optimizer=None, *, step: Optional[int] = None, extra: Any = None,
                    scheduler=None, keep: Optional[int] = None, async_: bool = False) -> str:
    """Save ``pm`` (and ``optimizer``) at ``path``. Without ``step``: one DCP directory
    at ``path`` (:func:`autopar.engine.checkpoint.save_checkpoint`). With ``step``:
    ``path`` is a directory of step entries, each visible only once complete, with the
    step, ``extra``, ``scheduler``'s state and the random streams, ``keep`` the latest
    kept, ``async_`` written in the background (module docstring, :func:`save_step`).
    Returns where it wrote. A collective: every rank calls it."""
    if step is None:
        if extra is not None or scheduler is not None or keep is not None or async_:
            raise ValueError("save_checkpoint(): extra=, scheduler=, keep= and async_= belong to step checkpoints; give "
                             "step= as well (the path is then a directory of steps that resume() reads)")
        dcp_checkpoint.save_checkpoint(pm, path, optimizer)
        return os.fspath(path)
    return save_step(pm, path, optimizer, step=int(step), extra=extra, scheduler=scheduler, keep=keep,
                     async_=async_)


def _prune(directory: str, keep: int) -> None:
    for _, path in complete_entries(directory)[:-keep]:
        hidden = os.path.join(directory, PARTIAL + "pruned-" + os.path.basename(path))
        os.replace(path, hidden)  # out of view at once, then removed
        shutil.rmtree(hidden, ignore_errors=True)
    for name in os.listdir(directory):
        if name.startswith(PARTIAL):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _check_torchrun_store() -> None:
    """Under ``torchrun --max-restarts`` with its rendezvous store shared across attempts
    (torch's default), a restarted rank that starts later than the others can read the
    previous attempt's gloo addresses from the store and the group fails to form: say
    what to set, once, on rank 0."""
    if (int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0 and _rank() == 0
            and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            and os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1"):
        log.warning("torchrun --max-restarts shares one rendezvous store across restarts; a restarted rank that "
                    "starts late can read the previous attempt's addresses and the process group fails to form. "
                    "Run torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment "
                    "(docs/guide/long_runs.md)")


def resume(pm, directory: str | os.PathLike, optimizer=None, scheduler=None) -> Optional[tuple[int, Any]]:
    """Load the latest complete entry under ``directory`` into ``pm`` (and ``optimizer``
    and ``scheduler``) and return ``(step, extra)``; None, changing nothing, where there
    is none. A collective: every rank calls it (module docstring)."""
    wait_checkpoints()
    _check_torchrun_store()
    entries = complete_entries(directory)
    chosen = [entries[-1] if entries else None]
    if dist.is_available() and dist.is_initialized():  # rank 0 chooses: every rank loads the same entry
        dist.broadcast_object_list(chosen, group_src=0)
    if chosen[0] is None:
        log.info("no complete checkpoint under %s: starting afresh", os.fspath(directory))
        return None
    step, path = chosen[0]
    trainer = torch.load(os.path.join(path, "trainer.pt"), weights_only=False)
    if scheduler is not None and trainer["scheduler"] is None:
        raise dcp_checkpoint.CheckpointError(f"the checkpoint at {path!r} holds no scheduler state (it was saved "
                                             f"without scheduler=); resume without scheduler=, or save with it")
    dcp_checkpoint.load_checkpoint(pm, path, optimizer)
    if scheduler is not None:
        scheduler.load_state_dict(trainer["scheduler"])
    with open(os.path.join(path, "autopar.json")) as f:
        written = json.load(f)
    # the draws' state (the number of calls) is the same on every rank and in every plan:
    # rank 0's, whatever the world size now; torch's own generator only on the same world
    own = os.path.join(path, f"rank{_rank()}.rng")
    first = os.path.join(path, "rank0.rng")
    if os.path.isfile(first) and pm._state.random is not None:
        streams = torch.load(first, weights_only=False)["streams"]
        if streams is not None and "calls" in streams:
            pm._state.random.set_state({"calls": streams["calls"]})
    if written["world_size"] == _world() and os.path.isfile(own):
        torch.set_rng_state(torch.load(own, weights_only=False)["torch"])
    else:
        log.warning("checkpoint %s was written by %d ranks, resumed on %d: torch's generator restarts from the seed "
                    "(autopar's random draws go on as they were)", path, written["world_size"], _world())
    log.info("resumed step %d from %s", step, path)
    return step, trainer["extra"]
