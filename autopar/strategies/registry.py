"""The families the planner weighs, in the order it weighs them (:mod:`autopar.planning.search`).

The order is part of the plan: the configurations weighed are listed in it, and a tie
goes to the earlier configuration (data before Megatron's smaller tensor degrees before
larger ones, D&SP, AxoNN's grids, Bian's cube, PTD-P, then mixed plans, so that a mixed
plan is taken only when it is predicted faster than every single-family one; expert
parallelism and context parallelism last: they ride on the data, Megatron (and pipeline) configurations;
replication after them all, weighed only when nothing else is feasible). A new family is a package under
``autopar/strategies/`` with a ``planner.py`` implementing
:class:`autopar.strategies.family.Family`, and one entry here.
"""
from __future__ import annotations

from autopar.strategies.context.planner import ContextParallel
from autopar.strategies.cube.planner import Cube
from autopar.strategies.data.planner import DataParallel
from autopar.strategies.dsp.planner import SubgraphParallel
from autopar.strategies.experts.planner import ExpertParallel
from autopar.strategies.family import Family
from autopar.strategies.megatron.planner import Megatron
from autopar.strategies.mixed.planner import Mixed
from autopar.strategies.pipeline.planner import Pipeline
from autopar.strategies.replicate.planner import Replicate
from autopar.strategies.tensor3d.planner import Tensor3D

FAMILIES: tuple[Family, ...] = (DataParallel(), Megatron(), SubgraphParallel(), Tensor3D(), Cube(), Pipeline(), Mixed(),
                                 ExpertParallel(), ContextParallel(), Replicate())
