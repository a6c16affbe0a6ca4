"""Federated optimizers on FEMNIST writers (Reddi et al. 2021's EMNIST CR setting).

``python -m experiments.main --config=experiments/configs/fed_optimizers_emnist.py
--workdir=runs/fed_optimizers_emnist`` reads LEAF's FEMNIST from
``../shared/data/femnist_leaf_sf005`` (``--config.data_dir=`` another LEAF folder holding
``train/`` and ``test/``). The model is ``fedco.models.EmnistCNN`` with dropout off
(decision 100: the simulator passes no key to a model), where the paper's CNN trains with
dropout.

Sources as in ``fed_optimizers.py``: google-research/federated
``optimization/docs/hyperparameters.md`` (commit 0f29cad), ``emnist_character``: batch 20,
1,500 rounds, 10 clients a round, one epoch. Not the paper's data: their EMNIST CR has
3,400 writers (TFF's federated EMNIST-62), ours the 105 writers of LEAF's 5% sample with
both splits. Published accuracies: not found (``paper`` entries unset).
"""

from experiments.configs import fed_optimizers

# emnist_character, "Best hyperparameters" (base-10 logs on the code page): client rate
# Adagrad, Adam, Yogi, AvgM 10^-1.5, Avg 10^-1; server rate Adagrad 10^-1, Adam 10^-2.5,
# Yogi 10^-2.5, AvgM 10^-0.5, Avg 10^0; epsilon (tau) Adagrad 10^-2, Adam 10^-4, Yogi 10^-4.
CHANGES = {
  "fedavg": {"learning_rate": 10**-1.0},
  "fedavgm": {
    "learning_rate": 10**-1.5,
    "server_sgd": {"learning_rate": 10**-0.5, "momentum": 0.9},
  },
  "fedadagrad": {"learning_rate": 10**-1.5, "server_lr": 10**-1.0, "adaptivity": 10**-2.0},
  "fedadam": {"learning_rate": 10**-1.5, "server_lr": 10**-2.5, "adaptivity": 10**-4.0},
  "fedyogi": {"learning_rate": 10**-1.5, "server_lr": 10**-2.5, "adaptivity": 10**-4.0},
  "scaffold": {"learning_rate": 10**-1.0},  # FedAvg's client rate (no tuned SCAFFOLD rate found)
}


def get_config():
  """FEMNIST writers at Reddi et al.'s EMNIST CR setting: 10 clients a round, one local
  epoch of batches of 20, 1,500 rounds."""
  config = fed_optimizers.get_config()
  config.dataset = "emnist"
  config.rounds = 1500
  config.batch_size = 20
  methods = {label: dict(entry) for label, entry in fed_optimizers.METHODS.items()}
  for label, change in CHANGES.items():
    methods[label].update(change)
  config.methods = fed_optimizers.entries(methods)
  return config
