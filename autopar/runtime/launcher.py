"""Starting ranks: :func:`launch` for local processes, :func:`init_from_env` for torchrun.

:func:`launch` is what tests, examples and the benchmarks use to run one function on
``world_size`` local processes with a ``torch.distributed`` default group initialised::

    >>> def all_ranks_sum():
    ...     t = torch.ones(1) * dist.get_rank()
    ...     dist.all_reduce(t)
    ...     return t
    >>> launch(all_ranks_sum, 2)
    [tensor([1.]), tensor([1.])]

Nothing hangs: a rank that raises makes the parent terminate the others (they would
wait forever in their next collective) and raise :class:`LaunchError` with that rank's
traceback; after ``timeout_s`` every child is killed and the error names the ranks that
had not finished. With ``return_exceptions=True`` the parent leaves the others alone
instead: each stops by itself, naming the rank at fault (``autopar.runtime.health``),
and ``launch`` returns one result or :class:`RankFailure` per rank::

    >>> launch(train, 4, timeout_s=20, return_exceptions=True)
    [RankFailure(rank=0, error='RankFailureError: rank 2 died during step() #2 ...', ...),
     RankFailure(rank=1, ...), RankFailure(rank=2, exitcode=-9, error='killed by SIGKILL', ...), ...]

The rendezvous store lives in the parent, not in rank 0 (the way torchrun's agent
hosts it), so no free port has to be guessed and a rank that finishes early cannot take
the store away from ranks that still create subgroups.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import pickle
import signal
import sys
import time
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autopar._torch_compat import AGENT_STORE_ENV
from autopar.runtime import health

log = logging.getLogger("autopar.runtime")

_GRACE_S = 5.0  # how long a terminated child gets before it is killed


class LaunchError(RuntimeError):
    """A launched rank failed, died, or did not finish within the timeout."""


@dataclasses.dataclass(frozen=True)
class RankFailure:
    """How one rank of a ``launch(..., return_exceptions=True)`` failed.

    ``error``: the exception's last line (``"RankFailureError: rank 2 died ..."``), or what
    became of a rank that reported nothing; ``traceback``: the full traceback ("" if
    none); ``exitcode``: the process's (negative: the signal that ended it; None: it was
    still running at the deadline); ``elapsed_s``: seconds from the start of ``launch``
    until the parent heard of the failure.
    """

    rank: int
    error: str
    traceback: str = ""
    exitcode: int | None = None
    elapsed_s: float = 0.0

    def __str__(self) -> str:
        return f"rank {self.rank} failed after {self.elapsed_s:.1f} s: {self.error}"


def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    *,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    return_exceptions: bool = False,
    deadline_s: float | None = None,
) -> list:
    """Run ``fn(*args)`` on ``world_size`` spawned processes; return their results in rank order.

    ``fn`` must be a picklable top-level function and its return value picklable
    (return detached tensors). Each child gets MASTER_ADDR, MASTER_PORT, RANK,
    WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, ``torch.set_num_threads(1)``, and an
    initialised default process group (``backend``, collective timeout ``timeout_s``,
    heartbeat started) that is destroyed after ``fn`` returns.

    ``return_exceptions``: False: the first failing rank makes the parent terminate the
    others and raise :class:`LaunchError`. True: every rank runs until it returns or fails
    by itself (or the deadline passes) and its entry in the returned list is its result
    or a :class:`RankFailure`.

    ``deadline_s``: how long the whole job may take, from the launch (None: ``timeout_s``),
    after which every rank still running is killed. ``timeout_s`` is each collective's
    and each failure's deadline, counted from the collective or the failure, so a job
    on a slow machine may take far longer than ``timeout_s`` and still detect a dead
    rank within it: give such jobs a ``deadline_s`` of their own.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if deadline_s is None:
        deadline_s = timeout_s
    deadline = time.monotonic() + deadline_s
    # The parent hosts the rendezvous store; children join it as clients
    # (TORCHELASTIC_USE_AGENT_STORE, the contract torchrun's agent uses).
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    processes, readers = [], {}
    try:
        for rank in range(world_size):
            reader, writer = ctx.Pipe(duplex=False)
            env = {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(store.port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world_size),
                **AGENT_STORE_ENV,
            }
            process = ctx.Process(
                target=_run_rank,
                args=(fn, tuple(args), env, backend, timeout_s, writer, os.getpid()),
                name=f"autopar-rank{rank}-{getattr(fn, '__name__', 'job')}",  # which launch, in `ps` and active_children()
                daemon=False,  # fn may start its own workers (DataLoader); _stop reaps us
            )
            process.start()
            writer.close()  # the child holds the only write end, so its death reads as EOF
            processes.append(process)
            readers[reader] = rank
        results = _collect(processes, readers, deadline, deadline_s, return_exceptions)
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        return [results[rank] for rank in range(world_size)]
    finally:
        _stop(processes)
        for reader in readers:
            reader.close()
        del store


