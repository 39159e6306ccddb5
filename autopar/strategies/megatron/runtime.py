"""What Megatron's family keeps on a rank while its programs run: under sequence
parallelism, the saved-tensor hooks that keep each column linear's gathered input as
this rank's chunk (:func:`autopar.strategies.megatron.collectives.keep_split_inputs`)."""
from __future__ import annotations

from autopar.runtime.family_runtime import RankRuntime
from autopar.strategies.megatron.collectives import keep_split_inputs


class SequenceRankRuntime(RankRuntime):
    """Sequence parallelism's run-time part: the programs run inside
    :func:`~autopar.strategies.megatron.collectives.keep_split_inputs`."""

    name = "megatron"

    def contexts(self, stage: bool) -> list:
        return [keep_split_inputs()]
