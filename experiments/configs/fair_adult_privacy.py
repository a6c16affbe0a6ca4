"""E6's test accuracy against the epsilon of client-level differential privacy on everything
the methods send (FedDRO, DS-FedDRO and SGD as they are and at each of ``EPSILONS``; 1,000
clients of about 33 rows, 100 per round): ``python -m experiments.main
--config=experiments/configs/fair_adult_privacy.py --workdir=runs/e6p``."""

from experiments import configs
from experiments.configs import fair_adult

# Client-level DP (fedco.privacy): every upload clipped per field, Gaussian noise on the
# server's mean. Clip bounds: about the size of an upload in a non-private run (lr 0.1 times
# a logistic gradient; y moves by beta times a batch's deviation), fixed, not tuned.
CLIP = {"params": 0.1, "y": 0.3}
EPSILONS = (1.0, 2.0, 8.0)
DELTA = 1e-5


def get_config():
  config = fair_adult.get_config()
  # Client-level DP needs many clients: the noise on a mean of m uploads scales as 1/m.
  config.num_clients, config.clients_per_round = 1000, 100
  methods = {}
  for label in ("feddro", "ds_feddro", "fedavg"):  # each as it is and once per epsilon
    entry = fair_adult.METHODS[label]
    if entry["algorithm"] == "fedavg":  # data-size weights are private: refused under DP
      entry = {**entry, "weighting": "uniform"}
    methods[label] = dict(entry)
    clip = {k: v for k, v in CLIP.items() if k == "params" or entry["algorithm"] != "fedavg"}
    for eps in EPSILONS:
      methods[f"{label}_eps{eps:g}"] = {
        **entry,
        "curve": label,
        "privacy": {"epsilon": eps, "delta": DELTA, "clip": clip},
      }
  config.methods = configs.methods(methods)
  return config
