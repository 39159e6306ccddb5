"""gloo's worker threads, seen from the process that owns them (Linux ``/proc``): how
many are running, and waiting until none is, which the orderly exit of a rank
(:func:`autopar.runtime.health._at_exit`) needs before the interpreter finalises."""
from __future__ import annotations

import os
import time

_WORKER_THREAD = "pt_gloo_runloop"  # the name torch gives ProcessGroupGloo's worker threads


def running_workers() -> int:
    """How many of this process's gloo worker threads are running or runnable (Linux:
    ``/proc/self/task``; 0 where it cannot be read). An idle worker sleeps on its queue."""
    running = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name, _, rest = stat.partition("(")[2].rpartition(")")
        if name.startswith(_WORKER_THREAD) and rest.split()[0] in ("R", "D"):
            running += 1
    return running


def wait_for_idle_workers(deadline: float) -> None:
    """Until every gloo worker thread is asleep at three looks in a row, 2 ms apart (the
    GIL released meanwhile, so a worker waiting for it gets it), or until ``deadline``."""
    idle = 0
    while idle < 3 and time.monotonic() < deadline:
        idle = idle + 1 if running_workers() == 0 else 0
        time.sleep(0.002)
