"""The lookup table: calibration + policy -> which head count runs in each battery/thermal state.

``policy`` (the TOML policy and its defaults) -> ``table`` (Pareto candidates, derating, cells;
the ``lut.json`` document) -> ``emit`` / ``emit_c`` / ``emit_kotlin`` (the same selection as C and
Kotlin source for apps) -> ``plot`` (PNG grid, markdown) -> ``make`` (every file ``hydra-edge lut``
writes; the click command is ``hydra_edge.commands.lut``). The device reads the table with
``hydra_edge.runtime.lut`` and switches with ``hydra_edge.runtime.switcher``.
"""
