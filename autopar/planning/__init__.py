"""Planning's data and shared facts, below the families and the search.

* :mod:`~autopar.planning.plan`: the :class:`Plan` (mesh, one strategy per region,
  predicted costs, the configurations weighed), its JSON form and rank layout;
  :mod:`~autopar.planning.explain` its explanations (``explain``, ``top``, ``why_not``);
* :mod:`~autopar.planning.strategy`: :class:`Strategy`, a configuration of any family
  (what a user may force, what a family offers), :class:`PlanError`, ``divisors``;
* :mod:`~autopar.planning.model`: :class:`ModelFacts`, what the planner knows of one
  analysed graph (work per node, regions and their classes, compute pricing memoised),
  and the data-parallel gradient all-reduce every family pays;
* :mod:`~autopar.planning.schedules` and :mod:`~autopar.planning.timeline`: the
  pipeline schedules as action lists (megatron §2.2) and their simulation, which the
  strategy language, the plan's explanation and the pipeline family all read;
* :mod:`~autopar.planning.drawing`: the regions drawn as Graphviz DOT.

Nothing here imports a family: each family's planning lives in its
package (``autopar/strategies/<family>/planner.py``, behind
:mod:`autopar.strategies.family`), and the search that loops over them is
:mod:`autopar.driver.search`, a layer above the families (docs/architecture.md,
"Layers"). The hardware and the α-β formulas are in :mod:`autopar.cost`, FLOP counting in :mod:`autopar.passes.analysis.flops`.
"""
