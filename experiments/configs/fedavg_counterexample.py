"""E7: FedAvg for compositional problems fails, FedDRO converges (paper 004, Theorem 4.1).

``python -m experiments.main --config=experiments/configs/fedavg_counterexample.py
--workdir=runs/e7``; e.g. ``--config.local_steps=1`` or ``--config.methods.feddro.beta=1``.
``fedavg_counterexample_compression.py`` runs FedDRO with its every-step ``y`` quantized.
"""

import ml_collections

from experiments import configs


def get_config():
  """E7: two clients, one-dimensional ``x``, no noise (deterministic runs)."""
  config = ml_collections.ConfigDict()
  config.experiment = "fedavg_counterexample"
  config.seeds = (0,)  # the runs are deterministic (no noise, full data): one seed suffices
  config.rounds = 400
  config.local_steps = 5  # I: local steps per round
  config.learning_rate = 0.02  # eta, every method
  config.batch_size = 0  # 0: each client's whole data (its one example); the only value
  config.eval_every = 1  # rounds between recorded |x_bar - x*| and |Phi'(x_bar)|
  config.x0 = 0.0  # the initial model x_bar_0
  config.methods = configs.methods(
    {
      "fedavg_co_case1": {"algorithm": "fedavg_co", "case": "I"},
      "fedavg_co_case2": {"algorithm": "fedavg_co", "case": "II"},
      "fedavg_co_modified": {"algorithm": "fedavg_co", "case": "modified"},
      "feddro": {"algorithm": "feddro", "beta": 0.5},  # hybrid-tracker beta in (0, 1]
    }
  )
  return config
