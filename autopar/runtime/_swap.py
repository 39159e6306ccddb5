"""One module-level setting swapped in for a block: the shared mechanism of
``groups.use_groups``, ``rng.use_random_states`` and ``grid3d.use_runtime``."""
from __future__ import annotations

from typing import Any


class SwapGlobal:
    """Set the global ``name`` of the module whose ``globals()`` is ``namespace`` to
    ``value`` for the duration of the block, then restore it. A plain class rather than a
    generator context manager, and the value is swapped by reference: the subclasses run
    around every step of a compiled model."""

    __slots__ = ("namespace", "name", "value", "saved")

    def __init__(self, namespace: dict[str, Any], name: str, value: Any):
        self.namespace, self.name, self.value = namespace, name, value

    def __enter__(self) -> None:
        self.saved = self.namespace[self.name]
        self.namespace[self.name] = self.value

    def __exit__(self, *exc) -> None:
        self.namespace[self.name] = self.saved
