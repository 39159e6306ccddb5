"""Rank health: a failure board in the rendezvous store, so that when one rank dies or
raises, every other rank stops with an error naming it instead of hanging.

gloo does not say who failed. A rank whose peer died reads ``Connection closed by peer
[127.0.0.1]:19844``; one whose peer raised before a collective waits for the process
group's timeout and reads ``Timed out waiting 20000ms for recv operation to complete``.
The board (:mod:`autopar.runtime.failure_board`) lives in the default process group's
store, which ``launch``'s parent (or torchrun's agent) hosts, so it outlives every rank.
It holds

* each rank's heartbeat (``beat/<rank>``), written every :data:`HEARTBEAT_S` by a daemon
  thread: the time, the process id and machine, and the autopar call the rank is in;
* the failures ranks reported (``failures``): a rank that raises inside a guarded call
  (``compile``, ``step``, ``forward``, ``grad_norm``, ...) writes its error there before
  the error leaves the call; a user's code can add its own with :func:`report_failure`.

When a collective fails inside a guarded call, :func:`explain` reads the board and the
call raises :class:`RankFailureError` (chained to gloo's error), naming the ranks at fault::

    RankFailureError: rank 2 died (its process 4711 is gone; last seen in step() #2); this
    rank (0) stopped in step() #2: RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read
    error [127.0.0.1]:47281: Connection reset by peer ...

A rank is dead when its process is gone, checked directly on the same machine (a busy
process is never taken for a dead one: eight ranks planning on two cores went more than
5 s without a heartbeat), and on another machine when its heartbeat is older than
:data:`STALE_AFTER_S`. A rank that stopped because of another's failure writes whom it
blamed, so ranks further away name the same culprit.

How fast the others stop: a collective with a dead or exited peer fails at once (its
connection closes); one with a peer that raised but lives on (the user caught the error)
fails at the process group's timeout, the only way gloo gives up on a live peer (its
``abort`` and ``shutdown`` leave the connections open). ``compile`` does better: its
ranks meet on the board (:func:`barrier`) before they create process groups and again
before they return, so a rank whose planning fails stops the others at once.

Timeouts: groups created inside ``compile`` get the default group's timeout (torch would
give them 30 minutes), and a mesh the user passes has its groups' timeouts lowered to it.
"""
from __future__ import annotations

import atexit
import datetime
import functools
import gc
import logging
import os
import re
import threading
import time
import zlib
from typing import Callable

import torch.distributed as dist

from autopar._torch_compat import group_timeout, new_groups_timeout, set_group_timeout
from autopar.runtime.failure_board import HEARTBEAT_S, STALE_AFTER_S, Board
from autopar.runtime.gloo_workers import wait_for_idle_workers

log = logging.getLogger("autopar.runtime")


class RankFailureError(RuntimeError):
    """Another rank died or raised while this one was in a collective (or waiting for it).

    ``failed``: rank -> what happened to it; ``during``: the call this rank was in. The
    process group is unusable afterwards: end the run, or destroy it and start again.
    """

    def __init__(self, message: str, failed: dict[int, str] | None = None, during: str = "",
                 details: dict[int, str] | None = None):
        super().__init__(message)
        self.failed = dict(failed or {})
        self.during = during
        self.details = dict(details or {})  # rank -> its error in full, where longer than a line

    def __reduce__(self):
        return type(self), (str(self), self.failed, self.during, self.details)

    @classmethod
    def naming(cls, culprits: dict[int, tuple[str, str]], tail: str, during: str) -> RankFailureError:
        """The error for ``culprits`` (rank -> (one line, full error or "")): the lines, then
        ``tail`` (what this rank was doing), then each full error::

            rank 1 raised in step() #2: CaptureError: autopar could not capture model MLP.; this rank (0) ...
            rank 1's error:
                CaptureError: autopar could not capture model MLP.
                  torch.fx.symbolic_trace failed: RuntimeError: 0D or 1D target tensor expected ...
        """
        message = "; ".join(line for line, _ in culprits.values()) + "; " + tail
        details = {rank: detail for rank, (_, detail) in culprits.items() if detail}
        for rank, detail in details.items():
            message += f"\nrank {rank}'s error:\n" + "\n".join("    " + line for line in detail.splitlines())
        return cls(message, {rank: line for rank, (line, _) in culprits.items()}, during, details)


