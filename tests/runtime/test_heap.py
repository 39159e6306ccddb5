"""autopar.heap.held: the objects that exist when a compile-time step starts are out of
the collector's walks while it runs, and back after it; nested steps freeze once; a
process that froze objects itself, or turned the collector off, is left as it is."""
from __future__ import annotations

import gc

import pytest

from autopar.heap import held
from autopar.timing import phase


def test_held_freezes_once_and_gives_everything_back():
    assert gc.get_freeze_count() == 0
    marker = [object()]  # an object that exists before the step
    with held():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with held():  # a nested step does not freeze again (frozen objects may still be freed meanwhile)
            assert gc.get_freeze_count() <= frozen
        assert gc.get_freeze_count() <= frozen
    assert gc.get_freeze_count() == 0 and marker


def test_garbage_made_during_the_step_is_collected_after_it():
    import weakref

    class Node:
        pass
    a, b = Node(), Node()
    a.other, b.other = b, a          # a cycle, alive when the step starts
    seen = weakref.ref(a)
    with phase("capture"):           # every timed phase holds the heap
        assert gc.get_freeze_count() > 0
        del a, b                     # garbage now, but frozen: not collected in the step
        gc.collect()
        assert seen() is not None
    gc.collect()
    assert seen() is None


def test_an_exception_unfreezes():
    with pytest.raises(RuntimeError):
        with held():
            raise RuntimeError("in the step")
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_itself_is_left_alone():
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        made = [[] for _ in range(10_000)]   # tracked objects made since: a freeze by autopar would add them
        # (frozen objects may still be freed meanwhile, by this or another thread: the count
        # may only shrink; unfrozen by autopar it would be 0)
        with held():
            assert 0 < gc.get_freeze_count() <= mine
        assert 0 < gc.get_freeze_count() <= mine and made  # not unfrozen by autopar
    finally:
        gc.unfreeze()


def test_a_disabled_collector_is_left_alone():
    gc.disable()
    try:
        with held():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()
