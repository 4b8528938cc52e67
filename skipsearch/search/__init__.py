"""The search: optimize's stages (``optimize``), the timed objective (``objective``), the layer-skip space
(``space``), the Optuna study (``study/``: records, race-safe claims, workers, shipping), one module per strategy
(``strategies/``), and re-planning a profile or a study for another device's costs (``replan``).
"""
