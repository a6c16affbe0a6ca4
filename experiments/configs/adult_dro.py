"""DRO-FL on UCI Adult, doctorate against non-doctorate (the agnostic-FL setting).

``python -m experiments.main --config=experiments/configs/adult_dro.py --workdir=runs/adult``;
override any field, e.g. ``--config.seeds=0,1 --config.budget=converged``.
"""

import ml_collections


def method(algorithm, problem, **hyperparameters):
  """One compared method: a ``fedco.ALGORITHMS`` name, the problem form it solves (``erm``,
  ``kl_exp``: the client-level KL-DRO exp form, ``kl_log``: its log form) and its factory
  arguments other than the learning rate and local steps."""
  return ml_collections.ConfigDict({"algorithm": algorithm, "problem": problem,
                                    "hyperparameters": hyperparameters})


def get_config():
  config = ml_collections.ConfigDict()
  config.experiment = "adult_dro"
  config.data_dir = ""  # default: ../shared/data/adult beside the checkout
  config.seeds = (0, 1, 2)
  # "short": the agnostic-FL / q-FFL papers' regime, batch 10, learning rate 0.1, 1,200
  # local steps per client in all; "converged": full-batch steps until the training
  # objective moves by less than converge_tol over converge_window rounds.
  config.budget = "short"
  # total_steps: local steps per client in all (rounds = total_steps / local_steps; methods
  # without local steps, AFL, run total_steps rounds); batch_size 0: each client's whole data.
  config.short = ml_collections.ConfigDict(
      {"batch_size": 10, "learning_rate": 0.1, "local_steps": 10, "total_steps": 1200,
       "evaluations": 12})
  config.converged = ml_collections.ConfigDict(
      {"batch_size": 0, "learning_rate": 0.5, "local_steps": 10, "total_steps": 10000,
       "evaluations": 10, "converge_tol": 1e-4})
  config.gamma = 0.5  # the KL temperature of the client-level DRO forms
  config.methods = ml_collections.ConfigDict({
      "fedavg": method("fedavg", "erm", weighting="samples"),
      "qfedavg": method("qfedavg", "erm", q=1.0),
      "afl": method("afl", "erm", weights_lr=0.1),
      "drfa": method("drfa", "erm", weights_lr=0.1),
      "comfedl": method("comfedl", "kl_exp"),
      "comfedl_normalized": method("comfedl", "kl_exp", normalized=True),
      "feddro": method("feddro", "kl_log", beta=0.5),
  })
  config.progress = True
  return config
