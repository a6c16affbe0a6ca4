"""DRO-FL on UCI Adult, doctorate against non-doctorate (the agnostic-FL setting).

``python -m experiments.main --config=experiments/configs/adult_dro.py --workdir=runs/adult``
(the short budget); ``adult_dro_converged.py`` trains to convergence; ``adult_dro_privacy.py``
runs the short budget with client-level differential privacy on everything the methods send,
at several epsilons. Override any field, e.g. ``--config.seeds=0,1``.
"""

import ml_collections

from experiments import configs

# problem: "erm", "kl_exp" (the client-level KL-DRO exp form) or "kl_log" (its log form).
METHODS = {
  "fedavg": {"algorithm": "fedavg", "problem": "erm", "weighting": "samples"},
  "qfedavg": {"algorithm": "qfedavg", "problem": "erm", "q": 1.0},
  "afl": {"algorithm": "afl", "problem": "erm", "weights_lr": 0.1},
  "drfa": {"algorithm": "drfa", "problem": "erm", "weights_lr": 0.1},
  "comfedl": {"algorithm": "comfedl", "problem": "kl_exp"},
  "comfedl_normalized": {"algorithm": "comfedl", "problem": "kl_exp", "normalized": True},
  "feddro": {"algorithm": "feddro", "problem": "kl_log", "beta": 0.5},
}


def get_config():
  """The short budget: the agnostic-FL / q-FFL papers' regime, batch 10, learning rate 0.1,
  1,200 local steps per client in all."""
  config = ml_collections.ConfigDict()
  config.experiment = "adult_dro"
  config.budget = "short"  # or "converged" (adult_dro_converged.py): report convergence
  config.data_dir = ""  # default: ../shared/data/adult beside the checkout
  config.seeds = (0, 1, 2)
  # Methods without local steps (AFL) run rounds * local_steps rounds of one step.
  config.rounds = 120
  config.local_steps = 10
  config.learning_rate = 0.1
  config.batch_size = 10  # 0: each client's whole data
  config.eval_every = 10
  config.converge_tol = 1e-4
  config.gamma = 0.5  # the KL temperature of the client-level DRO forms
  config.methods = configs.methods(METHODS)
  return config
