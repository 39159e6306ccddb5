"""Replication's declaration to the generic layers (:mod:`autopar.planning.declared`): its
regions' strategy (a region left whole); never forced by a key of its own."""
from __future__ import annotations

from autopar.planning.declared import Language


class ReplicateLanguage(Language):
    name = "replicate"
    built_in = True
    region_strategies = ("replicate",)
    colours = (("replicate", "#b8c4d6"),)


LANGUAGE = ReplicateLanguage()
