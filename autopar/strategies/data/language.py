"""Data parallelism's declaration to the generic layers (:mod:`autopar.planning.declared`):
the ``data`` key and mesh axis; a configuration no other family claims is its."""
from __future__ import annotations

from autopar.grid import MeshAxis
from autopar.planning.declared import Language


class DataLanguage(Language):
    name = "data"
    built_in = True
    precedence = 10
    keys = ("data",)
    key_text = "'data'"
    axes = (MeshAxis.DATA,)
    absent = "the batch is the only thing to split; it is always weighed unless a strategy was forced"

    def fields(self, strategy: dict) -> dict:
        return {"data": strategy.get("data")}

    def owns(self, candidate) -> bool:
        return True   # the last asked (below Megatron): what splits nothing but the batch


LANGUAGE = DataLanguage()
