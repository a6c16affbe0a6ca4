"""Experiment configs in the flax examples' convention: one ``ml_collections`` file per
experiment with ``get_config()``, run by ``python -m experiments.main --config=<file>``."""