def _collect(processes, readers, deadline, deadline_s, return_exceptions=False) -> dict[int, Any]:
    """Read every rank's report; raise on the first failure or at the deadline (with
    ``return_exceptions``: record a :class:`RankFailure` and go on)."""
    start = deadline - deadline_s
    pending = dict(readers)
    results: dict[int, Any] = {}
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if not return_exceptions:
                raise LaunchError(
                    f"launch timed out after {deadline_s:g}s; ranks still running: "
                    f"{sorted(pending.values())} (all ranks were killed)"
                )
            for rank in pending.values():
                results[rank] = RankFailure(rank, f"did not finish within the deadline of {deadline_s:g} s (killed)",
                                            elapsed_s=time.monotonic() - start)
            break
        for reader in wait(list(pending), timeout=remaining):
            rank = pending.pop(reader)
            try:
                status, payload = pickle.loads(reader.recv_bytes())
            except EOFError:
                processes[rank].join(_GRACE_S)
                code = processes[rank].exitcode
                if not return_exceptions:
                    raise LaunchError(
                        f"rank {rank} exited with code {code} "
                        "without reporting a result (killed, or os._exit in user code?)"
                    ) from None
                how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else \
                    f"exited with code {code}"
                results[rank] = RankFailure(rank, f"{how} without reporting a result", exitcode=code,
                                            elapsed_s=time.monotonic() - start)
                continue
            if status == "error":
                error, text = payload
                if not return_exceptions:
                    raise LaunchError(f"rank {rank} raised:\n{text}")
                results[rank] = RankFailure(rank, error, text, elapsed_s=time.monotonic() - start)
                continue
            results[rank] = payload
    if return_exceptions:  # the exit codes of the ranks that failed
        for rank, result in list(results.items()):
            if isinstance(result, RankFailure) and result.exitcode is None:
                processes[rank].join(max(0.0, min(_GRACE_S, deadline - time.monotonic())))
                results[rank] = dataclasses.replace(result, exitcode=processes[rank].exitcode)
    return results


def _stop(processes) -> None:
    """Terminate every child still alive, then kill those that ignore it."""
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        process.terminate()
    end = time.monotonic() + _GRACE_S
    for process in alive:
        process.join(max(0.0, end - time.monotonic()))
        if process.is_alive():
            log.warning("rank process %s ignored SIGTERM; killing it", process.name)
            process.kill()
            process.join()


def _die_with_launcher(launcher_pid: int) -> None:
    """A rank has no one to report to once its launcher is gone (killed, or crashed
    without reaping it): Linux ends it then (``PR_SET_PDEATHSIG``, SIGTERM), and it ends
    at once if that already happened. Elsewhere the launcher's own reaping is all."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != launcher_pid:
        os._exit(1)


def _run_rank(fn, args, env, backend, timeout_s, writer, launcher_pid: int) -> None:
    """Child entry point: set up the rank, run ``fn``, report through ``writer``."""
    _die_with_launcher(launcher_pid)
    os.environ.update(env)
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(int(env["LOCAL_RANK"]))
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        health.start()
        result = fn(*args)
        health.stop()  # finished, not dead, for ranks still running (an asynchronous save written first)
        dist.destroy_process_group()
        message = pickle.dumps(("ok", result))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it; SystemExit included
        error = f"{type(exc).__name__}: {exc}"
        writer.send_bytes(pickle.dumps(("error", (error, traceback.format_exc()))))
        writer.close()
        # End at once: the connections of this rank's process groups close only with the
        # process, and peers blocked in a collective with it wait for that (or the timeout)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    writer.send_bytes(message)
    writer.close()


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Initialise the default process group from torchrun's environment; return (rank, world_size).

    Does nothing but report when a default group already exists. ``backend`` defaults to
    ``nccl`` when CUDA is available (the device is set from LOCAL_RANK) and ``gloo``
    otherwise.
    """
    if not dist.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()
