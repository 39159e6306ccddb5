"""Planning: the hardware description, the cost model and the planner.

* :mod:`autopar.planning.hardware` describes a machine (peak rates, bandwidths,
  latencies, devices per node) and holds presets;
* :mod:`autopar.planning.flops` counts each graph node's work from its shapes;
* :mod:`autopar.planning.cost` turns work and message sizes into seconds and bytes with
  the papers' formulas (sympy expressions, lambdified once);
* ``plan`` and ``planner`` choose a strategy per region with that cost model.
"""
