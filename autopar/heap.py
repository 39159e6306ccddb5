"""The objects that exist when a long compile-time step starts (capture, analysis, the
search, a rank program's rewrite) held out of Python's cyclic garbage collector while it
runs.

Each full collection walks every object the collector tracks: torch's modules, the
model, the captured graph with its nodes' metadata: about 0.1-0.2 s a time after a
large capture, and the planner's allocations trigger several (0.4 s of the 2.6 s search
for GPT-3 175B on 3072 devices, 0.3 s of its capture and analysis). :func:`held` moves
them to the collector's permanent generation (``gc.freeze``) for the step and back
after it (``gc.unfreeze``), so the step's collections walk only what the step made.
Cycles among the objects that existed before the step are collected by the first full
collection after it (``gc.unfreeze`` returns every frozen object to the oldest
generation, the young ones too). Nested steps freeze once. A process that froze objects
itself before the step (``gc.get_freeze_count() > 0``, a pre-fork server) or turned the
collector off is left as it is; one that freezes objects during a step has them
unfrozen with the step's at its end. The training steps are not held (only the build of
their programs, a compile-time phase).
"""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_LOCK = threading.Lock()
_HOLDERS = [0]   # the steps inside held() now, over every thread
_OURS = [False]  # whether the freeze in force is held()'s


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Run the block with the objects that exist now out of the collector's walks."""
    with _LOCK:
        if _HOLDERS[0] == 0:
            _OURS[0] = gc.isenabled() and gc.get_freeze_count() == 0
            if _OURS[0]:
                gc.freeze()
        _HOLDERS[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _HOLDERS[0] -= 1
            if _HOLDERS[0] == 0 and _OURS[0]:
                _OURS[0] = False
                gc.unfreeze()


__all__ = ["held"]
