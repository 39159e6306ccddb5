"""What a plan costs: the hardware (:mod:`.hardware`: presets, detection, the
``Hardware`` object), this machine's cached calibrated profile (:mod:`.profiles`), the
α-β, compute and memory formulas every family prices with (:mod:`.model`), and
``autopar calibrate``, which measures a machine into a ``Hardware``
(:mod:`.calibrate`, with its measurements in :mod:`.calibrate_measure` and its fits in
:mod:`.calibrate_fit`)."""
