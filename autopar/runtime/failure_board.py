"""The failure board: the keys of a job's rank health in the default group's store, and
how one rank reads them.

The board lives in the default process group's store, which ``launch``'s parent (or
torchrun's agent) hosts, so it outlives every rank. :class:`Board` writes this rank's
heartbeat (``beat/<rank>``: the time, the process id and machine, and the autopar call
the rank is in), appends failure records (``failures``), counts barrier arrivals, and
runs the heartbeat thread. :class:`Snapshot` is the board as one rank read it: who is
dead (on this machine: its process is gone, :func:`process_gone`; on another: no
heartbeat for :data:`STALE_AFTER_S`), who raised, whom the ranks that stopped blamed.
Making the board, guarding calls with it and turning its contents into errors is
:mod:`autopar.runtime.health`'s.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
from typing import Callable

import torch.distributed as dist

from autopar._torch_compat import default_store, group_timeout

log = logging.getLogger("autopar.runtime")

HEARTBEAT_S = 1.0
"""Seconds between two heartbeats of a rank (one also follows each guarded call's start
and end, at most every :data:`_MIN_GAP_S`, so the board says which call a rank is in)."""
_MIN_GAP_S = 0.1
STALE_AFTER_S = 15.0
"""A rank on another machine whose last heartbeat is older than this is dead (on this
machine its process is checked instead)."""
_STORE_TIMEOUT_S = 10.0  # the board's own store operations never block longer
_PREFIX = "autopar/health/"


def this_machine() -> str:
    """This machine and process-id namespace: pids are comparable only within one."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        pass
    return "/".join(parts)


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` of this machine has ended (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
        return state in ("Z", "X")  # a zombie has died; its parent has not reaped it yet
    except FileNotFoundError:
        return True
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Board:
    """The keys of this job's health in the default group's store (one client of our own,
    so a rank blocked in a store wait does not delay its heartbeat)."""

    def __init__(self, activity: Callable[[], tuple[str, float]]):
        self.activity = activity  # () -> (the guarded call this process is in or "", since when)
        self.group = dist.group.WORLD
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        timeout = group_timeout(self.group)
        self.timeout_s = timeout.total_seconds() if timeout is not None else 1800.0
        self.store = default_store().clone()
        self.store.set_timeout(datetime.timedelta(seconds=min(self.timeout_s, _STORE_TIMEOUT_S)))
        # the n-th process group of every rank shares the n-th board: a store that outlives
        # a destroyed group (torchrun's) keeps the old group's beats and failures apart
        generation = self.store.add(f"{_PREFIX}groups_made_by/{self.rank}", 1)
        self.prefix = f"{_PREFIX}{generation}/"
        self.lock = threading.Lock()
        self.pid, self.machine = os.getpid(), this_machine()
        self.stop = threading.Event()
        self.wake = threading.Event()  # set when the main thread enters or leaves a guarded call
        self.thread: threading.Thread | None = None
        self.left = False  # the "left" beat was written
        self.barriers: dict[tuple[str, str, str], int] = {}  # barriers reached, by (call, name, members)

    def beat(self, state: str = "alive") -> None:
        doing, since = self.activity()
        value = json.dumps({"t": time.time(), "pid": self.pid, "machine": self.machine, "state": state,
                            "doing": doing, "since": since})
        with self.lock:
            self.store.set(f"{self.prefix}beat/{self.rank}", value)

    def record(self, **fields) -> None:
        line = json.dumps({"rank": self.rank, "t": time.time(), **fields})
        with self.lock:
            self.store.append(f"{self.prefix}failures", line + "\n")

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            return self.store.add(self.prefix + key, amount)

    def read(self) -> Snapshot:
        """The board now. Who is dead is decided before the failures are read: a rank
        reports before it dies, so one found dead has its report in what is read next
        (read the other way round, a rank that reported and exited in between would
        look like one that died without a word)."""
        keys = [f"{self.prefix}beat/{r}" for r in range(self.world)]
        with self.lock:
            if self.store.check(keys):
                beats = self.store.multi_get(keys)
            else:
                beats = [self.store.get(k) if self.store.check([k]) else None for k in keys]
        snapshot = Snapshot(self, [json.loads(b) if b is not None else None for b in beats])
        with self.lock:
            key = f"{self.prefix}failures"
            failures = self.store.get(key) if self.store.check([key]) else b""
        snapshot.read_failures(failures.decode())
        return snapshot

    def run(self) -> None:
        """The heartbeat thread: beat until :meth:`close` or until the default group is
        destroyed, then return without touching the store again.

        The thread is a daemon (a user who never stops it must not hang the interpreter's
        exit), so it must never be inside a store operation when the interpreter
        finalises: a daemon thread returning from C++ (the store call releases the GIL)
        into a finalising interpreter is ended with ``pthread_exit``, whose unwinding
        through pybind11's ``noexcept`` GIL guard calls ``std::terminate``. That was the
        ``terminate called without an active exception`` / SIGABRT seen at exit in about
        one run of three. :func:`stop` (registered with ``atexit``, which runs before
        daemon threads are ended) therefore joins this thread before anything else.
        """
        while True:
            self.wake.wait(HEARTBEAT_S)
            self.wake.clear()
            if self.stop.is_set() or dist.group.WORLD is not self.group:
                return  # stopped, or the user destroyed the process group
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - the store went away: nothing to report to
                log.debug("heartbeat of rank %d stopped: %s", self.rank, exc)
                return
            if self.stop.wait(_MIN_GAP_S):
                return

    def close(self) -> None:
        """Stop and join the heartbeat thread, then mark this rank as finished (not dead)
        with one last beat from the calling thread. Idempotent."""
        self.stop.set()
        self.wake.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            # a beat in flight ends within the store's timeout
            thread.join(_STORE_TIMEOUT_S + HEARTBEAT_S)
            if thread.is_alive():
                log.warning("the heartbeat thread of rank %d did not stop within %.0f s", self.rank,
                            _STORE_TIMEOUT_S + HEARTBEAT_S)
        if self.left:
            return
        self.left = True
        try:
            self.store.set_timeout(datetime.timedelta(seconds=1))  # never wait long on a store that went away
            self.beat("left")
        except Exception:  # noqa: BLE001 - the store's host may have exited already
            pass


class Snapshot:
    """The board as one rank read it."""

    def __init__(self, board: Board, beats: list[dict | None]):
        self.me, self.machine, self.now = board.rank, board.machine, time.time()
        self.beats = beats
        self.deaths = {rank: why for rank in range(len(beats)) if (why := self._dead(rank)) is not None}
        self.failures: dict[int, dict] = {}

    def read_failures(self, text: str) -> None:
        # the last record of each rank counts: a rank that went on to another call recovered
        for line in text.splitlines():
            if line.strip():
                record = json.loads(line)
                self.failures[record["rank"]] = record
        self.failures = {r: f for r, f in self.failures.items() if f["kind"] != "recovered"}

    def dead(self, rank: int) -> str | None:
        """Why ``rank`` is dead, or None while it lives (or left, or never beat)."""
        return self.deaths.get(rank)

    def _dead(self, rank: int) -> str | None:
        beat = self.beats[rank]
        if beat is None or beat["state"] == "left":
            return None
        seen = f"last seen in {beat['doing']}" if beat["doing"] else "last seen outside autopar's calls"
        if beat["machine"] == self.machine:
            return f"its process {beat['pid']} is gone; {seen}" if process_gone(beat["pid"]) else None
        age = self.now - beat["t"]
        if age > STALE_AFTER_S:
            return f"no heartbeat for {age:.1f} s; {seen}"
        return None

    def silent(self, members=None) -> list[int]:
        """Ranks on other machines not heard from for a few heartbeats (dead, or stalled)."""
        members = range(len(self.beats)) if members is None else members
        return [r for r in members if r != self.me and (beat := self.beats[r]) is not None and beat["state"] != "left"
                and beat["machine"] != self.machine and self.now - beat["t"] > 3 * HEARTBEAT_S]

    def doing(self, rank: int) -> str:
        beat = self.beats[rank]
        if beat is None:
            return "has not joined the board"
        if beat["state"] == "left":
            return "had left (finished; process group destroyed)"
        for_s = f" for {max(0.0, self.now - beat['since']):.1f} s"
        return f"in {beat['doing']}{for_s}" if beat["doing"] else f"outside autopar's calls{for_s}"

    def culprits(self, members=None) -> dict[int, tuple[str, str]]:
        """rank -> (what happened to it in one line, its error in full where longer), for
        every rank at fault other than this one."""
        members = range(len(self.beats)) if members is None else members
        out: dict[int, tuple[str, str]] = {}
        for rank, failure in sorted(self.failures.items()):
            if rank != self.me and rank in members and failure["kind"] == "raised":
                error = failure["error"]
                first = error.splitlines()[0] if error else ""
                out[rank] = (f"rank {rank} raised in {failure['during'] or 'its own code'}: {first}",
                             error if error != first else "")
        for rank in members:
            if rank == self.me or rank in self.failures or rank in out:
                continue
            why = self.dead(rank)
            if why is not None:
                out[rank] = (f"rank {rank} died ({why})", "")
        # ranks that stopped because of another's failure say whom they blamed
        for rank, failure in sorted(self.failures.items()):
            for culprit, line in failure.get("culprits", {}).items():
                culprit = int(culprit)
                if culprit != self.me and culprit not in out and culprit in members:
                    out[culprit] = (line, failure.get("details", {}).get(str(culprit), ""))
        return out

    def summary(self, members=None, limit: int = 8) -> str:
        members = [r for r in (range(len(self.beats)) if members is None else members) if r != self.me]
        parts = []
        for rank in members[:limit]:
            failure = self.failures.get(rank)
            if failure is not None:
                first = (failure["error"].splitlines() or [""])[0]
                parts.append(f"rank {rank} stopped in {failure['during'] or 'its own code'} ({first})")
            else:
                parts.append(f"rank {rank} {self.doing(rank)}")
        more = f", and {len(members) - limit} more" if len(members) > limit else ""
        return ", ".join(parts) + more


__all__ = ["HEARTBEAT_S", "STALE_AFTER_S", "Board", "Snapshot", "process_gone", "this_machine"]
