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
(no seeding can make it one).

Each stream is counter-based: every dropout call (a *site*) draws the next seed of its
stream, ``mix(stream seed, call number)``, and its mask is Philox4x32-10 of that seed
over the element index (:mod:`autopar.runtime.philox`), exactly what a generated Triton
kernel draws with ``tl.randint``. So a dropout fused into a kernel keeps the same
elements as the same dropout unfused, on any device, and a kernel's backward recomputes
its mask from the seed instead of saving it. Activation recomputation replays the masks
by restoring the call counters: snapshot ``get_random_states().get_state()`` before the
forward and ``set_state`` it before the recompute.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.fx

from autopar.runtime import philox
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
    """The replicated and the sharded dropout stream of one rank."""

    STREAMS = ("replicated", "sharded")

    def __init__(self, seed: int, tensor_rank: int, data_rank: int, shard_ranks: dict | None = None):
        self.seed, self.tensor_rank, self.data_rank = seed, tensor_rank, data_rank
        self.replicated_seed = _mix(seed, data_rank, _REPLICATED)
        self.sharded_seed = _mix(seed, data_rank, _SHARDED, tensor_rank)
        # a mixed plan splits activations over more than one group (Megatron's over the
        # tensor group, 3D regions' over x): group name -> this rank's shard index there
        self.shard_seeds = {group: _mix(seed, data_rank, _SHARDED, index)
                            for group, index in (shard_ranks or {}).items()}
        self._calls = {stream: 0 for stream in self.STREAMS}

    def next_seed(self, stream: str, group: str | None = None) -> int:
        """The Philox seed of the next dropout site on ``stream`` (``"replicated"`` or
        ``"sharded"``; a sharded value split over ``group``), in [2^62, 2^63): one
        integer width for every seed, so a Triton kernel taking it is compiled once."""
        if stream not in self._calls:
            raise ValueError(f"dropout stream {stream!r}: use one of {self.STREAMS}")
        base = self.replicated_seed if stream == "replicated" else self.shard_seeds.get(group, self.sharded_seed)
        call = self._calls[stream]
        self._calls[stream] = call + 1
        return _mix(base, call) | (1 << 62)

    def get_state(self) -> dict:
        """A snapshot of both streams' call counters, for replaying masks during recomputation."""
        return dict(self._calls)

    def set_state(self, state: dict) -> None:
        """Restore a snapshot taken with :meth:`get_state`."""
        self._calls.update(state)


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


def dropout_seed(stream: str, group: str) -> int:
    """The next seed of ``stream`` on this rank: a fused kernel's dropout site draws it in
    the graph where the unfused dropout stood, so both draw the same seeds in the same order."""
    return get_random_states(group).next_seed(stream, group)


def apply_dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """``x`` with the elements of :func:`philox.keep_mask` kept and scaled by 1/(1-p)."""
    if p == 1.0:
        return x * 0.0
    keep = philox.keep_mask(seed, x.shape, p, x.device)
    return torch.where(keep, x * (1.0 / (1.0 - p)), torch.zeros((), dtype=x.dtype, device=x.device))


def _dropout(x: torch.Tensor, p: float, training: bool, stream: str, group: str) -> torch.Tensor:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    return apply_dropout(x, p, dropout_seed(stream, group))


def replicated_dropout(x: torch.Tensor, p: float, training: bool, group: str) -> torch.Tensor:
    """Dropout of an activation replicated over ``group``: the same mask on every rank of it."""
    return _dropout(x, p, training, "replicated", group)


def sharded_dropout(x: torch.Tensor, p: float, training: bool, group: str) -> torch.Tensor:
    """Dropout of an activation sharded over ``group``: an independent mask per rank."""
    return _dropout(x, p, training, "sharded", group)


torch.fx.wrap("replicated_dropout")
torch.fx.wrap("sharded_dropout")
torch.fx.wrap("dropout_seed")