class _State:
    """What this process is doing, read by the heartbeat thread."""

    def __init__(self):
        # the guarded call the main thread is in, as (call, its count), () outside: one
        # attribute, so the heartbeat thread reads a consistent pair; its text ("step()
        # #3") is made when read (:attr:`doing`), not on every step
        self.in_call: tuple = ()
        self.since = time.time()  # when it entered or left it
        self.depth = 0
        self.reported = False  # this rank has a failure on the board
        self.calls: dict[str, int] = {}
        self.members: list[int] | None = None  # the ranks the current setup call spans
        self.was_rank = False  # a board was made: this process ran as one of several ranks

    @property
    def doing(self) -> str:
        """The guarded call the main thread is in (``"step() #3"``); "" outside."""
        call = self.in_call
        return f"{call[0]} #{call[1]}" if call else ""


_STATE = _State()
_BOARD: Board | None = None
_BOARD_LOCK = threading.Lock()


def _board() -> Board | None:
    """This job's board (made and its heartbeat started on first use), or None without a
    process group of more than one rank. A board of a destroyed group is closed (its
    thread joined) before the new group's board is made."""
    global _BOARD
    if not (dist.is_available() and dist.is_initialized()):
        return None
    board = _BOARD
    if board is not None and board.group is dist.group.WORLD and not board.stop.is_set():
        return board
    with _BOARD_LOCK:
        if _BOARD is None or _BOARD.group is not dist.group.WORLD or _BOARD.stop.is_set():
            if _BOARD is not None:
                _BOARD.close()
                _BOARD = None
            if dist.get_world_size() == 1:
                return None
            board = Board(lambda: (_STATE.doing, _STATE.since))
            board.beat()
            board.thread = threading.Thread(target=board.run, name="autopar-heartbeat", daemon=True)
            board.thread.start()
            _BOARD = board
            _STATE.was_rank = True
        return _BOARD


def start() -> None:
    """Start this rank's heartbeat (once per process group; ``compile`` and ``launch`` call it)."""
    _board()


_BEFORE_STOP: list = []  # work to finish before a rank stops (an asynchronous checkpoint's write)


def before_stop(fn) -> None:
    """Run ``fn()`` at the start of every :func:`stop` (a rank's orderly shutdown, from
    ``launch`` or at interpreter exit), once registered."""
    if fn not in _BEFORE_STOP:
        _BEFORE_STOP.append(fn)


def stop() -> None:
    """Mark this rank as finished, stop its heartbeat thread and join it; first the work
    registered with :func:`before_stop`.

    ``launch`` calls it before ``destroy_process_group``; it runs at interpreter exit
    (``atexit``, before daemon threads are ended: :func:`_at_exit`), so a user who never
    calls it, or who only destroys the process group, still exits cleanly. After
    ``destroy_process_group`` the thread ends by itself within :data:`HEARTBEAT_S`
    without touching the store again."""
    global _BOARD
    for fn in list(_BEFORE_STOP):
        try:
            fn()
        except Exception:  # noqa: BLE001 - reported, and the rank still stops in order
            log.exception("autopar: %s failed while the rank stopped", getattr(fn, "__name__", fn))
    with _BOARD_LOCK:
        board, _BOARD = _BOARD, None
    if board is not None:
        board.close()


_COLLECTING: set[int] = set()  # the threads inside a garbage collection now


def _note_collection(phase: str, info: dict) -> None:
    """``gc.callbacks``: which threads are collecting (a collection runs in whichever
    thread allocates past the threshold, a daemon thread's included)."""
    if phase == "start":
        _COLLECTING.add(threading.get_ident())
    else:
        _COLLECTING.discard(threading.get_ident())


