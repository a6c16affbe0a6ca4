"""Experiment configs in the flax examples' convention: one ``ml_collections`` file per
experiment (and one per variant, importing its experiment's file) with ``get_config()``,
run by ``python -m experiments.main --config=<file>``. ``methods`` is
:func:`fedco.experiment.runner.method_entries`."""

from fedco.experiment.runner import method_entries as methods

__all__ = ["methods"]
