"""Adult DRO-FL's short budget with client-level differential privacy on everything the
methods send: each of ``PRIVATE_METHODS`` as it is and at each of ``EPSILONS``
(``<label>_eps<e>``, curve ``<label>``): ``python -m experiments.main
--config=experiments/configs/adult_dro_privacy.py --workdir=runs/adult_p``."""

from experiments import configs
from experiments.configs import adult_dro

# One L2 bound for every upload (a round's model change is at most 10 steps x 0.1 x a
# logistic gradient; y and the reported losses are losses of about 0.3), delta 1e-5, and
# these epsilons for the whole run. FedAvg weighs the two clients uniformly here (data-size
# weights are private: refused under privacy). DRFA is left out: its server queries client
# losses outside its communication plan, which is refused.
CLIP = 1.0
EPSILONS = (1.0, 8.0, 64.0)
PRIVATE_METHODS = ("fedavg", "qfedavg", "afl", "comfedl_normalized", "feddro")


def get_config():
  config = adult_dro.get_config()
  methods = {}
  for label in PRIVATE_METHODS:
    entry = dict(adult_dro.METHODS[label])
    if entry.get("weighting") == "samples":  # data sizes are private: refused under DP
      entry["weighting"] = "uniform"
    methods[label] = entry
    for eps in EPSILONS:
      methods[f"{label}_eps{eps:g}"] = {
        **entry,
        "curve": label,
        "privacy": {"epsilon": eps, "delta": 1e-5, "clip": CLIP},
      }
  config.methods = configs.methods(methods)
  return config
