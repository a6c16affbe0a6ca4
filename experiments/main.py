r"""One driver for config-file experiments (the flax examples' convention).

    python -m experiments.main --config=experiments/configs/adult_dro.py --workdir=runs/adult
    python -m experiments.main --config=experiments/configs/adult_dro.py \
        --config.budget=converged --config.seeds=0 --workdir=runs/adult_converged

The config names its experiment (``config.experiment``); the module
``experiments.<experiment>`` runs it with ``run(config, workdir)``. Bad input ends with one
``error: ...`` line and exit status 1.
"""

from __future__ import annotations

import importlib
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from experiments import common

_CONFIG = config_flags.DEFINE_config_file("config", None, "An experiments/configs/*.py file.",
                                          lock_config=True)
flags.DEFINE_string("workdir", None, "Output directory (created if missing).")
FLAGS = flags.FLAGS

EXPERIMENTS = ("adult_dro",)


def main(argv):
  del argv
  common.quiet_logs()
  config = _CONFIG.value
  try:
    if config is None:
      raise ValueError("--config must name an experiments/configs/*.py file")
    name = config.get("experiment")
    if name not in EXPERIMENTS:
      raise ValueError(f"config.experiment must be one of {EXPERIMENTS}, got {name!r}")
    importlib.import_module(f"experiments.{name}").run(config, FLAGS.workdir)
  except (ValueError, FileNotFoundError) as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
