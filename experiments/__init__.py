"""The papers' experiments, each a module of its science and a config file
(``experiments/configs/``), run by ``python -m experiments.main --config=<file>`` on the
library's skeleton, :mod:`fedco.experiment`."""
