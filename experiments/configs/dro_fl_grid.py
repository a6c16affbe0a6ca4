"""E1 with the paper's grid search: every method's settings picked on validation from paper
001 Sec. 5.3's grids (``config.grid``, on the ``select_seeds``' data), then test reported over
the seeds: ``python -m experiments.main --config=experiments/configs/dro_fl_grid.py
--workdir=runs/e1-grid``."""

from experiments.configs import dro_fl


def get_config():
  config = dro_fl.get_config()
  config.mode = "grid"
  return config
