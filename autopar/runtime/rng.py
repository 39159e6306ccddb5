"""Rank-aware random streams for dropout inside tensor-parallel regions.

Megatron keeps two random states (its "model parallel RNG tracker", the CUDA RNG states
of Megatron-LM's ``tensor_parallel/random.py``) because of where §2.3 places dropout:

* the **replicated** stream has the same seed on every tensor-parallel rank of a
  data-parallel replica. Dropout on a replicated activation (after g, e.g.
  ``Z = Dropout(YB)`` in §2.3) must draw the same mask on every tensor rank, or the
  replicas of that activation drift apart;
* the **sharded** stream's seed is offset by the tensor rank. Dropout on a sharded
  activation (attention probabilities split by head) needs independent masks per shard.

Both streams are derived from one seed by :func:`seed_everything`; they are
reproducible, but a sharded mask is not a slice of what a single device would draw
(no seeding can make it one). Activation recomputation must replay the masks: snapshot
``get_random_states().get_state()`` before the forward and ``set_state`` it before the
recompute (``torch.utils.checkpoint`` only preserves torch's default generators).
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.fx

from autopar.runtime._swap import SwapGlobal
from autopar.runtime.groups import group_rank

log = logging.getLogger("autopar.runtime")

_REPLICATED, _SHARDED = 1, 2
_MASK64 = 2**64 - 1


def _mix(*values: int) -> int:
    """Combine integers into a 63-bit seed with SplitMix64, so nearby inputs give unrelated seeds."""
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ (value & _MASK64)) & _MASK64
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state >> 1


class RandomStates:
    """The replicated and the sharded dropout stream of one rank, one generator per device."""

    def __init__(self, seed: int, tensor_rank: int, data_rank: int):
        self.seed, self.tensor_rank, self.data_rank = seed, tensor_rank, data_rank
        self.replicated_seed = _mix(seed, data_rank, _REPLICATED)
        self.sharded_seed = _mix(seed, data_rank, _SHARDED, tensor_rank)
        self._generators: dict[tuple[str, torch.device], torch.Generator] = {}

    def generator(self, stream: str, device: torch.device | str = "cpu") -> torch.Generator:
        """The generator of ``stream`` (``"replicated"`` or ``"sharded"``) on ``device``."""
        device = torch.device(device)
        key = (stream, device)
        if key not in self._generators:
            seed = {"replicated": self.replicated_seed, "sharded": self.sharded_seed}[stream]
            self._generators[key] = torch.Generator(device=device).manual_seed(seed)
        return self._generators[key]

    def get_state(self) -> dict:
        """A snapshot of every generator, for replaying masks during recomputation."""
        return {key: g.get_state() for key, g in self._generators.items()}

    def set_state(self, state: dict) -> None:
        """Restore a snapshot taken with :meth:`get_state`."""
        for (stream, device), generator_state in state.items():
            self.generator(stream, device).set_state(generator_state)


_STATES: Optional[RandomStates] = None


def seed_everything(seed: int, tensor_rank: int, data_rank: int) -> RandomStates:
    """Seed torch's default generator with ``seed`` (identical on every rank, so full
    weights are initialised identically before sharding) and derive both dropout streams."""
    global _STATES
    torch.manual_seed(seed)
    _STATES = RandomStates(seed, tensor_rank, data_rank)
    return _STATES


class use_random_states(SwapGlobal):
    """Install ``states`` as the dropout streams for the duration of the block (each
    ParallelModule owns its streams; this lets several live in one process)."""

    __slots__ = ()

    def __init__(self, states: RandomStates):
        super().__init__(globals(), "_STATES", states)

def get_random_states(group: str | None = None) -> RandomStates:
    """The streams set by :func:`seed_everything`.

    If it was never called they are derived from ``torch.initial_seed()`` with this
    rank's position in ``group`` as the tensor rank and data rank 0 (so data-parallel
    replicas share masks, as in Megatron's default).
    """
    global _STATES
    if _STATES is None:
        tensor_rank = group_rank(group) if group is not None else 0
        log.debug("dropout streams not seeded; deriving them from torch.initial_seed()")
        _STATES = RandomStates(torch.initial_seed(), tensor_rank, 0)
    return _STATES


def _dropout(x: torch.Tensor, p: float, training: bool, stream: str, group: str) -> torch.Tensor:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    generator = get_random_states(group).generator(stream, x.device)
    keep = torch.empty_like(x).bernoulli_(1.0 - p, generator=generator)
    return x * keep * (1.0 / (1.0 - p))


def replicated_dropout(x: torch.Tensor, p: float, training: bool, group: str) -> torch.Tensor:
    """Dropout of an activation replicated over ``group``: the same mask on every rank of it."""
    return _dropout(x, p, training, "replicated", group)


def sharded_dropout(x: torch.Tensor, p: float, training: bool, group: str) -> torch.Tensor:
    """Dropout of an activation sharded over ``group``: an independent mask per rank."""
    return _dropout(x, p, training, "sharded", group)


torch.fx.wrap("replicated_dropout")
torch.fx.wrap("sharded_dropout")
