"""E8 on FEMNIST's writers under client-level DP, fixed against adaptive clip bounds (issue 48).

``python -m experiments.main --config=experiments/configs/natural_dro_femnist_privacy.py
--workdir=runs/e8_femnist_dp``. E8's FEMNIST settings (105 writers, every writer every round,
logistic regression, 100 rounds of 20 steps; AFL 2,000 rounds of one step) with everything
the methods send clipped and noised at each target epsilon of ``EPSILONS`` (delta 1e-5):
``<method>_eps<e>`` with fixed bounds ``CLIP[method]``, ``<method>_eps<e>_adaptive`` with
the model's bound starting there and following the median update norm
(``fedco.privacy.adaptive_clipping``; the count's noise the larger of ``105 / 20`` and
the run's noise multiplier). Clients are weighted
alike (data sizes are private). Only the model's bound adapts: FedDRO's ``y`` goes up after
every step and AFL's losses are reports the bound of which stays fixed (decision 107).
"""

from experiments import configs
from experiments.configs import natural_dro, natural_dro_femnist

EPSILONS = (1.0, 4.0, 8.0)
# Starting (fixed) bounds per field sent: the model's change over a round, FedDRO's y
# change per step (K = 105 losses of about 4 in its own coordinate each) and AFL's loss.
CLIP = {
  "fedavg_uniform": {"params": 0.5},
  "feddro": {"params": 0.5, "y": 50.0},
  "afl": {"params": 0.5, "loss": 10.0},
}


def get_config():
  config = natural_dro_femnist.get_config()
  config.seeds = (0,)
  methods = {}
  for label, clip in CLIP.items():
    entry = dict(natural_dro.METHODS[label])
    for eps in EPSILONS:
      private = {"epsilon": eps, "delta": 1e-5, "clip": clip}
      methods[f"{label}_eps{eps:g}"] = {**entry, "curve": label, "privacy": private}
      methods[f"{label}_eps{eps:g}_adaptive"] = {
        **entry,
        "curve": f"{label}_adaptive",
        "privacy": {**private, "adaptive": {"target_quantile": 0.5}},
      }
  config.methods = configs.methods(methods)
  return config
