"""Megatron's declaration to the generic layers (:mod:`autopar.planning.declared`): the
``tensor`` key and mesh axis, the pin ``'megatron'``, its regions' strategy."""
from __future__ import annotations

from autopar.grid import MeshAxis
from autopar.planning.declared import Language, PinForm


class MegatronLanguage(Language):
    name = "megatron"
    built_in = True
    precedence = 20
    keys = ("tensor",)
    key_text = "'tensor'"
    aliases = ("tensor",)
    axes = (MeshAxis.TENSOR,)
    absent = "a strategy was forced, or the world has one rank"
    region_strategies = ("megatron",)
    colours = (("megatron", "#4a7bd0"), ("vocab", "#2a9b9b"))
    pin = PinForm("megatron", "'megatron'")

    def fields(self, strategy: dict) -> dict:
        return {"tensor": strategy.get("tensor")}

    def owns(self, candidate) -> bool:
        return candidate.mesh.get(MeshAxis.TENSOR, 1) > 1


LANGUAGE = MegatronLanguage()
