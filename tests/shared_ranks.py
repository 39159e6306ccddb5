"""One launch per world size for the whole test session.

Starting a gloo rank costs seconds of CPU (importing torch, transformers, the first
``torch.export``), and on a 2-core machine that is most of what the multi-rank tests
cost. So the modules *register* their rank jobs when they are imported, and the first
test that needs a world size launches it once, running every registered job of that
size on the same ranks, one after the other::

    _reports = shared_ranks.register(8, __name__, equivalence_job, (CASES,))

    def test_case(index):
        for rank, reports in enumerate(_reports()):   # every rank's return value
            ...

Only the jobs of modules with a selected test run (``pytest tests/test_x.py`` or ``-k``
launches nothing for the others). A job that raises on any rank fails the tests that read
it, with every failing rank's traceback, and the jobs after it in that launch are run
again in a fresh one (the process group may not survive a failed job), so one broken
job does not fail another module's tests. Between jobs each rank drops the registered
process groups, resets the denormal flushing and restores the environment variables a
job may have changed, so a job sees the state a fresh rank would (jobs seed their own
generators).

``after=(world, name)`` runs another job's world first (a job reading what that one wrote).
``extended=True``: the job belongs to tests marked ``extended`` (``make test-extended``
and CI; ``make test`` deselects them), and runs only when one of those is selected.

The worlds start in the background as soon as the tests are collected, one at a time,
so they run beside the single-process tests (:func:`start_in_background`).
"""
from __future__ import annotations

import atexit
import concurrent.futures
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable

from autopar.runtime.launcher import launch

# world -> job name -> (fn, args, timeout_s, after)
_JOBS: dict[int, dict[str, tuple[Callable, tuple, float, tuple | None]]] = {}
_EXTENDED: set[tuple[int, str]] = set()  # (world, name) of the jobs of tests marked `extended`
_RESULTS: dict[int, dict[str, Any]] = {}
# the modules with a selected test, and with a selected `extended` test (None: no
# collection information, run every job)
_ACTIVE_MODULES: set[str] | None = None
_ACTIVE_EXTENDED: set[str] | None = None
_MAX_TIMEOUT_S = 3600.0  # a launch's timeout is its jobs' summed, at most this (a hang fails within it; the
# extended 4-rank launch runs about 13 min alone and over 30 beside the other launches on 2 cores)


class SharedRankJobError(AssertionError):
    """A registered job raised on some rank (or its launch failed)."""


class _Failed:
    def __init__(self, message: str):
        self.message = message


def register(world: int, name: str, fn: Callable, args: tuple = (), *, timeout_s: float = 300.0,
             after: tuple[int, str] | None = None, extended: bool = False) -> Callable[[], list]:
    """Register ``fn(*args)`` to run on every rank of the shared ``world``-rank launch;
    returns a function giving the list of every rank's return value (launching the world
    on first use). ``name`` starts with the registering module's ``__name__``;
    ``extended``: the job of tests marked ``extended``."""
    if name in _JOBS.get(world, {}):
        raise ValueError(f"a job named {name!r} is already registered for {world} ranks")
    _JOBS.setdefault(world, {})[name] = (fn, tuple(args), timeout_s, after)
    if extended:
        _EXTENDED.add((world, name))
    return lambda: results(world, name)


def registers_jobs(module: str) -> bool:
    """Whether ``module`` registered a job of some world."""
    return any(_owned_by(name, module) for jobs in _JOBS.values() for name in jobs)


def scratch_dir(prefix: str) -> str:
    """A directory for a job's files, made at registration (before any fixture exists)
    and removed when the test session ends."""
    path = tempfile.mkdtemp(prefix=f"autopar-{prefix}-")
    atexit.register(shutil.rmtree, path, True)
    return path


def select_modules(modules: set[str], extended: set[str] = frozenset()) -> None:
    """The modules with a selected test not marked ``extended``, and those with a selected
    ``extended`` test (conftest's ``pytest_collection_finish``); starts the worlds their
    jobs need in the background (:func:`start_in_background`)."""
    global _ACTIVE_MODULES, _ACTIVE_EXTENDED
    _ACTIVE_MODULES = set(modules)
    _ACTIVE_EXTENDED = set(extended)
    start_in_background()


_LOCK = threading.Lock()
_STARTED: dict[int, concurrent.futures.Future] = {}
_POOL: concurrent.futures.ThreadPoolExecutor | None = None


def start_in_background() -> None:
    """Run every world an active module needs, one world at a time, in a thread beside
    the tests: the single-process tests (one core) and the tests that start processes of
    their own run while the ranks work on the other core, instead of after them. A world
    another one depends on (``after=``) is started first; :func:`results` waits for its
    world's launch."""
    global _POOL
    worlds = [w for w in sorted(_JOBS) if any(_active(w, n) for n in _JOBS[w])]
    if not worlds or _POOL is not None:
        return
    _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="shared-ranks")
    atexit.register(_POOL.shutdown, wait=True, cancel_futures=True)
    for world in sorted(worlds, key=lambda w: (0 if any(after and after[0] == w for jobs in _JOBS.values()
                                                        for (_, _, _, after) in jobs.values()) else 1, w)):
        with _LOCK:
            _STARTED[world] = _POOL.submit(_run_world, world)


