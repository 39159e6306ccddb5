"""Planning: the hardware description, the cost model and the planner.

* :mod:`autopar.cost.hardware` describes a machine (peak rates, bandwidths,
  latencies, devices per node) and holds presets;
* :mod:`autopar.analysis.flops` counts each graph node's work from its shapes;
* :mod:`autopar.cost.model` turns work and message sizes into seconds and bytes with
  the papers' formulas (sympy expressions, lambdified once);
* ``plan`` and ``planner`` choose a strategy per region with that cost model.
"""
