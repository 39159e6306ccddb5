"""Megatron's declaration to the generic layers (:mod:`autopar.planning.declared`): the
``tensor`` key and mesh axis, the pin ``'megatron'``, its regions' strategy; in the
explanation, sequence parallelism's note, its regions' boundaries in a mixed plan and
the padded vocabularies."""
from __future__ import annotations

from autopar.grid import MeshAxis
from autopar.planning.declared import Language, PinForm
from autopar.planning.explain import PLACES


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
    runs_as = "Megatron-split"

    def fields(self, strategy: dict) -> dict:
        return {"tensor": strategy.get("tensor")}

    def owns(self, candidate) -> bool:
        return candidate.mesh.get(MeshAxis.TENSOR, 1) > 1

    def lever_note(self, plan, lever: str) -> str | None:
        if lever == "sequence_parallel" and plan.sequence_parallel:
            return ("; sequence parallel: between the Megatron regions (norms, residual adds, dropout) each tensor "
                    "rank holds 1/t of the tokens")
        return None

    def boundary(self, plan, choice) -> str:
        group = choice.details.get("group", MeshAxis.TENSOR)
        return (f"entry f (identity; backward all-reduce over {group}), exit g (all-reduce over {group}; "
                f"backward identity)")

    def region_label(self, plan, choice) -> str:
        return f"{choice.strategy} (tensor {plan.degree(MeshAxis.TENSOR)})"

    def sections(self, plan) -> list[tuple[int, list[str]]]:
        """The split vocabularies the tensor degree does not divide, and their padding."""
        padded = [r for r in plan.regions if r.details.get("padded_vocab")]
        if not padded:
            return []
        lines = ["", "padded vocabularies (as Megatron-LM's --make-vocab-size-divisible-by: the last ranks' rows "
                 "past the vocabulary are zero padding, their logits left out of the softmax and the loss):"]
        for r in padded:
            d = r.details
            lines.append(f"  {r.region}: vocab {d['vocab']} padded to {d['padded_vocab']} ({d['rows_per_rank']} rows "
                         f"per rank)")
        return [(PLACES["padded"], lines)]


LANGUAGE = MegatronLanguage()
