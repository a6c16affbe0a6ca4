"""fedco's experiments: one driver (``python -m experiments.main --config=<file>``), one
skeleton (:mod:`fedco.experiment.runner`), a module of science per experiment and its config files
(``experiments/configs/``)."""