def _at_exit(wait_s: float = 5.0) -> None:
    """At interpreter exit (``atexit``: the main thread, before the interpreter
    finalises and ends daemon threads): :func:`stop`, then no garbage left for a daemon
    thread to collect while the interpreter finalises.

    A compiled model is cyclic garbage once the function that trained it returns, and the
    cyclic collector runs in whichever thread allocates past its threshold: a daemon
    thread's too (a progress monitor, a logger, the user's). Freeing torch objects
    (process groups and their work, tensors whose storage has a Python object) releases
    the GIL inside their C++ destructors and takes it back; a daemon thread that takes it
    back after the interpreter began finalising is ended with ``pthread_exit`` inside
    that ``noexcept`` destructor: ``terminate called without an active exception``,
    SIGABRT, a rank's exit code -6 after a run that trained correctly. So automatic
    collection is switched off (no thread starts one from here on), a collection another
    thread is in is waited for (up to ``wait_s``), and this thread collects what is left.

    gloo's worker threads are the other such threads: each collective is a work item that
    a worker runs and then drops, after the caller's ``wait`` has returned; a worker that
    drops the last reference to a tensor whose Python object is gone (a temporary given
    to the collective) takes the GIL to free that object. Descheduled between finishing
    the collective and dropping it (ranks sharing busy cores), it did so after the
    interpreter began finalising and aborted the process the same way (a core dump of
    ``benchmarks/exit_soak.py`` shows it). So the last step also waits (up to ``wait_s``)
    until no gloo worker is running: each is back waiting for work.

    Only in a process that ran as one of several ranks (a failure board was made)."""
    stop()
    if not _STATE.was_rank or threading.current_thread() is not threading.main_thread():
        return
    gc.disable()
    me, deadline = threading.get_ident(), time.monotonic() + wait_s
    while _COLLECTING - {me} and time.monotonic() < deadline:
        time.sleep(0.001)  # the other thread's destructors take the GIL back and its collection ends
    gc.collect()
    wait_for_idle_workers(deadline)


gc.callbacks.append(_note_collection)
atexit.register(_at_exit)


def _after_fork_in_child() -> None:
    global _BOARD
    _BOARD = None  # a forked worker is not a rank
    _COLLECTING.clear()  # the threads that were collecting are not in the child


os.register_at_fork(after_in_child=_after_fork_in_child)


def report_failure(message: str) -> None:
    """Tell the other ranks that this one failed, with ``message`` (e.g. ``"ValueError:
    bad batch"``): their :class:`RankFailureError` will name this rank and quote it.
    autopar's guarded calls report their own errors; call it for failures outside them."""
    board = _board()
    if board is None:
        return
    try:
        board.record(kind="raised", error=_clip(message, 2000), during=_STATE.doing)
        _STATE.reported = True
    except Exception as exc:  # noqa: BLE001 - reporting must not hide the error being reported
        log.warning("could not report this rank's failure on the board: %s", exc)


def _report_stopped(error: RankFailureError) -> None:
    board = _board()
    if board is None:
        return
    try:
        board.record(kind="stopped", error=_clip(str(error).splitlines()[0]), during=error.during,
                     culprits={str(r): line for r, line in error.failed.items()},
                     details={str(r): text for r, text in error.details.items()})
        _STATE.reported = True
    except Exception as exc:  # noqa: BLE001
        log.warning("could not report this rank's failure on the board: %s", exc)


# ---------------------------------------------------------------------------- explaining errors
_TRANSPORT = re.compile(r"gloo|nccl|connection (closed|reset|refused)|broken pipe|timed out|timeout|socket", re.I)


