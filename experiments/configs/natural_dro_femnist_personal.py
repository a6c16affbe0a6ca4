"""Personalisation on FEMNIST's 105 writers (issue 49): each writer scored by its own model.

``python -m experiments.main --config=experiments/configs/natural_dro_femnist_personal.py
--workdir=runs/e8_femnist_personal``. E8's FEMNIST settings (every writer every round, 100
rounds of 20 steps of batch 10 at rate 0.01) on a one-hidden-layer MLP (784-128-62, so a
head exists to keep private): FedAvg (its shared model, the baseline every personalised
method must beat on held-out accuracy), Ditto (``lam = 0.1``), FedPer and FedRep (the
``out`` layer private; FedRep trains it 15 of the 20 steps, then the body 5) and APFL
(``alpha`` learnt from 0.25). Each writer's held-out accuracy is its own model's
(:func:`fedco.algorithms.personal.personal_model`); the shared model's mean is beside it
(``heldout_acc_global_avg``).
"""

from experiments import configs
from experiments.configs import natural_dro_femnist


def get_config():
  config = natural_dro_femnist.get_config()
  config.model = "mlp"
  config.hidden_size = 128
  config.seeds = (0, 1, 2)
  config.methods = configs.methods(
    {
      "fedavg": {"algorithm": "fedavg"},
      "ditto": {"algorithm": "ditto", "lam": 0.1},
      "fedper": {"algorithm": "fedper", "head": ("out",)},
      "fedrep": {"algorithm": "fedrep", "head": ("out",), "head_steps": 15},
      "apfl": {"algorithm": "apfl", "alpha": 0.25},
    }
  )
  return config