def _run_world(world: int) -> None:
    pending = [n for n in _JOBS[world] if _active(world, n)]
    if pending:
        _run(world, pending[0])


def results(world: int, name: str) -> list:
    """Every rank's return value of job ``name`` (running its world first if needed)."""
    started = _STARTED.get(world)
    if started is not None:
        started.result()  # the background launch of this world (its errors are per job)
    if name not in _RESULTS.get(world, {}):
        _run(world, name)
    outcome = _RESULTS[world][name]
    if isinstance(outcome, _Failed):
        raise SharedRankJobError(outcome.message)
    return outcome


def _active(world: int, name: str) -> bool:
    if _ACTIVE_MODULES is None:
        return True
    modules = _ACTIVE_EXTENDED if (world, name) in _EXTENDED else _ACTIVE_MODULES
    return any(_owned_by(name, m) for m in modules)


def _owned_by(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".") or name.startswith(module + ":")


def _run(world: int, wanted: str) -> None:
    done = _RESULTS.setdefault(world, {})
    pending = [n for n in _JOBS[world] if n not in done and (n == wanted or _active(world, n))]
    for name in pending:
        after = _JOBS[world][name][3]
        if after is not None and after[1] not in _RESULTS.get(after[0], {}):
            _run(*after)
    while pending:
        jobs = [(n, _JOBS[world][n][0], _JOBS[world][n][1]) for n in pending]
        start = time.perf_counter()
        try:
            per_rank = launch(run_jobs, world, (jobs,), timeout_s=min(_MAX_TIMEOUT_S, sum(_JOBS[world][n][2]
                                                                                         for n in pending)))
        except Exception as error:  # noqa: BLE001 - every job of this launch reports it
            for n in pending:
                done[n] = _Failed(f"the shared launch of {world} ranks running {pending} failed: {error}")
            return
        finally:
            if os.environ.get("AUTOPAR_TEST_JOB_TIMES"):  # profiling the suite, no assertion
                print(f"shared_ranks: the launch of {world} ranks ({len(pending)} jobs) took "
                      f"{time.perf_counter() - start:.1f} s, ending {time.strftime('%H:%M:%S')}",
                      file=sys.stderr, flush=True)
        finished = 0  # jobs every rank ran without an error, in order
        while finished < len(pending) and all(len(r) > finished and r[finished][0] == "ok" for r in per_rank):
            done[pending[finished]] = [r[finished][1] for r in per_rank]
            finished += 1
        if finished == len(pending):
            return
        # the first job that failed on some rank; those after it run again on fresh ranks
        failed = pending[finished]
        errors = [f"rank {rank}:\n{r[finished][1]}" for rank, r in enumerate(per_rank)
                  if len(r) > finished and r[finished][0] == "error"]
        done[failed] = _Failed(f"job {failed} on {world} ranks raised:\n" + "\n".join(errors))
        pending = pending[finished + 1:]


def run_jobs(jobs: list[tuple[str, Callable, tuple]]) -> list[tuple[str, Any]]:
    """On every rank: run the jobs in order, ``("ok", value)`` or ``("error", traceback)``
    each; stop at the first error (the process group may be unusable after it)."""
    import torch
    import torch.distributed as dist

    from autopar.runtime import health
    from autopar.runtime.groups import clear_groups
    out = []
    for name, fn, args in jobs:
        environ = dict(os.environ)
        start = time.perf_counter()
        try:
            out.append(("ok", fn(*args)))
        except Exception:  # noqa: BLE001 - reported to the parent, which fails the tests reading it
            out.append(("error", traceback.format_exc()))
            break
        finally:
            clear_groups()
            torch.set_flush_denormal(False)
            os.environ.clear()
            os.environ.update(environ)
            if os.environ.get("AUTOPAR_TEST_JOB_TIMES") and dist.get_rank() == 0:  # profiling the suite, no assertion
                print(f"shared_ranks: {name} on {dist.get_world_size()} ranks took "
                      f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        # A job that checks an error and catches it leaves that error on the failure board
        # until the rank's next guarded call; a peer already in the next job's compile would
        # read it there and blame this rank. Say so now, and let no rank go on before all have.
        if health._STATE.reported:
            health._recovered()
        dist.barrier()
    return out


FLOAT64_BOUNDS = (("output", 1e-12), ("loss", 1e-12), ("grad", 1e-12), ("param", 1e-10))
"""The relative differences a float64 comparison with one process stays within
(:func:`autopar.testing.compare_with_single_device`: parameters after the steps)."""


def assert_as_on_one_device(row: dict, label, floor: float = 0.0) -> None:
    """A job's comparison row: no error, and each kind's relative difference within
    :data:`FLOAT64_BOUNDS` (or ``floor`` where larger: a model whose own numerics are
    looser than float64's); ``label`` names the case in a failure."""
    assert "error" not in row, row.get("traceback")
    for kind, bound in FLOAT64_BOUNDS:
        assert row[kind][1] <= max(bound, floor), (label, kind, row[kind])
