"""DP-FTRL against DP-FedAvg on FEMNIST's writers, 15 writers a round (issue 48, item 3).

``python -m experiments.main --config=experiments/configs/natural_dro_femnist_dp_ftrl.py
--workdir=runs/e8_femnist_dp_ftrl``. E8's FEMNIST settings (105 writers, logistic
regression, 100 rounds of 20 steps of batch 10 at rate 0.01, writers weighted alike) with
15 writers a round instead of all, so that sampling has something to amplify:

* ``fedavg``: no privacy, 15 writers drawn uniformly each round;
* ``fedavg_epochs``: no privacy, the ``"epochs"`` schedule DP-FTRL needs (each epoch of
  ``105 // 15 = 7`` rounds a permutation of the writers): what the schedule alone does;
* ``dpfedavg_eps<e>``: the Gaussian mechanism on the mean (``fedco.privacy.gaussian``),
  uniform sampling, accounted with amplification at ``q = 15 / 105``;
* ``dpftrl_eps<e>``: DP-FTRL (``fedco.privacy.dp_ftrl``, Honaker's efficient tree), server
  step 1 without momentum (FedAvg's server), a tree per epoch; ``dpftrl_mom_eps<e>`` with
  momentum 0.9 at step 0.1 (the same long-run step, ``0.1 / (1 - 0.9)``; the paper's
  momentum, not tuned here); ``dpftrl_mom_plain_eps8``: the same with each node's own noisy
  value (``efficient=False``), what the efficient estimator buys.

Every private method clips each writer's model change to 0.1, the median norm of an honest
round's change here (where ``e8_femnist_dp``'s adaptive bound settled), at delta ``1e-5``
and epsilon 4 and 8 over the 100 rounds, accounted by RDP (DP-FTRL: its tree events).
"""

from experiments import configs
from experiments.configs import natural_dro, natural_dro_femnist

EPSILONS = (4.0, 8.0)
CLIP = 0.1
COHORT = 15


def get_config():
  config = natural_dro_femnist.get_config()
  config.seeds = (0, 1, 2)
  fedavg = dict(natural_dro.METHODS["fedavg_uniform"])
  uniform = {"participation": {"clients_per_round": COHORT}}
  epochs = {"participation": {"clients_per_round": COHORT, "sampling": "epochs"}}
  methods = {
    "fedavg": {**fedavg, **uniform},
    "fedavg_epochs": {**fedavg, **epochs, "curve": "fedavg"},
  }
  for eps in EPSILONS:
    private = {"epsilon": eps, "delta": 1e-5, "clip": CLIP}
    methods[f"dpfedavg_eps{eps:g}"] = {
      **fedavg,
      **uniform,
      "curve": "dpfedavg",
      "privacy": private,
    }
    tree = {**private, "mechanism": "dp_ftrl", "efficient": True}
    momentum = {"learning_rate": 0.1, "momentum": 0.9}
    methods[f"dpftrl_eps{eps:g}"] = {**fedavg, **epochs, "curve": "dpftrl", "privacy": tree}
    methods[f"dpftrl_mom_eps{eps:g}"] = {
      **fedavg,
      **epochs,
      "curve": "dpftrl_mom",
      "privacy": {**tree, **momentum},
    }
  methods["dpftrl_mom_plain_eps8"] = {
    **fedavg,
    **epochs,
    "curve": "dpftrl_mom_plain",
    "privacy": {
      "epsilon": 8.0,
      "delta": 1e-5,
      "clip": CLIP,
      "mechanism": "dp_ftrl",
      "efficient": False,
      **momentum,
    },
  }
  config.methods = configs.methods(methods)
  return config
