"""A configuration's *form* in the plan and in the configurations weighed, beside its
mesh: a family's (``Language.form``: ``"cube"``, ``"pipeline 1f1b"``, a mixed plan's,
:func:`autopar.strategies.shared.forms.mixed_form`), ``"replicate"`` (:func:`replicated`),
with expert parallelism's ``"experts P"`` after it (:func:`experts_form`)."""
from __future__ import annotations


def replicated(mesh: dict, regions) -> bool:
    """Whether a ``data × tensor`` mesh's tensor group splits nothing: every rank of it
    runs the whole of its data rank's work (the form ``"replicate"``)."""
    return mesh.get("tensor", 1) > 1 and set(mesh) <= {"data", "tensor"} and \
        all(r.strategy == "replicate" for r in regions)


def experts_form(base: str, experts: int) -> str:
    """A form with expert parallelism's ``experts P`` after the base's (``"experts 2"``,
    ``"pipeline 1f1b, experts 2"``); the base alone without it."""
    if experts <= 1:
        return base
    return (base + ", " if base else "") + f"experts {experts}"
