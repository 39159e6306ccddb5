"""Replication's declaration to the generic layers (:mod:`autopar.planning.declared`): its
regions' strategy (a region left whole); never forced by a key of its own. In the
explanation, a replicated plan's note beside the mesh and its configurations."""
from __future__ import annotations

from autopar.planning.declared import Language
from autopar.planning.explain import mesh_text
from autopar.planning.forms import replicated


class ReplicateLanguage(Language):
    name = "replicate"
    built_in = True
    region_strategies = ("replicate",)
    colours = (("replicate", "#b8c4d6"),)
    runs_as = "replicated"

    def form(self, plan) -> str | None:
        return self.name if replicated(plan.mesh, plan.regions) else None

    def mesh_note(self, plan) -> str:
        if plan.form != self.name:
            return ""
        return ("; replicated: the tensor group splits nothing, each of its ranks computes its data rank's whole "
                "batch" + ("; no configuration that splits the work is feasible (meshes weighed, below)"
                           if not any(c.feasible for c in plan.candidates if c.form != self.name) else ""))

    def candidate_text(self, candidate) -> str | None:
        return mesh_text(candidate.mesh) + ", replicated (every rank the whole batch)" \
            if candidate.form == self.name else None


LANGUAGE = ReplicateLanguage()
