"""E8 on FEMNIST's writers from the project's copy: 105 writers, each its own held-out images.

``python -m experiments.main --config=experiments/configs/natural_dro_femnist.py
--workdir=runs/e8_femnist`` reads LEAF's FEMNIST JSON (sample fraction 0.05, non-IID; 105
writers with both splits, 14,708 training and 1,685 held-out images, 62 classes) from
``<repository>/../shared/data/femnist_leaf_sf005``, the folder next to a source checkout
(``--config.data_dir=<folder>`` for another copy: LEAF's ``data/femnist/data``). Every
writer in every round, E8's methods and settings (logistic regression, 100 rounds of 20
steps of batch 10 at rate 0.01). ``--config.model=cnn`` trains a small CNN instead
(``fedco.models.CNN4`` without normalisation, ``--config.filters`` channels).
"""

import os

from experiments.configs import natural_dro

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The project's copy of LEAF's FEMNIST, next to the repository.
DATA_DIR = os.path.normpath(os.path.join(_REPO, "..", "shared", "data", "femnist_leaf_sf005"))


def get_config():
  config = natural_dro.get_config()
  config.dataset = "femnist"
  config.data_dir = DATA_DIR
  return config