def is_collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed collective or store operation (a peer, not this rank)."""
    if isinstance(exc, RankFailureError):
        return False
    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and _TRANSPORT.search(str(exc)) is not None


def explain(exc: BaseException, during: str = "", members=None) -> RankFailureError:
    """The :class:`RankFailureError` naming the ranks whose failure made the collective
    behind ``exc`` fail, read from the board. With no culprit yet it keeps reading: for
    3 heartbeats, and while a rank on another machine is silent, until its heartbeat is
    stale (a killed rank there shows no other way)."""
    board = _board()
    during = during or _STATE.doing or "a collective"
    if board is None:
        return RankFailureError(f"this rank stopped in {during}: {_one_line(exc)} (no process group: "
                                f"no failure board to ask which rank failed)", {}, during)
    tail = f"this rank ({board.rank}) stopped in {during}: {_one_line(exc)}"
    start = time.monotonic()
    try:
        while True:
            snapshot = board.read()
            culprits = snapshot.culprits(members)
            waited = time.monotonic() - start
            if culprits or waited > STALE_AFTER_S + HEARTBEAT_S or (
                    waited > 3 * HEARTBEAT_S and not snapshot.silent(members)):
                break
            time.sleep(0.1)
    except Exception as read_error:  # noqa: BLE001 - the store (rank 0's, without torchrun) may be gone
        return RankFailureError(f"the failure board could not be read ({_one_line(read_error)}); the rank hosting "
                                f"the rendezvous store may have died; {tail}", {}, during)
    if culprits:
        return RankFailureError.naming(culprits, tail, during)
    return RankFailureError(f"no rank reported a failure or died; {snapshot.summary(members)}; {tail}. The ranks may "
                            f"call different collectives (different programs or numbers of steps), or one is stuck "
                            f"outside autopar", {}, during)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return _clip(f"{type(exc).__name__}: {text[0] if text else ''}")


def _clip(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


# ---------------------------------------------------------------------------- guarding calls
def guarded(during: str, *, setup: bool = False) -> Callable:
    """Decorate a method that runs collectives: its own errors go on the board before they
    leave it; a failed collective raises :class:`RankFailureError` naming the culprit.

    ``setup``: the call creates process groups (``compile``): it starts the heartbeat,
    the groups it creates get the default group's timeout, and its ranks leave it
    together: a :func:`barrier` at its end (over the ranks its first barrier named), so it
    returns on every rank or raises on every rank.
    """
    def decorate(fn):
        if setup:
            @functools.wraps(fn)
            def call(*args, **kwargs):
                state = _STATE
                if state.depth:  # inside another guarded call, which handles errors
                    return fn(*args, **kwargs)
                _enter(state, during)
                state.members = None
                try:
                    board = _board()
                    timeout = datetime.timedelta(seconds=board.timeout_s) if board is not None else None
                    with new_groups_timeout(timeout):
                        result = fn(*args, **kwargs)
                    if state.members is not None:
                        _barrier(f"{during} end", state.members)
                    return result
                except BaseException as exc:
                    _failed(exc, state)
                    raise
                finally:
                    _leave(state)
            return call

        # the calls made on every step (step(), forward()): the bookkeeping of _enter and
        # _leave written out, two calls fewer each time; errors go through the same _failed
        @functools.wraps(fn)
        def call(*args, **kwargs):
            state = _STATE
            if state.depth:  # inside another guarded call, which handles errors
                return fn(*args, **kwargs)
            if state.reported:  # the user handled an earlier failure and goes on
                _recovered()
            count = state.calls[during] = state.calls.get(during, 0) + 1
            state.in_call, state.since, state.depth = (during, count), time.time(), 1
            board = _BOARD
            if board is not None and not board.wake.is_set():  # _wake(), inline
                board.wake.set()
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                _failed(exc, state)
                raise
            finally:
                state.in_call, state.since, state.depth = (), time.time(), 0
                board = _BOARD
                if board is not None and not board.wake.is_set():
                    board.wake.set()
        return call
    return decorate


def _enter(state: _State, during: str) -> None:
    """A guarded call begins: its count, what the heartbeat says this rank is in."""
    if state.reported:  # the user handled an earlier failure and goes on
        _recovered()
    count = state.calls[during] = state.calls.get(during, 0) + 1
    state.in_call, state.since, state.depth = (during, count), time.time(), 1
    _wake()


def _leave(state: _State) -> None:
    state.in_call, state.since, state.depth = (), time.time(), 0
    _wake()


def _failed(exc: BaseException, state: _State) -> None:
    """A guarded call raised ``exc``: its error goes on the board; a failed collective
    raises the :class:`RankFailureError` naming the culprit instead. Returns to have the
    caller re-raise ``exc``."""
    if isinstance(exc, RankFailureError):
        _report_stopped(exc)
        return
    if _board() is None:
        return
    if is_collective_failure(exc):
        error = explain(exc, state.doing)
        _report_stopped(error)
        raise error from exc
    report_failure(f"{type(exc).__name__}: {exc}")


def _wake() -> None:
    """Have the heartbeat thread beat (it says which call this rank is in). The flag is
    raised only where it is down: the thread lowers it when it wakes and beats at most
    every ``_MIN_GAP_S``, so between two beats every guarded call but the first finds it
    up, and ``Event.set`` (a lock and a notify) would be paid twice a step for nothing."""
    board = _BOARD
    if board is not None and not board.wake.is_set():
        board.wake.set()


def _recovered() -> None:
    board = _board()
    _STATE.reported = False
    if board is not None:
        try:
            board.record(kind="recovered")
        except Exception:  # noqa: BLE001
            pass


def barrier(name: str, mesh=None) -> None:
    """Wait until every rank of ``mesh`` (a ``DeviceMesh``; None: every rank) reaches the
    barrier ``name`` (the n-th call with that name meets the others' n-th). Raises
    :class:`RankFailureError` as soon as one of them reports a failure, dies, or leaves,
    and after the default group's timeout. Inside a ``setup`` call it fixes the ranks the
    call's end barrier waits for, and lowers a passed mesh's group timeouts to the
    default group's."""
    board = _board()
    if board is None:
        return
    members = sorted(mesh.mesh.flatten().tolist()) if mesh is not None else list(range(board.world))
    if mesh is not None:
        _limit_timeouts(mesh.get_all_groups(), board)
    if _STATE.depth:
        _STATE.members = members
    _barrier(name, members)


def _limit_timeouts(groups, board: Board) -> None:
    """Give the user's groups (``init_device_mesh`` makes them with 30 minutes) the default group's timeout."""
    limit = datetime.timedelta(seconds=board.timeout_s)
    for group in groups:
        timeout = group_timeout(group)
        if timeout is None or timeout > limit:
            set_group_timeout(group, limit)


def _barrier(name: str, members: list[int]) -> None:
    board = _board()
    if board is None or len(members) <= 1:
        return
    tag = "all" if members == list(range(board.world)) else f"{zlib.crc32(str(members).encode()):08x}"
    # keyed by the guarded call it is in ("compile() #3", counted alike on every rank)
    # then counted within it: a call that failed on some ranks before one of its barriers
    # leaves the next call's barriers matched
    within = _STATE.doing
    n = board.barriers[within, name, tag] = board.barriers.get((within, name, tag), 0) + 1
    key = f"barrier/{within}/{name}/{tag}/{n}"
    board.add(key, 1)
    start = time.monotonic()
    delay, next_look = 0.002, 0.0
    while board.add(key, 0) < len(members):
        waited = time.monotonic() - start
        if waited >= next_look:  # the board is read at most every 0.2 s
            snapshot = board.read()
            culprits = snapshot.culprits(members)
            left = [r for r in members if snapshot.beats[r] is not None and snapshot.beats[r]["state"] == "left"]
            if (culprits or left or waited > board.timeout_s) and board.add(key, 0) < len(members):
                # (counted again: a peer that passed this barrier and then failed in its next
                # call is not to blame for this one)
                during = _STATE.doing or name
                tail = f"this rank ({board.rank}) stopped waiting for the others in {during} ({name})"
                missing = culprits or {r: (f"rank {r} {snapshot.doing(r)}", "") for r in left}
                if missing:
                    raise RankFailureError.naming(missing, tail, during)
                raise RankFailureError(f"not every rank arrived within the timeout of {board.timeout_s:g} s: "
                                       f"{snapshot.summary(members)}; {tail}", {}, during)
            next_look = waited + 0.2
        time.sleep(delay)
        delay = min(2 * delay, 0.05)
